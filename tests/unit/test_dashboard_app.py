"""The dashboard's tornado app over real HTTP on loopback, with JupyterHub's own
HubOAuth code doing the auth. Only the hub's answer to "whose token is this?" is faked
(FakeHubAuth: a fixed token -> user model table instead of the hub API), and the GPU
data comes from CannedSource (a fixed snapshot) or a source that is unreachable."""

import json
import re
from http.cookies import SimpleCookie
from urllib.parse import parse_qs, urlsplit

import pytest
from jupyterhub.services.auth import HubOAuth
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port
from tornado.web import create_signed_value

from gpulab.dashboard.__main__ import build_parser, listen_address
from gpulab.dashboard.app import DashboardConfig, make_app
from gpulab.dashboard.sources import ExporterSource, SnapshotReader, Source

PREFIX = "/services/gpus/"
SECRET = b"s" * 32
EVIL = '<script>alert("x")</script>'

USERS = {
    "operator-token": {"kind": "user", "name": "olga", "admin": False, "groups": ["operators"],
                       "scopes": ["access:services!service=gpus", "read:metrics"]},
    "admin-token": {"kind": "user", "name": "admin", "admin": True, "groups": [],
                    "scopes": ["access:services", "admin:users"]},
    "user-token": {"kind": "user", "name": EVIL, "admin": False, "groups": [],
                   "scopes": ["access:servers!user=x", "access:services!service=other"]},
    "service-token": {"kind": "service", "name": "grafana", "scopes": ["read:metrics"]},
}

SNAPSHOT = {
    "timestamp": 1_700_000_000.0, "nvml_up": True, "nvml_error": None,
    "driver_version": "550.54.15", "fake": False, "docker_up": True,
    "gpus": [
        {"index": 0, "uuid": "GPU-aaaa", "model": "NVIDIA H100", "up": True,
         "utilization_ratio": 0.0, "memory_used_bytes": 4 << 30, "memory_total_bytes": 80 << 30,
         "leases": [{"user": "alice", "server": "", "container": "gpulab-alice"}],
         "processes": [{"pid": 99, "used_memory_bytes": 4 << 30, "user": "alice"}],
         "user_memory_bytes": {"alice": 4 << 30}},
        {"index": 1, "uuid": "GPU-bbbb", "model": "NVIDIA H100", "up": False,
         "error": "NVMLError_GpuIsLost: GPU is lost", "leases": []},
    ],
}


class FakeHubAuth(HubOAuth):
    """HubOAuth whose hub is a dict: ``user_for_token`` looks the token up in ``users``
    instead of asking the hub's API. Everything else (header and cookie parsing, scope
    checks, login redirect, xsrf) is JupyterHub's own code."""

    def __init__(self, users, **kwargs):
        super().__init__(**kwargs)
        self.users = users
        self.lookups = []

    def user_for_token(self, token, use_cache=True, session_id="", *, sync=True):
        self.lookups.append(token)
        model = json.loads(json.dumps(self.users[token])) if token in self.users else None
        if sync:
            return model

        async def answer():
            return model

        return answer()


class CannedSource(Source):
    """A source that always answers the same snapshot."""

    name = "canned"

    def __init__(self, snapshot):
        super().__init__("canned://")
        self.snapshot = snapshot

    async def fetch(self):
        return dict(self.snapshot)


def make_auth():
    return FakeHubAuth(USERS, api_token="service-token-of-gpus", oauth_client_id="service-gpus",
                       base_url=PREFIX, hub_prefix="/hub/",
                       api_url="http://127.0.0.1:1/hub/api",
                       access_scopes={"access:services!service=gpus"})


async def start(sources):
    auth = make_auth()
    app = make_app(auth, SnapshotReader(sources, max_age=0),
                   DashboardConfig(refresh_seconds=3), cookie_secret=SECRET)
    sock, port = bind_unused_port()
    server = HTTPServer(app)
    server.add_sockets([sock])
    return server, f"http://127.0.0.1:{port}", auth


@pytest.fixture
async def dashboard():
    server, base, auth = await start([CannedSource(SNAPSHOT)])
    yield base, auth
    server.stop()


async def get(url, headers=None):
    """(status, headers, body) without following redirects or raising on 4xx."""
    try:
        r = await AsyncHTTPClient().fetch(url, headers=headers or {}, follow_redirects=False)
    except HTTPClientError as e:
        r = e.response
    return r.code, r.headers, r.body.decode()


def token(name):
    return {"Authorization": f"token {name}"}


def oauth_cookie(auth, value):
    """The cookie HubOAuthCallbackHandler sets after a successful OAuth exchange."""
    signed = create_signed_value(SECRET, auth.cookie_name, value).decode()
    return f"{auth.cookie_name}={signed}"


# -- the page ------------------------------------------------------------------------
async def test_not_signed_in_is_sent_to_the_hub_oauth(dashboard):
    base, auth = dashboard
    status, headers, _ = await get(base + PREFIX)
    assert status == 302
    location = urlsplit(headers["Location"])
    assert location.path == "/hub/api/oauth2/authorize"
    params = parse_qs(location.query)
    assert params["client_id"] == ["service-gpus"]
    assert params["redirect_uri"] == [PREFIX + "oauth_callback"]
    assert params["state"] and params["code_challenge"]  # PKCE state cookie set too
    assert any("service-gpus-oauth-state" in c for c in headers.get_list("Set-Cookie"))


async def test_operator_with_token_sees_the_table(dashboard):
    base, _ = dashboard
    status, headers, body = await get(base + PREFIX, token("operator-token"))
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert body.count('<tr class="gpu ') == 2 and ">LOST<" in body
    assert "IDLE-ALLOCATED" in body  # GPU 0: held by alice at 0 %
    assert "2 GPUs, 1 allocated, 1 idle but allocated, 1 lost" in body
    assert "signed in as olga" in body
    assert f'data-api="{PREFIX}api/gpus"' in body and 'data-refresh="3"' in body
    assert "script-src 'unsafe-inline'" in headers["Content-Security-Policy"]


async def test_admin_with_oauth_cookie_sees_the_table(dashboard):
    base, auth = dashboard
    status, _, body = await get(base + PREFIX, {"Cookie": oauth_cookie(auth, "admin-token")})
    assert status == 200 and "signed in as admin" in body
    assert auth.lookups[-1] == "admin-token"  # the cookie's token was checked with the hub


async def test_user_without_scope_gets_a_clear_403_page(dashboard):
    base, _ = dashboard
    status, headers, body = await get(base + PREFIX, token("user-token"))
    assert status == 403 and headers["Content-Type"].startswith("text/html")
    assert "403 Forbidden" in body
    assert "needs the scope access:services!service=gpus" in body
    assert "operators" in body and "hub.operators" in body
    assert EVIL not in body and "&lt;script&gt;" in body  # the user's name, escaped
    assert "Location" not in headers  # no redirect loop through the hub


async def test_forged_cookie_is_not_accepted(dashboard):
    base, auth = dashboard
    status, _, _ = await get(base + PREFIX,
                             {"Cookie": f"{auth.cookie_name}=operator-token"})  # unsigned
    assert status == 302


async def test_prefix_without_slash_redirects(dashboard):
    base, _ = dashboard
    status, headers, _ = await get(base + PREFIX.rstrip("/"))
    assert status == 301 and headers["Location"] == PREFIX


# -- the JSON endpoint ---------------------------------------------------------------
async def test_api_shape_for_an_operator(dashboard):
    base, _ = dashboard
    status, headers, body = await get(base + PREFIX + "api/gpus", token("operator-token"))
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    data = json.loads(body)
    assert set(data) >= {"timestamp", "source", "unreachable", "banners", "message", "summary",
                         "gpus", "refresh_seconds", "snapshot"}
    assert data["source"] == {"name": "canned", "url": "canned:"}
    assert data["summary"] == {"gpus": 2, "mig_devices": 0, "allocated": 1, "idle_allocated": 1, "lost": 1,
                               "text": "2 GPUs, 1 allocated, 1 idle but allocated, 1 lost"}
    g0, g1 = data["gpus"]
    assert g0["holders"][0]["user"] == "alice" and g0["processes"][0]["pid"] == 99
    assert g0["memory_text"] == "4.0 GiB / 80.0 GiB" and g0["memory_bar"] == 5
    assert g1["state"] == "lost" and g1["uuid"] == "GPU-bbbb"
    assert data["snapshot"]["gpus"][0]["uuid"] == "GPU-aaaa"  # raw data for scripts
    assert data["refresh_seconds"] == 3


@pytest.mark.parametrize("headers, status", [
    ({}, 401),                                       # nobody: no login redirect for an API
    (token("no-such-token"), 401),
    (token("user-token"), 403),
    (token("service-token"), 403),                   # a service without the scope
])
async def test_api_refuses_without_the_scope(dashboard, headers, status):
    base, _ = dashboard
    code, resp_headers, body = await get(base + PREFIX + "api/gpus", headers)
    assert code == status and "Location" not in resp_headers
    data = json.loads(body)
    assert data["status"] == status and "gpus" not in data
    assert "access:services!service=gpus" in data["error"]


async def test_page_script_can_refresh_with_cookie_and_xsrf(dashboard):
    """What the page's fetch() does: cookie + X-XSRFToken from the page. A cross-site
    style request (Sec-Fetch-Mode: cors) with the cookie but no token is refused."""
    base, auth = dashboard
    cookie = oauth_cookie(auth, "operator-token")
    status, headers, page = await get(base + PREFIX, {"Cookie": cookie})
    assert status == 200
    xsrf = re.search(r'data-xsrf="([^"]+)"', page).group(1)
    jar = SimpleCookie()
    for c in headers.get_list("Set-Cookie"):
        jar.load(c)
    assert jar["_xsrf"]["path"] == PREFIX
    cookies = f"{cookie}; _xsrf={jar['_xsrf'].value}"
    fetch_headers = {"Cookie": cookies, "Sec-Fetch-Mode": "cors", "Sec-Fetch-Site": "same-origin"}
    status, _, _ = await get(base + PREFIX + "api/gpus", fetch_headers)
    assert status == 401
    status, _, body = await get(base + PREFIX + "api/gpus", {**fetch_headers, "X-XSRFToken": xsrf})
    assert status == 200 and json.loads(body)["summary"]["gpus"] == 2


# -- sources down: a view, never a 500 -----------------------------------------------
async def test_unreachable_sources_give_200_and_say_so():
    dead = ExporterSource("http://127.0.0.1:9", timeout=1)  # discard port: refused
    server, base, _ = await start([dead])
    try:
        status, _, body = await get(base + PREFIX, token("operator-token"))
        assert status == 200
        assert "Data source unreachable: exporter at http://127.0.0.1:9" in body
        assert "No GPU data: every data source is unreachable." in body
        status, _, body = await get(base + PREFIX + "api/gpus", token("admin-token"))
        data = json.loads(body)
        assert status == 200 and data["source"] is None and data["gpus"] == []
        assert data["unreachable"][0]["name"] == "exporter"
    finally:
        server.stop()


# -- command line ----------------------------------------------------------------------
@pytest.mark.parametrize("url, address", [
    (None, ("127.0.0.1", 10101)),
    ("http://127.0.0.1:9447", ("127.0.0.1", 9447)),
    ("http://localhost:9447", ("127.0.0.1", 9447)),
    ("http://gpulab-hub:9447", ("0.0.0.0", 9447)),
    ("http://[::1]:9447", ("::1", 9447)),
])
def test_listen_address_from_service_url(url, address):
    assert listen_address(url) == address


def test_cli_defaults_from_the_environment():
    env = {"JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:9447",
           "GPULAB_EXPORTER_URL": "http://127.0.0.1:9446",
           "GPULAB_PROMETHEUS_URL": "none"}
    args = build_parser(env).parse_args([])
    assert (args.ip, args.port, args.exporter_url, args.prometheus_url, args.refresh_seconds) \
        == ("127.0.0.1", 9447, "http://127.0.0.1:9446", "none", 5.0)
    args = build_parser({}).parse_args(["--port", "1234", "--refresh-seconds", "2"])
    assert (args.port, args.exporter_url, args.prometheus_url, args.refresh_seconds) == \
        (1234, "http://exporter:9445", "http://prometheus:9090", 2.0)


async def test_hub_api_down_is_503_with_a_reason_not_500():
    """The real HubOAuth, pointed at a hub API nobody answers on."""
    auth = HubOAuth(api_token="t", oauth_client_id="service-gpus", base_url=PREFIX,
                    hub_prefix="/hub/", api_url="http://127.0.0.1:9/hub/api",
                    access_scopes={"access:services!service=gpus"})
    app = make_app(auth, SnapshotReader([CannedSource(SNAPSHOT)]), cookie_secret=SECRET)
    sock, port = bind_unused_port()
    server = HTTPServer(app)
    server.add_sockets([sock])
    base = f"http://127.0.0.1:{port}"
    try:
        status, _, body = await get(base + PREFIX, token("operator-token"))
        assert status == 503 and "The hub&#39;s API did not answer" in body
        status, _, body = await get(base + PREFIX + "api/gpus", token("operator-token"))
        assert status == 503 and "hub's API did not answer" in json.loads(body)["error"]
    finally:
        server.stop()
