"""The one client of JupyterHub's REST API, for every gpulab process that calls it.

The ``gpulab`` command, the GPU culler, the dashboard's lease, members and usage pages
and the SSH gateway call the hub; this module owns what they share:

* URLs: the API's base URL and a path in which every name is quoted into one segment
  (``a/b`` is one user, never a user ``a`` and a path ``/b``);
* the ``Authorization: token ...`` header: the client's own token (a service's), or one
  per call (the members page acts as the signed-in admin, the SSH gateway as the
  member);
* JSON in and out;
* paging: ``?offset=&limit=``, answered with JupyterHub's ``items`` and
  ``_pagination.next`` when asked for with its pagination media type (a hub that does
  not page answers with a bare list, which is all of it);
* failures: every one is a :class:`HubApiError` with the HTTP status (0: no answer at
  all) and the hub's own message. Each caller says it in its own words.

:class:`HubApi` is asynchronous (tornado's AsyncHTTPClient), for the services and the
SSH gateway. :class:`SyncHubApi` runs the same calls to completion for the ``gpulab``
command; tornado is imported at the first call, so a command that never calls the hub
(``gpulab config check``) never loads it.

A member's own server, reached through the hub's proxy, answers the same way (the
single-user server's REST API and its websockets take the same header): the SSH
gateway's terminals and channels use a :class:`HubApi` whose URL is that server's.
"""

from __future__ import annotations

import asyncio
import functools
import http
import inspect
import json
import ssl
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

__all__ = ["HubApi", "HubApiError", "SyncHubApi", "page_of", "server_path", "user_path"]

JSON = "application/json"
PAGINATED = "application/jupyterhub-pagination+json"  # JupyterHub >= 2.0: items + _pagination
PAGE_SIZE = 200
_NO_BODY = object()


class HubApiError(Exception):
    """A call that did not get the answer it wanted.

    ``status`` is the HTTP status, 0 when no answer came at all (refused, timed out, a
    TLS failure), 502 when a successful answer was not JSON; ``message`` is the hub's
    own words (its JSON ``message``), or why nothing came.
    """

    def __init__(self, method: str, path: str, status: int, message: str = "", *,
                 url: str = "", body: str = ""):
        self.method, self.path, self.status, self.message = method, path, status, message
        self.url = url or path
        self.body = body
        super().__init__(str(self))

    def __str__(self) -> str:
        if not self.status:
            return f"{self.method} {self.path}: {self.message}"
        return f"{self.method} {self.path} answered {self.status}" + (
            f": {self.message}" if self.message else "")


# ---------------------------------------------------------------- paths (pure)


def user_path(user: str) -> str:
    return f"/users/{quote(user, safe='')}"


def server_path(user: str, server: str = "") -> str:
    """The user's default server (``""``) or one of their named servers."""
    if server:
        return f"{user_path(user)}/servers/{quote(server, safe='')}"
    return f"{user_path(user)}/server"


def line_path(user: str = "", server: str = "") -> str:
    """The line for GPUs (gpulab.line.api): all of it, a member's entries, or one."""
    path = "/gpulab/line"
    if user:
        path += f"/{quote(user, safe='')}"
        if server:
            path += f"/{quote(server, safe='')}"
    return path


def _login_tokens_path(user: str, token_id: str = "") -> str:
    path = f"/gpulab/login-tokens/{quote(user, safe='')}"  # gpulab.login.tokens' API
    return f"{path}/{quote(token_id, safe='')}" if token_id else path


def _tokens_path(user: str, token_id: str = "") -> str:
    path = f"{user_path(user)}/tokens"
    return f"{path}/{quote(token_id, safe='')}" if token_id else path


# ---------------------------------------------------------------- answers (pure)


def hub_time(iso: str | None) -> float:
    """Epoch seconds of a timestamp in the hub's models (``2026-12-02T14:00:00.1Z``;
    a naive one is UTC); 0.0 for none."""
    if not iso:
        return 0.0
    t = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def page_of(page: Any) -> tuple[list[Any], int | None]:
    """(the items of one page, the offset of the next page or None when it was the
    last), from JupyterHub's paginated model or a bare list."""
    if isinstance(page, list):
        return page, None
    if not isinstance(page, Mapping):
        return [], None
    following = (page.get("_pagination") or {}).get("next") or {}
    return list(page.get("items") or []), following.get("offset")


def hub_message(status: int, body: bytes) -> str:
    """What the hub said about a failure: its JSON ``message``, else the start of the
    text it sent, else the status's name."""
    text = body.decode("utf-8", "replace").strip()
    try:
        message = json.loads(text).get("message")
    except (ValueError, AttributeError):
        message = None
    if message:
        return str(message)
    if text:
        return text[:200]
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "no reason given"


def decode(method: str, path: str, url: str, status: int, body: bytes,
           ok: Sequence[int] = ()) -> tuple[int, Any]:
    """``(status, JSON or None)`` of an answer that is a success or in *ok*; a
    :class:`HubApiError` for any other."""
    if 200 <= status < 300 or status in ok:
        if not body:
            return status, None
        try:
            return status, json.loads(body)
        except ValueError:
            if status >= 300:
                return status, None
            raise HubApiError(method, path, 502, "the answer is not JSON", url=url,
                              body=body.decode("utf-8", "replace")[:200]) from None
    raise HubApiError(method, path, status, hub_message(status, body), url=url,
                      body=body.decode("utf-8", "replace")[:200])


# ---------------------------------------------------------------- the client


class HubApi:
    """JupyterHub's REST API at *url* (``http://hub:8081/hub/api``), with *token* unless a
    call brings its own. *timeout*: seconds to connect, and for the whole answer.
    *tls*: the TLS context to use, asked again at every call (a renewed certificate is
    picked up); None for the system's defaults."""

    def __init__(self, url: str, token: str = "", *, timeout: float = 20.0,
                 tls: Callable[[], ssl.SSLContext | None] | None = None):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.tls = tls

    def _headers(self, token: str | None, accept: str = JSON) -> dict[str, str]:
        token = token or self.token
        headers = {"Accept": accept}
        if token:
            headers["Authorization"] = f"token {token}"
        return headers

    def _url(self, path: str) -> str:
        return f"{self.url}/{path.lstrip('/')}"

    async def request(self, method: str, path: str, body: Any = _NO_BODY, *,
                      token: str | None = None, ok: Sequence[int] = (),
                      accept: str = JSON) -> tuple[int, Any]:
        """``(status, JSON or None)``: a success, or an answer whose status is in *ok*;
        :class:`HubApiError` otherwise."""
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

        url = self._url(path)
        headers = self._headers(token, accept)
        data = None
        if body is not _NO_BODY:
            headers["Content-Type"] = JSON
            data = json.dumps(body)
        request = HTTPRequest(url, method=method, headers=headers, body=data,
                              allow_nonstandard_methods=True,  # DELETE with a body
                              request_timeout=self.timeout, connect_timeout=self.timeout,
                              ssl_options=self.tls() if self.tls else None)
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (OSError, HTTPClientError) as e:  # refused, TLS, a missing file; timeout
            raise HubApiError(method, path, 0, str(e) or type(e).__name__, url=url) from None
        return decode(method, path, url, response.code, response.body or b"", ok)

    async def pages(self, path: str, params: Mapping[str, Any] | None = None, *,
                    token: str | None = None, limit: int = PAGE_SIZE) -> list[Any]:
        """Every item of a listing (``/users``, ``/groups``), page by page."""
        items: list[Any] = []
        offset: int | None = 0
        while offset is not None:
            query = urlencode({**(params or {}), "offset": offset, "limit": limit})
            _, page = await self.request("GET", f"{path}?{query}", token=token,
                                         accept=PAGINATED)
            got, offset = page_of(page)
            items.extend(got)
            if not got:
                break
        return items

    async def websocket(self, path: str, *, token: str | None = None, **options: Any):
        """A websocket to *path* (``ws``/``wss`` for this client's ``http``/``https``),
        opened with the token in its header; ``HubApiError`` with the answer's status
        (404: nothing there) or 0 when none came. *options*: tornado's
        ``websocket_connect`` (``ping_interval``, ``max_message_size``)."""
        from tornado.httpclient import HTTPClientError, HTTPRequest
        from tornado.websocket import websocket_connect

        url = self._url(path)
        if url.startswith("http"):
            url = "ws" + url[len("http"):]
        request = HTTPRequest(url, headers=self._headers(token), connect_timeout=self.timeout,
                              request_timeout=self.timeout,
                              ssl_options=self.tls() if self.tls else None)
        try:
            return await websocket_connect(request, **options)
        except HTTPClientError as e:
            raise HubApiError("GET", path, 0 if e.code == 599 else e.code,
                              e.message or str(e), url=url) from None
        except OSError as e:
            raise HubApiError("GET", path, 0, str(e), url=url) from None

    # ------------------------------------------------------------- users and servers

    async def whoami(self, token: str) -> dict[str, Any]:
        """The model of whoever holds *token* (``GET /user``)."""
        return (await self.request("GET", "/user", token=token))[1]

    async def user(self, name: str, *, token: str | None = None) -> dict[str, Any] | None:
        """*name*'s model, or None when the hub has no such user."""
        status, model = await self.request("GET", user_path(name), token=token, ok=(404,))
        return None if status == 404 else model

    async def create_user(self, name: str, *, token: str | None = None) -> dict[str, Any]:
        return (await self.request("POST", user_path(name), {}, token=token))[1]

    async def users(self, state: str = "", *, token: str | None = None) -> list[dict]:
        """Every user (with *state*, JupyterHub's filter: ``ready``, ``active``, ...)."""
        return await self.pages("/users", {"state": state} if state else None, token=token)

    async def groups(self, *, token: str | None = None) -> list[dict]:
        return await self.pages("/groups", token=token)

    async def stop_server(self, user: str, server: str = "", *,
                          token: str | None = None) -> bool:
        """Stop *user*'s *server* ("" = the default one); False when it was not running
        (the hub answers 400)."""
        status, _ = await self.request("DELETE", server_path(user, server), token=token,
                                       ok=(400,))
        return status != 400

    async def report_activity(self, user: str, server: str, when: float, *,
                              token: str | None = None) -> None:
        """Tell the hub that *user*'s *server* was active at *when* (epoch seconds), as the
        server itself does (``POST /users/{name}/activity``): the idle culler goes by it."""
        at = datetime.fromtimestamp(when, UTC).isoformat().replace("+00:00", "Z")
        await self.request("POST", f"{user_path(user)}/activity",
                           {"last_activity": at, "servers": {server: {"last_activity": at}}},
                           token=token)

    async def new_token(self, user: str, scopes: Sequence[str], note: str, *,
                        token: str | None = None) -> dict[str, Any]:
        """A new API token of *user*'s with *scopes*; its model, with ``token``."""
        return (await self.request("POST", _tokens_path(user),
                                   {"scopes": list(scopes), "note": note}, token=token))[1]

    async def delete_token(self, user: str, token_id: str, *, token: str | None = None) -> None:
        await self.request("DELETE", _tokens_path(user, token_id), token=token)

    # ------------------------------------------------------ SSH key sign-ins (the gateway)

    async def ssh_key_sign_in(self, user: str, key: str, *, check: bool, server: str = "",
                              token: str | None = None) -> dict[str, Any]:
        """As the gpulab-ssh service: is *key* (``ALGORITHM BASE64``) *user*'s, with
        access (*check*); else a token of hers for one connection (``token``, ``id``)
        to her *server* ("" her default one). HubApiError 403 with why not."""
        body = {"user": user, "key": key, "check": check, **({"server": server} if server
                                                              else {})}
        return (await self.request("POST", "gpulab/ssh-sign-in", body, token=token))[1]

    async def ssh_key_signed_out(self, user: str, token_id: str, *,
                                 token: str | None = None) -> None:
        await self.request("DELETE", "gpulab/ssh-sign-in",
                           {"user": user, "token_id": token_id}, token=token)

    # ------------------------------------------------------------- gpulab's login tokens

    async def login_tokens(self, user: str, *, token: str | None = None) -> list[dict]:
        """*user*'s login tokens, expired ones included (``"expired": true``)."""
        return (await self.request("GET", _login_tokens_path(user), token=token))[1][
            "login_tokens"]

    async def issue_login_token(self, user: str, expires_in: int | None, *,
                                token: str | None = None) -> dict[str, Any]:
        """A new login token (0 or None: never expires); the model includes ``token``."""
        return (await self.request("POST", _login_tokens_path(user),
                                   {"expires_in": expires_in or None}, token=token))[1]

    async def revoke_login_token(self, user: str, token_id: str, *,
                                 token: str | None = None) -> dict[str, Any]:
        return (await self.request("DELETE", _login_tokens_path(user, token_id),
                                   token=token))[1] or {}

    async def end_access(self, user: str, stop_servers: bool, *,
                         token: str | None = None) -> dict[str, Any]:
        """Every credential an admin issued to *user* revoked, what they opened ended,
        and with *stop_servers* their servers stopped (gpulab.login.tokens)."""
        return (await self.request("DELETE", f"/gpulab/access/{quote(user, safe='')}",
                                   {"stop_servers": stop_servers}, token=token))[1] or {}


    # ------------------------------------------------------------- the line for GPUs

    async def start_server(self, user: str, server: str = "",
                           options: Mapping[str, Any] | None = None, *,
                           token: str | None = None) -> tuple[int, Any]:
        """Ask the hub to start *user*'s *server* with *options*: (201 started, or 202
        starting; or the refusal's status and JSON, which is not raised)."""
        return await self.request("POST", server_path(user, server), dict(options or {}),
                                  token=token, ok=range(400, 600))

    async def line(self, *, token: str | None = None) -> list[dict[str, Any]]:
        """Every entry of the line, in order (admins and the line service)."""
        return (await self.request("GET", line_path(), token=token))[1]["line"]

    async def line_of(self, user: str, *, token: str | None = None) -> list[dict[str, Any]]:
        """*user*'s entries in the line."""
        return (await self.request("GET", line_path(user), token=token))[1]["line"]

    async def offer(self, user: str, server: str = "", offered: bool = True, *,
                    token: str | None = None) -> float | None:
        """The line is starting *user*'s *server*: her claim window opens (*offered*
        false: it could not, she waits again in her place). When it opened (None: it
        did not)."""
        _, body = await self.request("PATCH", line_path(user, server), {"offered": offered},
                                     token=token)
        return (body or {}).get("offered_at") if isinstance(body, dict) else None

    async def server_up(self, user: str, server: str = "", *,
                        token: str | None = None) -> float | None:
        """The server the line started for *user* is up: her claim window runs from
        then. When it was first said (None: she is not in line with such a server)."""
        status, body = await self.request("PATCH", line_path(user, server), {"up": True},
                                          token=token, ok=(404,))
        return (body or {}).get("ready_at") if status < 400 and isinstance(body, dict) \
            else None

    async def leave_line(self, user: str, server: str = "", *,
                         token: str | None = None) -> bool:
        """*user*'s *server* out of the line; False when it was not in it."""
        status, _ = await self.request("DELETE", line_path(user, server), token=token,
                                       ok=(404,))
        return status != 404


class SyncHubApi:
    """:class:`HubApi`'s calls, each run to completion: for the ``gpulab`` command."""

    def __init__(self, api: HubApi):
        self.api = api

    def __getattr__(self, name: str):
        call = getattr(self.api, name)
        if not inspect.iscoroutinefunction(call):
            return call

        @functools.wraps(call)
        def run(*args, **kwargs):
            return asyncio.run(call(*args, **kwargs))

        return run
