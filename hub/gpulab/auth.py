"""Token login: lab members sign in with their username and a personal access token.

Tokens are JupyterHub API tokens that an admin issued for the member
(``gpulab token issue alice``), so they are stored only as salted hashes in the hub's
database, can expire, and stop working the moment they are revoked. Only tokens
issued for login (their note starts with :data:`LOGIN_TOKEN_NOTE`) are accepted here:
a token a user made for a script cannot be turned into a browser session.

Around that check, :class:`GpulabLoginHandler` (served at ``/hub/login``):

* normalises the username (``"Alice "`` is ``alice``) and refuses invalid ones with a
  message that says what a username may contain;
* throttles failed sign-ins per username and per client address
  (:mod:`gpulab.throttle`), answering HTTP 429 with the time to try again; the
  lockouts are kept in a sqlite file, so a hub restart does not lift them;
* sends the user after sign-in only to a path on this hub (:mod:`gpulab.redirects`);
* refuses credentials in the URL (``?password=``/``?token=``) and keeps them out of
  the access log.

Tokens never reach a log line, a URL or an error page from here.
"""

from __future__ import annotations

import re
import unicodedata

from jupyterhub import orm
from jupyterhub.auth import Authenticator
from jupyterhub.handlers.login import LoginHandler
from jupyterhub.utils import utcnow
from tornado import web
from tornado.netutil import is_valid_ip
from traitlets import Bool, Float, Instance, Integer, Unicode, default

from .redirects import safe_next_url
from .throttle import Decision, Policy, Throttle

LOGIN_TOKEN_NOTE = "gpulab-login"

# 1-32 characters: lowercase letters and digits, with single ".", "_" or "-" between
# them. No leading/trailing punctuation, so "." and ".." and "-x" are impossible.
USERNAME_PATTERN = r"^(?=.{1,32}\Z)[a-z0-9]+(?:[._-][a-z0-9]+)*\Z"
USERNAME_RULES = (
    "A username is 1 to 32 characters: lowercase letters a-z and digits, with single "
    "'.', '_' or '-' between them (for example alice or j.smith)."
)
# Query parameters that would put a credential into a URL (and so into logs and
# browser history). JupyterHub's log scrubber does not know "password".
CREDENTIAL_PARAMS = ("password", "token")
MAX_TOKEN_LENGTH = 256


def client_address(request) -> str:
    """The client's address for throttling, as JupyterHub sees it, minus ``X-Real-Ip``.

    The hub runs tornado with ``xheaders=True`` and ``trusted_downstream =
    c.JupyterHub.trusted_downstream_ips``: ``remote_ip`` is the right-most
    ``X-Forwarded-For`` entry that is not a trusted proxy (configurable-http-proxy
    appends the real peer there). But tornado then lets an ``X-Real-Ip`` header
    override that, and the proxy passes a client's own ``X-Real-Ip`` through
    unchanged, so any client could pick its address. When that header is present the
    address is worked out again from ``X-Forwarded-For`` (or the TCP peer) alone.
    """
    remote_ip = request.remote_ip
    headers = request.headers
    if "X-Real-Ip" not in headers:
        return remote_ip
    context = getattr(getattr(request, "connection", None), "context", None)
    peer = getattr(context, "_orig_remote_ip", None) or remote_ip
    trusted = getattr(context, "trusted_downstream", None) or set()
    forwarded = headers.get("X-Forwarded-For")
    if not forwarded:
        return peer
    ip = peer
    for candidate in reversed([c.strip() for c in forwarded.split(",")]):
        ip = candidate
        if candidate not in trusted:
            break
    return ip if is_valid_ip(ip) else peer


def _display_name(raw: str) -> str:
    """What of a submitted username may be echoed back (escaped by the template)."""
    return raw if len(raw) <= 32 else f"{raw[:16]}...({len(raw)} chars)"


class GpulabLoginHandler(LoginHandler):
    """JupyterHub's login page with throttling, username rules and safe redirects."""

    @property
    def throttle(self) -> Throttle:
        return self.authenticator.throttle

    async def prepare(self):
        leaked = [p for p in CREDENTIAL_PARAMS if p in self.request.query_arguments]
        if leaked:
            # The access log line is written from request.uri after the response:
            # drop the query so the credential does not end up there.
            self.request.uri = self.request.path
        await super().prepare()
        if leaked:
            raise web.HTTPError(
                400,
                "Tokens must not be sent in a URL. Sign in with the form. If this link "
                "was shared or bookmarked, ask the lab admin to revoke that token.",
            )

    def get_next_url(self, user=None, default=None):
        next_url = super().get_next_url(user, default)
        safe = safe_next_url(next_url, self.base_url)
        if safe != next_url:
            # not logging the URL: it may carry secrets of its own
            self.log.warning("Refusing redirect after login to a URL outside this hub")
        return safe

    async def _finish_locked(self, decision: Decision, username: str = ""):
        self.set_status(decision.status)
        self.set_header("Retry-After", str(decision.retry_after))
        html = await self._render(login_error=decision.message(), username=username)
        self.finish(html)

    async def get(self):
        if self.current_user is None and not self.authenticator.auto_login:
            decision = self.throttle.check(None, client_address(self.request))
            if decision.locked:
                await self._finish_locked(decision)
                return
        await super().get()

    async def post(self):
        raw_username = self.get_body_argument("username", default="", strip=True)
        token = self.get_body_argument("password", default="", strip=False)
        address = client_address(self.request)
        username = self.authenticator.normalize_username(raw_username)
        valid = self.authenticator.validate_username(username)

        decision = self.throttle.check(username if valid else None, address)
        if decision.locked:
            self.log.warning(
                "Sign-in refused for %r from %s: locked for %ss",
                _display_name(raw_username), address, decision.retry_after,
            )
            await self._finish_locked(decision, _display_name(raw_username))
            return

        if not valid:
            decision = self.throttle.record_failure(None, address)
            if decision.locked:
                await self._finish_locked(decision, _display_name(raw_username))
                return
            self.log.warning("Sign-in with invalid username %r from %s",
                             _display_name(raw_username), address)
            self.set_status(403)
            html = await self._render(
                login_error=self.authenticator.invalid_username_message,
                username=_display_name(raw_username),
            )
            self.finish(html)
            return

        user = await self.login_user({"username": username, "password": token})
        if user:
            self.throttle.record_success(username)
            self._jupyterhub_user = user
            self.redirect(self.get_next_url(user))
            return

        decision = self.throttle.record_failure(username, address)
        if decision.locked:
            self.log.warning("Sign-in locked for %r / %s for %ss",
                             username, address, decision.retry_after)
            await self._finish_locked(decision, username)
            return
        self.set_status(403)
        html = await self._render(login_error="Invalid username or token.", username=username)
        self.finish(html)


class TokenAuthenticator(Authenticator):
    """Username + personal access token, checked against the hub's hashed token table."""

    throttle_db_path = Unicode(
        "/srv/jupyterhub/gpulab-login-throttle.sqlite",
        help="""File that keeps failed sign-ins and lockouts across hub restarts
        (sqlite, created mode 0600). Put it next to the hub database, on the volume.

        Example:
        c.TokenAuthenticator.throttle_db_path = "/srv/jupyterhub/login-throttle.sqlite"
        """,
    ).tag(config=True)

    max_failed_logins = Integer(
        5,
        help="""Failed sign-ins for one username within `failed_login_window` seconds
        that lock the username (default 5).

        Example: c.TokenAuthenticator.max_failed_logins = 5
        """,
    ).tag(config=True)

    max_failed_logins_per_address = Integer(
        20,
        help="""Failed sign-ins from one client address (an IPv6 /64 counts as one)
        within `failed_login_window` seconds that lock that address (default 20;
        higher than per username because a lab may share one NAT address).

        Example: c.TokenAuthenticator.max_failed_logins_per_address = 20
        """,
    ).tag(config=True)

    failed_login_window = Float(
        15 * 60,
        help="""Seconds over which failed sign-ins are counted (default 900).

        Example: c.TokenAuthenticator.failed_login_window = 900
        """,
    ).tag(config=True)

    lockout_seconds = Float(
        15 * 60,
        help="""Seconds of the first lockout; each further lockout of the same
        username or address doubles it, up to `max_lockout_seconds` (default 900).

        Example: c.TokenAuthenticator.lockout_seconds = 900
        """,
    ).tag(config=True)

    max_lockout_seconds = Float(
        24 * 3600,
        help="""Longest lockout in seconds; also how long a key must stay free of
        failures before its lockout history is forgotten (default 86400).

        Example: c.TokenAuthenticator.max_lockout_seconds = 86400
        """,
    ).tag(config=True)

    end_sessions_without_token = Bool(
        True,
        help="""Sign a user out of the hub (within `auth_refresh_age` seconds,
        default 300) once they have no unexpired login token left, e.g. after
        `gpulab token revoke`. Their API tokens are not affected.

        Example: c.TokenAuthenticator.end_sessions_without_token = True
        """,
    ).tag(config=True)

    invalid_username_message = Unicode(
        USERNAME_RULES,
        help="""What the login page says about a username that does not match
        `username_pattern`. Change it together with the pattern.""",
    ).tag(config=True)

    throttle = Instance(Throttle, help="The failed-login store; built from the traits above.")

    @default("throttle")
    def _throttle_default(self):
        forget = self.max_lockout_seconds
        return Throttle(
            self.throttle_db_path,
            user_policy=Policy(
                max_failures=self.max_failed_logins,
                window=self.failed_login_window,
                lockout=self.lockout_seconds,
                max_lockout=self.max_lockout_seconds,
                forget_after=forget,
            ),
            address_policy=Policy(
                max_failures=self.max_failed_logins_per_address,
                window=self.failed_login_window,
                lockout=self.lockout_seconds,
                max_lockout=self.max_lockout_seconds,
                forget_after=forget,
            ),
        )

    @default("allow_all")
    def _allow_all_default(self):
        # Only holders of an admin-issued token for an existing user get this far.
        return True

    @default("username_pattern")
    def _username_pattern_default(self):
        return USERNAME_PATTERN

    @default("username_regex")
    def _username_regex_default(self):
        # JupyterHub compiles the pattern only when it is *set*; a default needs this.
        return re.compile(self.username_pattern) if self.username_pattern else None

    def get_handlers(self, app):
        return [("/login", GpulabLoginHandler)]

    def normalize_username(self, username):
        """``" Alice "`` -> ``alice``; full-width and other compatibility forms fold
        to their plain letters (NFKC) before JupyterHub lowercases them."""
        username = unicodedata.normalize("NFKC", username or "").strip()
        return super().normalize_username(username)

    async def authenticate(self, handler, data):
        data = data or {}
        username = self.normalize_username(data.get("username") or "")
        token = (data.get("password") or "").strip()
        if not username or not token or not self.validate_username(username):
            return None
        if len(token) > MAX_TOKEN_LENGTH or not token.isprintable():
            reason = "malformed token"
            orm_token = None
        else:
            orm_token = orm.APIToken.find(handler.db, token, kind="user")
            if orm_token is None:
                reason = "unknown, expired or revoked token"
            elif orm_token.expired:
                reason = "expired token"
            elif orm_token.user is None or orm_token.user.name != username:
                reason = "token of another user"
            elif not (orm_token.note or "").startswith(LOGIN_TOKEN_NOTE):
                reason = "not a login token"
            else:
                reason = None
        if reason:
            # Never log the token itself, not even a prefix of it.
            self.log.warning("Failed token login for %r: %s", username, reason)
            return None
        orm_token.last_activity = utcnow(with_tz=False)
        handler.db.commit()
        return {"name": username}

    async def refresh_user(self, user, handler=None):
        """False (sign in again) once the user has no unexpired login token left."""
        if not self.end_sessions_without_token:
            return True
        orm_user = getattr(user, "orm_user", user)
        for token in orm_user.api_tokens:
            if (token.note or "").startswith(LOGIN_TOKEN_NOTE) and not token.expired:
                return True
        self.log.info("User %s has no valid login token left: ending their hub session",
                      orm_user.name)
        return False
