"""The admins' lease page and stuck-lease release.

Pure parts first (rows from docker-shaped container dicts, the release rule), then
the handlers over real HTTP on loopback with JupyterHub's own HubOAuth (FakeHubAuth
from test_dashboard_app answers token lookups), a FakeContainers store standing in
for the Docker daemon, and a tiny real HTTP server standing in for the hub's
``GET /hub/api/users/NAME``.
"""

import json
import logging
import re
from datetime import UTC, datetime
from http.cookies import SimpleCookie

import docker
import pytest
import requests
from test_dashboard_app import (  # the same hub stand-in and fixtures as the GPU page
    EVIL,
    PREFIX,
    SECRET,
    SNAPSHOT,
    CannedSource,
    make_auth,
    oauth_cookie,
    token,
)
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port
from tornado.web import Application, RequestHandler

from gpulab import live_config
from gpulab.contract import LABEL_GPUS, LABEL_MANAGED, LABEL_SERVER, LABEL_USER, lease_labels
from gpulab.dashboard.app import DashboardConfig, make_app
from gpulab.dashboard.leases import (
    ContainerStore,
    DockerContainers,
    HubUnavailable,
    LeaseAdmin,
    ReleaseRefused,
    SwarmServices,
    release_decision,
    server_active,
    server_containers,
)
from gpulab.dashboard.sources import SnapshotReader
from gpulab.gpus.leases import LeaseBook
from gpulab.hubapi import HubApi

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
CREATED = int(datetime(2026, 1, 1, 10, 30, tzinfo=UTC).timestamp())
G0 = "GPU-00000000-0000-0000-0000-000000000000"
G1 = "GPU-00000001-0000-0000-0000-000000000000"
G2 = "GPU-00000002-0000-0000-0000-000000000000"
HUB_TOKEN = "service-token-of-gpus"

GPUS_YAML = f"""\
inventory:
  - {{index: 0, uuid: {G0}, model: A100, pool: big}}
  - {{index: 1, uuid: {G1}, model: T4, pool: small}}
pools:
  big: {{mode: exclusive}}
  small: {{mode: shared, max_users: 2}}
"""


def container(user, gpus, server="", state="running", cid=None, created=CREATED, job=False):
    """One entry of docker-py's ``APIClient.containers(all=True)``."""
    return {
        "Id": cid or f"{user}-{server or 'default'}-{state}-0123456789",
        "Names": [f"/jupyter-{user}" + (f"--{server}" if server else "")],
        "Labels": lease_labels(user, server, gpus, job=job),
        "State": state,
        "Created": created,
    }


class FakeContainers(ContainerStore):
    """A Docker daemon's gpulab containers as a list; ``remove`` drops one by id."""

    def __init__(self, containers=()):
        self.containers = list(containers)
        self.removed = []

    async def list(self):
        return [dict(c) for c in self.containers]

    async def remove(self, container_id):
        self.removed.append(container_id)
        self.containers = [c for c in self.containers if c["Id"] != container_id]


class UsersApi(RequestHandler):
    """``GET /hub/api/users/NAME`` as the hub answers it to a token with read:servers:
    only the active servers are listed; 404 for a user the hub does not know."""

    def initialize(self, servers, seen):
        self.servers = servers
        self.seen = seen

    def get(self, name):
        self.seen.append((name, self.request.headers.get("Authorization")))
        if self.request.headers.get("Authorization") != f"token {HUB_TOKEN}":
            self.set_status(403)
            self.finish({"status": 403, "message": "Action is not authorized"})
            return
        if name not in self.servers:
            self.set_status(404)
            self.finish({"status": 404, "message": "Not Found"})
            return
        self.finish({"kind": "user", "name": name,
                     "servers": {s: {"name": s, "ready": True} for s in self.servers[name]}})


@pytest.fixture
async def hub_api():
    """(api_url, servers, seen): servers maps user -> names of active servers."""
    servers, seen = {}, []
    app = Application([(r"/hub/api/users/([^/]+)", UsersApi,
                        {"servers": servers, "seen": seen})])
    sock, port = bind_unused_port()
    server = HTTPServer(app)
    server.add_sockets([sock])
    yield f"http://127.0.0.1:{port}/hub/api", servers, seen
    server.stop()


@pytest.fixture
def gpus_path(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text(GPUS_YAML)
    return path


def no_nvml():
    raise AssertionError("an explicit inventory must not ask NVML")


def lease_admin(store, api_url, gpus_path, token=HUB_TOKEN):
    return LeaseAdmin(store, HubApi(api_url, token, timeout=2), gpus_path,
                      book=LeaseBook(store.list, discover=no_nvml), now=lambda: NOW)


# -- pure: the release rule -----------------------------------------------------------
@pytest.mark.parametrize("state, hub_active, remove", [
    ("running", True, False),     # the hub runs it: stop it through the hub
    ("created", True, False),     # a spawn in progress
    ("paused", True, False),
    ("restarting", True, False),
    ("exited", True, True),       # dead container the hub has not noticed yet
    ("dead", True, True),
    ("running", False, True),     # the hub lost it: it holds the GPU for nobody
    ("created", False, True),
    ("paused", False, True),
    ("exited", False, True),
    ("", False, True),            # no State: docker lists running ones so
    ("", True, False),
])
def test_release_decision(state, hub_active, remove):
    d = release_decision(state, hub_active)
    assert d.remove is remove
    assert ("the hub runs this server" in d.why) is (hub_active and not remove)


def test_server_containers_match_user_server_and_gpu_exactly():
    cs = [container("alice", [G0, G1]), container("alice", [G0], server="big"),
          container("alicia", [G0]), container("alice", [G1], state="exited", cid="old")]
    assert [c["Id"] for c in server_containers(cs, G0, "alice", "")] == \
        ["alice-default-running-0123456789"]
    assert [c["Id"] for c in server_containers(cs, G1, "alice", "")] == \
        ["alice-default-running-0123456789", "old"]  # an exited one too
    assert server_containers(cs, G2, "alice", "") == []


# -- pure-ish: the model from container dicts ----------------------------------------
async def test_lease_model_from_container_dicts(gpus_path):
    store = FakeContainers([
        container("alice", [G0]),
        container("bob", [G1], server="small", state="created", job=True),
        container("carol", [G2]),                      # GPU not in the inventory
        container("dave", [G1], state="exited"),      # holds nothing
    ])
    model = await lease_admin(store, "http://127.0.0.1:9/hub/api", gpus_path).model()
    rows = {le["user"]: le for le in model["leases"]}
    assert set(rows) == {"alice", "bob", "carol"}
    assert rows["alice"] == {
        "gpu_uuid": G0, "gpu_index": 0, "model": "A100", "pool": "big", "machine": "", "user": "alice",
        "server": "", "since": "2026-01-01T10:30:00+00:00", "state": "active",
        "container_id": "alice-default-running-0123456789", "container_state": "running",
        "job": False, "held_seconds": 5400, "releasable": True}
    # bob's server runs a job: the page says so
    assert (rows["bob"]["server"], rows["bob"]["container_state"], rows["bob"]["job"]) == (
        "small", "created", True)
    assert (rows["carol"]["state"], rows["carol"]["gpu_index"]) == ("orphaned", None)
    assert model["gpus"] == [
        {"index": 0, "uuid": G0, "model": "A100", "pool": "big", "machine": "", "mode": "exclusive",
         "reserved": False, "capacity": 1, "held": 1, "free": 0, "holders": ["alice"],
         "kept_for": []},
        {"index": 1, "uuid": G1, "model": "T4", "pool": "small", "machine": "", "mode": "shared",
         "reserved": False, "capacity": 2, "held": 1, "free": 1, "holders": ["bob/small"],
         "kept_for": []},
    ]
    assert model["summary"] == {"gpus": 2, "held": 2, "leases": 3, "orphaned": 1,
                                "text": "3 leases on 2 of 2 GPUs"}
    assert model["config_errors"] == []


async def test_the_gpus_the_line_keeps_are_shown_and_not_free(gpus_path, tmp_path):
    from gpulab.line.store import LineStore

    store = FakeContainers([container("alice", [G0])])
    line = tmp_path / "line.sqlite"
    admin = LeaseAdmin(store, HubApi("http://x", HUB_TOKEN, timeout=2), gpus_path,
                       book=LeaseBook(store.list, discover=no_nvml), now=lambda: NOW,
                       line_path=line)
    assert [g["kept_for"] for g in (await admin.model())["gpus"]] == [[], []]
    # bob waits for alice's A100: nothing is free for him; erin's T4 turn has come
    LineStore(line).join("bob", "", 1, ["big-users"])
    LineStore(line).join("erin", "", 1)
    gpus_path.write_text(GPUS_YAML + "groups:\n  big-users: {pools: [big]}\n"
                                     "defaults: {pools: [small]}\n")
    model = await admin.model()
    assert [(g["kept_for"], g["free"]) for g in model["gpus"]] == [
        ([], 0), (["erin, whose turn in line it is"], 0 + 1)]  # a shared T4: one place left


async def test_refused_gpus_yaml_edit_is_reported_and_last_good_stays(gpus_path):
    admin = lease_admin(FakeContainers([container("alice", [G1])]), "http://x", gpus_path)
    assert (await admin.model())["config_errors"] == []
    gpus_path.write_text(GPUS_YAML + "pools:\n  small: {mode: sometimes}\n")
    try:
        model = await admin.model()
        assert len(model["config_errors"]) == 1 and str(gpus_path) in model["config_errors"][0]
        assert [g["model"] for g in model["gpus"]] == ["A100", "T4"]  # last good inventory
        assert model["leases"][0]["gpu_index"] == 1
    finally:
        live_config.gpus_file.errors.pop(str(gpus_path), None)


async def test_refused_gpulab_yaml_edit_is_reported_too(gpus_path):
    settings = gpus_path.with_name("gpulab.yaml")
    settings.write_text("spawn:\n  mem_limit: 3g\n")
    admin = LeaseAdmin(FakeContainers([]), HubApi("http://x", "t"), gpus_path,
                       book=LeaseBook(FakeContainers([]).list, discover=lambda: []),
                       now=lambda: NOW, settings_path=settings)
    assert (await admin.model())["config_errors"] == []
    settings.write_text("spawn:\n  mem_limit: plenty\n")
    try:
        assert (await admin.model())["config_errors"] == [
            f"{settings}:2: spawn.mem_limit: expected a size such as 2g or 512m, got 'plenty'"
            f" (the last good version, stays in force)"]
        never = LeaseAdmin(FakeContainers([]), HubApi("http://x", "t"), gpus_path,
                           settings_path=settings.with_name("never.yaml"))
        never.book = admin.book
        assert "no valid version was read yet" in (await never.model())["config_errors"][-1]
    finally:
        live_config.settings_file.errors.pop(str(settings), None)


async def test_never_valid_gpus_yaml_gives_defaults_and_says_so(tmp_path):
    bad = tmp_path / "gpus.yaml"
    bad.write_text("inventory: [{index: zero}]\n")
    store = FakeContainers([container("alice", [G0])])
    admin = LeaseAdmin(store, HubApi("http://x", "t"), bad,
                       book=LeaseBook(store.list, discover=lambda: []), now=lambda: NOW)
    model = await admin.model()
    assert "no valid version was read yet" in model["config_errors"][0]
    assert model["gpus"] == [] and model["leases"][0]["state"] == "orphaned"


# -- asking the hub whether a server runs, against a real HTTP server ----------------
async def test_server_active_reads_active_servers(hub_api):
    url, servers, seen = hub_api
    servers.update({"alice": [""], "bob": ["big"], "a/b": [""]})
    hub = HubApi(url, HUB_TOKEN)
    assert await server_active(hub, "alice", "") is True
    assert await server_active(hub, "bob", "") is False
    assert await server_active(hub, "bob", "big") is True
    assert await server_active(hub, "nobody", "") is False      # 404: the hub has no such user
    # the name is quoted into one path segment: /users/a%2Fb is "a/b", not /users/a + /b
    # (which the hub would answer with 404, i.e. "not running": a wrong release)
    assert await server_active(hub, "a/b", "") is True
    assert seen[0] == ("alice", f"token {HUB_TOKEN}")
    assert seen[-1] == ("a/b", f"token {HUB_TOKEN}")


async def test_server_active_without_the_scope_or_hub_says_why(hub_api):
    url, servers, _ = hub_api
    servers["alice"] = [""]
    with pytest.raises(HubUnavailable, match="Action is not authorized.*scope read:servers"):
        await server_active(HubApi(url, "wrong-token"), "alice", "")
    with pytest.raises(HubUnavailable, match="failed"):
        await server_active(HubApi("http://127.0.0.1:9/hub/api", HUB_TOKEN, timeout=1),
                            "alice", "")


# -- the handlers over HTTP ------------------------------------------------------------
@pytest.fixture
async def dashboard(hub_api, gpus_path):
    """(base, auth, store, servers)."""
    api_url, servers, _ = hub_api
    store = FakeContainers([
        container("alice", [G0]),
        container("bob", [G1], state="exited"),
        container(EVIL, [G1], server="x"),
    ])
    auth = make_auth()
    app = make_app(auth, SnapshotReader([CannedSource(SNAPSHOT)], max_age=0),
                   DashboardConfig(refresh_seconds=3), cookie_secret=SECRET,
                   leases=lease_admin(store, api_url, gpus_path))
    sock, port = bind_unused_port()
    server = HTTPServer(app)
    server.add_sockets([sock])
    yield f"http://127.0.0.1:{port}", auth, store, servers
    server.stop()


async def fetch(url, method="GET", headers=None, body=None):
    try:
        r = await AsyncHTTPClient().fetch(url, method=method, headers=headers or {},
                                          body=body, follow_redirects=False)
    except HTTPClientError as e:
        r = e.response
    return r.code, r.headers, r.body.decode()


async def release(base, who, body):
    headers = {**token(who), "Content-Type": "application/json"}
    status, _, text = await fetch(base + PREFIX + "api/leases/release", "POST", headers,
                                  json.dumps(body))
    return status, json.loads(text)


async def test_admin_sees_the_lease_page(dashboard):
    base, _, _, _ = dashboard
    status, headers, body = await fetch(base + PREFIX + "leases", headers=token("admin-token"))
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert body.count('<tr class="lease">') == 2
    assert "2026-01-01T10:30:00+00:00" in body and "A100" in body
    assert body.count('class="release"') == 2
    assert EVIL not in body and "&lt;script&gt;" in body  # user names escaped
    assert f'data-release="{PREFIX}api/leases/release"' in body
    assert re.search(r'data-xsrf="[^"]+"', body)


async def test_admin_gets_the_json(dashboard):
    base, _, _, _ = dashboard
    status, _, body = await fetch(base + PREFIX + "api/leases", headers=token("admin-token"))
    data = json.loads(body)
    assert status == 200 and set(data) == {"timestamp", "leases", "gpus", "summary",
                                           "config_errors", "holder"}
    assert [(le["user"], le["gpu_index"], le["container_state"]) for le in data["leases"]] == \
        [("alice", 0, "running"), (EVIL, 1, "running")]
    assert [(g["held"], g["free"]) for g in data["gpus"]] == [(1, 0), (1, 1)]


@pytest.mark.parametrize("who, status, words", [
    ("operator-token", 403, "for hub admins only, and olga is not one"),
    ("user-token", 403, "needs the scope access:services!service=gpus"),
    ("service-token", 403, "needs the scope"),
])
@pytest.mark.parametrize("path", ["leases", "api/leases"])
async def test_non_admins_are_refused(dashboard, who, status, words, path):
    base, _, _, _ = dashboard
    code, headers, body = await fetch(base + PREFIX + path, headers=token(who))
    assert code == status and "Location" not in headers
    assert "alice" not in body and G0 not in body
    if path == "leases":
        assert words.replace("'", "&#39;") in body
    else:
        assert words in json.loads(body)["error"]


async def test_not_signed_in(dashboard):
    base, _, _, _ = dashboard
    status, headers, _ = await fetch(base + PREFIX + "leases")
    assert status == 302 and "/hub/api/oauth2/authorize" in headers["Location"]
    status, _, body = await fetch(base + PREFIX + "api/leases")
    assert status == 401 and "Not signed in" in json.loads(body)["error"]


async def test_dashboard_header_links_the_lease_page_for_admins_only(dashboard):
    base, _, _, _ = dashboard
    _, _, admin_page = await fetch(base + PREFIX, headers=token("admin-token"))
    _, _, operator_page = await fetch(base + PREFIX, headers=token("operator-token"))
    assert f'<a id="leases-link" href="{PREFIX}leases">' in admin_page
    assert "leases-link" not in operator_page and "signed in as olga" in operator_page


async def test_release_refused_with_409_when_the_hub_runs_the_server(dashboard, caplog):
    base, _, store, servers = dashboard
    servers["alice"] = [""]
    status, data = await release(base, "admin-token",
                                 {"gpu_uuid": G0, "user": "alice", "server": ""})
    assert status == 409
    assert "/hub/admin" in data["error"] and "the hub runs this server" in data["error"]
    assert store.removed == [] and len(store.containers) == 3


async def test_release_of_a_stuck_lease_removes_its_container(dashboard, caplog):
    base, _, store, servers = dashboard
    servers["alice"] = []  # the hub knows alice but runs no server of hers
    with caplog.at_level(logging.WARNING, logger="gpulab.dashboard"):
        status, data = await release(base, "admin-token",
                                     {"gpu_uuid": G0, "user": "alice", "server": ""})
    assert status == 200 and data["removed_containers"] == ["jupyter-alice"]
    assert store.removed == ["alice-default-running-0123456789"]
    assert any("admin admin released GPU " + G0 + " of alice" in r.getMessage()
               for r in caplog.records)
    _, _, body = await fetch(base + PREFIX + "api/leases", headers=token("admin-token"))
    assert [le["user"] for le in json.loads(body)["leases"]] == [EVIL]  # GPU 0 is free


async def test_the_lab_assistants_gpu_is_not_released_here_and_the_admin_is_told_where(
        dashboard):
    base, _, store, _ = dashboard
    status, data = await release(base, "admin-token",
                                 {"gpu_uuid": G1, "user": "(lab assistant)", "server": "assistant"})
    assert status == 409 and "assistant.gpus" in data["error"], data
    assert store.removed == []


async def test_release_for_a_user_the_hub_does_not_know(dashboard):
    base, _, store, _ = dashboard  # servers is empty: 404 from the hub
    status, data = await release(base, "admin-token",
                                 {"gpu_uuid": G1, "user": EVIL, "server": "x"})
    assert status == 200 and store.removed == [f"{EVIL}-x-running-0123456789"]


async def test_release_of_nothing_is_404_and_bad_bodies_400(dashboard):
    base, _, store, _ = dashboard
    status, data = await release(base, "admin-token",
                                 {"gpu_uuid": G1, "user": "alice", "server": ""})
    assert status == 404 and "already released" in data["error"]
    for body in ([], {"user": "alice"}, {"gpu_uuid": G0, "user": 3}, "nope"):
        status, data = await release(base, "admin-token", body)
        assert status == 400 and '"gpu_uuid"' in data["error"]
    assert store.removed == []


async def test_release_is_admin_only(dashboard):
    base, _, store, _ = dashboard
    status, data = await release(base, "operator-token",
                                 {"gpu_uuid": G0, "user": "alice", "server": ""})
    assert status == 403 and "admins only" in data["error"] and store.removed == []


async def test_release_with_cookie_needs_the_pages_xsrf_token(dashboard):
    """What the page's button does: cookie + X-XSRFToken. Without the token the cookie
    does not count (HubAuth), so nothing is removed."""
    base, auth, store, servers = dashboard
    servers["alice"] = []
    cookie = oauth_cookie(auth, "admin-token")
    status, headers, page = await fetch(base + PREFIX + "leases", headers={"Cookie": cookie})
    assert status == 200
    xsrf = re.search(r'data-xsrf="([^"]+)"', page).group(1)
    jar = SimpleCookie()
    for c in headers.get_list("Set-Cookie"):
        jar.load(c)
    post_headers = {"Cookie": f"{cookie}; _xsrf={jar['_xsrf'].value}",
                    "Content-Type": "application/json", "Sec-Fetch-Mode": "cors",
                    "Sec-Fetch-Site": "same-origin"}
    body = json.dumps({"gpu_uuid": G0, "user": "alice", "server": ""})
    url = base + PREFIX + "api/leases/release"
    status, _, _ = await fetch(url, "POST", post_headers, body)
    assert status == 401 and store.removed == []
    status, _, text = await fetch(url, "POST", {**post_headers, "X-XSRFToken": xsrf}, body)
    assert status == 200 and json.loads(text)["removed_containers"] == ["jupyter-alice"]


async def test_release_when_the_hub_api_is_down_removes_nothing(gpus_path):
    store = FakeContainers([container("alice", [G0])])
    admin = lease_admin(store, "http://127.0.0.1:9/hub/api", gpus_path)
    with pytest.raises(ReleaseRefused) as e:
        await admin.release(G0, "alice", "", admin="root")
    assert e.value.status == 503 and "Nothing removed" in e.value.message
    assert store.removed == []


def test_lease_routes_absent_without_a_lease_admin():
    app = make_app(make_auth(), SnapshotReader([CannedSource(SNAPSHOT)]), cookie_secret=SECRET)
    paths = {rule.matcher.regex.pattern for rule in app.wildcard_router.rules}
    assert not any("leases" in p for p in paths) and any("api/gpus" in p for p in paths)


def test_cli_reads_gpus_yaml_from_the_config_dir():
    from gpulab.dashboard.__main__ import build_parser

    args = build_parser({"GPULAB_CONFIG_DIR": "/srv/gpulab/config"}).parse_args([])
    assert (args.gpus_file, args.no_leases) == ("/srv/gpulab/config/gpus.yaml", False)
    args = build_parser({}).parse_args(["--gpus-file", "/tmp/g.yaml", "--no-leases"])
    assert (args.gpus_file, args.no_leases) == ("/tmp/g.yaml", True)


class ScriptedDockerClient(docker.APIClient):
    """docker-py's APIClient (never connected) whose two calls used here answer from a
    script: ``containers()`` from a list, ``remove_container()`` with the given errors."""

    def __init__(self, listed, remove_errors):
        super().__init__(base_url="tcp://127.0.0.1:9", version="1.41")
        self.listed, self.remove_errors, self.calls = listed, dict(remove_errors), []

    def containers(self, **kwargs):
        self.calls.append(("containers", kwargs))
        return self.listed

    def remove_container(self, container, **kwargs):
        self.calls.append(("remove", container, kwargs))
        if container in self.remove_errors:
            raise self.remove_errors[container]


def _api_error(status):
    response = requests.Response()
    response.status_code = status
    return docker.errors.APIError(f"HTTP {status}", response=response)


async def test_docker_containers_lists_gpulab_ones_and_removes_by_force():
    client = ScriptedDockerClient([container("alice", [G0])], {
        "gone": _api_error(404), "going": _api_error(409), "broken": _api_error(500)})
    store = DockerContainers(client)
    assert [c["Id"] for c in await store.list()] == ["alice-default-running-0123456789"]
    assert client.calls[0] == ("containers", {"all": True,
                                              "filters": {"label": "org.gpulab.managed=true"}})
    await store.remove("abc")
    await store.remove("gone")   # already removed: released
    await store.remove("going")  # removal in progress
    with pytest.raises(docker.errors.APIError):
        await store.remove("broken")
    assert [c[1] for c in client.calls[1:]] == ["abc", "gone", "going", "broken"]
    assert all(c[2] == {"force": True} for c in client.calls[1:])


class ScriptedSwarmClient(docker.APIClient):
    """docker-py's APIClient (never connected) answering a Swarm manager's three calls the
    lease page makes from a script: ``services()``, ``nodes()``, ``remove_service()``."""

    def __init__(self, services, nodes):
        super().__init__(base_url="tcp://127.0.0.1:9", version="1.41")
        self.listed, self.node_list, self.calls = services, nodes, []

    def services(self, **kwargs):
        self.calls.append(("services", kwargs))
        return [s for s in self.listed if s["ID"] not in
                {c[1] for c in self.calls if c[0] == "remove"}]

    def nodes(self, **kwargs):
        return self.node_list

    def remove_service(self, service):
        self.calls.append(("remove", service))
        if service == "gone":
            raise _api_error(404)


def swarm_service(sid, user, gpus, node_id):
    return {"ID": sid, "CreatedAt": "2026-01-01T10:30:00Z",
            "Spec": {"Name": f"gpulab-user-{user}", "Labels": {
                LABEL_MANAGED: "true", LABEL_USER: user, LABEL_SERVER: "",
                LABEL_GPUS: ",".join(gpus), "org.gpulab.node": node_id}}}


def swarm_node(node_id, hostname, gpus):
    return {"ID": node_id, "Spec": {"Availability": "active"}, "Status": {"State": "ready"},
            "Description": {"Hostname": hostname,
                            "Engine": {"Labels": {"gpulab.gpus": ",".join(gpus)}}}}


async def test_on_a_swarm_the_page_lists_services_by_machine_and_releases_a_stuck_one(
        hub_api, tmp_path):
    """Every machine's GPUs (from the nodes' engine labels), the services holding them,
    and a release that removes the service of a server the hub does not run."""
    api_url, servers, _ = hub_api
    servers["alice"] = [""]  # the hub runs alice's server; bob's service is left over
    client = ScriptedSwarmClient(
        [swarm_service("s-alice", "alice", [G0], "n1"), swarm_service("s-bob", "bob", [G2], "n2")],
        [swarm_node("n1", "gpu-server-1", [G0, G1]), swarm_node("n2", "gpu-server-2", [G2])])
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("inventory: auto\n")
    admin = LeaseAdmin(SwarmServices(client), HubApi(api_url, HUB_TOKEN, timeout=2), gpus,
                       now=lambda: NOW)
    model = await admin.model()
    assert model["holder"] == "service"
    assert [(g["machine"], g["index"], g["holders"]) for g in model["gpus"]] == [
        ("gpu-server-1", 0, ["alice"]), ("gpu-server-1", 1, []), ("gpu-server-2", 0, ["bob"])]
    assert [(le["user"], le["machine"], le["container_id"]) for le in model["leases"]] == [
        ("alice", "gpu-server-1", "s-alice"), ("bob", "gpu-server-2", "s-bob")]

    with pytest.raises(ReleaseRefused) as refused:
        await admin.release(G0, "alice", "", admin="root")
    assert refused.value.status == 409
    assert "the hub runs this server; service running (gpulab-user-alice)" in \
        refused.value.message
    assert await admin.release(G2, "bob", "", admin="root") == ["gpulab-user-bob"]
    assert ("remove", "s-bob") in client.calls
    assert [le["user"] for le in (await admin.model())["leases"]] == ["alice"]
    await SwarmServices(client).remove("gone")  # already removed: released
