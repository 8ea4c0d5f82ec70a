"""gpulab.login.tokens on JupyterHub's real orm and scopes: the record of login tokens,
ending a member's access, the one-time migration, and configure_login."""

from __future__ import annotations

import stat
from datetime import timedelta

import pytest
from jupyterhub import orm, scopes
from jupyterhub.utils import utcnow
from traitlets.config import Config

from gpulab.login import tokens as lt
from gpulab.login.auth import configure_login
from gpulab.login.tokens import LoginTokenStore
from gpulab.settings import defaults
from tests.unit.hub_orm import add_user

ADMIN = "service gpulab-admin"


@pytest.fixture
def store(tmp_path):
    return LoginTokenStore(tmp_path / "data" / "gpulab-login-tokens.sqlite")


def test_store_is_private_to_the_hub(store):
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600


def test_issue_records_the_token_and_only_it(db, store, alice):
    token, row = lt.issue(db, store, alice, expires_in=3600, issued_by=ADMIN)
    assert orm.APIToken.find(db, token) is row
    assert row.note == f"gpulab-login: issued by {ADMIN}"
    assert lt.is_login_token(store, row)
    assert store.recorded("alice") == {row.hashed: row.id}
    same_note = orm.APIToken.find(db, alice.new_api_token(note=row.note))
    assert not lt.is_login_token(store, same_note)
    assert lt.login_tokens(db, store, alice) == [row]


def test_a_reused_token_id_is_not_a_login_token(db, store, alice):
    """sqlite reuses the highest integer id after a delete: the record names the hash."""
    _, row = lt.issue(db, store, alice, expires_in=None, issued_by=ADMIN)
    old_id = row.id
    db.delete(row)  # revoked through JupyterHub's own API: the record stays behind
    db.commit()
    reused = orm.APIToken.find(db, alice.new_api_token(note="gpulab-login: x"))
    assert reused.id == old_id
    assert not lt.is_login_token(store, reused)
    assert lt.login_tokens(db, store, alice) == []
    assert store.recorded("alice") == {}  # the stale row was forgotten on the way


def test_expired_login_tokens_do_not_count_but_are_listed(db, store, alice):
    _, row = lt.issue(db, store, alice, expires_in=3600, issued_by=ADMIN)
    row.expires_at = utcnow(with_tz=False) - timedelta(seconds=1)
    db.commit()
    assert not lt.is_login_token(store, row)
    assert lt.login_tokens(db, store, alice) == []
    assert lt.login_tokens(db, store, alice, include_expired=True) == [row]


def test_end_access_deletes_every_token_but_the_kept_ones(db, store, alice):
    _, login = lt.issue(db, store, alice, expires_in=None, issued_by=ADMIN)
    script = orm.APIToken.find(db, alice.new_api_token(note="script"))
    db.add(orm.OAuthClient(identifier="service-x"))
    db.commit()
    alice.new_api_token(client_id="service-x")
    alice.new_api_token(client_id="service-x")
    server = orm.APIToken.find(db, alice.new_api_token(note="Server at /user/alice/"))
    bob = add_user(db, "bob")
    _, bobs = lt.issue(db, store, bob, expires_in=None, issued_by=ADMIN)
    cookie_id = alice.cookie_id

    ended = lt.end_access(db, store, alice, keep={server.id})

    assert sorted(ended.api_tokens) == sorted([login.api_id, script.api_id])
    assert ended.oauth_tokens == 2 and ended.kept_server_tokens == 1
    assert [t.id for t in lt.user_tokens(db, alice)] == [server.id]
    assert [t.id for t in alice.api_tokens] == [server.id]  # the collection is reloaded
    assert alice.cookie_id != cookie_id
    assert store.recorded("alice") == {}
    assert lt.login_tokens(db, store, bob) == [bobs]


def test_a_members_self_scopes_never_hold_the_admin_scopes(db, alice):
    """What the REST API checks: the unfiltered scopes, as JupyterHub's has_scope does."""
    held = scopes.expand_scopes({"self"}, owner=alice)  # the default 'user' role
    alice_admin_held = {"admin:users!user=alice", "tokens!user=alice", *held}
    for have in (held, alice_admin_held):
        parsed = scopes.parse_scopes(frozenset(have))
        assert scopes.has_scope("tokens!user=alice", parsed)
        for scope in lt.ADMIN_SCOPES:
            assert not scopes.has_scope(scope, parsed), scope
    admin = scopes.parse_scopes(frozenset(scopes.expand_scopes(
        {"admin:users", "tokens", "list:users"})))
    assert all(scopes.has_scope(s, admin) for s in lt.ADMIN_SCOPES)


# ------------------------------------------------------------------ configure_login


def test_configure_login_sets_the_hub_config(tmp_path):
    c = Config()
    c.JupyterHub.db_url = f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    settings = {**defaults(), "hub.member_token_max_age": 7 * 86400}

    configure_login(c, settings, tmp_path, ["172.30.0.3", "10.0.0.0/24", "10.1.2.3/32"])

    assert dict(c.JupyterHub) == {
        "db_url": f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}",
        "authenticator_class": "gpulab-token",
        "trusted_downstream_ips": ["172.30.0.3", "10.1.2.3"],
        "token_expires_in_max_seconds": 7 * 86400,
    }
    assert dict(c.TokenAuthenticator) == {
        "throttle_db_path": str(tmp_path / "gpulab-login-throttle.sqlite"),
        "login_tokens_db_path": str(tmp_path / "gpulab-login-tokens.sqlite"),
        "ssh_keys_db_path": str(tmp_path / "gpulab-ssh-keys.sqlite"),
        "trusted_proxies": ["172.30.0.3/32", "10.0.0.0/24", "10.1.2.3/32"],
    }
    assert dict(c.Authenticator) == {"auth_refresh_age": 1, "auth_refresh_strict": True}


def test_configure_login_without_a_limit_and_with_a_bad_proxy(tmp_path):
    c = Config()
    configure_login(c, {**defaults(), "hub.member_token_max_age": 0}, tmp_path, [])
    assert c.JupyterHub.token_expires_in_max_seconds == 0  # JupyterHub: no limit
    with pytest.raises(ValueError, match="proxy.example"):
        configure_login(Config(), defaults(), tmp_path, ["proxy.example"])
