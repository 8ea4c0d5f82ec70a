"""Login tokens: the admin-issued tokens that open a browser session, and nothing else.

A login token is an ordinary JupyterHub API token (a salted hash in the hub database,
with an expiry, revocable) that an admin issued through the admin-only REST API below
(``gpulab token issue``). What makes it a login token is a row in
:class:`LoginTokenStore`, a small sqlite file next to the hub database that only this
module writes, holding the token's salted ``hashed`` value, its id and its owner. A
member cannot forge or collide with such a row: the hub picks the salt and the token,
so no token a member makes (whatever its note says) ever matches one. The note of a
login token (``gpulab-login: issued by ...``) is for people only.

When a member has no valid login token left (revoked, expired, deleted),
:func:`end_access` deletes their other API tokens and their OAuth tokens (the sessions
of their servers and of services) and rotates their hub cookie id, so neither scripts
nor open browser tabs outlive the token the admin gave them; the authenticator
(:class:`gpulab.login.auth.TokenAuthenticator`) does that at the member's next request too.

REST API (inside the hub, served under ``/hub/api/gpulab/``), for callers holding the
*unfiltered* ``admin:users`` and ``tokens`` scopes (admins and the ``gpulab-admin``
service; a member's own ``self`` scopes are all filtered to ``!user=<name>``, so they
never pass, not even for herself):

* ``POST   /hub/api/gpulab/login-tokens/{user}`` body ``{"expires_in": seconds|null}``:
  201, the token model with ``"token"`` (shown only this once);
* ``GET    /hub/api/gpulab/login-tokens/{user}``: 200, ``{"login_tokens": [model...]}``
  (id, created, expires_at, last_activity, expired, note; never the token);
* ``DELETE /hub/api/gpulab/login-tokens/{user}/{token_id}``: 200,
  ``{"revoked": id, "login_tokens_left": n, "ended_access": {...}|null}``.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.apihandlers.users import UserTokenListAPIHandler
from jupyterhub.utils import isoformat, new_token
from tornado import web

from gpulab import compat, private_db
from gpulab import shares as server_shares

orm = compat.hub_orm()  # JupyterHub's tokens and users (gpulab.compat)

LOGIN_TOKEN_NOTE = "gpulab-login"  # prefix of the note, for people; recognises nothing
JUPYTERHUB_CLIENT = "jupyterhub"  # client_id of API tokens; anything else is an OAuth token
# Unfiltered scopes a caller of the REST API must hold (the admin role and the
# gpulab-admin service do).
ADMIN_SCOPES = ("admin:users", "tokens")

log = logging.getLogger(__name__)

# What an admin issued: a login token (signs in, and is the member's access), or an API
# token an admin made for a user through JupyterHub's own REST API (a credential of its
# own, for scripts and service accounts; it never signs in).
KIND_LOGIN = "login"
KIND_API = "api"

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS login_tokens (
        hashed TEXT PRIMARY KEY,   -- api_tokens.hashed: salted by the hub, unique
        token_id INTEGER NOT NULL, -- api_tokens.id (sqlite may reuse it: not enough alone)
        username TEXT NOT NULL,
        issued_by TEXT NOT NULL,
        issued_at REAL NOT NULL,
        kind TEXT NOT NULL DEFAULT 'login'
    )""",
    "CREATE INDEX IF NOT EXISTS login_tokens_user ON login_tokens (username)",
)


class LoginTokenStore:
    """Which API tokens are login tokens: a sqlite file only the admin path writes.

    ``LoginTokenStore(path)`` opens (and creates, mode 0600) the file. A row matches an
    ``orm.APIToken`` only when its hashed value, id and owner's name all match.
    """

    def __init__(self, path: str | os.PathLike, *, now: Callable[[], float] = time.time):
        # which tokens open a session: readable and writable by the hub only
        self.path = private_db.create(path, _SCHEMA)
        self.now = now
        with self._connect() as db:
            columns = {row[1] for row in db.execute("PRAGMA table_info(login_tokens)")}
            if "kind" not in columns:  # a store from before admin-made API tokens
                db.execute("ALTER TABLE login_tokens ADD COLUMN kind TEXT NOT NULL "
                           "DEFAULT 'login'")

    def _connect(self) -> sqlite3.Connection:
        return private_db.connect(self.path)

    def record(self, orm_token: orm.APIToken, issued_by: str, kind: str = KIND_LOGIN) -> None:
        if orm_token.user is None:
            raise ValueError("only a user's token can be a login token")
        with self._connect() as db:
            db.execute(
                "INSERT OR REPLACE INTO login_tokens VALUES (?, ?, ?, ?, ?, ?)",
                (orm_token.hashed, orm_token.id, orm_token.user.name, issued_by, self.now(),
                 kind),
            )

    def recorded(self, username: str, kind: str = KIND_LOGIN) -> dict[str, int]:
        """``{hashed: token_id}`` of the rows of *kind* for *username*."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT hashed, token_id FROM login_tokens WHERE username = ? AND kind = ?",
                (username, kind))
            return dict(rows.fetchall())

    def is_recorded(self, orm_token: orm.APIToken, kind: str = KIND_LOGIN) -> bool:
        if orm_token.user is None or not orm_token.hashed:
            return False
        with self._connect() as db:
            row = db.execute(
                "SELECT 1 FROM login_tokens WHERE hashed = ? AND token_id = ? AND username = ?"
                " AND kind = ?",
                (orm_token.hashed, orm_token.id, orm_token.user.name, kind),
            ).fetchone()
        return row is not None

    def forget(self, hashed: Iterable[str]) -> None:
        with self._connect() as db:
            db.executemany("DELETE FROM login_tokens WHERE hashed = ?", [(h,) for h in hashed])

    def forget_user(self, username: str) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM login_tokens WHERE username = ?", (username,))

    def forget_login_tokens(self, username: str) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM login_tokens WHERE username = ? AND kind = ?",
                       (username, KIND_LOGIN))



# ------------------------------------------------------------------ on the hub's ORM


def issue(db, store: LoginTokenStore, orm_user: orm.User, *, expires_in: int | None,
          issued_by: str) -> tuple[str, orm.APIToken]:
    """Create a login token for *orm_user* and record it; ``(token, orm_token)``."""
    token = orm_user.new_api_token(
        note=f"{LOGIN_TOKEN_NOTE}: issued by {issued_by}", expires_in=expires_in)
    orm_token = orm.APIToken.find(db, token, kind="user")
    store.record(orm_token, issued_by)
    return token, orm_token


def user_tokens(db, orm_user: orm.User) -> list[orm.APIToken]:
    """All API and OAuth tokens of *orm_user*, read from the database.

    Not ``orm_user.api_tokens``: the hub's session does not expire objects on commit,
    so that collection can still hold a token deleted since it was loaded.
    """
    return db.query(orm.APIToken).filter(orm.APIToken.user_id == orm_user.id).all()


def login_tokens(db, store: LoginTokenStore, orm_user: orm.User, *,
                 include_expired: bool = False, kind: str = KIND_LOGIN) -> list[orm.APIToken]:
    """The user's recorded login tokens (or, with *kind* :data:`KIND_API`, the API
    tokens an admin made for them) that still exist in the hub database.

    Rows whose token is gone (revoked through JupyterHub's own API, purged after
    expiry, or the user deleted) are forgotten on the way.
    """
    recorded = store.recorded(orm_user.name, kind)
    if not recorded:
        return []
    found = [t for t in user_tokens(db, orm_user) if recorded.get(t.hashed) == t.id]
    gone = set(recorded) - {t.hashed for t in found}
    if gone:
        store.forget(gone)
    if not include_expired:
        found = [t for t in found if not t.expired]
    return sorted(found, key=lambda t: t.id)


def admin_api_tokens(db, store: LoginTokenStore, orm_user: orm.User) -> list[orm.APIToken]:
    """The unexpired API tokens an admin made for *orm_user* through JupyterHub's REST
    API (:class:`UserTokensAPIHandler`)."""
    return login_tokens(db, store, orm_user, kind=KIND_API)


def is_login_token(store: LoginTokenStore, orm_token: orm.APIToken) -> bool:
    """Is this an unexpired token the admin path issued to its owner?"""
    return (orm_token.user is not None and orm_token.client_id == JUPYTERHUB_CLIENT
            and not orm_token.expired and store.is_recorded(orm_token))


@dataclass(frozen=True)
class Ended:
    """What :func:`end_access` removed."""

    api_tokens: list[str] = field(default_factory=list)  # api ids such as "a12"
    oauth_tokens: int = 0
    kept_server_tokens: int = 0
    shares: int = 0  # shares of her servers, to her, and her share codes (gpulab.shares)


def running_server_tokens(db, user) -> set[int]:
    """Ids of the API tokens the hub gave *user*'s servers (a JupyterHub ``User``; an
    ``orm.User`` has none). Known only for servers started since the hub itself
    started: the hub does not keep them across its own restarts."""
    spawners = getattr(user, "spawners", None) or {}
    ids = set()
    for spawner in spawners.values():
        if spawner.api_token:
            found = orm.APIToken.find(db, spawner.api_token, kind="user")
            if found is not None:
                ids.add(found.id)
    return ids


def has_access_to_end(db, orm_user: orm.User, keep: set[int]) -> bool:
    return any(t.id not in keep for t in user_tokens(db, orm_user))


def end_access(db, store: LoginTokenStore, orm_user: orm.User, keep: set[int],
               admin_made: set[int] = frozenset()) -> Ended:
    """Delete every API and OAuth token of *orm_user* except the ids in *keep* (their
    running servers' own tokens) and *admin_made* (API tokens an admin made for them,
    which stand on their own), rotate their hub cookie id so that every browser
    session on the hub ends at its next request, and end every share to or from them.
    For a user with no login token left."""
    api_ids, oauth = [], 0
    for token in user_tokens(db, orm_user):
        if token.id in keep or token.id in admin_made:
            continue
        if token.client_id and token.client_id != JUPYTERHUB_CLIENT:
            oauth += 1
        else:
            api_ids.append(token.api_id)
        db.delete(token)
    orm_user.cookie_id = new_token()
    db.commit()
    db.expire(orm_user, ["api_tokens"])  # reload the collection at its next use
    store.forget_login_tokens(orm_user.name)
    shares = server_shares.end_member_shares(db, orm_user)
    return Ended(sorted(api_ids), oauth, len(keep), shares)


# ------------------------------------------------------------------ REST API


def token_model(token: orm.APIToken) -> dict:
    """What the API shows of a login token: never the token or its hash."""
    return {
        "id": token.api_id,
        "user": token.user.name,
        "created": isoformat(token.created),
        "expires_at": isoformat(token.expires_at),
        "expired": token.expired,
        "last_activity": isoformat(token.last_activity),
        "note": token.note,
    }


class LoginTokenAPIBase(APIHandler):
    """Base of the login-token endpoints and of the SSH keys' (gpulab.login.sshkeys): the
    authenticator's store, admins-only checks, JSON."""

    @property
    def store(self) -> LoginTokenStore:
        store = getattr(self.authenticator, "login_tokens", None)
        if not isinstance(store, LoginTokenStore):
            raise web.HTTPError(500, "login tokens need c.JupyterHub.authenticator_class = "
                                     "'gpulab-token'")
        return store

    def require_admin(self) -> None:
        if self.current_user is None:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        # unfiltered only: a member's "tokens!user=alice" does not pass
        missing = [s for s in ADMIN_SCOPES if not self.has_scope(s)]
        if missing:
            self.log.warning("%s may not manage login tokens (lacks %s)",
                             self.current_user.name, ", ".join(missing))
            raise web.HTTPError(
                403, "Only admins may issue, list or revoke login tokens (requires the "
                     f"unfiltered scopes {', '.join(ADMIN_SCOPES)}).")

    def user_or_404(self, name: str):
        user = self.find_user(name)
        if user is None:
            raise web.HTTPError(404, f"No such user: {name}. Create it first "
                                     f"(gpulab token issue {name} does).")
        return user

    @property
    def requester(self) -> str:
        """``service gpulab-admin`` or ``user alice``, for the note and the log."""
        return f"{getattr(self.current_user, 'kind', 'user')} {self.current_user.name}"


class LoginTokensAPIHandler(LoginTokenAPIBase):
    """``GET`` (list) and ``POST`` (issue) ``/hub/api/gpulab/login-tokens/{user}``."""

    def get(self, user_name):
        self.require_admin()
        user = self.user_or_404(user_name)
        tokens = login_tokens(self.db, self.store, user.orm_user, include_expired=True)
        self.write(json.dumps({"login_tokens": [token_model(t) for t in tokens]}))

    def post(self, user_name):
        self.require_admin()
        user = self.user_or_404(user_name)
        body = self.get_json_body() or {}
        if not isinstance(body, dict) or set(body) - {"expires_in"}:
            raise web.HTTPError(400, 'Body must be {"expires_in": seconds or null}')
        expires_in = body.get("expires_in")
        if expires_in is not None and (
                isinstance(expires_in, bool) or not isinstance(expires_in, int)
                or expires_in <= 0):
            raise web.HTTPError(
                400, f"expires_in must be a positive number of seconds or null (never), "
                     f"not {expires_in!r}")
        token, orm_token = issue(self.db, self.store, user.orm_user,
                                 expires_in=expires_in, issued_by=self.requester)
        access_given = getattr(self.authenticator, "access_given", None)
        if access_given is not None:  # an end of her access no longer stands
            access_given(user.name)
        self.log.info("%s issued login token %s for %s (expires %s)", self.requester,
                      orm_token.api_id, user.name, isoformat(orm_token.expires_at) or "never")
        self.set_status(201)
        self.write(json.dumps({**token_model(orm_token), "token": token}))


class LoginTokenAPIHandler(LoginTokenAPIBase):
    """``DELETE /hub/api/gpulab/login-tokens/{user}/{token_id}``: revoke one."""

    def delete(self, user_name, token_id):
        self.require_admin()
        user = self.user_or_404(user_name)
        orm_user = user.orm_user
        tokens = login_tokens(self.db, self.store, orm_user, include_expired=True)
        target = next((t for t in tokens if t.api_id == token_id), None)
        if target is None:
            raise web.HTTPError(404, f"{user.name} has no login token {token_id} "
                                     f"(see gpulab token list {user.name})")
        hashed = target.hashed
        self.db.delete(target)
        self.db.commit()
        self.db.expire(orm_user, ["api_tokens"])
        self.store.forget([hashed])
        left = login_tokens(self.db, self.store, orm_user)
        scripts = admin_api_tokens(self.db, self.store, orm_user)
        ended = None
        if not left:
            ended = end_access(self.db, self.store, orm_user,
                               running_server_tokens(self.db, user),
                               {t.id for t in scripts})
            # refresh at this user's next request, whatever auth_refresh_age says
            compat.expire_auth(user)
        self.log.info("%s revoked login token %s of %s%s", self.requester, token_id,
                      user.name, "; no login token left: access ended" if ended else "")
        self.write(json.dumps({
            "revoked": token_id,
            "login_tokens_left": len(left),
            # API tokens an admin made for this user stand on their own: they are ended
            # by deleting them, or by DELETE /hub/api/gpulab/access/{user}.
            "admin_api_tokens_left": sorted(t.api_id for t in scripts),
            "ended_access": asdict(ended) if ended else None,
        }))


class UserTokensAPIHandler(UserTokenListAPIHandler):
    """JupyterHub's own ``/hub/api/users/{name}/tokens``, unchanged, except that a token
    an admin (or a service holding the unfiltered admin scopes) makes there *for another
    user* is recorded as an admin-made API token (:data:`KIND_API`): a credential of its
    own, as JupyterHub documents, that works with its scopes until it expires or is
    deleted, whether or not its owner has a login token. It never signs in. Tokens a
    member makes for herself stay tied to her login token."""

    async def post(self, user_name):
        user = self.find_user(user_name)
        before = {t.id for t in user_tokens(self.db, user.orm_user)} if user else set()
        await super().post(user_name)
        requester = self.current_user
        if (user is None or self.get_status() != 201 or requester is None
                or requester is user or not all(self.has_scope(s) for s in ADMIN_SCOPES)):
            return
        store = getattr(self.authenticator, "login_tokens", None)
        if not isinstance(store, LoginTokenStore):
            return
        requester_name = f"{getattr(requester, 'kind', 'user')} {requester.name}"
        for token in user_tokens(self.db, user.orm_user):
            if token.id not in before:
                store.record(token, requester_name, kind=KIND_API)
                self.log.info("%s made API token %s for %s: it stands on its own (not "
                              "tied to a login token)", requester_name, token.api_id,
                              user.name)


class AccessAPIHandler(LoginTokenAPIBase):
    """``DELETE /hub/api/gpulab/access/{user}`` (body ``{"stop_servers": bool}``): end
    a member's access at once and entirely: every login token and admin-made API token,
    her SSH keys (gpulab.login.sshkeys), then everything they opened (sessions, her own
    tokens, OAuth tokens of her servers), and, when asked, her servers. The user stays
    (her home and history are kept)."""

    async def delete(self, user_name):
        self.require_admin()
        user = self.user_or_404(user_name)
        body = self.get_json_body() or {}
        if not isinstance(body, dict) or set(body) - {"stop_servers"} or not isinstance(
                body.get("stop_servers", False), bool):
            raise web.HTTPError(400, 'Body must be {"stop_servers": true or false}')
        if body.get("stop_servers") and not self.has_scope("servers"):
            raise web.HTTPError(403, "Stopping the member's servers needs the servers scope "
                                     "(admins have it): end access without stop_servers, or "
                                     "ask an admin.")
        orm_user = user.orm_user
        revoked = []
        for kind in (KIND_LOGIN, KIND_API):
            for token in login_tokens(self.db, self.store, orm_user, include_expired=True,
                                      kind=kind):
                revoked.append(token.api_id)
                self.store.forget([token.hashed])
                self.db.delete(token)
        self.db.commit()
        self.db.expire(orm_user, ["api_tokens"])
        stop = body.get("stop_servers", False)
        keep = set() if stop else running_server_tokens(self.db, user)
        ended = end_access(self.db, self.store, orm_user, keep)
        self.store.forget_user(orm_user.name)
        keys = getattr(self.authenticator, "ssh_keys", None)  # gpulab.login.sshkeys
        removed_keys = keys.forget_user(orm_user.name) if keys is not None else 0
        self.authenticator.access_ended(orm_user.name, orm_user.id)  # what others keep
        compat.expire_auth(user)
        stopped = []
        if stop:
            for name, spawner in list(user.spawners.items()):
                if spawner.active and not spawner.pending:
                    await self.stop_single_user(user, name)
                    stopped.append(name)
                elif spawner.pending:  # starting or stopping: its own end follows
                    self.log.warning("%s's server %r is %s: not stopped by the end of "
                                     "access; stop it when it is", user.name, name,
                                     spawner.pending)
        self.log.warning("%s ended the access of %s: revoked %s, removed %d SSH keys%s",
                         self.requester, user.name, ", ".join(revoked) or "no credentials",
                         removed_keys, f"; stopped servers {stopped}" if stopped else "")
        self.write(json.dumps({"revoked": sorted(revoked), "ended_access": asdict(ended),
                               "removed_ssh_keys": removed_keys,
                               "stopped_servers": stopped}))


def api_handlers() -> list[tuple[str, type]]:
    """For ``Authenticator.get_handlers`` (JupyterHub puts them under /hub/, before its
    own: the users' tokens route here replaces JupyterHub's with its subclass)."""
    return [
        (r"/api/gpulab/login-tokens/([^/]+)", LoginTokensAPIHandler),
        (r"/api/gpulab/login-tokens/([^/]+)/([^/]+)", LoginTokenAPIHandler),
        (r"/api/gpulab/access/([^/]+)", AccessAPIHandler),
        (r"/api/users/([^/]+)/tokens", UserTokensAPIHandler),
    ]
