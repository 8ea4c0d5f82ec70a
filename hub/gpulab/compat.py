"""Upstream private names gpulab uses or patches, in one guarded place.

gpulab's hub code reaches the private names below only through this module. Each
entry in :data:`PRIVATE_NAMES` says where the name lives upstream, the version it was
checked against, why gpulab needs it, and the upstream issue or pull request that would
make it unnecessary. ``tests/unit/test_compat.py`` checks every entry against the
installed packages and fails when an upgrade changes one: read the entry, check the
upstream code again, adjust here, then raise ``checked``. Two of them cannot go
through a function here: DockerSpawner's ``_object_name_default`` is overridden under
that name in ``gpulab.spawn.spawner`` (DockerSpawner calls it by name), and the hub's
``templates/not_running.html`` reads the exception JupyterHub hands that page.

Three more live in the single-user image, which cannot import gpulab: they are listed
here (and in :data:`IMAGE_NAMES`), their code stays in the image, and the same test
checks them from ``tests/unit``:

* ``jupyterhub.services.auth.HubAuth._get_token_url`` is replaced in
  ``images/singleuser/jupyter_server_config.py`` so that a member's server never takes a
  token from a URL (JupyterHub still does for any request that says
  ``Sec-Fetch-Mode: websocket``). Checked against jupyterhub 6.1.1. Upstream:
  jupyterhub/jupyterhub#4945; jupyter/enhancement-proposals#121 (websockets without a
  token in the URL) would remove the exception itself.
* ``tornado.websocket.WebSocketHandler.get`` (public, but patched on the class) is
  wrapped in ``images/singleuser/gpulab_access.py`` to note each open websocket, since
  tornado keeps no list of them. Checked against tornado 6.6.1. Upstream: none found.
* ``asyncio.subprocess.Process._transport`` is read in
  ``images/singleuser/gpulab_channels.py`` to close a command's stdout and stderr pipes
  when its SSH client goes away. Checked against CPython 3.11. Upstream:
  python/cpython#130929 (gh-130925: ``StreamReader.close()``) would do it publicly.

And two in JupyterLab's built scripts, guarded where they are made (JupyterLab is not
installed where the unit tests run): ``images/singleuser/patch_jupyterlab_load.py`` edits
the image's ``jlab_core`` bundle so that ``@jupyterlab/apputils-extension``'s
``loadState`` command does not wait for the workspace's save, and
``RecentsManager._loadRecents`` (``@jupyterlab/docmanager``) does not save what it has
just read: together they held up every JupyterLab load by ~1 s. Checked against
jupyterlab 4.6.6. The edits only save time, so on another version or any change to the
texts the image's build leaves the bundle as it is, with a warning;
``tests/unit/test_patch_jupyterlab_load.py`` fails when the image's lock pins another
JupyterLab, and runs both versions of each edit in Node. Upstream: not reported from here.
``images/singleuser/labextension-gpulab-job`` ("Run as Job..." in the file browser) is a
federated extension written by hand: it speaks JupyterLab's module-federation loading
(``window._JUPYTERLAB[name]``'s ``init(shareScope)`` and ``get("./extension")``, the
``jupyterlab._build`` keys of its package.json) and takes ``@jupyterlab/filebrowser``,
``apputils``, ``services``, ``coreutils`` and ``@lumino/widgets`` from the share scope,
public APIs only. Checked against jupyterlab 4.6.6, in Chromium by
``tests/integration/test_jobs.py``. Upstream: the supported way is a webpack build
(``jupyter labextension build``), which the image's build would need Node for.

One public name is here too, because upstream deprecated it: gpulab's routes under
``/hub/`` (its REST APIs, the bookings and sharing pages) are ``JupyterHub.extra_handlers``,
set by ``gpulab.hubconfig``, so that they do not depend on which authenticator signs
members in. JupyterHub deprecated it in 3.1 ("use services"; its author has "no plans to
remove the feature", jupyterhub/jupyterhub#4236) and warns at every start;
:func:`quiet_extra_handlers_warning` drops that one line, since the lab's admin can do
nothing about it.

No longer used, and kept out by the same test: ``Spawner._spawn_future`` (the spawner's
``progress()`` need not end itself: JupyterHub stops reading it when the spawn ends,
``jupyterhub.utils.iterate_until``) and tornado's ``RequestHandler._reason`` (the
dashboard's error pages take the status's standard reason).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = [
    "IMAGE_NAMES",
    "PRIVATE_NAMES",
    "PrivateName",
    "expire_auth",
    "forget_named_server",
    "from_rest_api",
    "hub_orm",
    "mark_cookie_request",
    "quiet_extra_handlers_warning",
    "render_login",
    "set_current_user",
    "set_hub_cookie",
    "simple_options_from_form",
    "spawner_log_name",
    "start_stream_session",
]


@dataclass(frozen=True)
class PrivateName:
    name: str  # where it lives upstream
    package: str  # the distribution it comes with
    checked: str  # the version it was checked against
    used_by: str  # gpulab's code that needs it (through the function here)
    why: str
    upstream: str  # what would make it unnecessary ("none found": nothing filed yet)


PRIVATE_NAMES: tuple[PrivateName, ...] = (
    PrivateName(
        "jupyterhub.handlers.base.BaseHandler._jupyterhub_user", "jupyterhub", "6.1.1",
        "gpulab.login.auth.GpulabLoginHandler.post (set_current_user)",
        "the login page's own post() signs a member in as LoginHandler.post does: the "
        "request's current user is set before redirecting",
        "none found (a hook around LoginHandler.post's checks would let gpulab call it)"),
    PrivateName(
        "jupyterhub.handlers.base.BaseHandler._token_authenticated", "jupyterhub", "6.1.1",
        "gpulab.login.auth.TokenAuthenticator.refresh_user (mark_cookie_request)",
        "refresh_auth reads it after a failed refresh, but it is set only on "
        "token-authenticated requests: a cookie request would end in an AttributeError",
        "none found (BaseHandler could set it to False at start; it is read since "
        "jupyterhub/jupyterhub#5500, auth_refresh_strict)"),
    PrivateName(
        "jupyterhub.user.User._auth_refreshed", "jupyterhub", "6.1.1",
        "gpulab.login.tokens (expire_auth)",
        "a revoked last login token ends the member's access at her next request, "
        "whatever auth_refresh_age says",
        "none found (no public way to expire a user's auth; it came with "
        "jupyterhub/jupyterhub#2342)"),
    PrivateName(
        "jupyterhub.handlers.base.BaseHandler._set_cookie", "jupyterhub", "6.1.1",
        "gpulab.login.auth.GpulabLoginHandler.set_device_cookie (set_hub_cookie)",
        "the device cookie gets JupyterHub's cookie options (httponly, secure behind "
        "HTTPS, c.JupyterHub.cookie_options) like the hub's own cookies",
        "none found"),
    PrivateName(
        "jupyterhub.handlers.login.LoginHandler._render", "jupyterhub", "6.1.1",
        "gpulab.login.auth.GpulabLoginHandler (render_login)",
        "the login page is rendered again with an error (locked, invalid username)",
        "none found (authenticators override it too: "
        "jupyterhub/firstuseauthenticator#30)"),
    PrivateName(
        "jupyterhub.spawner.Spawner._log_name", "jupyterhub", "6.1.1",
        "gpulab.spawn.spawner.GpulabSpawner.log_name (spawner_log_name)",
        "gpulab's log lines name a server as JupyterHub's own do (alice, alice:train)",
        "none found"),
    PrivateName(
        "jupyterhub.spawner.Spawner._simple_options_from_form", "jupyterhub", "6.1.1",
        "gpulab.spawn.spawner.GpulabSpawner's options_from_form default "
        "(simple_options_from_form)",
        "the documented value 'simple' is turned into this function only when "
        "options_from_form is set, not when a subclass's default returns it",
        "none found (a public staticmethod, or 'simple' coerced in defaults too)"),
    PrivateName(
        "asyncssh.stream.SSHServerStreamSession._chan, ._conn, ._session_factory",
        "asyncssh", "2.24.1",
        "gpulab.ssh.connection._StreamSession.session_started (start_stream_session)",
        "every subsystem, sftp included, goes to the gateway's handler (the member's own "
        "sftp-server in her server) instead of asyncssh's built-in SFTP server, which "
        "would serve the gateway's files",
        "none found (subsystem_requested could route sftp to the session factory when "
        "no sftp_factory is given; ronf/asyncssh#707 describes the factories)"),
    PrivateName(
        "dockerspawner.DockerSpawner._object_name_default", "dockerspawner", "14.0.0",
        "gpulab.spawn.spawner.GpulabSpawner._object_name_default (an override, under "
        "DockerSpawner's name)",
        "a server's container is named by gpulab.spawn.naming, not by name_template: "
        "DockerSpawner names it again through this method, called by name, whenever the "
        "image is set (gpulab sets it at every spawn)",
        "none found (a callable name_template would do it publicly; the call by name came "
        "with jupyterhub/dockerspawner#466)"),
    PrivateName(
        "jupyterhub.orm.new_session_factory, .DatabaseSchemaMismatch, .Group.find, "
        ".Group.users", "jupyterhub", "6.1.1",
        "gpulab.login.roles.prune_group_members and prune_hub_db (hub_orm)",
        "load_groups only adds members: gpulab's config file removes those no longer "
        "listed from the hub's database, with JupyterHub's own models, before the hub "
        "opens it",
        "none found (load_groups could make a group's users exact, as load_roles does)"),
    PrivateName(
        "jupyterhub.handlers.pages.SpawnPendingHandler.get: not_running.html's exception",
        "jupyterhub", "6.1.1",
        "gpulab/templates/not_running.html (exception.headers.Location)",
        "she opens the page after a start from the spawn form put her in line: the spawn's "
        "own HTTPError, handed to the page (JupyterHub's template does not use it), names "
        "her home page, where she is sent",
        "none found (the page's variables are not documented)"),
    PrivateName(
        "jupyterhub.user.User._delete_spawner, .spawners.pop", "jupyterhub", "6.1.1",
        "gpulab.spawn.servers_api.ServersAPIHandler (forget_named_server)",
        "a named server whose first start is refused (a bad job, past max_servers or "
        "max_gpus) is removed, as JupyterHub's own DELETE with {\"remove\": true} removes "
        "one: JupyterHub keeps it, so each bad request would leave an entry on her home "
        "page, counted in named_server_limit_per_user",
        "none found (a refused first start of a named server could be discarded upstream, "
        "or the REST API's remove exposed as a method)"),
    PrivateName(
        "jupyterhub.orm.APIToken.find, .user_id, User.new_api_token", "jupyterhub", "6.1.1",
        "gpulab.login.tokens (hub_orm): issue, user_tokens, the login-token API",
        "login tokens are JupyterHub API tokens gpulab issues, finds and lists for a member "
        "in the running hub's database, as JupyterHub's own token handlers do",
        "none found (the REST API's token endpoints cannot issue for another user with "
        "an expiry an admin chooses and a record of who issued it)"),
    PrivateName(
        "jupyterhub.orm.Share, .ShareCode (spawner_id, owner_id, user_id)", "jupyterhub",
        "6.1.1", "gpulab.shares (hub_orm): end_server_shares, end_member_shares",
        "a server's shares end when it stops, and a member's when her access ends: "
        "JupyterHub keeps a share until its server is deleted, and a user's until the "
        "user is; gpulab deletes the rows in the running hub, as JupyterHub's own "
        "DELETE /api/shares/NAME/SERVER does",
        "none found (a share that ends with its server's stop would be an upstream "
        "option; the REST API can end a server's shares but not from the spawner)"),
    PrivateName(
        "jupyterhub.app.JupyterHub.extra_handlers (public, deprecated since 3.1)",
        "jupyterhub", "6.1.1",
        "gpulab.hubconfig.configure (quiet_extra_handlers_warning)",
        "the hub serves gpulab's REST APIs and pages under /hub/, in the hub's process "
        "with its database and current user, whatever authenticator the lab uses",
        "jupyterhub/jupyterhub#4236 deprecated it for services: the line's, bookings' "
        "and assistant's APIs as services of their own (own processes, the hub's OAuth)"),
)


# In the single-user image (images/singleuser/), which cannot import gpulab; see above.
IMAGE_NAMES: tuple[PrivateName, ...] = (
    PrivateName(
        "jupyterhub.services.auth.HubAuth._get_token_url", "jupyterhub", "6.1.1",
        "images/singleuser/jupyter_server_config.py",
        "a member's server never takes a token from a URL, websocket or not",
        "jupyterhub/jupyterhub#4945; jupyter/enhancement-proposals#121"),
    PrivateName(
        "tornado.websocket.WebSocketHandler.get (wrapped)", "tornado", "6.6.1",
        "images/singleuser/gpulab_access.py",
        "each open websocket is noted, to close those whose token the hub no longer "
        "accepts", "none found"),
    PrivateName(
        "asyncio.subprocess.Process._transport", "python", "3.11",
        "images/singleuser/gpulab_channels.py",
        "a command's stdout and stderr pipes close when its SSH client goes away",
        "python/cpython#130929 (gh-130925: StreamReader.close())"),
)


# ---------------------------------------------------------------- JupyterHub's handlers

EXTRA_HANDLERS_WARNING = "JupyterHub.extra_handlers is deprecated"


def _not_the_extra_handlers_warning(record: Any) -> bool:
    return not str(record.msg).startswith(EXTRA_HANDLERS_WARNING)


def quiet_extra_handlers_warning() -> None:
    """Drop JupyterHub's warning that ``extra_handlers`` is deprecated (logged by the
    hub's application logger when the config file sets it; checked against jupyterhub
    6.1.1, ``JupyterHub._extra_handlers_changed``), and nothing else it logs."""
    log = logging.getLogger("JupyterHub")
    if _not_the_extra_handlers_warning not in log.filters:
        log.addFilter(_not_the_extra_handlers_warning)



def from_rest_api(handler: Any) -> bool:
    """Whether a spawn was asked through the REST API (JupyterHub sets ``spawner.handler``
    to the request's handler while it spawns), not from the spawn form. The form's
    handler answers a spawn's ``HTTPError`` with its status and its ``headers`` (checked
    against jupyterhub 6.1.1, ``SpawnHandler.post``), so a 303 there redirects."""
    from jupyterhub.apihandlers.base import APIHandler

    return handler is None or isinstance(handler, APIHandler)


def options_reused(handler: Any) -> bool:
    """Whether JupyterHub starts this server with the options of its last start, because
    the request gave none: it does so when ``User.spawn`` gets ``options=None`` (checked
    against jupyterhub 6.1.1, ``user.py``: "load from db which should have the previous
    value"): the spawn page without a form (a GET without query options), and a REST
    start whose body JupyterHub reads as no options (``get_server_json_body`` in
    ``apihandlers/users.py``: no body, ``{}``, ``null``, or ``display_name`` or
    ``user_options`` given with ``user_options`` null or absent). The form's POST,
    query options and a REST body with options are fresh."""
    if handler is None or getattr(handler, "request", None) is None:
        return False
    request = handler.request
    if from_rest_api(handler):
        try:
            body = json.loads((request.body or b"").strip() or b"null")
        except ValueError:
            return False  # JupyterHub refuses it before any spawn
        if not body:
            return True
        if isinstance(body, dict) and ("display_name" in body or "user_options" in body):
            return body.get("user_options") is None
        return False
    query = {k for k in request.query_arguments if k not in ("next", "display_name")}
    return request.method == "GET" and not query


def set_current_user(handler: Any, user: Any) -> None:
    """The request's signed-in user from now on (``LoginHandler.post`` does the same)."""
    handler._jupyterhub_user = user


def cookie_authenticated(handler: Any) -> bool:
    """The request's user came from her browser session cookie, not from a token
    (JupyterHub marks token-authenticated requests only)."""
    return (handler.current_user is not None
            and not getattr(handler, "_token_authenticated", False))


def mark_cookie_request(handler: Any) -> None:
    """A request not authenticated by a token says so, for ``refresh_auth``."""
    if not hasattr(handler, "_token_authenticated"):
        handler._token_authenticated = False


def set_hub_cookie(handler: Any, name: str, value: str, **options: Any) -> None:
    """A signed, encrypted cookie with JupyterHub's own cookie options."""
    handler._set_cookie(name, value, encrypted=True, **options)


async def render_login(handler: Any, login_error: str, username: str) -> str:
    """The login page, with *login_error* above the form and *username* in it."""
    return await handler._render(login_error=login_error, username=username)


def expire_auth(user: Any) -> None:
    """*user*'s auth is refreshed at their next request (``refresh_user``)."""
    user._auth_refreshed = None


# ---------------------------------------------------------------- the spawner


def spawner_log_name(spawner: Any) -> str:
    """``alice`` or ``alice:train``, as JupyterHub's log names a server."""
    return spawner._log_name


def simple_options_from_form(spawner: Any) -> Callable[[dict], dict]:
    """What ``options_from_form = "simple"`` stands for: one-element lists of the form's
    fields unwrapped."""
    return spawner._simple_options_from_form


# ---------------------------------------------------------------- the hub's database


async def forget_named_server(handler: Any, user: Any, name: str) -> bool:
    """Remove *user*'s named server *name*, stopped, as JupyterHub's ``DELETE
    /users/NAME/servers/SERVER`` with ``{"remove": true}`` does; False (kept) while it is
    active or gone already."""
    spawner = user.spawners.get(name) if name in user.orm_spawners else None
    if spawner is None or spawner.active:
        return False
    await user._delete_spawner(spawner)
    handler.db.delete(spawner.orm_spawner)
    user.spawners.pop(name, None)
    handler.db.commit()
    return True


def hub_orm() -> ModuleType:
    """JupyterHub's database models (``jupyterhub.orm``), for what gpulab changes in the
    hub's database before the hub opens it."""
    from jupyterhub import orm

    return orm


# ---------------------------------------------------------------- asyncssh


def start_stream_session(session: Any) -> None:
    """asyncssh's ``SSHServerStreamSession.session_started`` without its SFTP and SCP
    branches: the session factory gets the streams of every session, subsystems
    included."""
    # here, not at the top: the hub imports this module and has no use for asyncssh
    from asyncssh.constants import EXTENDED_DATA_STDERR
    from asyncssh.stream import SSHReader, SSHWriter

    stdin = SSHReader(session, session._chan)
    stdout = SSHWriter(session, session._chan)
    stderr = SSHWriter(session, session._chan, EXTENDED_DATA_STDERR)
    session._conn.create_task(session._session_factory(stdin, stdout, stderr), stdin.logger)
