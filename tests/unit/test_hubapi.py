"""gpulab.hubapi, the one client of the hub's REST API, against a real HTTP server on
loopback that answers as JupyterHub does (its paging, its JSON errors); the real hub is
asked in tests/unit/test_login_hub.py (the CLI, paging through its users)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading

import pytest
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port
from tornado.web import Application, RequestHandler
from tornado.websocket import WebSocketHandler

from gpulab.hubapi import HubApi, HubApiError, SyncHubApi, page_of, server_path, user_path

TOKEN = "service-token"
USERS = [{"name": f"u{i}"} for i in range(5)]


class Recorded(RequestHandler):
    def initialize(self, seen):
        self.seen = seen

    def prepare(self):
        self.seen.append((self.request.method, self.request.uri,
                          self.request.headers.get("Authorization"),
                          self.request.headers.get("Accept"), self.request.body))


class UsersApi(Recorded):
    """/users as JupyterHub 6 pages it: items and _pagination.next, for the pagination
    media type; a bare list for any other Accept."""

    def get(self):
        offset = int(self.get_argument("offset", "0"))
        limit = int(self.get_argument("limit", "2"))
        page = USERS[offset:offset + limit]
        if self.request.headers.get("Accept") != "application/jupyterhub-pagination+json":
            self.finish(json.dumps(USERS))
            return
        following = offset + limit if offset + limit < len(USERS) else None
        self.finish({"items": page, "_pagination": {
            "offset": offset, "limit": limit, "total": len(USERS),
            "next": None if following is None else {"offset": following, "limit": limit}}})


class UserApi(Recorded):
    def get(self, name):
        if name == "nobody":
            self.set_status(404)
            self.finish({"status": 404, "message": "No such user"})
        elif name == "secret":
            self.set_status(403)
            self.finish({"status": 403, "message": "Action is not authorized"})
        elif name == "broken":
            self.set_status(500)
            self.finish("<html>Internal Server Error</html>")
        elif name == "garbled":
            self.finish("not json")
        else:
            self.finish({"name": name, "servers": {}})

    def post(self, name):
        self.set_status(201)
        self.finish({"name": name, "created": True})


class ServerApi(Recorded):
    def delete(self, name, server=None):
        if name == "idle":
            self.set_status(400)
            self.finish({"status": 400, "message": f"{name}'s server is not running"})
            return
        self.set_status(204)


class AccessApi(Recorded):
    def delete(self, name):
        self.finish({"revoked": [name], "body": json.loads(self.request.body)})


class Echo(WebSocketHandler):
    def open(self):
        self.write_message(self.request.headers.get("Authorization") or "")


def hub_app(seen: list) -> Application:
    args = {"seen": seen}
    return Application([
        (r"/hub/api/users", UsersApi, args),
        (r"/hub/api/users/([^/]+)", UserApi, args),
        (r"/hub/api/users/([^/]+)/server", ServerApi, args),
        (r"/hub/api/users/([^/]+)/servers/([^/]+)", ServerApi, args),
        (r"/hub/api/gpulab/access/([^/]+)", AccessApi, args),
        (r"/hub/api/echo", Echo),
    ])


@pytest.fixture
async def hub():
    """(api_url, seen): seen lists (method, uri, Authorization, Accept, body)."""
    seen = []
    sock, port = bind_unused_port()
    server = HTTPServer(hub_app(seen))
    server.add_sockets([sock])
    yield f"http://127.0.0.1:{port}/hub/api", seen
    server.stop()


@pytest.fixture
def hub_in_a_thread():
    """The same, on an event loop of its own: for the synchronous client, which runs
    each call on a loop of its own too."""
    seen, started, stop = [], threading.Event(), threading.Event()
    where = {}

    async def serve():
        sock, port = bind_unused_port()
        server = HTTPServer(hub_app(seen))
        server.add_sockets([sock])
        where["url"] = f"http://127.0.0.1:{port}/hub/api"
        started.set()
        while not stop.is_set():
            await asyncio.sleep(0.02)
        server.stop()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    yield where["url"], seen
    stop.set()
    thread.join(10)


async def test_pages_through_every_item_with_the_pagination_media_type(hub):
    url, seen = hub
    assert await HubApi(url, TOKEN).pages("/users", {"state": "ready"}, limit=2) == USERS
    assert [uri for _, uri, *_ in seen] == [
        "/hub/api/users?state=ready&offset=0&limit=2",
        "/hub/api/users?state=ready&offset=2&limit=2",
        "/hub/api/users?state=ready&offset=4&limit=2"]
    assert {accept for *_, accept, _ in seen} == {"application/jupyterhub-pagination+json"}


@pytest.mark.parametrize("page, items, following", [
    ([{"name": "a"}], [{"name": "a"}], None),  # a hub that does not page: all of it
    ({"items": [1, 2], "_pagination": {"next": {"offset": 2, "limit": 2}}}, [1, 2], 2),
    ({"items": [3], "_pagination": {"next": None}}, [3], None),
    ({"items": []}, [], None),
    (None, [], None),
])
def test_a_page_and_where_the_next_one_starts(page, items, following):
    assert page_of(page) == (items, following)


async def test_the_clients_token_or_the_calls_own(hub):
    url, seen = hub
    api = HubApi(url, TOKEN)
    await api.user("alice")
    await api.user("alice", token="admin-oauth-token")
    await HubApi(url).user("alice")
    assert [auth for _, _, auth, *_ in seen] == [
        f"token {TOKEN}", "token admin-oauth-token", None]


async def test_names_are_quoted_into_one_path_segment(hub):
    url, seen = hub
    assert (await HubApi(url, TOKEN).user("a/b"))["name"] == "a/b"
    assert seen[-1][1] == "/hub/api/users/a%2Fb"
    assert user_path("a/b") == "/users/a%2Fb"
    assert server_path("a/b") == "/users/a%2Fb/server"
    assert server_path("alice", "x/y") == "/users/alice/servers/x%2Fy"


async def test_answers_and_failures(hub):
    url, _ = hub
    api = HubApi(url, TOKEN)
    assert await api.user("nobody") is None  # 404: no such user
    assert await api.create_user("bob") == {"name": "bob", "created": True}
    with pytest.raises(HubApiError) as e:
        await api.user("secret")
    assert (e.value.status, e.value.message) == (403, "Action is not authorized")
    assert e.value.url == f"{url}/users/secret"
    assert str(e.value) == "GET /users/secret answered 403: Action is not authorized"
    with pytest.raises(HubApiError) as e:
        await api.user("broken")
    assert (e.value.status, e.value.message) == (500, "<html>Internal Server Error</html>")
    with pytest.raises(HubApiError) as e:
        await api.user("garbled")
    assert (e.value.status, e.value.message) == (502, "the answer is not JSON")
    with pytest.raises(HubApiError) as e:
        await HubApi("http://127.0.0.1:9/hub/api", TOKEN, timeout=1).user("alice")
    assert e.value.status == 0 and "Connection refused" in e.value.message
    assert str(e.value).startswith("GET /users/alice: ")


async def test_stopping_a_server_says_whether_it_ran(hub):
    url, seen = hub
    api = HubApi(url, TOKEN)
    assert await api.stop_server("alice") is True
    assert await api.stop_server("alice", "train") is True
    assert await api.stop_server("idle") is False  # 400: not running
    assert [(m, uri) for m, uri, *_ in seen] == [
        ("DELETE", "/hub/api/users/alice/server"),
        ("DELETE", "/hub/api/users/alice/servers/train"),
        ("DELETE", "/hub/api/users/idle/server")]


async def test_a_delete_with_a_body(hub):
    url, seen = hub
    result = await HubApi(url, TOKEN).end_access("alice", True)
    assert result == {"revoked": ["alice"], "body": {"stop_servers": True}}
    assert json.loads(seen[-1][4]) == {"stop_servers": True}


async def test_websockets_carry_the_token_in_their_header(hub):
    url, _ = hub
    ws = await HubApi(url, TOKEN).websocket("echo")
    assert await ws.read_message() == f"token {TOKEN}"
    ws.close()
    with pytest.raises(HubApiError) as e:
        await HubApi(url, TOKEN).websocket("nothing-here")
    assert e.value.status == 404


def test_the_sync_client_runs_the_same_calls(hub_in_a_thread):
    url, _ = hub_in_a_thread
    hub_api = SyncHubApi(HubApi(url, TOKEN))
    assert hub_api.user("alice") == {"name": "alice", "servers": {}}
    assert hub_api.users() == USERS
    assert hub_api.url == url
    with pytest.raises(HubApiError, match="answered 403"):
        hub_api.user("secret")


def test_the_gpulab_command_loads_no_tornado_until_it_calls_the_hub():
    code = "import sys, gpulab.cli; print(sorted(m for m in sys.modules if m.startswith('tornado')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("iso, epoch", [
    ("2026-12-02T14:00:00.500000Z", 1796220000.5),
    ("2026-12-02T14:00:00+00:00", 1796220000.0),
    ("2026-12-02T14:00:00", 1796220000.0),  # naive: UTC
    (None, 0.0), ("", 0.0),
])
def test_the_hubs_timestamps(iso, epoch):
    from gpulab.hubapi import hub_time

    assert hub_time(iso) == epoch
