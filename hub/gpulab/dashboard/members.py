"""The admins' members page: add members, issue login tokens, list and revoke them.

Every call goes to the hub's REST API *as the signed-in admin*: with the OAuth token the
hub gave this service for them, which carries ``admin:users`` only for hub admins (the
service's ``oauth_client_allowed_scopes``; the hub drops scopes a user lacks). The hub
then checks and records each action under the admin's own name, exactly as
``gpulab token issue`` does through gpulab.login.tokens; the service holds no admin
token of its own.

`parse_issue`/`parse_revoke`/`parse_end_access` (what an admin's form sent) and
`members_model` (what the page shows) are pure; `HubMembers` is the thin I/O, over
:class:`gpulab.hubapi.HubApi`.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpulab.hubapi import HubApi, HubApiError
from gpulab.refusal import Refusal
from gpulab.settings import parse_duration

# JupyterHub accepts more; a lab's member names are kept to what works everywhere
# (container, volume and Unix names): lowercase letters, digits, '.', '_' and '-'.
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
DEFAULT_EXPIRY = "90d"


class MemberError(Refusal, ValueError):
    """What was wrong with an admin's request or what the hub refused, with the HTTP
    status to answer."""


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
            # her servers that run: "default" for her default one, named ones by name
            "server": ", ".join(n or "default" for n in sorted(user.get("servers") or {})),
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

    def __init__(self, hub: HubApi):
        self.hub = hub

    async def model(self, token: str) -> dict[str, Any]:
        async with _refusals():
            users = await self.hub.users(token=token)
            tokens = {}
            for user in users:
                try:
                    tokens[user["name"]] = await self.hub.login_tokens(user["name"],
                                                                       token=token)
                except HubApiError as e:
                    # deleted since the list was read (another admin, a script; seen in
                    # CI as the whole page's 404): not on the page; any other 404 is said
                    if e.status != 404 or await self.hub.user(user["name"], token=token):
                        raise
        return members_model([u for u in users if u["name"] in tokens], tokens)

    async def issue(self, token: str, issue: Issue) -> dict[str, Any]:
        """Creates the member when the hub does not know them yet; the new token's model,
        with the token itself (shown once)."""
        async with _refusals():
            created = await self.hub.user(issue.name, token=token) is None
            if created:
                await self.hub.create_user(issue.name, token=token)
            model = await self.hub.issue_login_token(issue.name, issue.expires_in,
                                                     token=token)
        return {**model, "created_user": created}

    async def revoke(self, token: str, user: str, token_id: str) -> None:
        async with _refusals():
            await self.hub.revoke_login_token(user, token_id, token=token)

    async def end_access(self, token: str, user: str, stop_server: bool) -> dict[str, Any]:
        """Every credential an admin issued to *user* revoked, everything opened with them
        ended, and with *stop_server* her servers stopped (gpulab.login.tokens)."""
        async with _refusals():
            return await self.hub.end_access(user, stop_server, token=token)


@contextlib.asynccontextmanager
async def _refusals():
    """The hub's refusals as :class:`MemberError`: its 4xx passed on with its message,
    anything worse a 502, no answer a 503."""
    try:
        yield
    except HubApiError as e:
        if not e.status:
            raise MemberError(503, f"the hub's API did not answer: {e.message}") from None
        raise MemberError(e.status if e.status < 500 else 502,
                          f"the hub answered {e.status} to {e.method} {e.path}: "
                          f"{e.message}") from None
