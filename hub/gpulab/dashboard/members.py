"""The admins' members page: add members, issue login tokens, list and revoke them.

Every call goes to the hub's REST API *as the signed-in admin*: with the OAuth token the
hub gave this service for them, which carries ``admin:users`` only for hub admins (the
service's ``oauth_client_allowed_scopes``; the hub drops scopes a user lacks). The hub
then checks and records each action under the admin's own name, exactly as
``gpulab token issue`` does through gpulab.login.tokens; the service holds no admin
token of its own.

`parse_issue`/`parse_revoke`/`parse_end_access` (what an admin's form sent) and
`members_model` (what the page shows) are pure; `HubMembers` is the thin I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpulab.settings import parse_duration

# JupyterHub accepts more; a lab's member names are kept to what works everywhere
# (container, volume and Unix names): lowercase letters, digits, '.', '_' and '-'.
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
DEFAULT_EXPIRY = "90d"


class MemberError(ValueError):
    """What was wrong with an admin's request or what the hub refused, with the HTTP
    status to answer."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Issue:
    name: str
    expires_in: int | None  # seconds; None: never expires


def parse_issue(body: Any) -> Issue:
    """{"name": "alice", "expires": "90d" | "0"} from the page (or a script)."""
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        raise MemberError(400, 'Send JSON {"name": "alice", "expires": "90d"} '
                               '("0" = never expires).')
    name = body["name"].strip()
    if not NAME.match(name):
        raise MemberError(400, f"{name!r} is not a member name: use lowercase letters, digits, "
                               "'.', '_' and '-' (at most 63, starting with a letter or digit).")
    expires = body.get("expires", DEFAULT_EXPIRY)
    if not isinstance(expires, str):
        raise MemberError(400, 'expires: a lifetime such as "90d" or "12h", or "0" for never')
    expires = expires.strip() or DEFAULT_EXPIRY
    if expires in ("0", "never"):
        return Issue(name, None)
    try:
        seconds = parse_duration(expires)
    except ValueError as e:
        raise MemberError(400, f"expires: {e}, or 0 for never") from None
    if not seconds:
        return Issue(name, None)
    return Issue(name, seconds)


def parse_revoke(body: Any) -> tuple[str, str]:
    if (not isinstance(body, dict) or not isinstance(body.get("user"), str)
            or not isinstance(body.get("token_id"), str)
            or not body["user"] or not body["token_id"]):
        raise MemberError(400, 'Send JSON {"user": "alice", "token_id": "a12"}.')
    return body["user"], body["token_id"]


def parse_end_access(body: Any) -> tuple[str, bool]:
    """{"user": "alice", "stop_server": true|false} from the page (or a script)."""
    if (not isinstance(body, dict) or not isinstance(body.get("user"), str) or not body["user"]
            or not isinstance(body.get("stop_server", False), bool)
            or set(body) - {"user", "stop_server"}):
        raise MemberError(400, 'Send JSON {"user": "alice", "stop_server": true or false}.')
    return body["user"], body.get("stop_server", False)


def _day(stamp: str | None) -> str:
    if not stamp:
        return ""
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return stamp


def members_model(users: list[dict], tokens: dict[str, list[dict]]) -> dict[str, Any]:
    """The page's rows: every user, admins marked, with their login tokens (never the
    tokens themselves: the hub keeps only hashes)."""
    rows = []
    for user in sorted(users, key=lambda u: u.get("name", "")):
        name = user.get("name", "")
        rows.append({
            "name": name,
            "admin": bool(user.get("admin")),
            "server": "running" if (user.get("servers") or {}).get("") else "",
            "last_activity": _day(user.get("last_activity")),
            "tokens": [{
                "id": t.get("id", ""),
                "created": _day(t.get("created")),
                "expires": _day(t.get("expires_at")) or "never",
                "last_used": _day(t.get("last_activity")) or "never",
                "expired": bool(t.get("expired")),
            } for t in tokens.get(name, [])],
        })
    with_token = sum(1 for r in rows if any(not t["expired"] for t in r["tokens"]))
    noun = "member" if len(rows) == 1 else "members"
    return {"members": rows,
            "summary": f"{len(rows)} {noun}, {with_token} with a valid login token"}


class HubMembers:
    """The hub's user and login-token APIs, called with the signed-in admin's token."""

    def __init__(self, api_url: str, timeout: float = 10.0):
        self.api_url = api_url.rstrip("/")
        self.timeout = timeout

    async def _call(self, token: str, method: str, path: str, body: Any = None) -> Any:
        request = HTTPRequest(
            f"{self.api_url}{path}", method=method,
            headers={"Authorization": f"token {token}", "Accept": "application/json",
                     "Content-Type": "application/json"},
            body=None if body is None and method in ("GET", "DELETE") else json.dumps(body or {}),
            allow_nonstandard_methods=True,  # DELETE with a body (/gpulab/access)
            request_timeout=self.timeout, connect_timeout=self.timeout)
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as e:
            raise MemberError(e.code if e.code < 500 else 502,
                              f"the hub answered {e.code} to {method} {path}: {_message(e)}") \
                from None
        except OSError as e:
            raise MemberError(503, f"the hub's API did not answer: {e}") from None
        return json.loads(response.body) if response.body else None

    async def model(self, token: str) -> dict[str, Any]:
        users = await self._call(token, "GET", "/users?limit=1000")
        users = users.get("items", users) if isinstance(users, dict) else users
        tokens = {u["name"]: (await self._call(token, "GET", _tokens_path(u["name"])))
                  ["login_tokens"] for u in users}
        return members_model(users, tokens)

    async def issue(self, token: str, issue: Issue) -> dict[str, Any]:
        """Creates the member when the hub does not know them yet; the new token's model,
        with the token itself (shown once)."""
        created = False
        try:
            await self._call(token, "GET", f"/users/{quote(issue.name, safe='')}")
        except MemberError as e:
            if e.status != 404:
                raise
            await self._call(token, "POST", f"/users/{quote(issue.name, safe='')}", {})
            created = True
        model = await self._call(token, "POST", _tokens_path(issue.name),
                                 {"expires_in": issue.expires_in})
        return {**model, "created_user": created}

    async def revoke(self, token: str, user: str, token_id: str) -> None:
        await self._call(token, "DELETE", f"{_tokens_path(user)}/{quote(token_id, safe='')}")

    async def end_access(self, token: str, user: str, stop_server: bool) -> dict[str, Any]:
        """Every credential an admin issued to *user* revoked, everything opened with them
        ended, and with *stop_server* her servers stopped (gpulab.login.tokens)."""
        return await self._call(token, "DELETE", f"/gpulab/access/{quote(user, safe='')}",
                                {"stop_servers": stop_server})


def _tokens_path(user: str) -> str:
    return f"/gpulab/login-tokens/{quote(user, safe='')}"


def _message(e: HTTPClientError) -> str:
    try:
        return str(json.loads(e.response.body)["message"])
    except (AttributeError, TypeError, ValueError, KeyError):
        return e.message or "no reason given"
