"""The hub and a member's Jupyter terminal, reached through the hub's proxy (I/O only).

:class:`HubClient` asks the hub who a token belongs to (``GET /hub/api/user``).
:class:`Terminal` opens a terminal in the member's server with her token
(``POST /user/<name>/api/terminals``), talks terminado's websocket protocol to it
(``/user/<name>/terminals/websocket/<term>``: ``["stdin", text]``,
``["set_size", rows, cols]`` out; ``["stdout", text]``, ``["disconnect", ...]`` in) and
deletes it afterwards. jupyterhub-singleuser checks the token's
``access:servers!server=<name>/`` scope on every request, so a token opens its owner's
server and no other. Tokens travel only in ``Authorization`` headers, never in URLs.
"""

from __future__ import annotations

import json
import socket
import ssl
from pathlib import Path
from urllib.parse import quote, urlsplit

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.netutil import DefaultLoopResolver, Resolver
from tornado.websocket import WebSocketClientConnection, websocket_connect

TIMEOUT = 15.0  # seconds for any one request to the hub or the member's server


def tls_context(trust: Path | None) -> ssl.SSLContext | None:
    """For a hub served over HTTPS: trust exactly the certificate the proxy serves (the
    file itself, leaf first, as a trust anchor), with the host name checked as usual.
    Read at each call, so that a renewed certificate is picked up."""
    if trust is None:
        return None
    ctx = ssl.create_default_context(cafile=str(trust))
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return ctx


class BelowTheHubResolver(Resolver):
    """Names below the hub's (``alice.gpu.lab.example``: members' servers with one origin
    each) resolve as the hub's own name: inside the stack the proxy answers for all of
    them, and Docker's DNS knows it by the hub's name only (a network alias)."""

    def initialize(self, hub_host: str) -> None:
        self.hub_host = hub_host.lower()
        self.resolver = DefaultLoopResolver()

    async def resolve(self, host, port, family=socket.AF_UNSPEC):
        if host.lower().endswith("." + self.hub_host):
            host = self.hub_host
        return await self.resolver.resolve(host, port, family)


def resolve_below_the_hub(hub_url: str) -> None:
    """Every tornado client of this process resolves NAME.<hub host> as <hub host>."""
    host = urlsplit(hub_url).hostname
    if host:
        Resolver.configure(BelowTheHubResolver, hub_host=host)


class HubError(Exception):
    """The hub or the member's server did not answer as expected (not a policy refusal)."""


class HubClient:
    def __init__(self, hub_url: str, tls_trust: Path | None = None):
        self.hub_url = hub_url.rstrip("/")
        self.tls_trust = tls_trust
        self.http = AsyncHTTPClient()

    async def whoami(self, token: str) -> tuple[int, dict | None]:
        """``(HTTP status, model)`` of ``GET /hub/api/user`` with *token*; status 0
        when the hub could not be reached."""
        try:
            req = HTTPRequest(f"{self.hub_url}/hub/api/user", headers=_auth(token),
                              request_timeout=TIMEOUT, connect_timeout=TIMEOUT,
                              ssl_options=tls_context(self.tls_trust))
            resp = await self.http.fetch(req, raise_error=False)
        except (OSError, HTTPClientError):  # ssl.SSLError, a missing trust file; a
            return 0, None  # timeout or a closed stream is raised even without raise_error
        if resp.code != 200:
            return resp.code, None
        try:
            return 200, json.loads(resp.body)
        except ValueError:
            return 502, None


    async def server_token(self, name: str, token: str) -> tuple[str, str]:
        """A new token of *name*'s, made with her *token*, that may only reach her own
        default server (``access:servers!server=NAME/``): what the gateway hands her
        server instead of her login token, which may carry an admin's scopes. Made by
        her, it ends with her login token. ``(token, id)``; HubError if refused."""
        body = {"scopes": [f"access:servers!server={name}/"],
                "note": "gpulab-ssh: this SSH connection's way into your server"}
        req = HTTPRequest(f"{self.hub_url}/hub/api/users/{quote(name, safe='')}/tokens",
                          method="POST", body=json.dumps(body),
                          headers={**_auth(token), "Content-Type": "application/json"},
                          request_timeout=TIMEOUT, connect_timeout=TIMEOUT,
                          ssl_options=tls_context(self.tls_trust))
        try:
            resp = await self.http.fetch(req, raise_error=False)
        except (OSError, HTTPClientError) as e:
            raise HubError(f"could not make a server token: {e}") from None
        if resp.code != 201:
            raise HubError(f"the hub answered {resp.code} to making a server token")
        model = json.loads(resp.body)
        return model["token"], model["id"]

    async def delete_token(self, name: str, token_id: str, token: str) -> None:
        """Delete *name*'s token *token_id* (with her *token*); errors are ignored: the
        token ends with her login token anyway."""
        req = HTTPRequest(f"{self.hub_url}/hub/api/users/{quote(name, safe='')}/tokens/"
                          f"{quote(token_id, safe='')}", method="DELETE", headers=_auth(token),
                          request_timeout=TIMEOUT, connect_timeout=TIMEOUT,
                          ssl_options=tls_context(self.tls_trust))
        try:
            await self.http.fetch(req, raise_error=False)
        except (OSError, HTTPClientError):
            pass


class Terminal:
    """One terminal in a member's server, used as ``async with Terminal(...) as t``."""

    def __init__(self, hub_url: str, server_path: str, token: str,
                 tls_trust: Path | None = None):
        self.base = hub_url.rstrip("/") + server_path  # server_path: /user/alice/
        self.token = token
        self.tls = tls_context(tls_trust)
        self.name: str | None = None
        self.ws: WebSocketClientConnection | None = None
        self.http = AsyncHTTPClient()

    async def __aenter__(self) -> Terminal:
        req = HTTPRequest(f"{self.base}api/terminals", method="POST", body="{}",
                          headers={**_auth(self.token), "Content-Type": "application/json"},
                          request_timeout=TIMEOUT, connect_timeout=TIMEOUT,
                          ssl_options=self.tls)
        try:
            resp = await self.http.fetch(req)
            self.name = json.loads(resp.body)["name"]
        except (HTTPClientError, OSError, ValueError, KeyError) as e:
            raise HubError(f"could not open a terminal in {self.base}: {e}") from None
        ws_url = ("ws" + self.base[len("http"):] if self.base.startswith("http") else self.base)
        req = HTTPRequest(f"{ws_url}terminals/websocket/{quote(self.name)}",
                          headers=_auth(self.token), connect_timeout=TIMEOUT,
                          request_timeout=TIMEOUT, ssl_options=self.tls)
        try:
            self.ws = await websocket_connect(req, ping_interval=30)
        except (HTTPClientError, OSError) as e:
            await self._delete()
            raise HubError(f"could not attach to terminal {self.name}: {e}") from None
        return self

    async def __aexit__(self, *exc) -> None:
        if self.ws is not None:
            self.ws.close()
        await self._delete()

    async def _delete(self) -> None:
        if self.name is None:
            return
        req = HTTPRequest(f"{self.base}api/terminals/{quote(self.name)}", method="DELETE",
                          headers=_auth(self.token), request_timeout=TIMEOUT,
                          connect_timeout=TIMEOUT, ssl_options=self.tls)
        try:
            await self.http.fetch(req, raise_error=False)  # 404: it ended with its shell
        except (OSError, HTTPClientError):
            pass

    async def send_stdin(self, text: str) -> None:
        await self.ws.write_message(json.dumps(["stdin", text]))

    async def set_size(self, rows: int, cols: int) -> None:
        if rows > 0 and cols > 0:
            await self.ws.write_message(json.dumps(["set_size", rows, cols]))

    async def read(self) -> str | None:
        """The next output of the terminal ("" for messages without any), or None once
        the terminal has ended (its shell exited, or the server went away)."""
        message = await self.ws.read_message()
        if message is None:
            return None
        try:
            kind, *rest = json.loads(message)
        except (ValueError, TypeError):
            return ""
        if kind == "stdout" and rest and isinstance(rest[0], str):
            return rest[0]
        if kind == "disconnect":
            return None
        return ""  # "setup" and anything newer


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"token {token}"}
