"""Single sign-on's decisions (gpulab.login.sso) and settings login.*, without a hub.

The real hub and provider: tests/unit/test_sso_hub.py."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from gpulab.login.auth import configure_login
from gpulab.login.sso import GroupMapping, GroupsVerdict, groups_after, idp_groups
from gpulab.settings import ConfigError, defaults, settings_from_yaml
from gpulab.yamlfile import parse_yaml

MAPPING = GroupMapping(allowed=frozenset({"gpu-users"}), admins=frozenset({"gpu-admins"}),
                       operators=frozenset({"gpu-ops"}),
                       groups={"ml-staff": ("staff",), "phd": ("students", "staff")})

OIDC = """login:
  provider: oidc
  oidc_authorize_url: https://id.lab.example/auth
  oidc_token_url: https://id.lab.example/token
  oidc_userinfo_url: https://id.lab.example/userinfo
  oidc_client_id: gpulab
  allowed_groups: [gpu-users]
"""


def load_text(text: str):
    return settings_from_yaml(parse_yaml(text, "gpulab.yaml"))


@pytest.mark.parametrize("idp, verdict", [
    ([], GroupsVerdict(False, False, frozenset())),
    (["gpu-users"], GroupsVerdict(True, False, frozenset())),
    (["gpu-users", "gpu-admins", "ml-staff"], GroupsVerdict(True, True, frozenset({"staff"}))),
    (["gpu-admins"], GroupsVerdict(False, True, frozenset())),  # an admin group alone lets no one in
    (["gpu-users", "phd", "gpu-ops"],
     GroupsVerdict(True, False, frozenset({"students", "staff", "operators"}))),
    (["GPU-USERS"], GroupsVerdict(False, False, frozenset())),  # group names match exactly
])
def test_the_providers_groups_decide_who_may_sign_in_and_her_groups(idp, verdict):
    assert MAPPING.verdict(idp) == verdict


def test_the_mapping_manages_only_the_groups_it_names():
    assert MAPPING.managed == {"staff", "students", "operators"}
    assert GroupMapping(allowed=frozenset({"x"})).managed == frozenset()


@pytest.mark.parametrize("current, wanted, after", [
    ([], {"staff"}, ["staff"]),
    (["extra", "students"], {"staff"}, ["extra", "staff"]),  # unmanaged groups stay
    (["staff", "operators"], set(), []),
    (["extra"], {"not-managed"}, ["extra"]),  # never adds a group the mapping does not name
])
def test_groups_after_a_check(current, wanted, after):
    assert groups_after(current, MAPPING.managed, wanted) == after


@pytest.mark.parametrize("userinfo, groups", [
    ({"groups": ["a", "b"]}, ["a", "b"]),
    ({"groups": "a"}, ["a"]),
    ({"groups": ["a", 3, None]}, ["a"]),
    ({}, []),
    ({"groups": {"a": 1}}, []),
])
def test_idp_groups_reads_the_claim_it_is_given(userinfo, groups):
    assert idp_groups(userinfo, "groups") == groups


def test_login_settings_are_read_and_checked():
    s = load_text(OIDC + "  groups: {ml-staff: staff, phd: [students, staff]}\n"
                         "  refresh_every: 1m\n")
    assert s["login.provider"] == "oidc"
    assert s["login.groups"] == {"ml-staff": ("staff",), "phd": ("students", "staff")}
    assert s["login.refresh_every"] == 60
    assert GroupMapping.from_settings(s).verdict(["gpu-users", "phd"]).groups == {
        "students", "staff"}


@pytest.mark.parametrize("text, where, words", [
    ("login:\n  provider: kerberos\n", "gpulab.yaml:2: login.provider", "expected none"),
    ("login:\n  provider: oidc\n", "gpulab.yaml:2: login.provider",
     "needs login.oidc_authorize_url, login.oidc_token_url, login.oidc_userinfo_url, "
     "login.oidc_client_id, login.allowed_groups"),
    (OIDC.replace("  allowed_groups: [gpu-users]\n", ""), "gpulab.yaml:2: login.provider",
     "needs login.allowed_groups"),
    (OIDC + "  refresh_every: 0\n", "gpulab.yaml:8: login.refresh_every", "more than 0"),
    ("login:\n  oidc_token_url: id.lab.example/token\n", "gpulab.yaml:2: login.oidc_token_url",
     "http:// or https:// URL"),
    ("login:\n  groups: [staff]\n", "gpulab.yaml:2: login.groups", "mapping"),
    ("login:\n  groups: {a: [1]}\n", "gpulab.yaml:2: login.groups", "list of group names"),
])
def test_bad_login_settings_say_file_line_and_key(text, where, words):
    with pytest.raises(ConfigError) as e:
        load_text(text)
    assert str(e.value).startswith(where), str(e.value)
    assert words in str(e.value)


def test_without_a_provider_login_is_configured_as_before(tmp_path):
    c = Config()
    configure_login(c, defaults(), tmp_path, ["172.30.0.3"], secrets_dir=tmp_path)
    assert c.JupyterHub.authenticator_class == "gpulab-token"
    assert "identity_provider" not in c.TokenAuthenticator
    assert "LabOIDCAuthenticator" not in c and "CryptKeeper" not in c


def test_with_oidc_the_provider_part_is_configured(tmp_path):
    (tmp_path / "oidc-client-secret").write_text("s3cret\n")
    (tmp_path / "crypt-key").write_text("ab" * 32)
    c = Config()
    s = load_text(OIDC + "  admin_groups: [gpu-admins]\n")
    configure_login(c, s.with_values({"hub.admins": ("root",)}), tmp_path, [],
                    secrets_dir=tmp_path, public_url="https://gpu.lab.example/")
    assert c.JupyterHub.authenticator_class == "gpulab-token"  # tokens still sign in
    assert c.TokenAuthenticator.identity_provider == "oidc"
    o = c.LabOIDCAuthenticator
    assert o.client_secret == "s3cret"
    assert o.oauth_callback_url == "https://gpu.lab.example/hub/oidc/oauth_callback"
    assert o.userdata_url == "https://id.lab.example/userinfo"
    assert o.hub_admins == {"root"} and o.mapping.admins == {"gpu-admins"}
    assert c.CryptKeeper["keys"] == ["ab" * 32]


def test_with_oidc_a_missing_secret_says_where(tmp_path):
    with pytest.raises(ValueError, match=r"oidc-client-secret is missing"):
        configure_login(Config(), load_text(OIDC), tmp_path, [], secrets_dir=tmp_path)


LDAP = """login:
  provider: ldap
  ldap_url: ldaps://ldap.lab.example
  ldap_user_base: ou=people,dc=lab,dc=example
  ldap_bind_dn: cn=gpulab,dc=lab,dc=example
  allowed_groups: [gpu-users]
"""


@pytest.mark.parametrize("text, where, words", [
    ("login:\n  provider: ldap\n", "gpulab.yaml:2: login.provider",
     "ldap needs login.ldap_url, login.ldap_user_base, login.ldap_bind_dn, "
     "login.allowed_groups"),
    ("login:\n  ldap_url: ldap.lab.example\n", "gpulab.yaml:2: login.ldap_url",
     "ldap://HOST[:PORT] or ldaps://"),
    (LDAP.replace("ldaps://", "ldap://") + "  ldap_starttls: false\n",
     "gpulab.yaml:7: login.ldap_starttls", "unencrypted"),
    (LDAP + "  ldap_ca_file: lab-ca.pem\n", "gpulab.yaml:7: login.ldap_ca_file",
     "absolute path"),
])
def test_bad_ldap_settings_say_file_line_and_key(text, where, words):
    with pytest.raises(ConfigError) as e:
        load_text(text)
    assert str(e.value).startswith(where), str(e.value)
    assert words in str(e.value)


def test_with_ldap_the_directory_part_is_configured(tmp_path):
    from gpulab.login.ldap import group_names
    (tmp_path / "ldap-bind-password").write_text("bind-pw\n")
    (tmp_path / "crypt-key").write_text("cd" * 32)
    c = Config()
    configure_login(c, load_text(LDAP), tmp_path, [], secrets_dir=tmp_path)
    assert c.TokenAuthenticator.identity_provider == "ldap"
    d = c.LabLDAPAuthenticator.directory
    assert (d.url, d.bind_password, d.starttls, d.user_attribute, d.subject_attribute) == (
        "ldaps://ldap.lab.example", "bind-pw", True, "uid", "entryUUID")
    assert "LabOIDCAuthenticator" not in c
    assert group_names(["cn=gpu-users,ou=groups,dc=lab,dc=example", "CN=Ops,DC=x", "plain"]) \
        == ["gpu-users", "Ops", "plain"]


def test_with_ldap_a_missing_bind_password_says_where(tmp_path):
    with pytest.raises(ValueError, match=r"ldap-bind-password is missing"):
        configure_login(Config(), load_text(LDAP), tmp_path, [], secrets_dir=tmp_path)


def test_when_the_provider_last_vouched_is_kept_and_an_older_file_starts_the_grace_afresh(
        tmp_path):
    import sqlite3

    from gpulab.login.identities import IdentityStore

    old = tmp_path / "ids.sqlite"  # an older gpulab's file: no vouched_at
    with sqlite3.connect(old) as db:
        db.execute("CREATE TABLE identities (username TEXT PRIMARY KEY, subject TEXT,"
                   " bound_at REAL, ended_at REAL)")
        db.execute("INSERT INTO identities VALUES ('ann', 'sub-ann', 5, NULL)")
    clock = [1000.0]
    store = IdentityStore(old, now=lambda: clock[0])
    assert store.grace_from("ann") == 1000.0  # never recorded: from now, not from bound_at
    clock[0] = 2000.0
    assert store.grace_from("ann") == 1000.0  # kept
    store.vouched("ann")
    assert IdentityStore(old, now=lambda: 9e9).grace_from("ann") == 2000.0  # a restart
    assert store.subject("ann") == "sub-ann"


def test_the_unreachable_grace_is_a_duration_with_a_default_of_a_day():
    assert defaults()["login.unreachable_grace"] == 86400
    s = settings_from_yaml(parse_yaml("login: {unreachable_grace: 8h}\n", "gpulab.yaml"))
    assert s["login.unreachable_grace"] == 8 * 3600


def test_an_access_token_without_a_refresh_token_is_said_once(tmp_path, caplog):
    """Without a refresh token, a member's access ends at the first check after her access
    token expires (tried in test_sso_hub.py): the hub says so to the operator."""
    import logging

    from gpulab.login.sso import LabOIDCAuthenticator

    a = LabOIDCAuthenticator(identities_db_path=str(tmp_path / "ids.sqlite"))
    a.log = logging.getLogger("test-sso")
    with caplog.at_level(logging.WARNING, "test-sso"):
        a._warn_without_refresh_token({"refresh_token": "r", "token_response": {"expires_in": 300}})
        a._warn_without_refresh_token({"token_response": {}})  # never expires: nothing to say
        assert caplog.messages == []
        for _ in range(2):
            a._warn_without_refresh_token({"token_response": {"expires_in": 300}})
    (said,) = caplog.messages
    assert "gave no refresh token with an access token that expires in 5 min" in said
