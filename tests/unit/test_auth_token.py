"""TokenAuthenticator against the real JupyterHub orm on an in-memory sqlite database."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from jupyterhub import orm
from jupyterhub.handlers.login import LoginHandler
from jupyterhub.utils import utcnow
from sqlalchemy import text
from tornado.httputil import HTTPHeaders

from gpulab.auth import (
    LOGIN_TOKEN_NOTE,
    GpulabLoginHandler,
    TokenAuthenticator,
    client_address,
)
from gpulab.throttle import Throttle


class LoginRequest:
    """The parts of tornado's HTTPServerRequest the authenticator reads."""

    def __init__(self, remote_ip: str = "192.0.2.10", headers: dict | None = None):
        self.remote_ip = remote_ip
        self.headers = HTTPHeaders(headers or {})


class LoginFormHandler:
    """Stands in for the hub's login handler: a database session and a request."""

    def __init__(self, db, remote_ip: str = "192.0.2.10"):
        self.db = db
        self.request = LoginRequest(remote_ip)


@pytest.fixture
def db():
    session = orm.new_session_factory("sqlite:///:memory:")()
    session.add(orm.OAuthClient(identifier="jupyterhub"))
    session.commit()
    yield session
    session.close()


def add_user(db, name: str) -> orm.User:
    user = orm.User(name=name)
    db.add(user)
    db.commit()
    return user


@pytest.fixture
def alice(db):
    return add_user(db, "alice")


@pytest.fixture
def alice_token(alice):
    return alice.new_api_token(note=f"{LOGIN_TOKEN_NOTE}: issued by test")


@pytest.fixture
def auth(tmp_path):
    return TokenAuthenticator(throttle_db_path=str(tmp_path / "throttle.sqlite"))


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


async def test_script_tokens_cannot_open_a_browser_session(auth, db, alice):
    script_token = alice.new_api_token(note="my training script")
    assert await login(auth, db, "alice", script_token) is None


async def test_expired_token_is_refused(auth, db, alice, alice_token):
    row = orm.APIToken.find(db, alice_token)
    row.expires_at = utcnow(with_tz=False) - timedelta(seconds=1)
    db.commit()
    assert await login(auth, db, "alice", alice_token) is None


async def test_token_with_expiry_works_until_then(auth, db, alice):
    token = alice.new_api_token(note=f"{LOGIN_TOKEN_NOTE}: 90d", expires_in=90 * 86400)
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
    expired = alice.new_api_token(note=f"{LOGIN_TOKEN_NOTE}: x")
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
    db.delete(orm.APIToken.find(db, alice_token))
    db.commit()
    db.refresh(alice)
    assert await auth.refresh_user(alice) is False
    auth.end_sessions_without_token = False
    assert await auth.refresh_user(alice) is True


async def test_session_ends_when_the_login_token_expires(auth, db, alice, alice_token):
    orm.APIToken.find(db, alice_token).expires_at = utcnow(with_tz=False) - timedelta(seconds=1)
    db.commit()
    assert await auth.refresh_user(alice) is False


def test_login_page_is_the_throttled_handler(auth):
    assert auth.get_handlers(app=None) == [("/login", GpulabLoginHandler)]
    assert issubclass(GpulabLoginHandler, LoginHandler)


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


def test_default_throttle_file_is_next_to_the_hub_db():
    trait = TokenAuthenticator.class_traits()["throttle_db_path"]
    assert trait.default_value == "/srv/jupyterhub/gpulab-login-throttle.sqlite"


class ProxiedConnection:
    class context:  # noqa: N801 - tornado's _HTTPRequestContext
        _orig_remote_ip = "172.18.0.2"  # configurable-http-proxy, inside the hub container
        trusted_downstream = {"10.0.0.5"}


def proxied(remote_ip: str, **headers) -> LoginRequest:
    request = LoginRequest(remote_ip, {k.replace("_", "-"): v for k, v in headers.items()})
    request.connection = ProxiedConnection()
    return request


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        # no X-Real-Ip: exactly what JupyterHub (tornado xheaders) says
        (proxied("198.51.100.7", X_Forwarded_For="198.51.100.7"), "198.51.100.7"),
        # a client-sent X-Real-Ip is ignored; the proxy-appended XFF entry counts
        (proxied("6.6.6.6", X_Forwarded_For="1.1.1.1, 198.51.100.7", X_Real_Ip="6.6.6.6"),
         "198.51.100.7"),
        # trusted downstream proxies (c.JupyterHub.trusted_downstream_ips) are skipped
        (proxied("6.6.6.6", X_Forwarded_For="198.51.100.7, 10.0.0.5", X_Real_Ip="6.6.6.6"),
         "198.51.100.7"),
        # X-Real-Ip and no XFF at all: the TCP peer
        (proxied("6.6.6.6", X_Real_Ip="6.6.6.6"), "172.18.0.2"),
        # garbage in XFF: the TCP peer
        (proxied("6.6.6.6", X_Forwarded_For="not-an-ip", X_Real_Ip="6.6.6.6"), "172.18.0.2"),
    ],
)


def test_client_address(request_, expected):
    assert client_address(request_) == expected
