"""Token login: lab members sign in with their username and a personal access token.

Tokens are JupyterHub API tokens that an admin issued for the member through the
admin-only REST API of :mod:`gpulab.login.tokens` (``gpulab token issue alice``), so
they are stored only as salted hashes in the hub's database, can expire, and stop
working the moment they are revoked. Only tokens recorded there as login tokens sign
in: a token a member made for a script, whatever its note says, cannot be turned into
a browser session. Once a member has no valid login token left, their hub session ends
at its next request and their other tokens are deleted (:meth:`refresh_user`).

Around that check, :class:`GpulabLoginHandler` (served at ``/hub/login``):

* normalises the username (``"Alice "`` is ``alice``) and refuses invalid ones with a
  message that says what a username may contain;
* throttles failed sign-ins per username and per client address (:mod:`gpulab.login.throttle`),
  answering HTTP 429 with the time to try again; the lockouts are kept in a sqlite
  file, so a hub restart does not lift them. The client address is the TCP peer, or,
  when the peer is a trusted proxy, the right-most untrusted ``X-Forwarded-For`` hop
  (:func:`client_address`). A browser that signed in as a user before carries a
  signed *device cookie* for that user: its attempts count against that device only,
  so nobody can lock a member out of the browser they use;
* sends the user after sign-in only to a path on this hub (:mod:`gpulab.login.redirects`);
* refuses credentials in the URL (``?password=``/``?token=``) and keeps them out of
  the access log.

Tokens never reach a log line, a URL or an error page from here. :func:`configure_login`
sets everything above on a JupyterHub config object.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from jupyterhub import orm
from jupyterhub.auth import Authenticator
from jupyterhub.handlers.login import LoginHandler
from jupyterhub.utils import utcnow
from sqlalchemy import inspect
from tornado import web
from traitlets import Bool, Float, Instance, Integer, List, Unicode, default

from gpulab import compat
from gpulab.contract import PROXY_IP
from gpulab.login import sshkeys
from gpulab.login import tokens as lt
from gpulab.login.forwarded import TrustedProxies, client_address
from gpulab.login.redirects import safe_next_url
from gpulab.login.sshkeys import SshKeyStore
from gpulab.login.throttle import LockoutDecision, LockoutPolicy, Throttle
from gpulab.login.tokens import LOGIN_TOKEN_NOTE, LoginTokenStore
from gpulab.login.usernames import USERNAME_PATTERN, USERNAME_RULES, fold

__all__ = ["LOGIN_TOKEN_NOTE", "GpulabLoginHandler", "TokenAuthenticator", "TrustedProxies",
           "client_address", "configure_login"]

# Query parameters that would put a credential into a URL (and so into logs and
# browser history). JupyterHub's log scrubber does not know "password".
CREDENTIAL_PARAMS = ("password", "token")
MAX_TOKEN_LENGTH = 256
# "This browser signed in as <user>": one signed cookie per username, path /hub/.
DEVICE_COOKIE_PREFIX = "gpulab-device-"
_DEVICE_ID = re.compile(r"[A-Za-z0-9_-]{16,64}\Z")
THROTTLE_FILE = "gpulab-login-throttle.sqlite"
LOGIN_TOKENS_FILE = "gpulab-login-tokens.sqlite"
SSH_KEYS_FILE = "gpulab-ssh-keys.sqlite"
# The key JupyterHub encrypts an identity provider's tokens with (secrets/, made by make secrets).
CRYPT_KEY_FILE = "crypt-key"


def credentials_in_query(query: str) -> list[str]:
    """Credential parameters in a query string, or in the query of its ``next`` URL:
    ``/hub/home?token=X`` sends a signed-out browser to ``/hub/login?next=`` that URL,
    and signing in would carry the token on into the browser's history."""
    args = parse_qs(query, keep_blank_values=True)
    found = [p for p in CREDENTIAL_PARAMS if p in args]
    for next_url in args.get("next", []):
        nested = parse_qs(urlsplit(next_url).query, keep_blank_values=True)
        found += [f"next: {p}" for p in CREDENTIAL_PARAMS if p in nested]
    return found


def _display_name(raw: str) -> str:
    """What of a submitted username may be echoed back (escaped by the template)."""
    return raw if len(raw) <= 32 else f"{raw[:16]}...({len(raw)} chars)"


class KeyedLocks:
    """An asyncio lock per key, dropped when nobody holds or waits for it."""

    def __init__(self):
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str):
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


SIGN_IN_LOCKS = KeyedLocks()


class GpulabLoginHandler(LoginHandler):
    """JupyterHub's login page with throttling, username rules and safe redirects."""

    # TokenAuthenticator.authenticate accepts tokens from handlers marked so only:
    # JupyterHub's POST /hub/api/users/{name}/tokens {"auth": ...} would bypass the throttle.
    accepts_token_sign_in = True

    @property
    def throttle(self) -> Throttle:
        return self.authenticator.throttle

    @property
    def client_address(self) -> str:
        return self.authenticator.client_address(self.request)

    async def prepare(self):
        # tornado's remote_ip follows X-Forwarded-For/X-Real-Ip from any peer; on the
        # login page JupyterHub's access log line (and its anonymous xsrf id) get the
        # address the throttle counts instead.
        self.request.remote_ip = self.client_address
        leaked = credentials_in_query(self.request.query)
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

    # ---------------------------------------------------------------- device cookies

    def device_id(self, username: str) -> str | None:
        """The id in this browser's valid device cookie for *username*, if any."""
        raw = self.get_secure_cookie(
            DEVICE_COOKIE_PREFIX + username,
            max_age_days=self.authenticator.device_cookie_max_age_days, min_version=2)
        value = raw.decode("ascii", "replace") if raw else ""
        return value if _DEVICE_ID.match(value) else None

    def has_any_device_cookie(self) -> bool:
        return any(self.device_id(name[len(DEVICE_COOKIE_PREFIX):])
                   for name in self.request.cookies if name.startswith(DEVICE_COOKIE_PREFIX))

    def set_device_cookie(self, username: str) -> None:
        # JupyterHub's cookie helper: httponly, secure on https, c.JupyterHub.cookie_options
        compat.set_hub_cookie(self, DEVICE_COOKIE_PREFIX + username, secrets.token_urlsafe(24),
                              path=self.hub.base_url,
                              expires_days=self.authenticator.device_cookie_max_age_days)

    # ---------------------------------------------------------------- pages

    async def _finish_locked(self, decision: LockoutDecision, username: str = ""):
        self.set_status(decision.status)
        self.set_header("Retry-After", str(decision.retry_after))
        html = await compat.render_login(self, decision.message(), username)
        self.finish(html)

    async def get(self):
        if (self.current_user is None and not self.authenticator.auto_login
                and not self.has_any_device_cookie()):
            decision = self.throttle.check(None, self.client_address)
            if decision.locked:
                await self._finish_locked(decision)
                return
        await super().get()

    async def post(self):
        # One sign-in at a time per username and per address, from the throttle's check
        # to its record: otherwise a burst of guesses all pass the check while the first
        # waits on the directory (review: 29 of 40 parallel guesses were tried).
        raw_username = self.get_body_argument("username", default="", strip=True)
        name = self.authenticator.normalize_username(raw_username)
        async with SIGN_IN_LOCKS.hold(f"user:{name}"), \
                SIGN_IN_LOCKS.hold(f"address:{self.client_address}"):
            await self._post()

    async def _post(self):
        raw_username = self.get_body_argument("username", default="", strip=True)
        token = self.get_body_argument("password", default="", strip=False)
        address = self.client_address
        username = self.authenticator.normalize_username(raw_username)
        valid = self.authenticator.validate_username(username)
        device = self.device_id(username) if valid else None

        decision = self.throttle.check(username if valid else None, address, device)
        if decision.locked:
            self.log.warning(
                "Sign-in refused for %r from %s%s: locked for %ss",
                _display_name(raw_username), address, " (device)" if device else "",
                decision.retry_after,
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
            html = await compat.render_login(
                self, self.authenticator.invalid_username_message,
                _display_name(raw_username))
            self.finish(html)
            return

        user = await self.login_user({"username": username, "password": token})
        if user:
            if getattr(self, "signed_in_with_directory", False):  # her groups, as it says
                await self.authenticator.sso.signed_in(user)
            self.throttle.record_success(username, device)
            self.set_device_cookie(username)
            compat.set_current_user(self, user)
            self.redirect(self.get_next_url(user))
            return

        decision = self.throttle.record_failure(username, address, device)
        if decision.locked:
            self.log.warning("Sign-in locked for %r / %s for %ss",
                             username, "its device" if device else address,
                             decision.retry_after)
            await self._finish_locked(decision, username)
            return
        self.set_status(403)
        html = await compat.render_login(self, "Invalid username or token.", username)
        self.finish(html)


class TokenAuthenticator(Authenticator):
    """Username + login token, checked against the hub's hashed token table and the
    record of login tokens (:mod:`gpulab.login.tokens`)."""

    device_cookie_max_age_days = Float(
        90,
        help="""Days a browser's device cookie ("this browser signed in as alice")
        stays valid; renewed at each sign-in (default 90). Sign-in attempts with a
        valid device cookie for the username count against that browser only, so
        failures by others (on the username or a shared address) do not lock it out.

        Example: c.TokenAuthenticator.device_cookie_max_age_days = 90
        """,
    ).tag(config=True)

    more_api_handlers = List(
        help="""More (route, handler) pairs for the hub to serve under /hub/, before
        its own routes, beside the login page and the login-token and SSH-key APIs:
        gpulab.hubconfig puts the start API's wrapper here (gpulab.spawn.servers_api);
        its other routes are JupyterHub.extra_handlers.""",
    ).tag(config=True)

    on_access_ended = List(
        help="""Callables called with a username whose access ended (an admin ended it
        with gpulab.login.tokens' access API, or deleted her): each drops what another
        part keeps for her. gpulab.hubconfig puts the line's here: she leaves the line,
        so that no server is started for her later.""",
    ).tag(config=True)

    end_sessions_without_token = Bool(
        True,
        help="""End a member's access once they have no valid login token left
        (revoked, expired or deleted): their hub session ends at its next request,
        their token-authenticated requests are refused, and their other API tokens and
        OAuth tokens are deleted (default True; needs auth_refresh_age > 0).

        Example: c.TokenAuthenticator.end_sessions_without_token = True
        """,
    ).tag(config=True)

    failed_login_window = Float(
        15 * 60,
        help="""Seconds over which failed sign-ins are counted (default 900).

        Example: c.TokenAuthenticator.failed_login_window = 900
        """,
    ).tag(config=True)

    invalid_username_message = Unicode(
        USERNAME_RULES,
        help="""What the login page says about a username that does not match
        `username_pattern`. Change it together with the pattern.""",
    ).tag(config=True)

    lockout_seconds = Float(
        15 * 60,
        help="""Seconds of the first lockout; each further lockout of the same
        username, address or device doubles it, up to `max_lockout_seconds`
        (default 900).

        Example: c.TokenAuthenticator.lockout_seconds = 900
        """,
    ).tag(config=True)

    login_tokens_db_path = Unicode(
        f"/srv/jupyterhub/{LOGIN_TOKENS_FILE}",
        help="""File that records which API tokens are login tokens (sqlite, created
        mode 0600; only the admin REST API writes it). Put it next to the hub
        database, on the same volume, and back them up together.

        Example:
        c.TokenAuthenticator.login_tokens_db_path = "/srv/jupyterhub/gpulab-login-tokens.sqlite"
        """,
    ).tag(config=True)

    max_failed_logins = Integer(
        5,
        help="""Failed sign-ins for one username (or one device) within
        `failed_login_window` seconds that lock it (default 5).

        Example: c.TokenAuthenticator.max_failed_logins = 5
        """,
    ).tag(config=True)

    max_failed_logins_per_address = Integer(
        20,
        help="""Failed sign-ins from one client address (an IPv6 /64 counts as one)
        within `failed_login_window` seconds that lock that address for browsers
        without a device cookie (default 20; higher than per username because a lab
        may share one NAT address).

        Example: c.TokenAuthenticator.max_failed_logins_per_address = 20
        """,
    ).tag(config=True)

    max_lockout_seconds = Float(
        24 * 3600,
        help="""Longest lockout in seconds; also how long a key must stay free of
        failures before its lockout history is forgotten (default 86400).

        Example: c.TokenAuthenticator.max_lockout_seconds = 86400
        """,
    ).tag(config=True)

    throttle_db_path = Unicode(
        f"/srv/jupyterhub/{THROTTLE_FILE}",
        help="""File that keeps failed sign-ins and lockouts across hub restarts
        (sqlite, created mode 0600). Put it next to the hub database, on the volume.

        Example:
        c.TokenAuthenticator.throttle_db_path = "/srv/jupyterhub/login-throttle.sqlite"
        """,
    ).tag(config=True)

    trusted_proxies = List(
        Unicode(),
        help="""Addresses or networks of the proxies in front of the hub whose
        X-Forwarded-For entries name the client (default: none). From any other peer
        the header is ignored and the peer is the client. configure_login() puts
        gpulab's own proxy and settings hub.trusted_proxies here.

        Example: c.TokenAuthenticator.trusted_proxies = ["10.0.0.5", "10.0.0.0/24"]
        """,
    ).tag(config=True)

    ssh_keys_db_path = Unicode(
        f"/srv/jupyterhub/{SSH_KEYS_FILE}",
        help="""File that records members' SSH public keys (sqlite, created mode 0600),
        next to the hub database, on the volume (gpulab.login.sshkeys).

        Example: c.TokenAuthenticator.ssh_keys_db_path = "/srv/jupyterhub/gpulab-ssh-keys.sqlite"
        """,
    ).tag(config=True)

    identity_provider = Unicode(
        "",
        help="""The lab's identity provider members may sign in with besides login
        tokens: "" (none), "oidc" (gpulab.login.sso.LabOIDCAuthenticator, configured
        as c.LabOIDCAuthenticator) or "ldap" (gpulab.login.ldap.LabLDAPAuthenticator:
        the token form takes directory passwords too). configure_login() sets it from
        settings login.provider.""",
    ).tag(config=True)

    sso = Instance(Authenticator, allow_none=True,
                   help="The identity provider's authenticator (from identity_provider), "
                        "or None.")
    login_tokens = Instance(LoginTokenStore, help="The login-token record; from the path above.")
    ssh_keys = Instance(SshKeyStore, help="The SSH key record; from ssh_keys_db_path.")
    throttle = Instance(Throttle, help="The failed-login store; built from the traits above.")
    trusted = Instance(TrustedProxies, help="Parsed `trusted_proxies`.")

    @default("sso")
    def _sso_default(self):
        if not self.identity_provider:
            return None
        if self.identity_provider == "oidc":
            from gpulab.login.sso import LabOIDCAuthenticator  # oauthenticator: with SSO only
            return LabOIDCAuthenticator(parent=self)
        if self.identity_provider == "ldap":
            from gpulab.login.ldap import LabLDAPAuthenticator  # ldap3: with LDAP only
            return LabLDAPAuthenticator(parent=self)
        raise ValueError(f"unknown identity_provider {self.identity_provider!r}")

    @default("reconcile_auth_state_hook")
    def _reconcile_default(self):
        if not self.identity_provider:
            return None
        from gpulab.login.sso import keep_auth_state_unless_given
        return keep_auth_state_unless_given

    @default("enable_auth_state")
    def _enable_auth_state_default(self):
        # The provider's tokens, kept encrypted in the hub's database (c.CryptKeeper.keys).
        return bool(self.identity_provider)

    @default("login_tokens")
    def _login_tokens_default(self):
        return LoginTokenStore(self.login_tokens_db_path)

    @default("ssh_keys")
    def _ssh_keys_default(self):
        return SshKeyStore(self.ssh_keys_db_path)

    @default("trusted")
    def _trusted_default(self):
        return TrustedProxies(self.trusted_proxies)

    @default("throttle")
    def _throttle_default(self):
        forget = self.max_lockout_seconds
        return Throttle(
            self.throttle_db_path,
            user_policy=LockoutPolicy(
                max_failures=self.max_failed_logins,
                window=self.failed_login_window,
                lockout=self.lockout_seconds,
                max_lockout=self.max_lockout_seconds,
                forget_after=forget,
            ),
            address_policy=LockoutPolicy(
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
        # JupyterHub adds these under /hub/, before its own; extra_handlers would do
        # the same but is deprecated (a warning at every start).
        sso = []
        if self.identity_provider == "oidc":
            from gpulab.login.sso import sso_handlers
            sso = sso_handlers()
        return [("/login", GpulabLoginHandler), *sso, *lt.api_handlers(),
                *sshkeys.api_handlers(), *self.more_api_handlers]

    def access_ended(self, username: str, user_id: int | None = None) -> None:
        """An admin ended *username*'s access: the ``on_access_ended`` callables drop
        what other parts keep for her, and the lab's identity provider no longer signs
        her in until an admin gives her access again (:meth:`access_given`)."""
        if self.sso is not None:
            self.sso.access_ended(username, user_id)
        for forget in self.on_access_ended:
            forget(username)

    def access_given(self, username: str) -> None:
        """An admin gave *username* access (issued her a login token): the lab's
        identity provider may sign her in again if an admin had ended her access."""
        if self.sso is not None:
            self.sso.access_given(username)

    async def delete_user(self, user):
        """A deleted user's login tokens and SSH keys go with her: a new user of the same
        name later is someone else (seen in review: her keys would have signed in).

        JupyterHub stops her default server before this, not her named ones, and would
        fail (a 500) after this on one that runs, her tokens and keys already gone: they
        are stopped here first, as its own stop does (her route off the proxy, then the
        server); one still starting or stopping is a 400 that changes nothing more."""
        servers = sorted((name, spawner) for name, spawner in
                         getattr(user, "spawners", {}).items() if name and spawner.active)
        busy = [f"{name} ({spawner.pending})" for name, spawner in servers if spawner.pending]
        if busy:
            raise web.HTTPError(400, f"{user.name}'s named servers {', '.join(busy)} are "
                                     f"starting or stopping: try again once they are not.")
        proxy = getattr(self.parent, "proxy", None)
        for name, _ in servers:
            if proxy is not None:
                await proxy.delete_user(user, name)
            await user.stop(name)
            self.log.info("Stopped %s's named server %s: she is being deleted", user.name, name)
        self.login_tokens.forget_user(user.name)
        self.ssh_keys.forget_user(user.name)
        for forget in self.on_access_ended:
            forget(user.name)
        if self.sso is not None:  # a new account of that name binds afresh
            self.sso.forget(user.name, getattr(user, "id", None))
        return super().delete_user(user)

    def client_address(self, request) -> str:
        return client_address(request, self.trusted)

    def normalize_username(self, username):
        """``" Alice "`` -> ``alice``; full-width and other compatibility forms fold
        to their plain letters (NFKC) before JupyterHub lowercases them."""
        return super().normalize_username(fold(username))

    async def authenticate(self, handler, data):
        data = data or {}
        username = self.normalize_username(data.get("username") or "")
        token = (data.get("password") or "").strip()
        if not getattr(handler, "accepts_token_sign_in", False):
            self.log.warning("Refusing token sign-in for %r outside the login page (%s)",
                             _display_name(username), type(handler).__name__)
            return None
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
            elif not lt.is_login_token(self.login_tokens, orm_token):
                reason = "not a login token (only tokens an admin issued sign in)"
            else:
                reason = None
        if reason:
            password_sign_in = getattr(self.sso, "sign_in", None)  # the lab's directory
            if password_sign_in is not None:
                # her password as typed: spaces at either end may be part of it
                model = await password_sign_in(handler, username, data.get("password") or "")
                if model is not None:
                    handler.signed_in_with_directory = True
                    return model
                reason += ", and not her directory password"
            # Never log the token itself, not even a prefix of it.
            self.log.warning("Failed token login for %r: %s", username, reason)
            return None
        orm_token.last_activity = utcnow(with_tz=False)
        handler.db.commit()
        return {"name": username}

    async def vouched_by_provider(self, user, handler) -> bool:
        """Whether the lab's identity provider vouches for *user* now (False without
        one, or if she never signed in there): for what needs access but is not her own
        request, such as an SSH key sign-in. Her groups and admin right follow its
        answer, as at her own requests."""
        if self.sso is None:
            return False
        vouched = await self.sso.check(user, handler)
        if isinstance(vouched, dict):
            await handler.auth_to_user(vouched, user)
        return bool(vouched)

    async def refresh_user(self, user, handler=None):
        """True while the user has a valid login token. Otherwise end their access
        (:func:`gpulab.login.tokens.end_access`) and return False: JupyterHub then
        asks a cookie session to sign in again and, with auth_refresh_strict, refuses
        token-authenticated requests. API tokens an admin made for the user through
        JupyterHub's REST API are the exception: they are kept, and a request made with
        one (or with her server's own token while she holds one) is True."""
        if not self.end_sessions_without_token:
            return True
        orm_user = getattr(user, "orm_user", user)
        db = inspect(orm_user).session
        has_token = bool(lt.login_tokens(db, self.login_tokens, orm_user))
        if self.sso is not None and user is not orm_user:
            # Signed in with the lab's identity provider: it decides (gpulab.login.sso)
            # her admin right and groups, and her access unless she has a login token.
            vouched = await self.sso.check(user, handler)
            if vouched:
                return vouched
            if vouched is False and has_token:
                return self.sso.demoted(user)
        if has_token:
            return True
        keep = lt.running_server_tokens(db, user)
        # API tokens an admin made for this user stand on their own: a request made with
        # one of them (or, while one exists, with her servers' own tokens) goes on.
        admin_made = {t.id for t in lt.admin_api_tokens(db, self.login_tokens, orm_user)}
        get_token = getattr(handler, "get_token", None)  # JupyterHub's BaseHandler
        if admin_made and get_token is not None:
            token = get_token()  # the request's Authorization token, if any
            if token is not None and token.user_id == orm_user.id and (
                    token.id in admin_made or token.id in keep):
                return True
        if lt.has_access_to_end(db, orm_user, keep | admin_made):
            ended = lt.end_access(db, self.login_tokens, orm_user, keep, admin_made)
            self.log.warning(
                "User %s has no valid login token left: ended their hub sessions, deleted "
                "API tokens %s and %d OAuth tokens", orm_user.name,
                ", ".join(ended.api_tokens) or "(none)", ended.oauth_tokens)
        else:
            self.log.debug("User %s has no valid login token: sign-in required", orm_user.name)
        if handler is not None:
            # JupyterHub 6.1.1 marks only token-authenticated requests, and its
            # refresh_auth reads the mark after a failed refresh: a cookie request would
            # end in an AttributeError (signed out all the same, with a traceback).
            compat.mark_cookie_request(handler)
        return False


# ---------------------------------------------------------------------- config


def default_trusted_proxies(settings: Mapping, environ: Mapping[str, str] = os.environ
                            ) -> list[str]:
    """gpulab's own proxy (env GPULAB_PROXY_IP, default :data:`gpulab.contract.PROXY_IP`) and the
    reverse proxies in settings ``hub.trusted_proxies``."""
    proxy_ip = environ.get("GPULAB_PROXY_IP", "").strip() or PROXY_IP
    return [proxy_ip, *settings["hub.trusted_proxies"]]


def configure_login(c, settings: Mapping, data_dir: Path, trusted_proxies: Sequence[str],
                    secrets_dir: Path | None = None, public_url: str = "") -> None:
    """Everything token login needs, on JupyterHub config object *c*; with settings
    ``login.provider: oidc`` the lab's identity provider too, with its client secret and
    the key that encrypts its tokens at rest from *secrets_dir*."""
    data_dir = Path(data_dir)
    trusted = TrustedProxies(trusted_proxies)  # refuses a bad entry before anything is set
    c.JupyterHub.authenticator_class = "gpulab-token"
    c.TokenAuthenticator.throttle_db_path = str(data_dir / THROTTLE_FILE)
    c.TokenAuthenticator.login_tokens_db_path = str(data_dir / LOGIN_TOKENS_FILE)
    c.TokenAuthenticator.ssh_keys_db_path = str(data_dir / SSH_KEYS_FILE)
    c.TokenAuthenticator.trusted_proxies = [str(n) for n in trusted.networks]
    # Only for tornado's remote_ip in the hub's log lines; it believes X-Forwarded-For
    # from any peer, so the throttle works its address out itself (client_address).
    c.JupyterHub.trusted_downstream_ips = trusted.addresses()
    # Tokens members make themselves: JupyterHub caps "expires_in": null at this and
    # refuses a longer one with 400. Admin-issued login tokens are not affected.
    c.JupyterHub.token_expires_in_max_seconds = int(settings["hub.member_token_max_age"])
    # refresh_user at most 1 s apart: 0 would turn refreshing off (handlers/base.py
    # refresh_auth). The admin's revoke resets it, so that one takes effect at once.
    c.Authenticator.auth_refresh_age = 1
    # Without a login token, token-authenticated requests are refused too: JupyterHub's
    # default lets them through on stale auth.
    c.Authenticator.auth_refresh_strict = True
    provider = settings["login.provider"]
    if provider == "none":
        return
    from gpulab.login import sso
    secrets_dir = Path(secrets_dir or data_dir)
    c.TokenAuthenticator.identity_provider = provider
    if provider == "oidc":
        sso.configure_oidc(c, settings, read_file_secret(secrets_dir / sso.CLIENT_SECRET_FILE),
                           public_url)
        c.LabOIDCAuthenticator.identities_db_path = str(data_dir / sso.IDENTITIES_FILE)
    else:
        from gpulab.login import ldap
        ldap.configure_ldap(c, settings,
                            read_file_secret(secrets_dir / ldap.BIND_PASSWORD_FILE))
        c.LabLDAPAuthenticator.identities_db_path = str(data_dir / sso.IDENTITIES_FILE)
    c.CryptKeeper.keys = [read_file_secret(secrets_dir / CRYPT_KEY_FILE)]


def read_file_secret(path: Path) -> str:
    """The secret in *path*, or a ValueError that says how to put it there."""
    try:
        value = Path(path).read_text().strip()
    except FileNotFoundError:
        raise ValueError(f"secret {path} is missing: `make secrets` creates the hub's own; "
                         "the identity provider's client secret is the one it gave "
                         "for gpulab") from None
    if not value:
        raise ValueError(f"secret {path} is empty")
    return value
