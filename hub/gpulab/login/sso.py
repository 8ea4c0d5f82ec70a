"""Single sign-on: members sign in with the lab's OpenID Connect provider, beside login tokens.

The hub's authenticator stays :class:`gpulab.login.auth.TokenAuthenticator` (the token
form at ``/hub/login``, the throttle, the login-token and SSH-key APIs). With settings
``login.provider: oidc`` it holds a :class:`LabOIDCAuthenticator` as its ``sso`` part,
served at ``/hub/oidc/oauth_login`` and ``/hub/oidc/oauth_callback`` (the redirect URI the
lab registers), and the sign-in page offers a "Sign in with <login.label>" button.

What the provider says decides, through :class:`GroupMapping` (pure):

* who may sign in (``login.allowed_groups``);
* who is an admin (``login.admin_groups``, besides ``hub.admins``) and an operator
  (``login.operator_groups``, besides ``hub.operators``);
* which of gpulab's groups (gpus.yaml ``groups:``) a member is in (``login.groups``):
  exactly those her provider groups map to. Groups the mapping does not name are left as
  the admin set them.

And it keeps deciding: at most every ``login.refresh_every`` while a member uses the hub,
:meth:`LabOIDCAuthenticator.check` asks the provider's userinfo endpoint again with her
access token. A member removed from the directory (the provider refuses her token) or
from every allowed group loses access as a revoked login token does
(:func:`gpulab.login.tokens.end_access`): her hub session, her API tokens and her
servers' sessions end. While the provider cannot be reached, she keeps access and the hub
logs why at each check, for ``login.unreachable_grace`` from when it last vouched for her
(then her access ends likewise: a removed member keeps no access for as long as the hub
cannot ask, whoever cut it off).

One hub account per name: the first provider identity (``sub``) that signs in as a name
is bound to it, and a different identity with the same name is refused. A member with a
login token and the same name signs in either way.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from jupyterhub.auth import Authenticator
from oauthenticator.generic import GenericOAuthenticator
from oauthenticator.oauth2 import OAuthCallbackHandler, OAuthLoginHandler
from prometheus_client import Counter
from tornado import web
from traitlets import Any, Bool, Float, Instance, Set, Unicode, default

from gpulab.login.identities import IdentityStore
from gpulab.login.roles import OPERATORS_GROUP
from gpulab.login.usernames import USERNAME_PATTERN, USERNAME_RULES, fold
from gpulab.settings import duration_text

__all__ = ["GroupMapping", "LabOIDCAuthenticator", "ProviderPart", "GroupsVerdict",
           "configure_oidc", "configure_provider", "groups_after", "sso_handlers"]

# What the hub's checks with the provider found, on /hub/metrics: Prometheus alerts when
# it could not be asked at all for a while (GpulabLoginProviderUnreachable), because
# signed-in members keep access meanwhile, removed ones too.
PROVIDER_CHECKS = Counter(
    "gpulab_login_provider_checks",
    "The hub's questions to the lab's identity provider (sign-ins with a directory "
    "password, and checks of signed-in members every login.refresh_every), by what came "
    "of them: vouched, not_vouched (removed, out of the allowed groups, ...) or "
    "unreachable (no answer, an error, the hub's own directory account refused).",
    ["result"])
for _result in ("vouched", "not_vouched", "unreachable"):
    PROVIDER_CHECKS.labels(_result)  # every series from the start, at 0

LOGIN_PATH = "/oidc/oauth_login"
CALLBACK_PATH = "/oidc/oauth_callback"
CLIENT_SECRET_FILE = "oidc-client-secret"
IDENTITIES_FILE = "gpulab-identities.sqlite"


# ---------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class GroupsVerdict:
    """What the provider's groups for one member mean in gpulab."""

    allowed: bool
    admin: bool
    groups: frozenset[str]  # gpulab groups she is in, of those the mapping decides


@dataclass(frozen=True)
class GroupMapping:
    """``login.allowed_groups``, ``admin_groups``, ``operator_groups`` and ``groups``."""

    allowed: frozenset[str]
    admins: frozenset[str] = frozenset()
    operators: frozenset[str] = frozenset()
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Mapping) -> GroupMapping:
        return cls(allowed=frozenset(settings["login.allowed_groups"]),
                   admins=frozenset(settings["login.admin_groups"]),
                   operators=frozenset(settings["login.operator_groups"]),
                   groups=dict(settings["login.groups"]))

    @property
    def managed(self) -> frozenset[str]:
        """The gpulab groups whose members the provider decides."""
        targets = {g for names in self.groups.values() for g in names}
        if self.operators:
            targets.add(OPERATORS_GROUP)
        return frozenset(targets)

    def verdict(self, idp_groups: Iterable[str]) -> GroupsVerdict:
        idp = set(idp_groups)
        hub = {g for name in idp for g in self.groups.get(name, ())}
        if idp & self.operators:
            hub.add(OPERATORS_GROUP)
        return GroupsVerdict(allowed=bool(idp & self.allowed), admin=bool(idp & self.admins),
                       groups=frozenset(hub))


def keep_auth_state_unless_given(authenticator, authenticated: Mapping, existing):
    """JupyterHub saves what a sign-in or refresh returns as auth_state, None included:
    a sign-in with a login token would wipe the provider's tokens. Keep them then."""
    given = authenticated.get("auth_state")
    return existing if given is None else given


def groups_after(current: Iterable[str], managed: Iterable[str], wanted: Iterable[str]
                 ) -> list[str]:
    """A member's gpulab groups after a check: the ones the mapping does not manage stay,
    the managed ones are exactly *wanted*."""
    managed = set(managed)
    return sorted({g for g in current if g not in managed} | (set(wanted) & managed))


def idp_groups(userinfo: Mapping, claim: str) -> list[str]:
    """The groups in a userinfo answer's *claim* (a list, or one name), [] if absent."""
    value = userinfo.get(claim)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


# ---------------------------------------------------------------------- the authenticator


class ProviderPart(Authenticator):
    """What every identity provider part of gpulab's TokenAuthenticator does alike: bind
    names to the provider's identities, map its groups, and ask it again every
    ``refresh_every``. A subclass says what an identity is in its auth state
    (:meth:`identity_of`) and how to ask the provider about a member
    (:meth:`ask_provider`)."""

    login_service = Unicode("Lab sign-in", help="The provider's name on the sign-in page "
                            "(settings login.label).").tag(config=True)
    mapping = Any(help="A GroupMapping from settings login.*.").tag(config=True)
    hub_admins = Set(Unicode(), help="settings hub.admins: admins whatever the provider says.",
                     ).tag(config=True)
    hub_operators = Set(Unicode(), help="settings hub.operators: operators whatever the "
                        "provider says.").tag(config=True)
    refresh_every = Float(300, help="Seconds between asking the provider again about a "
                          "signed-in member (settings login.refresh_every).").tag(config=True)
    unreachable_grace = Float(
        86400, help="Seconds a signed-in member keeps access while the provider cannot be "
        "asked, from when it last vouched for her; 0: no limit (settings "
        "login.unreachable_grace).").tag(config=True)
    link_existing_accounts = Bool(
        False, help="""Let the provider's identity of a name take over a hub account of
        that name that exists already and never signed in there (settings
        login.link_existing_accounts). Off: such an account is refused, so that whoever
        the provider calls "admin" does not become the hub's admin.""").tag(config=True)
    identities_db_path = Unicode(
        f"/srv/jupyterhub/{IDENTITIES_FILE}",
        help="gpulab.login.identities' file, next to the hub database.").tag(config=True)
    identities = Instance(IdentityStore, help="From identities_db_path.")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # user id -> (when, what check() decided): the provider is asked at most every
        # refresh_every per member, whatever she does meanwhile.
        self._checked: dict[int, tuple[float, object]] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    @default("identities")
    def _identities_default(self):
        return IdentityStore(self.identities_db_path)

    @default("username_pattern")
    def _username_pattern_default(self):
        return USERNAME_PATTERN

    @default("username_regex")
    def _username_regex_default(self):
        # JupyterHub compiles the pattern only when it is *set*; a default needs this
        # (without it, a provider's "Not Valid" became the hub user "not valid": seen).
        return re.compile(self.username_pattern)

    @default("reconcile_auth_state_hook")
    def _reconcile_default(self):
        return keep_auth_state_unless_given

    def normalize_username(self, username):
        return super().normalize_username(fold(username))

    def validate_username(self, username):
        """A name gpulab cannot use is refused with the reason, not JupyterHub's "not
        authorized" (it is checked right after the provider answers)."""
        if super().validate_username(username):
            return True
        raise web.HTTPError(
                403, f"The lab's sign-in gave the username {username!r}, which gpulab cannot "
                     f"use: {USERNAME_RULES} Ask the lab admin.")

    # ------------------------------------------------------------------ what a subclass says

    def identity_of(self, auth_state: Mapping) -> tuple[str | None, list[str]]:
        """(the provider's subject, the provider's groups) in an auth state it gave."""
        raise NotImplementedError

    async def ask_provider(self, user, handler) -> dict | str:
        """A fresh auth model (name, auth_state) if the provider still knows *user*, or
        why not; raises if it cannot be asked."""
        raise NotImplementedError

    # ------------------------------------------------------------------ decisions

    def _verdict(self, auth_state: Mapping) -> GroupsVerdict:
        return self.mapping.verdict(self.identity_of(auth_state)[1])

    def _wanted_groups(self, name: str, verdict: GroupsVerdict | None) -> set[str]:
        wanted = set(verdict.groups) if verdict else set()
        if name in self.hub_operators:
            wanted.add(OPERATORS_GROUP)
        return wanted

    def is_admin(self, name: str, auth_state: Mapping) -> bool:
        return self._verdict(auth_state).admin or name in self.hub_admins

    def refuse_unless_allowed(self, username: str, auth_state: Mapping) -> None:
        if not self._verdict(auth_state).allowed:
            self.log.warning("Sign-in refused for %s: in none of login.allowed_groups %s",
                             username, sorted(self.mapping.allowed))
            raise web.HTTPError(403, f"Your lab account {username} is in none of the groups "
                                     "that may use this GPU hub. Ask the lab admin to add you.")

    # ------------------------------------------------------------------ sign-in

    def bind_identity(self, name: str, auth_state: Mapping, user) -> None:
        """Binds *name* to the provider's identity in *auth_state*, or refuses the sign-in
        (*user*: the hub's account of that name, or None)."""
        sub = self.identity_of(auth_state)[0]
        if not isinstance(sub, str) or not sub:
            raise web.HTTPError(403, "The lab's sign-in did not say who you are (no subject "
                                     "in its answer). Ask the lab admin.")
        if self.identities.is_ended(name):
            self.log.warning("Sign-in refused for %s: an admin ended her access", name)
            raise web.HTTPError(403, f"An admin ended the access of {name} to this hub. "
                                     "Ask the lab admin.")
        bound = self.identities.subject(name)
        if bound is not None and bound != sub:
            self.log.warning("Sign-in refused for %s: a different identity of the provider "
                             "(%r) than the one bound to it", name, sub)
            raise web.HTTPError(403, f"The username {name} belongs to another identity of "
                                     "the lab's sign-in. Ask the lab admin.")
        if bound is None and user is not None and not self.link_existing_accounts:
            self.log.warning("Sign-in refused for %s: the account exists and never signed in "
                             "with the lab's provider (login.link_existing_accounts: false)",
                             name)
            raise web.HTTPError(403, f"The hub has an account {name} already that never "
                                     "signed in with the lab's account. Ask the lab admin "
                                     "to link it (settings login.link_existing_accounts).")
        self.identities.bind(name, sub)

    def groups_at_sign_in(self, name: str, auth_state: Mapping, user) -> list[str]:
        """Her gpulab groups once signed in (*user*: her account, or None)."""
        current = [g.name for g in user.groups] if user is not None else []
        return groups_after(current, self.mapping.managed,
                            self._wanted_groups(name, self._verdict(auth_state)))

    def vouched_now(self, user) -> None:
        """She just signed in: no need to ask the provider again for refresh_every."""
        self._checked[user.id] = (time.monotonic(), True)
        self.identities.vouched(user.name)

    # ------------------------------------------------------------------ later checks

    async def check(self, user, handler=None):
        """For TokenAuthenticator.refresh_user, at most every refresh_every per member:
        None if *user* never signed in with the provider; True (the provider vouches,
        nothing changed) or an auth model to apply (admin, groups, fresh auth state);
        False if it no longer vouches for her (removed from the directory or from every
        allowed group, or an admin ended her access). Her provider-given groups go
        with a False."""
        lock = self._locks.setdefault(user.id, asyncio.Lock())
        async with lock:  # one question at a time: a refresh token may be used only once
            cached = self._checked.get(user.id)
            if cached is not None and time.monotonic() - cached[0] < self.refresh_every:
                return cached[1]
            decided = await self._ask(user, handler)
            self._checked[user.id] = (time.monotonic(), bool(decided) if decided else decided)
            return decided

    async def _ask(self, user, handler):
        if self.identities.subject(user.name) is None:
            return None
        if self.identities.is_ended(user.name):
            return self._not_vouched(user, "an admin ended her access")
        try:
            model = await self.ask_provider(user, handler)
        except Exception as e:  # unreachable, 5xx, bad answer: keep access a while, say why
            PROVIDER_CHECKS.labels("unreachable").inc()
            since = time.time() - self.identities.grace_from(user.name)
            if self.unreachable_grace and since >= self.unreachable_grace:
                return self._not_vouched(
                    user, f"it could not be asked ({e}) and last vouched for her "
                          f"{duration_text(since)} ago, longer than login.unreachable_grace "
                          f"({duration_text(self.unreachable_grace)})")
            self.log.warning("Could not ask the lab's sign-in about %s (%s); keeping access "
                             "until it answers, for %s at most", user.name, e,
                             duration_text(self.unreachable_grace - since)
                             if self.unreachable_grace else "ever")
            return True
        if isinstance(model, str):
            return self._not_vouched(user, model)
        if model["name"] != user.name:
            return self._not_vouched(user, f"the provider now names her {model['name']}")
        if self.identity_of(model["auth_state"])[0] != self.identities.subject(user.name):
            return self._not_vouched(user, "the provider's answer is for another identity")
        verdict = self._verdict(model["auth_state"])
        if not verdict.allowed:
            return self._not_vouched(user, "in none of login.allowed_groups "
                                           f"{sorted(self.mapping.allowed)} any more")
        groups = groups_after([g.name for g in user.groups], self.mapping.managed,
                              self._wanted_groups(user.name, verdict))
        user.sync_groups(groups)
        PROVIDER_CHECKS.labels("vouched").inc()
        self.identities.vouched(user.name)
        return {"name": user.name, "admin": self.is_admin(user.name, model["auth_state"]),
                "groups": groups, "auth_state": model["auth_state"]}

    def _not_vouched(self, user, why: str) -> bool:
        PROVIDER_CHECKS.labels("not_vouched").inc()
        self.log.warning("The lab's sign-in no longer vouches for %s: %s", user.name, why)
        user.sync_groups(groups_after([g.name for g in user.groups], self.mapping.managed,
                                      self._wanted_groups(user.name, None)))
        return False

    def demoted(self, user) -> dict | bool:
        """For a member with a login token whom the provider no longer vouches for: her
        admin right as hub.admins alone says (her provider groups went in check);
        True if that changes nothing."""
        admin = user.name in self.hub_admins
        if bool(user.admin) == admin:
            return True
        return {"name": user.name, "admin": admin,
                "groups": [g.name for g in user.groups]}

    def access_ended(self, name: str, user_id: int | None = None) -> None:
        """An admin ended her access: the provider's word no longer lets her in."""
        self.identities.end(name)
        self._checked.pop(user_id, None)

    def access_given(self, name: str) -> None:
        self.identities.restore(name)

    def forget(self, name: str, user_id: int | None = None) -> None:
        """Her account was deleted: its name binds afresh."""
        self.identities.forget(name)
        self._checked.pop(user_id, None)
        self._locks.pop(user_id, None)

    async def refresh_user(self, user, handler=None, **kwargs):
        # Only the hub's authenticator refreshes (TokenAuthenticator.refresh_user, which
        # calls check); a refresh on a route of this part must not skip its rules.
        return await self.parent.refresh_user(user, handler)


class LabOIDCAuthenticator(ProviderPart, GenericOAuthenticator):
    """The lab's OpenID Connect provider, as the ``sso`` part of gpulab's
    TokenAuthenticator: never the hub's ``authenticator_class`` itself. Its routes:
    :func:`sso_handlers`; the sign-in page's button leads to the first."""

    button_path = LOGIN_PATH.lstrip("/")

    groups_claim = Unicode("groups", help="The userinfo claim that lists the member's groups.",
                           ).tag(config=True)

    @default("manage_groups")
    def _manage_groups_default(self):
        # At sign-in, JupyterHub sets her groups to the list post_auth_hook makes:
        # the unmanaged ones as they were, the managed ones from the provider.
        return True

    @default("enable_auth_state")
    def _enable_auth_state_default(self):
        return True  # her access token, for asking the provider again

    @default("post_auth_hook")
    def _post_auth_hook_default(self):
        return self._after_sign_in

    def identity_of(self, auth_state):
        userinfo = auth_state.get("oauth_user") or {}
        return userinfo.get("sub"), idp_groups(userinfo, self.groups_claim)

    _said_no_refresh = False  # _warn_without_refresh_token said it

    async def update_auth_model(self, auth_model):
        auth_model["admin"] = self.is_admin(auth_model["name"], auth_model["auth_state"])
        return auth_model

    async def check_allowed(self, username, auth_model):
        if auth_model is not None:
            self.refuse_unless_allowed(username, auth_model["auth_state"])
        return True

    async def _after_sign_in(self, authenticator, handler, authentication):
        """Binds the name to the provider's identity (or refuses another one) and sets
        her groups."""
        name, state = authentication["name"], authentication["auth_state"]
        user = handler.find_user(name)
        self.bind_identity(name, state, user)
        authentication["groups"] = self.groups_at_sign_in(name, state, user)
        if user is not None:
            self.vouched_now(user)
        PROVIDER_CHECKS.labels("vouched").inc()  # the provider answered
        self._warn_without_refresh_token(state)
        return authentication

    def _warn_without_refresh_token(self, auth_state: Mapping) -> None:
        """Once per hub process: an access token that expires with no refresh token to
        renew it ends the member's access at the first check after it expires, as if the
        provider had removed her."""
        response = auth_state.get("token_response") or {}
        if self._said_no_refresh or auth_state.get("refresh_token") \
                or not response.get("expires_in"):
            return
        self._said_no_refresh = True
        self.log.warning(
            "The lab's sign-in gave no refresh token with an access token that expires in "
            "%s: a member's access ends at the first check after it expires (every "
            "login.refresh_every), and she must sign in again. Let the provider give "
            "gpulab's client refresh tokens (some need offline_access in "
            "login.oidc_scopes).", duration_text(float(response["expires_in"])))

    async def ask_provider(self, user, handler):
        if not await user.get_auth_state():
            return "no readable sign-in state (crypt key changed?)"
        model = await GenericOAuthenticator.refresh_user(self, user, handler)
        return model or "removed, or its token refused"

    def get_callback_url(self, handler=None):
        if self.oauth_callback_url:
            return self.oauth_callback_url
        # oauthenticator would guess /hub/oauth_callback; this part's is under /hub/oidc/
        return (f"{handler.request.protocol}://{handler.request.host}"
                f"{handler.hub.base_url}{CALLBACK_PATH.lstrip('/')}")


# ---------------------------------------------------------------------- routes


class _OnTheSsoPart:
    """Handlers whose ``self.authenticator`` is the hub authenticator's ``sso`` part."""

    @property
    def authenticator(self):
        return self.settings["authenticator"].sso


class SsoLoginHandler(_OnTheSsoPart, OAuthLoginHandler):
    pass


class SsoCallbackHandler(_OnTheSsoPart, OAuthCallbackHandler):
    pass


def sso_handlers() -> list[tuple[str, type]]:
    return [(LOGIN_PATH, SsoLoginHandler), (CALLBACK_PATH, SsoCallbackHandler)]


# ---------------------------------------------------------------------- config


def configure_provider(o, settings: Mapping) -> None:
    """What every provider part takes from settings login.* (*o*: its config section)."""
    o.login_service = settings["login.label"]
    o.mapping = GroupMapping.from_settings(settings)
    o.hub_admins = set(settings["hub.admins"])
    o.hub_operators = set(settings["hub.operators"])
    o.refresh_every = float(settings["login.refresh_every"])
    o.unreachable_grace = float(settings["login.unreachable_grace"])
    o.link_existing_accounts = bool(settings["login.link_existing_accounts"])


def configure_oidc(c, settings: Mapping, client_secret: str, public_url: str) -> None:
    """The provider part, on JupyterHub config object *c* (settings ``login.*``)."""
    o = c.LabOIDCAuthenticator
    configure_provider(o, settings)
    o.authorize_url = settings["login.oidc_authorize_url"]
    o.token_url = settings["login.oidc_token_url"]
    o.userdata_url = settings["login.oidc_userinfo_url"]
    o.client_id = settings["login.oidc_client_id"]
    o.client_secret = client_secret
    o.scope = list(settings["login.oidc_scopes"])
    o.username_claim = settings["login.oidc_username_claim"]
    o.groups_claim = settings["login.oidc_groups_claim"]
    if settings["login.oidc_ca_file"]:
        o.http_request_kwargs = {"ca_certs": settings["login.oidc_ca_file"]}
    if public_url:
        o.oauth_callback_url = public_url.rstrip("/") + "/hub" + CALLBACK_PATH
    o.allow_all = False
