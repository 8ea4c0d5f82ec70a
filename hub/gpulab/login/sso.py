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
logs why at each check.

One hub account per name: the first provider identity (``sub``) that signs in as a name
is bound to it, and a different identity with the same name is refused. A member with a
login token and the same name signs in either way.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from oauthenticator.generic import GenericOAuthenticator
from oauthenticator.oauth2 import OAuthCallbackHandler, OAuthLoginHandler
from tornado import web
from traitlets import Any, Float, Set, Unicode, default

from gpulab.login.roles import OPERATORS_GROUP
from gpulab.login.usernames import USERNAME_PATTERN, USERNAME_RULES, fold

__all__ = ["GroupMapping", "LabOIDCAuthenticator", "Verdict", "configure_oidc",
           "groups_after", "sso_handlers"]

LOGIN_PATH = "/oidc/oauth_login"
CALLBACK_PATH = "/oidc/oauth_callback"
CLIENT_SECRET_FILE = "oidc-client-secret"


# ---------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Verdict:
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

    def verdict(self, idp_groups: Iterable[str]) -> Verdict:
        idp = set(idp_groups)
        hub = {g for name in idp for g in self.groups.get(name, ())}
        if idp & self.operators:
            hub.add(OPERATORS_GROUP)
        return Verdict(allowed=bool(idp & self.allowed), admin=bool(idp & self.admins),
                       groups=frozenset(hub))


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


class LabOIDCAuthenticator(GenericOAuthenticator):
    """The lab's OpenID Connect provider, as the ``sso`` part of gpulab's
    TokenAuthenticator: never the hub's ``authenticator_class`` itself."""

    login_service = Unicode("Lab sign-in", help="The button's label (settings login.label).",
                            ).tag(config=True)
    groups_claim = Unicode("groups", help="The userinfo claim that lists the member's groups.",
                           ).tag(config=True)
    mapping = Any(help="A GroupMapping from settings login.*.").tag(config=True)
    hub_admins = Set(Unicode(), help="settings hub.admins: admins whatever the provider says.",
                     ).tag(config=True)
    hub_operators = Set(Unicode(), help="settings hub.operators: operators whatever the "
                        "provider says.").tag(config=True)
    refresh_every = Float(300, help="Seconds between asking the provider again about a "
                          "signed-in member (settings login.refresh_every).").tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._checked: dict[str, float] = {}  # name -> when the provider last vouched

    @default("username_pattern")
    def _username_pattern_default(self):
        return USERNAME_PATTERN

    @default("username_regex")
    def _username_regex_default(self):
        # JupyterHub compiles the pattern only when it is *set*; a default needs this
        # (without it, a provider's "Not Valid" became the hub user "not valid": seen).
        return re.compile(self.username_pattern)

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

    def normalize_username(self, username):
        return super().normalize_username(fold(username))

    # ------------------------------------------------------------------ sign-in

    def _verdict(self, auth_state: Mapping) -> Verdict:
        userinfo = auth_state.get("oauth_user") or {}
        return self.mapping.verdict(idp_groups(userinfo, self.groups_claim))

    async def update_auth_model(self, auth_model):
        verdict = self._verdict(auth_model["auth_state"])
        auth_model["admin"] = verdict.admin or auth_model["name"] in self.hub_admins
        return auth_model

    async def check_allowed(self, username, auth_model):
        if auth_model is None:
            return True
        if not self._verdict(auth_model["auth_state"]).allowed:
            self.log.warning("Sign-in refused for %s: in none of login.allowed_groups %s",
                             username, sorted(self.mapping.allowed))
            raise web.HTTPError(403, f"Your lab account {username} is in none of the groups "
                                     "that may use this GPU hub. Ask the lab admin to add you.")
        return True

    def validate_username(self, username):
        """A name gpulab cannot use is refused with the reason, not JupyterHub's "not
        authorized" (it is checked right after the provider answers)."""
        if super().validate_username(username):
            return True
        raise web.HTTPError(
                403, f"The lab's sign-in gave the username {username!r}, which gpulab cannot "
                     f"use: {USERNAME_RULES} Ask the lab admin (settings "
                     "login.oidc_username_claim).")

    async def _after_sign_in(self, authenticator, handler, authentication):
        """Binds the name to the provider's identity and sets her groups."""
        name = authentication["name"]
        sub = (authentication["auth_state"].get("oauth_user") or {}).get("sub")
        user = handler.find_user(name)
        current: list[str] = []
        if user is not None:
            current = [g.name for g in user.groups]
            before = await user.get_auth_state() or {}
            bound = (before.get("oauth_user") or {}).get("sub")
            if bound and sub != bound:
                self.log.warning("Sign-in refused for %s: a different identity of the "
                                 "provider (sub %r) than the one bound to it", name, sub)
                raise web.HTTPError(403, f"The username {name} belongs to another "
                                         "identity of the lab's sign-in. Ask the lab admin.")
        verdict = self._verdict(authentication["auth_state"])
        wanted = set(verdict.groups)
        if name in self.hub_operators:
            wanted.add(OPERATORS_GROUP)
        authentication["groups"] = groups_after(current, self.mapping.managed, wanted)
        self._checked[name] = time.monotonic()
        return authentication

    # ------------------------------------------------------------------ later checks

    def is_identity(self, auth_state: Mapping | None) -> bool:
        return bool(auth_state and (auth_state.get("oauth_user") or {}).get("sub"))

    async def check(self, user, handler=None):
        """For TokenAuthenticator.refresh_user: None if *user* never signed in here;
        True if the provider vouched for her within refresh_every; a refreshed auth
        model (admin, auth_state) after it vouched again (her groups updated); False if
        it no longer does."""
        last = self._checked.get(user.name)
        if last is not None and time.monotonic() - last < self.refresh_every:
            return True
        auth_state = await user.get_auth_state()
        if not self.is_identity(auth_state):
            return None
        try:
            model = await GenericOAuthenticator.refresh_user(self, user, handler)
        except Exception as e:  # unreachable, 5xx, bad answer: keep access, say why
            self.log.warning("Could not ask the lab's sign-in about %s (%s); keeping access "
                             "until it answers", user.name, e)
            return True
        if not model:
            self.log.warning("The lab's sign-in no longer vouches for %s (removed, or its "
                             "token refused)", user.name)
            return self._forget(user.name)
        if model["name"] != user.name:
            self.log.warning("The lab's sign-in now names %s %s", user.name, model["name"])
            return self._forget(user.name)
        verdict = self._verdict(model["auth_state"])
        if not verdict.allowed:
            self.log.warning("%s is in none of login.allowed_groups %s any more",
                             user.name, sorted(self.mapping.allowed))
            return self._forget(user.name)
        wanted = set(verdict.groups)
        if user.name in self.hub_operators:
            wanted.add(OPERATORS_GROUP)
        user.sync_groups(groups_after([g.name for g in user.groups], self.mapping.managed,
                                      wanted))
        self._checked[user.name] = time.monotonic()
        return {"name": user.name, "admin": model["admin"], "auth_state": model["auth_state"]}

    def _forget(self, name: str) -> bool:
        self._checked.pop(name, None)
        return False

    async def refresh_user(self, user, handler=None, **kwargs):
        # Only the hub's authenticator refreshes (TokenAuthenticator.refresh_user, which
        # calls check); a refresh on the callback route must not skip its rules.
        return await self.parent.refresh_user(user, handler)

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


def configure_oidc(c, settings: Mapping, client_secret: str, public_url: str) -> None:
    """The provider part, on JupyterHub config object *c* (settings ``login.*``)."""
    o = c.LabOIDCAuthenticator
    o.login_service = settings["login.label"]
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
    o.mapping = GroupMapping.from_settings(settings)
    o.hub_admins = set(settings["hub.admins"])
    o.hub_operators = set(settings["hub.operators"])
    o.refresh_every = float(settings["login.refresh_every"])
    o.allow_all = False
