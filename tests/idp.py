"""A real OpenID Connect provider for the tests: npm's oidc-provider (tests/idp/), run with Node.

:class:`OidcProvider` starts ``tests/idp/oidc_provider.mjs`` on a loopback port, waits for
its discovery document, and stops it by its PID. Its accounts live in a JSON file that it
reads at every lookup: :meth:`OidcProvider.set_accounts` is "the lab's directory changed".
``make test-idp`` installs the npm package (``npm ci --prefix tests/idp``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from ldap3.core.exceptions import LDAPException

from tests.ports import free_port

HERE = Path(__file__).resolve().parent / "idp"
CLIENT_ID = "gpulab"


def missing() -> str | None:
    """Why the provider cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed (make test-idp installs it)"
    if not (HERE / "node_modules" / "oidc-provider").is_dir():
        return "tests/idp/node_modules is missing: make test-idp (npm ci --prefix tests/idp)"
    return None


@dataclass
class OidcProvider:
    run_dir: Path
    redirect_uris: list[str]
    host: str = "127.0.0.1"  # where it listens; its URLs name it
    port: int = field(default_factory=free_port)
    client_secret: str = field(default_factory=lambda: secrets.token_hex(24))
    access_ttl: int | None = None  # seconds an access token lasts (None: an hour)
    refresh_tokens: bool = False  # whether a sign-in also gets a refresh token
    process: subprocess.Popen | None = None

    @property
    def issuer(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def accounts_file(self) -> Path:
        return self.run_dir / "accounts.json"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "oidc.log"

    def set_accounts(self, accounts: dict) -> None:
        """The directory: {name: {"password", "groups", ["username"]}}; atomic."""
        tmp = self.accounts_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(accounts))
        tmp.replace(self.accounts_file)

    def settings(self) -> dict:
        """settings login.* for a hub that signs in here."""
        return {"login.provider": "oidc",
                "login.oidc_authorize_url": f"{self.issuer}/auth",
                "login.oidc_token_url": f"{self.issuer}/token",
                "login.oidc_userinfo_url": f"{self.issuer}/me",
                "login.oidc_client_id": CLIENT_ID,
                "login.oidc_scopes": ("openid", "profile", "email", "groups")}

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self, timeout: float = 20) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not self.accounts_file.exists():
            self.set_accounts({})
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "OIDC_HOST": self.host,
               "OIDC_PORT": str(self.port),
               "OIDC_ACCOUNTS": str(self.accounts_file), "OIDC_CLIENT_ID": CLIENT_ID,
               "OIDC_CLIENT_SECRET": self.client_secret,
               "OIDC_REDIRECT_URIS": ",".join(self.redirect_uris),
               "OIDC_REFRESH_TOKENS": "1" if self.refresh_tokens else "0"}
        if self.access_ttl is not None:
            env["OIDC_ACCESS_TTL"] = str(self.access_ttl)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(["node", str(HERE / "oidc_provider.mjs")],
                                            env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"oidc-provider exited with {self.process.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                r = requests.get(f"{self.issuer}/.well-known/openid-configuration", timeout=2)
                if r.status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"oidc-provider did not answer within {timeout} s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def require() -> None:
    """Skip (a failure under CI=true, tests/conftest.py) when the provider cannot run."""
    why = missing()
    if why:
        pytest.skip(why)


# ---------------------------------------------------------------------- LDAP

LDAP_SUFFIX = "dc=lab,dc=example"
LDAP_ADMIN = f"cn=admin,{LDAP_SUFFIX}"
PEOPLE = f"ou=people,{LDAP_SUFFIX}"
GROUPS = f"ou=groups,{LDAP_SUFFIX}"
SERVICE = f"cn=gpulab,{LDAP_SUFFIX}"  # the hub's own account


def ldap_missing() -> str | None:
    for tool in ("slapd", "slapadd", "slappasswd", "openssl"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} is not installed (make test-idp installs slapd and ldap-utils)"
    return None


def require_ldap() -> None:
    why = ldap_missing()
    if why:
        pytest.skip(why)


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class Slapd:
    """A throwaway OpenLDAP server (Debian's slapd, its own cn=config in *run_dir*) on
    *host*, with StartTLS (a certificate for *host*, in ``ca_file``), the memberof
    overlay, the hub's service account and members edited through :meth:`set_member`.
    After ../shared/reference/identity-harness/start_slapd.sh."""

    run_dir: Path
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    admin_password: str = field(default_factory=lambda: secrets.token_hex(12))
    service_password: str = field(default_factory=lambda: secrets.token_hex(12))
    pid: int | None = None

    @property
    def url(self) -> str:
        return f"ldap://{self.host}:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.run_dir / "tls.crt"

    def settings(self) -> dict:
        """settings login.* for a hub that signs in here."""
        return {"login.provider": "ldap", "login.ldap_url": self.url,
                "login.ldap_ca_file": str(self.ca_file), "login.ldap_user_base": PEOPLE,
                "login.ldap_bind_dn": SERVICE}

    def start(self, timeout: float = 20) -> None:
        """Made at the first start; started again on what it has after a stop."""
        first = not (self.run_dir / "slapd.d").exists()
        if first:
            self._make()
        self._launch(timeout)
        if first:
            self._seed()

    def _make(self) -> None:
        d = self.run_dir
        for sub in ("slapd.d", "data", "run"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        subprocess.run([_tool("openssl"), "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                        f"/CN={self.host}", "-addext", f"subjectAltName=IP:{self.host}",
                        "-keyout", str(d / "tls.key"), "-out", str(self.ca_file)],
                       check=True, capture_output=True)
        hashed = subprocess.run([_tool("slappasswd"), "-s", self.admin_password],
                                check=True, capture_output=True, text=True).stdout.strip()
        (d / "config.ldif").write_text(SLAPD_CONFIG.format(dir=d, suffix=LDAP_SUFFIX,
                                                           admin=LDAP_ADMIN, hash=hashed))
        subprocess.run([_tool("slapadd"), "-q", "-n", "0", "-F", str(d / "slapd.d"), "-l",
                        str(d / "config.ldif")], check=True, capture_output=True)
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "openldap:openldap", str(d)], check=True)

    def _launch(self, timeout: float) -> None:
        d = self.run_dir
        as_user = ["-u", "openldap", "-g", "openldap"] if os.geteuid() == 0 else []
        (d / "run" / "slapd.pid").unlink(missing_ok=True)
        subprocess.run([_tool("slapd"), "-F", str(d / "slapd.d"), "-h", f"{self.url}/",
                        *as_user], check=True, capture_output=True)  # forks
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.pid = int((d / "run" / "slapd.pid").read_text())
                self._admin().unbind()
                break
            except (OSError, ValueError, LDAPException):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"slapd did not answer on {self.url} within {timeout} s") from None
                time.sleep(0.05)

    def _seed(self) -> None:
        conn = self._admin()
        conn.add(LDAP_SUFFIX, ["dcObject", "organization"], {"dc": "lab", "o": "Lab"})
        conn.add(PEOPLE, ["organizationalUnit"], {"ou": "people"})
        conn.add(GROUPS, ["organizationalUnit"], {"ou": "groups"})
        conn.add(SERVICE, ["organizationalRole", "simpleSecurityObject"],
                 {"cn": "gpulab", "userPassword": self.service_password})
        conn.unbind()

    def _admin(self):
        import ldap3
        return ldap3.Connection(ldap3.Server(self.host, port=self.port, connect_timeout=5),
                                user=LDAP_ADMIN, password=self.admin_password,
                                auto_bind=True, raise_exceptions=True)

    def set_member(self, uid: str, password: str, groups: list[str]) -> None:
        """She is in the directory with *password*, in exactly *groups*."""
        import ldap3
        conn = self._admin()
        dn = f"uid={uid},{PEOPLE}"
        conn.raise_exceptions = False
        if not conn.search(dn, "(objectClass=*)", search_scope=ldap3.BASE):
            conn.add(dn, ["inetOrgPerson"], {"uid": uid, "cn": uid, "sn": uid,
                                              "userPassword": password})
        else:
            conn.modify(dn, {"userPassword": [(ldap3.MODIFY_REPLACE, [password])]})
        conn.search(GROUPS, "(objectClass=groupOfNames)", attributes=["cn", "member"])
        have = {str(e.cn): [str(m) for m in e.member] for e in conn.entries}
        for group, members in have.items():
            if dn in members and group not in groups:
                if members == [dn]:
                    conn.delete(f"cn={group},{GROUPS}")
                else:
                    conn.modify(f"cn={group},{GROUPS}", {"member": [(ldap3.MODIFY_DELETE, [dn])]})
        for group in groups:
            if group not in have:
                conn.add(f"cn={group},{GROUPS}", ["groupOfNames"], {"cn": group, "member": dn})
            elif dn not in have[group]:
                conn.modify(f"cn={group},{GROUPS}", {"member": [(ldap3.MODIFY_ADD, [dn])]})
        conn.unbind()

    def set_attribute(self, uid: str, attribute: str, values: list[str]) -> None:
        import ldap3
        conn = self._admin()
        conn.modify(f"uid={uid},{PEOPLE}", {attribute: [(ldap3.MODIFY_REPLACE, values)]})
        conn.unbind()

    def add_group_elsewhere(self, cn: str, uid: str) -> str:
        """A group *cn* with her in it, outside ou=groups (where anyone might make one)."""
        conn = self._admin()
        ou = f"ou=elsewhere,{LDAP_SUFFIX}"
        conn.raise_exceptions = False
        conn.add(ou, ["organizationalUnit"], {"ou": "elsewhere"})
        dn = f"cn={cn},{ou}"
        conn.add(dn, ["groupOfNames"], {"cn": cn, "member": f"uid={uid},{PEOPLE}"})
        conn.unbind()
        return dn

    def remove_member(self, uid: str) -> None:
        self.set_member(uid, secrets.token_hex(8), [])
        conn = self._admin()
        conn.delete(f"uid={uid},{PEOPLE}")
        conn.unbind()

    def stop(self) -> None:
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while Path(f"/proc/{self.pid}").exists() and time.monotonic() < deadline:
            try:  # a zombie still has /proc/PID (the harness's lesson): read its state
                if "State:\tZ" in Path(f"/proc/{self.pid}/status").read_text():
                    break
            except OSError:
                break
            time.sleep(0.05)


SLAPD_CONFIG = """dn: cn=config
objectClass: olcGlobal
cn: config
olcPidFile: {dir}/run/slapd.pid
olcArgsFile: {dir}/run/slapd.args
olcLogLevel: none
olcTLSCertificateFile: {dir}/tls.crt
olcTLSCertificateKeyFile: {dir}/tls.key

dn: cn=module{{0}},cn=config
objectClass: olcModuleList
cn: module{{0}}
olcModulePath: /usr/lib/ldap
olcModuleLoad: back_mdb
olcModuleLoad: memberof

dn: cn=schema,cn=config
objectClass: olcSchemaConfig
cn: schema

include: file:///etc/ldap/schema/core.ldif
include: file:///etc/ldap/schema/cosine.ldif
include: file:///etc/ldap/schema/nis.ldif
include: file:///etc/ldap/schema/inetorgperson.ldif

dn: olcDatabase={{-1}}frontend,cn=config
objectClass: olcDatabaseConfig
objectClass: olcFrontendConfig
olcDatabase: {{-1}}frontend

dn: olcDatabase={{0}}config,cn=config
objectClass: olcDatabaseConfig
olcDatabase: {{0}}config
olcRootDN: cn=admin,cn=config
olcRootPW: {hash}

dn: olcDatabase={{1}}mdb,cn=config
objectClass: olcDatabaseConfig
objectClass: olcMdbConfig
olcDatabase: {{1}}mdb
olcSuffix: {suffix}
olcRootDN: {admin}
olcRootPW: {hash}
olcDbDirectory: {dir}/data
olcDbMaxSize: 67108864
olcDbIndex: objectClass eq
olcDbIndex: uid,member eq
olcAccess: {{0}}to attrs=userPassword by self write by anonymous auth by * none
olcAccess: {{1}}to * by users read by * none

dn: olcOverlay={{0}}memberof,olcDatabase={{1}}mdb,cn=config
objectClass: olcOverlayConfig
objectClass: olcMemberOf
olcOverlay: {{0}}memberof
olcMemberOfRefInt: TRUE
olcMemberOfGroupOC: groupOfNames
olcMemberOfMemberAD: member
olcMemberOfMemberOfAD: memberOf
"""
