"""Every upstream private name gpulab uses (gpulab.compat), checked against the installed
packages: a test here fails when an upgrade changes one, or when the installed version
is not the one the entry was checked against (read the entry, check upstream again,
adjust gpulab.compat and raise ``checked``)."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import logging
import re
import sys
import tempfile
import tomllib
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy
from asyncssh.stream import SSHReader, SSHServerStreamSession, SSHWriter
from dockerspawner import DockerSpawner
from jupyterhub.app import JupyterHub
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.handlers.login import LoginHandler
from jupyterhub.handlers.pages import SpawnHandler, SpawnPendingHandler
from jupyterhub.services.auth import HubAuth
from jupyterhub.spawner import Spawner
from jupyterhub.user import User
from tornado.websocket import WebSocketHandler
from traitlets.config import Config

from gpulab import compat, shares
from gpulab.login.roles import prune_hub_db
from gpulab.spawn.naming import container_name
from gpulab.spawn.spawner import GpulabSpawner

ROOT = Path(__file__).resolve().parents[2]
IMAGE = ROOT / "images" / "singleuser"


def source(obj) -> str:
    return inspect.getsource(obj)


def parameters(function) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(function).parameters.values()]


# ---------------------------------------------------------------- one probe per entry


def jupyterhub_user():
    # gpulab's post() does what LoginHandler.post does once the user is signed in
    assert "self._jupyterhub_user = user" in source(LoginHandler.post)
    assert "hasattr(self, '_jupyterhub_user')" in source(BaseHandler.get_current_user)


def token_authenticated():
    assert "self._token_authenticated" in source(BaseHandler.refresh_auth)
    assert "self._token_authenticated = True" in source(BaseHandler.get_current_user_token)
    # still set only on token requests: once upstream gives it a default, gpulab's
    # mark_cookie_request can go
    assert not hasattr(BaseHandler, "_token_authenticated")


def auth_refreshed():
    assert User._auth_refreshed is None
    assert "user._auth_refreshed" in source(BaseHandler.refresh_auth)


def set_cookie():
    assert parameters(BaseHandler._set_cookie) == [
        ("self", inspect.Parameter.empty), ("key", inspect.Parameter.empty),
        ("value", inspect.Parameter.empty), ("encrypted", True),
        ("overrides", inspect.Parameter.empty)]


def render():
    assert parameters(LoginHandler._render)[:3] == [
        ("self", inspect.Parameter.empty), ("login_error", None), ("username", None)]
    assert "login.html" in source(LoginHandler._render)


def log_name():
    assert isinstance(inspect.getattr_static(Spawner, "_log_name"), property)
    spawner = SimpleNamespace(user=SimpleNamespace(name="alice"), name="train")
    assert Spawner._log_name.fget(spawner) == "alice:train"


def simple_options_from_form():
    unwrap = compat.simple_options_from_form(Spawner)
    assert unwrap({"gpus": ["1"], "pick": ["a", "b"], "box": ["on"]}) == {
        "gpus": "1", "pick": ["a", "b"], "box": True}


def asyncssh_stream_session():
    assert "self._session_factory = session_factory" in source(SSHServerStreamSession.__init__)
    started = source(SSHServerStreamSession.session_started)
    assert "self._session_factory(stdin, stdout, stderr)" in started
    assert "self._conn.create_task(" in started
    assert "self._chan = chan" in source(SSHServerStreamSession.connection_made)
    # gpulab's copy hands the session factory the streams asyncssh would have made
    made = []
    chan = SimpleNamespace(logger="chan-logger")
    session = SSHServerStreamSession(lambda i, o, e: (i, o, e))
    session._chan = chan
    session._conn = SimpleNamespace(create_task=lambda task, logger: made.append((task, logger)))
    compat.start_stream_session(session)
    (stdin, stdout, stderr), logger = made[0]
    assert isinstance(stdin, SSHReader) and isinstance(stdout, SSHWriter)
    assert isinstance(stderr, SSHWriter) and logger == "chan-logger"


def get_token_url():
    """The image's jupyter_server_config.py replaces it: upstream still takes a token
    from the URL of any request that says it is a websocket, gpulab's never does."""
    original = HubAuth._get_token_url
    assert parameters(original) == [("self", inspect.Parameter.empty),
                                    ("handler", inspect.Parameter.empty)]
    handler = SimpleNamespace(request=SimpleNamespace(headers={"Sec-Fetch-Mode": "websocket"}),
                              get_argument=lambda name, default: "url-token")
    assert original(HubAuth(allow_token_in_url=False), handler) == "url-token"
    config = IMAGE / "jupyter_server_config.py"
    try:
        exec(compile(config.read_text(), str(config), "exec"), {"c": Config()})
        assert HubAuth._get_token_url is not original
        assert HubAuth(allow_token_in_url=False)._get_token_url(handler) == ""
    finally:
        HubAuth._get_token_url = original


def websocket_get():
    original = WebSocketHandler.get
    assert inspect.iscoroutinefunction(original)
    assert [(n, p.kind) for n, p in inspect.signature(original).parameters.items()] == [
        ("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("args", inspect.Parameter.VAR_POSITIONAL), ("kwargs", inspect.Parameter.VAR_KEYWORD)]
    spec = importlib.util.spec_from_file_location("gpulab_access", IMAGE / "gpulab_access.py")
    access = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(access)
        access.track_websockets()
        assert WebSocketHandler.get is access._noted_get
    finally:
        WebSocketHandler.get = original


def process_transport():
    assert "self._transport = transport" in source(asyncio.subprocess.Process.__init__)

    async def pipes():
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; sys.stdin.read()", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        found = [proc._transport.get_pipe_transport(fd) is not None for fd in (0, 1, 2)]
        proc.stdin.close()
        await proc.wait()
        return found

    assert asyncio.run(pipes()) == [True, True, True]


def object_name_default():
    changed = DockerSpawner._image_changed  # an observer of image
    assert changed.trait_names == ("image",)
    assert "self.object_name = self._object_name_default()" in source(changed.func)
    # gpulab's override names the container, and names it again when the image is set
    spawner = GpulabSpawner(user=SimpleNamespace(name="alice"))
    assert spawner.object_name == container_name("alice", "")
    spawner.object_name = "jupyter-alice"
    spawner.image = "gpulab/other:1"
    assert spawner.object_name == container_name("alice", "")


def hub_orm():
    # gpulab's config file runs before the hub opens its database and loads the groups
    start = source(JupyterHub.initialize)
    assert (start.index("self.load_config_file(") < start.index("self.init_db()")
            < start.index("await self.init_groups()"))
    orm = compat.hub_orm()
    assert "check_db_revision(engine)" in source(orm.new_session_factory)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/jupyterhub.sqlite"
        db = orm.new_session_factory(url)()
        db.add(orm.Group(name="operators", users=[orm.User(name="carol"), orm.User(name="dave")]))
        db.commit()
        db.close()
        db.get_bind().dispose()
        assert prune_hub_db(url, {"operators": {"users": ["carol"]}}) == {"operators": ["dave"]}
        db = orm.new_session_factory(url)()
        assert [u.name for u in orm.Group.find(db, "operators").users] == ["carol"]
        assert orm.Group.find(db, "students") is None
        # a database of another JupyterHub: left alone, as the hub itself refuses it
        db.execute(sqlalchemy.text("UPDATE alembic_version SET version_num = 'older'"))
        db.commit()
        db.close()
        db.get_bind().dispose()
        with pytest.raises(orm.DatabaseSchemaMismatch, match="jupyterhub upgrade-db"):
            orm.new_session_factory(url)
        assert prune_hub_db(url, {"operators": {"users": []}}) == {}


def hub_tokens():
    orm = compat.hub_orm()
    assert "kind" in inspect.signature(orm.APIToken.find).parameters
    with tempfile.TemporaryDirectory() as tmp:
        db = orm.new_session_factory(f"sqlite:///{tmp}/jupyterhub.sqlite")()
        carol = orm.User(name="carol")
        db.add(carol)
        db.add(orm.OAuthClient(identifier="jupyterhub"))  # the hub makes it at its start
        db.commit()
        token = carol.new_api_token(note="gpulab login token: issued by root",
                                    expires_in=3600)
        found = orm.APIToken.find(db, token, kind="user")
        assert found is not None and found.user_id == carol.id and found.expires_at
        assert db.query(orm.APIToken).filter(orm.APIToken.user_id == carol.id).all() == [found]
        db.close()
        db.get_bind().dispose()


def not_running_exception():
    get = source(SpawnPendingHandler.get)
    failed = get[get.index("exc = spawner._spawn_future.exception()"):]
    failed = failed[:failed.index("self.finish(html)")]
    for passed in ('"not_running.html"', "failed=True,", "failed_html_message=html_message,",
                   "exception=exc,"):
        assert passed in failed, passed
    # the spawner's own exception, not a wrapper
    assert "await spawn_future" in source(BaseHandler.spawn_single_user)
    assert "# raise original exception" in source(User.spawn)
    # its headers: what the spawn form's handler answers with (a 303 to her home page)
    assert 'headers = getattr(e, "headers", None) or {}' in source(SpawnHandler._post)


def delete_spawner():
    """What JupyterHub's own DELETE with remove does, which forget_named_server repeats;
    and the POST it wraps, which keeps a refused named server."""
    from jupyterhub.apihandlers.users import UserServerAPIHandler
    remove = source(UserServerAPIHandler.delete)
    for step in ("await maybe_future(user._delete_spawner(spawner))",
                 "self.db.delete(spawner.orm_spawner)", "user.spawners.pop(server_name, None)",
                 "self.db.commit()"):
        assert step in remove, step
    assert "if spawner.active:" in source(User._delete_spawner)
    post = source(UserServerAPIHandler.post)
    assert "spawner = user.get_or_create_spawner(" in post
    assert "await self.spawn_single_user(user, server_name, display_name, options=options)" \
        in post


def hub_shares():
    """A stopped server's shares and share codes end; a member whose access ends loses
    the shares to her and those of her servers, nobody else's."""
    orm = compat.hub_orm()
    with tempfile.TemporaryDirectory() as tmp:
        db = orm.new_session_factory(f"sqlite:///{tmp}/jupyterhub.sqlite")()
        alice, bob, carol = (orm.User(name=n) for n in ("alice", "bob", "carol"))
        db.add_all([alice, bob, carol])
        db.commit()
        hers, his = orm.Spawner(user=alice, name=""), orm.Spawner(user=carol, name="x")
        db.add_all([hers, his])
        db.commit()
        orm.Share.grant(db, hers, bob)
        orm.Share.grant(db, his, alice)
        orm.Share.grant(db, his, bob)
        orm.ShareCode.new(db, hers, scopes=["access:servers!server=alice/"])
        assert [len(hers.shares), len(hers.share_codes), len(his.shares)] == [1, 1, 2]
        assert shares.end_server_shares(db, hers) == 2
        db.expire_all()
        assert [len(hers.shares), len(hers.share_codes), len(his.shares)] == [0, 0, 2]
        orm.Share.grant(db, hers, carol)
        assert shares.end_member_shares(db, alice) == 2  # hers to carol, carol's to her
        db.expire_all()
        assert hers.shares == [] and [s.user.name for s in his.shares] == ["bob"]
        db.close()
        db.get_bind().dispose()


def extra_handlers():
    """The hub serves extra_handlers under its prefix, after its own and the
    authenticator's routes, and its deprecation warning is the one line the filter drops
    (a JupyterHub made from config, as the hub makes itself from jupyterhub_config.py)."""
    init = source(JupyterHub.init_handlers)
    steps = ["h.extend(self.authenticator.get_handlers(self))",
             "h.extend(self.extra_handlers)",
             "self.handlers = self.add_url_prefix(self.hub_prefix, h)"]
    assert all(step in init for step in steps)
    assert [init.index(step) for step in steps] == sorted(init.index(s) for s in steps)
    seen = []

    def caught(record):  # a filter, after the hub's: the app's logging config replaces
        seen.append(record.getMessage())  # its logger's handlers, not its filters
        return False

    log = logging.getLogger("JupyterHub")
    before = list(log.filters)  # gpulab.hubconfig's, if its tests ran first
    for f in before:
        log.removeFilter(f)
    log.addFilter(caught)
    try:
        config = Config()
        config.JupyterHub.extra_handlers = [("/x", BaseHandler)]
        JupyterHub(config=config)
        assert [m for m in seen if m.startswith("JupyterHub.extra_handlers")] == [
            "JupyterHub.extra_handlers is deprecated in JupyterHub 3.1. Please use "
            "JupyterHub services to register additional HTTP endpoints."]
        seen.clear()
        log.removeFilter(caught)
        compat.quiet_extra_handlers_warning()
        compat.quiet_extra_handlers_warning()  # once is enough: no second filter
        log.addFilter(caught)
        JupyterHub(config=config).log.warning("another warning")
        assert seen[-1] == "another warning" and len(log.filters) == 2
        assert not [m for m in seen if m.startswith("JupyterHub.extra_handlers")]
    finally:
        for f in list(log.filters):
            log.removeFilter(f)
        for f in before:
            log.addFilter(f)


PROBES = {
    "jupyterhub.handlers.base.BaseHandler._jupyterhub_user": jupyterhub_user,
    "jupyterhub.handlers.base.BaseHandler._token_authenticated": token_authenticated,
    "jupyterhub.user.User._auth_refreshed": auth_refreshed,
    "jupyterhub.handlers.base.BaseHandler._set_cookie": set_cookie,
    "jupyterhub.handlers.login.LoginHandler._render": render,
    "jupyterhub.spawner.Spawner._log_name": log_name,
    "jupyterhub.spawner.Spawner._simple_options_from_form": simple_options_from_form,
    "asyncssh.stream.SSHServerStreamSession._chan, ._conn, ._session_factory":
        asyncssh_stream_session,
    "jupyterhub.services.auth.HubAuth._get_token_url": get_token_url,
    "tornado.websocket.WebSocketHandler.get (wrapped)": websocket_get,
    "asyncio.subprocess.Process._transport": process_transport,
    "dockerspawner.DockerSpawner._object_name_default": object_name_default,
    "jupyterhub.orm.new_session_factory, .DatabaseSchemaMismatch, .Group.find, .Group.users":
        hub_orm,
    "jupyterhub.handlers.pages.SpawnPendingHandler.get: not_running.html's exception":
        not_running_exception,
    "jupyterhub.orm.APIToken.find, .user_id, User.new_api_token": hub_tokens,
    "jupyterhub.user.User._delete_spawner, .spawners.pop": delete_spawner,
    "jupyterhub.orm.Share, .ShareCode (spawner_id, owner_id, user_id)": hub_shares,
    "jupyterhub.app.JupyterHub.extra_handlers (public, deprecated since 3.1)":
        extra_handlers,
}
ENTRIES = compat.PRIVATE_NAMES + compat.IMAGE_NAMES


def test_every_entry_has_a_probe_and_says_why_and_what_upstream_could_do():
    assert sorted(e.name for e in ENTRIES) == sorted(PROBES)
    for e in ENTRIES:
        assert e.why and e.used_by and e.upstream, e.name


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_the_private_name_is_still_as_checked(entry):
    PROBES[entry.name]()


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_the_installed_version_is_the_one_checked(entry):
    installed = (".".join(map(str, sys.version_info[:2])) if entry.package == "python"
                 else version(entry.package))
    assert installed == entry.checked, (
        f"{entry.name} was checked against {entry.package} {entry.checked}, and "
        f"{installed} is installed: check it upstream again, then raise checked in "
        f"gpulab.compat")


def requirement_pins(lines) -> dict[str, str]:
    """``{name: what follows it}`` of requirement lines, names normalised as pip does."""
    found = (re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*([^\s\\;#]*)", line)
             for line in lines)
    return {re.sub(r"[-_.]+", "-", m[1]).lower(): m[2] for m in found if m}


def test_pyproject_pins_the_versions_of_the_hub_images_lock():
    """The versions checked above are the hub image's (images/hub/requirements.lock):
    gpulab installed from pyproject.toml, as the unit tests' .venv is, gets the same."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = requirement_pins(project["dependencies"])
    lock = ROOT / "images" / "hub" / "requirements.lock"
    locked = requirement_pins(line for line in lock.read_text().splitlines()
                              if not line.lstrip().startswith(("#", "--")))
    assert wanted and locked
    differ = [f"{name}: pyproject.toml says {name}{spec or ' (any version)'}, the lock "
              + (f"pins {locked[name].lstrip('=')}" if name in locked else "has none")
              for name, spec in sorted(wanted.items())
              if name not in locked or spec != "==" + locked[name].lstrip("=")]
    assert not differ, (
        "pyproject.toml's dependencies and images/hub/requirements.lock disagree: "
        + "; ".join(differ) + ". Pin ==<the lock's version> in pyproject.toml (or change "
        "images/hub/requirements.txt and run make lock).")


def test_gpulabs_hub_code_names_no_private_name_of_upstream_but_through_compat():
    """The names above appear in gpulab's package only in gpulab.compat (asyncssh's
    _chan and _conn: in the SSH gateway, whose own classes subclass asyncssh's;
    DockerSpawner's _object_name_default: in the spawner that overrides it)."""
    package = Path(compat.__file__).parent
    names = {"._jupyterhub_user", "._token_authenticated", "._auth_refreshed",
             "._set_cookie", "._render(", "._log_name", "._simple_options_from_form",
             "._session_factory", "._spawn_future", "._reason", "._delete_spawner"}
    found = {(str(p.relative_to(package)), n) for p in package.rglob("*.py")
             if p.name != "compat.py" for n in names if n in p.read_text()}
    found |= {(str(p.relative_to(package)), n) for p in (package / "ssh").glob("*.py")
              for n in ("._chan", "._conn") if n in p.read_text()}
    found |= {(str(p.relative_to(package)), "_object_name_default")
              for p in package.rglob("*.py")
              if p.name != "compat.py" and p != package / "spawn" / "spawner.py"
              and "_object_name_default" in p.read_text()}
    assert not found
