"""TokenAuthenticator against the real JupyterHub orm on an in-memory sqlite database.

Login tokens are issued the way the admin REST API issues them
(:func:`gpulab.login.tokens.issue`); tests/unit/test_login_hub.py drives the same
checks through a real hub process.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from jupyterhub import orm
from jupyterhub.apihandlers.users import UserTokenListAPIHandler
from jupyterhub.handlers.login import LoginHandler
from jupyterhub.utils import utcnow
from sqlalchemy import text
from tornado.httputil import HTTPHeaders

from gpulab.login import sshkeys
from gpulab.login import tokens as lt
from gpulab.login.auth import (
    LOGIN_TOKEN_NOTE,
    GpulabLoginHandler,
    TokenAuthenticator,
    TrustedProxies,
    client_address,
    credentials_in_query,
    default_trusted_proxies,
)
from gpulab.login.throttle import Throttle
from gpulab.settings import defaults
from tests.unit.hub_orm import add_user


class LoginRequest:
    """The parts of tornado's HTTPServerRequest the authenticator reads."""

    def __init__(self, remote_ip: str = "192.0.2.10", headers: dict | None = None):
        self.remote_ip = remote_ip
        self.headers = HTTPHeaders(headers or {})


class LoginFormHandler:
    """Stands in for the hub's login handler: a database session and a request."""

    accepts_token_sign_in = GpulabLoginHandler.accepts_token_sign_in

    def __init__(self, db, remote_ip: str = "192.0.2.10"):
        self.db = db
        self.request = LoginRequest(remote_ip)


class TokenListHandler(LoginFormHandler):
    """Stands in for JupyterHub's POST /users/NAME/tokens {"auth": ...}: not the form."""

    accepts_token_sign_in = False


@pytest.fixture
def auth(tmp_path):
    return TokenAuthenticator(throttle_db_path=str(tmp_path / "throttle.sqlite"),
                              login_tokens_db_path=str(tmp_path / "login-tokens.sqlite"))


def issue(auth, db, user, expires_in=None) -> str:
    """A login token, as the admin REST API issues it."""
    token, _ = lt.issue(db, auth.login_tokens, user, expires_in=expires_in,
                        issued_by="service gpulab-admin")
    return token


@pytest.fixture
def alice_token(auth, db, alice):
    return issue(auth, db, alice)


async def login(auth, db, username, token):
    return await auth.get_authenticated_user(
        LoginFormHandler(db), {"username": username, "password": token}
    )


async def test_right_token_signs_in_and_records_activity(auth, db, alice, alice_token):
    result = await login(auth, db, "alice", alice_token)
    assert result["name"] == "alice"
    row = orm.APIToken.find(db, alice_token)
    assert row.last_activity is not None and row.last_activity.tzinfo is None


@pytest.mark.parametrize("typed", ["Alice", " alice ", "ALICE\t", "ａｌｉｃｅ"])
async def test_username_is_normalised(auth, db, alice, alice_token, typed):
    result = await login(auth, db, typed, alice_token)
    assert result["name"] == "alice"


def test_tokens_are_stored_hashed_only(db, alice, alice_token):
    row = orm.APIToken.find(db, alice_token)
    assert row.hashed != alice_token and alice_token not in row.hashed
    assert row.prefix == alice_token[: orm.APIToken.prefix_length]
    tables = [r[0] for r in db.execute(text("SELECT name FROM sqlite_master WHERE type='table'"))]
    assert "api_tokens" in tables
    for table in tables:
        for values in db.execute(text(f'SELECT * FROM "{table}"')):
            assert not any(alice_token in str(v) for v in values), table


async def test_wrong_token_is_refused(auth, db, alice, alice_token):
    assert await login(auth, db, "alice", alice_token[:-1] + "x") is None
    assert await login(auth, db, "alice", "") is None


async def test_another_users_token_is_refused(auth, db, alice, alice_token):
    add_user(db, "bob")
    assert await login(auth, db, "bob", alice_token) is None


@pytest.mark.parametrize("note", ["my training script", f"{LOGIN_TOKEN_NOTE}: x",
                                  LOGIN_TOKEN_NOTE,
                                  "gpulab-login: issued by gpulab token issue", ""])
async def test_tokens_members_make_cannot_open_a_browser_session(auth, db, alice, note):
    script_token = alice.new_api_token(note=note)
    assert await login(auth, db, "alice", script_token) is None


async def test_the_token_api_cannot_be_used_to_sign_in(auth, db, alice, alice_token):
    """JupyterHub's POST /users/NAME/tokens with {"auth": {...}} would skip the throttle."""
    handler = TokenListHandler(db)
    data = {"username": "alice", "password": alice_token}
    assert await auth.get_authenticated_user(handler, data) is None


async def test_a_recorded_id_alone_does_not_make_a_login_token(auth, db, alice):
    bob = add_user(db, "bob")
    bobs = bob.new_api_token(note="bob's script")
    row = orm.APIToken.find(db, bobs)
    # even a row naming bob with bob's id but another token's hash does not match
    with auth.login_tokens._connect() as store:
        store.execute("INSERT INTO login_tokens VALUES (?, ?, ?, ?, ?, 'login')",
                      ("sha512:1:00:00", row.id, "bob", "forged", 0))
    assert await login(auth, db, "bob", bobs) is None


async def test_expired_token_is_refused(auth, db, alice, alice_token):
    row = orm.APIToken.find(db, alice_token)
    row.expires_at = utcnow(with_tz=False) - timedelta(seconds=1)
    db.commit()
    assert await login(auth, db, "alice", alice_token) is None


async def test_token_with_expiry_works_until_then(auth, db, alice):
    token = issue(auth, db, alice, expires_in=90 * 86400)
    assert (await login(auth, db, "alice", token))["name"] == "alice"


async def test_revoked_token_is_refused_at_once(auth, db, alice, alice_token):
    assert await login(auth, db, "alice", alice_token) is not None
    db.delete(orm.APIToken.find(db, alice_token))  # what DELETE /users/alice/tokens/ID does
    db.commit()
    assert await login(auth, db, "alice", alice_token) is None


@pytest.mark.parametrize(
    "name", ["a/b", "..", ".", "-alice", "alice-", "a..b", "x" * 33, "<script>", "al ice", ""]
)


async def test_invalid_usernames_are_refused(auth, db, alice_token, name):
    assert not auth.validate_username(auth.normalize_username(name))
    assert await login(auth, db, name, alice_token) is None


@pytest.mark.parametrize("name", ["alice", "j.smith", "ab_c", "a-1", "x" * 32, "7"])
def test_valid_usernames(auth, name):
    assert auth.validate_username(auth.normalize_username(name))


async def test_failed_logins_never_log_the_token(auth, db, alice, alice_token, caplog):
    caplog.set_level(logging.DEBUG)
    expired = issue(auth, db, alice)
    orm.APIToken.find(db, expired).expires_at = utcnow(with_tz=False) - timedelta(seconds=5)
    db.commit()
    attempts = [alice_token + "0", expired, alice.new_api_token(note="script"), "\x00" * 300]
    for token in attempts:
        assert await login(auth, db, "alice", token) is None
    assert caplog.records, "failures are logged"
    for token in attempts + [alice_token]:
        assert token not in caplog.text
        assert token[:8] not in caplog.text


async def test_session_ends_once_no_login_token_is_left(auth, db, alice, alice_token):
    assert await auth.refresh_user(alice) is True
    db.delete(orm.APIToken.find(db, alice_token))  # JupyterHub's own DELETE does this
    db.commit()
    # no db.refresh(alice): the hub's session keeps alice.api_tokens stale too
    assert await auth.refresh_user(alice) is False
    auth.end_sessions_without_token = False
    assert await auth.refresh_user(alice) is True


async def test_session_ends_when_the_login_token_expires(auth, db, alice, alice_token):
    orm.APIToken.find(db, alice_token).expires_at = utcnow(with_tz=False) - timedelta(seconds=1)
    db.commit()
    assert await auth.refresh_user(alice) is False


async def test_a_self_made_token_does_not_keep_a_session(auth, db, alice):
    alice.new_api_token(note=f"{LOGIN_TOKEN_NOTE}: x")
    assert await auth.refresh_user(alice) is False


async def test_no_login_token_left_ends_the_members_other_tokens(auth, db, alice, alice_token):
    script = alice.new_api_token(note="script")
    oauth_client = orm.OAuthClient(identifier="jupyterhub-user-alice")
    db.add(oauth_client)
    db.commit()
    alice.new_api_token(client_id="jupyterhub-user-alice", note="Server at /user/alice/")
    bob = add_user(db, "bob")
    bobs = bob.new_api_token(note="bob's")
    cookie_id = alice.cookie_id
    db.delete(orm.APIToken.find(db, alice_token))
    db.commit()

    assert await auth.refresh_user(alice) is False
    assert db.query(orm.APIToken).filter_by(user_id=alice.id).count() == 0
    assert orm.APIToken.find(db, script) is None
    assert alice.cookie_id != cookie_id  # hub cookies of alice no longer match
    assert orm.APIToken.find(db, bobs) is not None  # nobody else is touched


class FakeSpawner:
    """The one attribute running_server_tokens reads of a JupyterHub Spawner."""

    def __init__(self, api_token):
        self.api_token = api_token


class HubUser:
    """The parts of jupyterhub.user.User that refresh_user reads."""

    def __init__(self, orm_user, server_token):
        self.orm_user = orm_user
        self.spawners = {"": FakeSpawner(server_token)}


async def test_the_running_servers_own_token_is_kept(auth, db, alice, alice_token):
    server_token = alice.new_api_token(note="Server at /user/alice/")
    db.delete(orm.APIToken.find(db, alice_token))
    db.commit()
    assert await auth.refresh_user(HubUser(alice, server_token)) is False
    assert [t.id for t in lt.user_tokens(db, alice)] == [orm.APIToken.find(db, server_token).id]
    # called again: nothing left to end, still False
    assert await auth.refresh_user(HubUser(alice, server_token)) is False


def test_login_page_and_admin_api_are_the_authenticators_handlers(auth):
    assert auth.get_handlers(app=None) == [
        ("/login", GpulabLoginHandler),
        (r"/api/gpulab/login-tokens/([^/]+)", lt.LoginTokensAPIHandler),
        (r"/api/gpulab/login-tokens/([^/]+)/([^/]+)", lt.LoginTokenAPIHandler),
        (r"/api/gpulab/access/([^/]+)", lt.AccessAPIHandler),
        # JupyterHub's own route, served by its subclass (JupyterHub adds these first)
        (r"/api/users/([^/]+)/tokens", lt.UserTokensAPIHandler),
        (r"/api/gpulab/ssh-keys/([^/]+)", sshkeys.SshKeysAPIHandler),
        (r"/api/gpulab/ssh-keys/([^/]+)/([^/]+)", sshkeys.SshKeyAPIHandler),
        (r"/api/gpulab/ssh-sign-in", sshkeys.SshSignInAPIHandler),
        ("/ssh-keys", sshkeys.SshKeysPageHandler),
    ]
    assert issubclass(GpulabLoginHandler, LoginHandler)
    assert issubclass(lt.UserTokensAPIHandler, UserTokenListAPIHandler)
    from jupyterhub.apihandlers import default_handlers
    assert (r"/api/users/([^/]+)/tokens", UserTokenListAPIHandler) in default_handlers


def test_throttle_follows_the_traits(tmp_path):
    auth = TokenAuthenticator(
        throttle_db_path=str(tmp_path / "t.sqlite"),
        max_failed_logins=3,
        max_failed_logins_per_address=7,
        lockout_seconds=60,
    )
    assert isinstance(auth.throttle, Throttle)
    assert auth.throttle.path == tmp_path / "t.sqlite" and auth.throttle.path.exists()
    assert auth.throttle.policies["user"].max_failures == 3
    assert auth.throttle.policies["address"].max_failures == 7
    assert auth.throttle.policies["user"].lockout == 60


def test_default_files_are_next_to_the_hub_db():
    traits = TokenAuthenticator.class_traits()
    assert traits["throttle_db_path"].default_value == "/srv/jupyterhub/gpulab-login-throttle.sqlite"
    assert traits["login_tokens_db_path"].default_value == "/srv/jupyterhub/gpulab-login-tokens.sqlite"


def test_constructing_the_authenticator_creates_no_file(tmp_path):
    auth = TokenAuthenticator(throttle_db_path=str(tmp_path / "t.sqlite"),
                              login_tokens_db_path=str(tmp_path / "l.sqlite"))
    assert list(tmp_path.iterdir()) == []  # JupyterHub's token app builds one too
    assert auth.login_tokens.path.exists()


class Context:
    """tornado's _HTTPRequestContext: the TCP peer before xheaders rewrote remote_ip."""

    def __init__(self, peer: str):
        self._orig_remote_ip = peer


class Connection:
    def __init__(self, peer: str):
        self.context = Context(peer)


def request_from(peer: str, **headers) -> LoginRequest:
    """A request whose TCP peer is *peer*; remote_ip is what tornado's xheaders made of
    the headers (it believes them from anyone): the spoofed value."""
    headers = {k.replace("_", "-"): v for k, v in headers.items()}
    spoofed = headers.get("X-Real-Ip") or headers.get("X-Forwarded-For", peer).split(",")[-1]
    request = LoginRequest(spoofed.strip(), headers)
    request.connection = Connection(peer)
    return request


PROXY = "172.30.0.3"  # gpulab's own proxy
EDGE = "10.0.0.5"  # an admin's TLS reverse proxy (hub.trusted_proxies)
TRUSTED = TrustedProxies([PROXY, "10.0.0.0/29"])


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        # from an untrusted peer (a user container on :8081) headers mean nothing
        (request_from("172.30.0.9"), "172.30.0.9"),
        (request_from("172.30.0.9", X_Forwarded_For="198.51.100.7"), "172.30.0.9"),
        (request_from("172.30.0.9", X_Real_Ip="198.51.100.7"), "172.30.0.9"),
        (request_from("172.30.0.9", X_Forwarded_For=f"1.1.1.1, {PROXY}"), "172.30.0.9"),
        # through gpulab's proxy: the address it appended
        (request_from(PROXY, X_Forwarded_For="198.51.100.7"), "198.51.100.7"),
        # what the client sent itself is left of that, and ignored
        (request_from(PROXY, X_Forwarded_For="1.1.1.1, 6.6.6.6,198.51.100.7"), "198.51.100.7"),
        # X-Real-Ip is passed through by the proxy unchanged: never used
        (request_from(PROXY, X_Forwarded_For="198.51.100.7", X_Real_Ip="6.6.6.6"), "198.51.100.7"),
        # edge -> proxy -> hub: trusted hops (addresses or networks) are skipped
        (request_from(PROXY, X_Forwarded_For=f"6.6.6.6, 198.51.100.7, {EDGE}"), "198.51.100.7"),
        (request_from(PROXY, X_Forwarded_For=f"198.51.100.7,{EDGE} , {PROXY}"), "198.51.100.7"),
        # a trusted peer that forwards nothing: the peer itself
        (request_from(PROXY), PROXY),
        (request_from(PROXY, X_Real_Ip="6.6.6.6"), PROXY),
        # only trusted hops: the left-most of them
        (request_from(PROXY, X_Forwarded_For=EDGE), EDGE),
        # garbage where an address should be: the last address a trusted hop gave
        (request_from(PROXY, X_Forwarded_For="not-an-ip"), PROXY),
        (request_from(PROXY, X_Forwarded_For=f"198.51.100.7, junk, {EDGE}"), EDGE),
        # IPv6, and IPv4-mapped peers
        (request_from("::ffff:172.30.0.3", X_Forwarded_For="2001:db8::7"), "2001:db8::7"),
        (request_from("2001:db8::9", X_Forwarded_For="198.51.100.7"), "2001:db8::9"),
    ],
)
def test_client_address(request_, expected):
    assert client_address(request_, TRUSTED) == expected


def test_trusted_proxies():
    trusted = TrustedProxies(["172.30.0.3", "10.0.0.0/24", "2001:db8::/64", "192.0.2.1/32"])
    assert "10.0.0.200" in trusted and "::ffff:10.0.0.1" in trusted
    assert "10.0.1.1" not in trusted and "garbage" not in trusted and None not in trusted
    assert "2001:db8::1" in trusted
    assert trusted.addresses() == ["172.30.0.3", "192.0.2.1"]
    with pytest.raises(ValueError, match="not an IP address or network"):
        TrustedProxies(["proxy.example"])


def test_default_trusted_proxies():
    settings = {**defaults(), "hub.trusted_proxies": ("10.0.0.5/32",)}
    assert default_trusted_proxies(settings, {}) == ["172.30.0.251", "10.0.0.5/32"]
    assert default_trusted_proxies(settings, {"GPULAB_PROXY_IP": "172.31.0.3"})[0] == "172.31.0.3"


@pytest.mark.parametrize("query, found", [
    ("", []),
    ("next=%2Fhub%2Fhome", []),
    ("token=abc", ["token"]),
    ("password=", ["password"]),
    ("next=%2Fhub%2Fhome%3Ftoken%3Dabc", ["next: token"]),
    ("next=%2Fhub%2Fspawn%3Fx%3D1%26password%3Dp", ["next: password"]),
    ("next=%2Fhub%2Fhome%3Ftokens%3D1", []),
])
def test_credentials_are_found_in_the_url_and_in_its_next_url(query, found):
    assert credentials_in_query(query) == found
