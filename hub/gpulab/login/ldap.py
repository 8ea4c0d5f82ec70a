"""Sign-in with the lab's LDAP directory (OpenLDAP, FreeIPA, Active Directory), beside login
tokens.

With settings ``login.provider: ldap`` the sign-in form at ``/hub/login`` takes a
member's directory password where it takes a login token: :class:`gpulab.login.auth.
TokenAuthenticator` tries the login token first and then the directory, behind the same
throttle. :class:`LabLDAPAuthenticator` is its ``sso`` part: a
:class:`gpulab.login.sso.ProviderPart`, so the directory's groups decide who may sign
in, admins, operators and gpulab's groups exactly as an OpenID Connect provider's do,
and are read again every ``login.refresh_every`` with the hub's own directory account
(``login.ldap_bind_dn``, password in ``secrets/ldap-bind-password``).

:class:`Directory` is the blocking part (ldap3), run in a thread with timeouts: a slow
or dead directory never stalls the hub. A member is found by ``login.ldap_user_attribute``
(``uid``) under ``login.ldap_user_base``; her groups are the ``cn`` of each
``memberOf`` value; her identity is ``entryUUID`` (``login.ldap_subject_attribute``;
``objectGUID`` on Active Directory). Her password is checked by binding as her DN and is
never kept.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import ldap3
from ldap3.core.exceptions import LDAPBindError, LDAPException
from ldap3.utils.conv import escape_filter_chars
from ldap3.utils.dn import parse_dn
from traitlets import Any

from gpulab.login.sso import PROVIDER_CHECKS, ProviderPart, configure_provider

__all__ = ["BIND_PASSWORD_FILE", "Directory", "DirectoryEntry", "LabLDAPAuthenticator",
           "configure_ldap", "group_names"]

BIND_PASSWORD_FILE = "ldap-bind-password"
TIMEOUT = 10  # seconds for connecting to the directory and for each answer
# The directory's own threads: a slow directory holds these, never the default executor
# that the hub's other work (DNS lookups among it) shares.
DIRECTORY_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpulab-ldap")


async def in_directory_thread(call, *args):
    return await asyncio.get_running_loop().run_in_executor(DIRECTORY_THREADS, call, *args)


def group_names(values) -> list[str]:
    """``cn=gpu-users,ou=groups,dc=lab`` -> ``gpu-users``; a value that is no DN stays."""
    names = []
    for value in values or ():
        try:
            names.append(parse_dn(str(value))[0][1])
        except (LDAPException, IndexError):
            names.append(str(value))
    return names


@dataclass(frozen=True)
class DirectoryEntry:
    dn: str
    name: str
    subject: str
    groups: list[str]

    def auth_state(self) -> dict:
        return {"subject": self.subject, "groups": self.groups, "dn": self.dn}


@dataclass(frozen=True)
class Directory:
    """The lab's directory, as settings login.ldap_* describe it. Blocking: call it in a
    thread."""

    url: str
    user_base: str
    bind_dn: str
    bind_password: str
    starttls: bool = True
    ca_file: str = ""
    user_attribute: str = "uid"
    user_filter: str = ""  # ANDed into the search: e.g. accounts not disabled
    groups_attribute: str = "memberOf"
    group_base: str = ""  # only groups below it count; "": any
    subject_attribute: str = "entryUUID"

    def _server(self) -> ldap3.Server:
        parts = urlsplit(self.url)
        tls = ldap3.Tls(validate=ssl.CERT_REQUIRED, ca_certs_file=self.ca_file or None)
        return ldap3.Server(parts.hostname, port=parts.port, use_ssl=parts.scheme == "ldaps",
                            tls=tls, connect_timeout=TIMEOUT, get_info=ldap3.NONE)

    def _bind(self, dn: str, password: str) -> ldap3.Connection | None:
        """A connection bound as *dn*, or None if the directory refuses the password;
        raises when the directory cannot be reached or TLS fails."""
        tls = self.starttls and not self.url.startswith("ldaps://")
        try:
            # No referrals: ldap3 would follow one to any host, with a TLS that checks no
            # certificate, and bind there as the hub (review: reproduced with two slapds).
            return ldap3.Connection(
                self._server(), user=dn, password=password, receive_timeout=TIMEOUT,
                auto_bind=ldap3.AUTO_BIND_TLS_BEFORE_BIND if tls else ldap3.AUTO_BIND_NO_TLS,
                auto_referrals=False, raise_exceptions=False)
        except LDAPBindError:
            return None

    def find(self, name: str) -> DirectoryEntry | None:
        """The member called *name*, looked up with the hub's own account; None if the
        directory has no such member (or more than one)."""
        conn = self._bind(self.bind_dn, self.bind_password)
        if conn is None:
            raise LDAPException(f"the directory refused the hub's own account {self.bind_dn} "
                                f"(settings login.ldap_bind_dn, secrets/{BIND_PASSWORD_FILE})")
        try:
            match = f"({self.user_attribute}={escape_filter_chars(name)})"
            conn.search(self.user_base,
                        f"(&{match}{self.user_filter})" if self.user_filter else match,
                        search_scope=ldap3.SUBTREE,
                        attributes=[self.user_attribute, self.groups_attribute,
                                    self.subject_attribute])
            if conn.result.get("result") not in (0, 32):  # success, no such object
                # (10, a referral, too: the member is elsewhere, where the hub does not go)
                raise LDAPException(f"search failed: {conn.result.get('description')} "
                                    f"{conn.result.get('message')}".strip())
            if len(conn.entries) != 1:
                return None
            entry = conn.entries[0]
            attrs = entry.entry_attributes_as_dict
            found = [str(v) for v in attrs.get(self.user_attribute) or []]
            subject = [str(v) for v in attrs.get(self.subject_attribute) or []]
            if not subject:
                raise LDAPException(f"{entry.entry_dn} has no {self.subject_attribute} "
                                    "(settings login.ldap_subject_attribute)")
            return DirectoryEntry(dn=entry.entry_dn, name=found[0] if found else name,
                                  subject=subject[0],
                                  groups=group_names(self._in_group_base(
                                      attrs.get(self.groups_attribute))))
        finally:
            conn.unbind()

    def _in_group_base(self, values) -> list[str]:
        """Her group DNs below group_base (any without one): a group named like an
        allowed one elsewhere in the directory does not count."""
        values = [str(v) for v in values or ()]
        if not self.group_base:
            return values
        base = [(k.lower(), v.lower()) for k, v, _ in parse_dn(self.group_base)]
        kept = []
        for value in values:
            try:
                parts = [(k.lower(), v.lower()) for k, v, _ in parse_dn(value)]
            except LDAPException:
                continue
            if len(parts) > len(base) and parts[-len(base):] == base:
                kept.append(value)
        return kept

    def sign_in(self, name: str, password: str) -> DirectoryEntry | None:
        """The member called *name* if *password* is hers, else None."""
        if not password or not password.strip():
            return None  # an empty password is an unauthenticated bind: never a sign-in
        entry = self.find(name)
        if entry is None:
            return None
        conn = self._bind(entry.dn, password)
        if conn is None:
            return None
        conn.unbind()
        return entry


class LabLDAPAuthenticator(ProviderPart):
    """The lab's LDAP directory, as the ``sso`` part of gpulab's TokenAuthenticator:
    never the hub's ``authenticator_class`` itself. It has no routes: the token form
    takes directory passwords (:meth:`sign_in`)."""

    directory = Any(help="A Directory from settings login.ldap_*.").tag(config=True)

    def identity_of(self, auth_state):
        return auth_state.get("subject"), list(auth_state.get("groups") or [])

    async def sign_in(self, handler, username: str, password: str) -> dict | None:
        """An auth model if *password* is *username*'s in the directory and she may sign
        in (refused with the reason otherwise: HTTPError 403); None for a wrong name or
        password. Her groups follow with :meth:`signed_in`."""
        try:
            entry = await in_directory_thread(self.directory.sign_in, username, password)
        except LDAPException as e:
            PROVIDER_CHECKS.labels("unreachable").inc()
            self.log.error("The lab's directory could not be asked about %s: %s", username, e)
            return None
        PROVIDER_CHECKS.labels("vouched" if entry is not None else "not_vouched").inc()
        if entry is None:
            return None
        name = self.normalize_username(entry.name)
        if name != username:
            self.log.warning("Sign-in refused for %s: the directory calls her %r", username,
                             entry.name)
            return None
        state = entry.auth_state()
        self.validate_username(name)
        self.refuse_unless_allowed(name, state)
        self.bind_identity(name, state, handler.find_user(name))
        return {"name": name, "admin": self.is_admin(name, state), "auth_state": state}

    async def signed_in(self, user) -> None:
        """Right after her sign-in: her groups as the directory says."""
        state = await user.get_auth_state() or {}
        user.sync_groups(self.groups_at_sign_in(user.name, state, user))
        self.vouched_now(user)

    async def ask_provider(self, user, handler):
        entry = await in_directory_thread(self.directory.find, user.name)
        if entry is None:
            return "not in the directory any more"
        return {"name": self.normalize_username(entry.name), "auth_state": entry.auth_state()}


def configure_ldap(c, settings: Mapping, bind_password: str) -> None:
    """The directory part, on JupyterHub config object *c* (settings ``login.*``)."""
    o = c.LabLDAPAuthenticator
    configure_provider(o, settings)
    o.directory = Directory(
        url=settings["login.ldap_url"], user_base=settings["login.ldap_user_base"],
        bind_dn=settings["login.ldap_bind_dn"], bind_password=bind_password,
        starttls=settings["login.ldap_starttls"], ca_file=settings["login.ldap_ca_file"],
        user_attribute=settings["login.ldap_user_attribute"],
        user_filter=settings["login.ldap_user_filter"],
        groups_attribute=settings["login.ldap_groups_attribute"],
        group_base=settings["login.ldap_group_base"],
        subject_attribute=settings["login.ldap_subject_attribute"])
