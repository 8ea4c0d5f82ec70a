"""Login tokens, their admin API and the login throttle, against a real ``jupyterhub``.

One hub process per module (tests/unit/real_hub.py), configured by
``gpulab.login.auth.configure_login`` exactly as the hub container is, with members' own
tokens capped at one hour. Clients connect to the hub's own port from loopback
addresses: 127.0.0.2 is the trusted proxy, every other 127.0.0.x is an untrusted peer
(as a user container calling http://gpulab-hub:8081 is). Each test uses its own
usernames and addresses, so that the throttle's counters do not leak between tests.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from real_hub import TRUSTED_PROXY, Client, RunningHub, new_hub

from gpulab.dashboard.members import HubMembers, MemberError
from gpulab.hubapi import HubApi, SyncHubApi

INVALID_LOGIN = "Invalid username or token."
LOCKED = "Too many failed sign-ins"
MAX_AGE = 3600  # hub.member_token_max_age of these hubs


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    running = new_hub(tmp_path_factory.mktemp("hub"), max_age=MAX_AGE)
    running.start()
    yield running
    running.stop()


@pytest.fixture
def hub_log(hub, request):
    """Prints the end of the hub's log when the test fails."""
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        print(f"\n----- jupyterhub log -----\n{hub.log_tail(80)}")


def new_name(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(4)}"


def member(hub: RunningHub, prefix: str = "m", expires_in: int | None = 600) -> tuple[str, str]:
    """A new user with a login token from the admin API: (name, token)."""
    name = new_name(prefix)
    r = hub.api("POST", f"/users/{name}", {})
    assert r.status == 201, r.text
    r = hub.api("POST", f"/gpulab/login-tokens/{name}", {"expires_in": expires_in})
    assert r.status == 201, r.text
    return name, r.json()["token"]


def signed_in(client: Client) -> bool:
    r = client.get("/hub/home", headers={"Sec-Fetch-Mode": "navigate"})
    assert r.status in (200, 302), r.status
    if r.status == 302:
        assert urlsplit(r.location).path == "/hub/login", r.location
    return r.status == 200


def self_made_token(token: str, name: str, note: str | None = "my script",
                    expires_in: int | None = None, hub: RunningHub = None):
    body = {"expires_in": expires_in}
    if note is not None:
        body["note"] = note
    return hub.api("POST", f"/users/{name}/tokens", body, token=token)


def whoami(hub: RunningHub, token: str) -> int:
    return hub.api("GET", "/user", token=token).status


def expires_in_seconds(model: dict) -> float:
    expires = datetime.fromisoformat(model["expires_at"].replace("Z", "+00:00"))
    return (expires - datetime.now(UTC)).total_seconds()


def error_text(html: str) -> str:
    m = re.search(r'class="login_error[^"]*">([^<]*)<', html)
    return m.group(1).strip() if m else ""


# ------------------------------------------------------------------ admin REST API


def test_admin_issues_lists_and_revokes_login_tokens(hub, hub_log):
    name, token = member(hub, expires_in=600)
    r = hub.api("GET", f"/gpulab/login-tokens/{name}")
    assert r.status == 200
    [model] = r.json()["login_tokens"]
    assert set(model) == {"id", "user", "created", "expires_at", "expired", "last_activity",
                          "note"}
    assert token not in r.text and "sha512" not in r.text
    assert 590 < expires_in_seconds(model) <= 600
    assert model["note"] == "gpulab-login: issued by service gpulab-admin"

    r = hub.api("POST", f"/gpulab/login-tokens/{name}", {"expires_in": None})
    assert r.status == 201 and r.json()["expires_at"] is None  # admins may issue for ever
    second = r.json()["id"]
    r = hub.api("DELETE", f"/gpulab/login-tokens/{name}/{model['id']}")
    assert r.status == 200
    assert r.json() == {"revoked": model["id"], "login_tokens_left": 1,
                        "admin_api_tokens_left": [], "ended_access": None}
    assert [t["id"] for t in hub.api("GET", f"/gpulab/login-tokens/{name}").json()[
        "login_tokens"]] == [second]
    assert hub.api("DELETE", f"/gpulab/login-tokens/{name}/{model['id']}").status == 404


@pytest.mark.parametrize("body", [{"expires_in": 0}, {"expires_in": -5}, {"expires_in": "90d"},
                                  {"expires_in": True}, {"note": "x"}, ["expires_in"]])
def test_issue_refuses_a_bad_body(hub, hub_log, body):
    name, _ = member(hub)
    r = hub.api("POST", f"/gpulab/login-tokens/{name}", body)
    assert r.status == 400, r.text


def test_unknown_user_is_404(hub, hub_log):
    assert hub.api("POST", "/gpulab/login-tokens/nobody-here", {}).status == 404
    assert hub.api("GET", "/gpulab/login-tokens/nobody-here").status == 404


def test_members_and_lesser_services_cannot_call_the_admin_endpoints(hub, hub_log):
    alice, alice_token = member(hub, "alice")
    bob, _ = member(hub, "bob")
    r = hub.api("POST", "/users/mallory", {})  # holds admin:users!user=mallory (real_hub.py)
    assert r.status in (201, 409), r.text
    mallory_token = hub.api("POST", "/gpulab/login-tokens/mallory", {}).json()["token"]
    mallory_scopes = hub.api("GET", "/user", token=mallory_token).json()["scopes"]
    assert {"admin:users!user=mallory", "tokens!user=mallory"} <= set(mallory_scopes)
    bob_ids = [t["id"] for t in hub.api("GET", f"/gpulab/login-tokens/{bob}").json()[
        "login_tokens"]]

    callers = {"alice": alice_token, "mallory": mallory_token, "not-admin": hub.weak_token}
    for who, token in callers.items():
        for target in (alice, bob, "mallory"):
            for method, path, body in (
                ("POST", f"/gpulab/login-tokens/{target}", {"expires_in": None}),
                ("GET", f"/gpulab/login-tokens/{target}", None),
                ("DELETE", f"/gpulab/login-tokens/{target}/{bob_ids[0]}", None),
            ):
                r = hub.api(method, path, body, token=token)
                assert r.status == 403, (who, method, path, r.status, r.text)
    # no credentials at all
    r = Client(hub).request("GET", f"/hub/api/gpulab/login-tokens/{alice}")
    assert r.status == 403
    # a signed-in member's browser session is no better than her token
    browser = Client(hub)
    assert browser.login(alice, alice_token).status == 302
    assert browser.get(f"/hub/api/gpulab/login-tokens/{alice}").status == 403
    # nothing changed
    assert [t["id"] for t in hub.api("GET", f"/gpulab/login-tokens/{bob}").json()[
        "login_tokens"]] == bob_ids


def test_token_sign_in_through_the_rest_api_is_refused(hub, hub_log):
    """JupyterHub's POST /users/NAME/tokens {"auth": ...} calls the authenticator
    without the login page, so without its throttle: gpulab refuses it."""
    name, token = member(hub)
    r = Client(hub).request("POST", f"/hub/api/users/{name}/tokens",
                            json_body={"auth": {"username": name, "password": token}})
    assert r.status == 403, r.text


# ------------------------------------------------------------------ sign-in


def test_issued_token_signs_in_and_sets_a_device_cookie(hub, hub_log):
    name, token = member(hub)
    browser = Client(hub)
    r = browser.login(name, token)
    assert r.status == 302, error_text(r.text)
    assert {"jupyterhub-hub-login", f"gpulab-device-{name}"} <= set(browser.cookies)
    device = next(h for h in r.headers.get_all("Set-Cookie")
                  if h.startswith(f"gpulab-device-{name}="))
    attrs = {a.strip().split("=")[0].lower() for a in device.split(";")[1:]}
    assert {"httponly", "path", "expires"} <= attrs and "Path=/hub/" in device
    assert "secure" not in attrs  # plain http here
    assert signed_in(browser)
    # behind a TLS proxy (JupyterHub's cookie rules): Secure
    r = Client(hub, source=TRUSTED_PROXY).login(name, token,
                                                headers={"X-Forwarded-Proto": "https"})
    device = next(h for h in r.headers.get_all("Set-Cookie")
                  if h.startswith(f"gpulab-device-{name}="))
    assert "Secure" in device and "HttpOnly" in device


@pytest.mark.parametrize("note", ["gpulab-login: x", "gpulab-login: issued by gpulab token issue",
                                  "gpulab-login", None])
def test_self_made_tokens_cannot_sign_in_whatever_their_note(hub, hub_log, note):
    name, token = member(hub)
    r = self_made_token(token, name, note=note, expires_in=None, hub=hub)
    assert r.status == 201, r.text
    made = r.json()
    # JupyterHub caps "never" at token_expires_in_max_seconds (hub.member_token_max_age)
    assert MAX_AGE - 60 < expires_in_seconds(made) <= MAX_AGE
    browser = Client(hub)
    r = browser.login(name, made["token"])
    assert r.status == 403 and error_text(r.text) == INVALID_LOGIN
    assert "jupyterhub-hub-login" not in browser.cookies and not signed_in(browser)
    assert whoami(hub, made["token"]) == 200  # still a fine token for scripts


def test_members_tokens_longer_than_the_limit_are_refused(hub, hub_log):
    name, token = member(hub)
    r = self_made_token(token, name, expires_in=MAX_AGE + 1, hub=hub)
    assert r.status == 400 and f"must not exceed {MAX_AGE}" in r.json()["message"]
    assert self_made_token(token, name, expires_in=MAX_AGE, hub=hub).status == 201


# ------------------------------------------------------------------ revocation


def oauth_token(hub: RunningHub, browser: Client) -> str:
    """An OAuth access token for the signed-in *browser*, from the oauth-probe service
    (what a user's server or a service gets when she opens it)."""
    redirect = "http://127.0.0.1:9/oauth_callback"
    query = urlencode({"client_id": "service-oauth-probe", "redirect_uri": redirect,
                       "response_type": "code", "state": "s1"})
    r = browser.get(f"/hub/api/oauth2/authorize?{query}",
                    headers={"Sec-Fetch-Mode": "navigate"})
    assert r.status == 302 and r.location.startswith(redirect), (r.status, r.location)
    code = parse_qs(urlsplit(r.location).query)["code"][0]
    r = Client(hub).request("POST", "/hub/api/oauth2/token", form={
        "client_id": "service-oauth-probe", "client_secret": hub.oauth_token,
        "grant_type": "authorization_code", "code": code, "redirect_uri": redirect})
    assert r.status == 200, r.text
    return r.json()["access_token"]


def hub_token_ids(hub: RunningHub, name: str) -> set[str]:
    r = hub.api("GET", f"/users/{name}/tokens")
    assert r.status == 200, r.text
    return {t["id"] for t in r.json()["api_tokens"]}


def test_revoking_the_last_login_token_ends_every_session_and_token(hub, hub_log):
    name, token = member(hub)
    browser = Client(hub)
    assert browser.login(name, token).status == 302 and signed_in(browser)
    script = self_made_token(token, name, hub=hub).json()
    oauth = oauth_token(hub, browser)
    assert whoami(hub, script["token"]) == 200 and whoami(hub, oauth) == 200
    [login] = hub.api("GET", f"/gpulab/login-tokens/{name}").json()["login_tokens"]

    r = hub.api("DELETE", f"/gpulab/login-tokens/{name}/{login['id']}")

    assert r.status == 200, r.text
    assert r.json() == {"revoked": login["id"], "login_tokens_left": 0,
                        "admin_api_tokens_left": [], "ended_access": {
                            "api_tokens": [script["id"]], "oauth_tokens": 1,
                            "kept_server_tokens": 0, "shares": 0}}
    assert not signed_in(browser)  # the very next request
    for dead in (token, script["token"], oauth):
        assert whoami(hub, dead) == 403
    assert hub_token_ids(hub, name) == set()
    r = Client(hub).login(name, token)
    assert r.status == 403 and error_text(r.text) == INVALID_LOGIN


# ---------------------------------------------- API tokens an admin makes (JupyterHub's API)


def admin_made_token(hub: RunningHub, name: str, **body) -> dict:
    """``POST /hub/api/users/{name}/tokens`` as an admin (the gpulab-admin service), as
    automation built on JupyterHub's REST API does."""
    r = hub.api("POST", f"/users/{name}/tokens", {"note": "grading bot", **body})
    assert r.status == 201, r.text
    return r.json()


def test_a_user_made_through_the_rest_api_uses_the_token_an_admin_made_for_it(hub, hub_log):
    """JupyterHub's documented path for service accounts and bots: create the user, make
    it a token, use the token. Before, gpulab deleted the token at its first use ("no
    valid login token left") and answered 403 without saying why."""
    name = new_name("bot")
    assert hub.api("POST", f"/users/{name}", {}).status == 201
    made = admin_made_token(hub, name)
    for _ in range(3):  # and again after auth_refresh_age (1 s): nothing ends it
        assert whoami(hub, made["token"]) == 200
        time.sleep(1.1)
    assert made["id"] in hub_token_ids(hub, name)
    # with the scopes it was given, as JupyterHub documents
    scoped = admin_made_token(hub, name, scopes=["read:users:name!user"])
    assert hub.api("GET", f"/users/{name}", token=scoped["token"]).status == 200
    assert hub.api("POST", f"/users/{name}/server", {}, token=scoped["token"]).status == 403
    # It is no login token: it never opens a browser session.
    r = Client(hub).login(name, made["token"])
    assert r.status == 403 and error_text(r.text) == INVALID_LOGIN
    # Deleting it through JupyterHub's API ends it, at once.
    assert hub.api("DELETE", f"/users/{name}/tokens/{made['id']}").status == 204
    assert whoami(hub, made["token"]) == 403


def test_a_member_cannot_make_a_token_that_stands_on_its_own(hub, hub_log):
    """Only an admin's token for another user stands on its own: a member's token for
    herself ends with her login token, whatever she asks for."""
    name, token = member(hub)
    own = self_made_token(token, name, note="grading bot", hub=hub).json()
    [login] = hub.api("GET", f"/gpulab/login-tokens/{name}").json()["login_tokens"]
    r = hub.api("DELETE", f"/gpulab/login-tokens/{name}/{login['id']}")
    assert r.json()["admin_api_tokens_left"] == []
    assert whoami(hub, own["token"]) == 403


def test_revoking_the_last_login_token_keeps_the_admins_api_token_and_ends_the_rest(
        hub, hub_log):
    name, token = member(hub)
    browser = Client(hub)
    assert browser.login(name, token).status == 302 and signed_in(browser)
    script = self_made_token(token, name, hub=hub).json()
    made = admin_made_token(hub, name)
    [login] = hub.api("GET", f"/gpulab/login-tokens/{name}").json()["login_tokens"]

    r = hub.api("DELETE", f"/gpulab/login-tokens/{name}/{login['id']}")

    assert r.status == 200, r.text
    assert r.json()["admin_api_tokens_left"] == [made["id"]]
    assert r.json()["ended_access"]["api_tokens"] == [script["id"]]
    assert not signed_in(browser)
    assert whoami(hub, script["token"]) == 403
    assert whoami(hub, made["token"]) == 200
    assert not signed_in(browser)  # her browser stays signed out


def test_ending_access_revokes_every_credential_an_admin_issued(hub, hub_log):
    name, token = member(hub)
    browser = Client(hub)
    assert browser.login(name, token).status == 302 and signed_in(browser)
    made = admin_made_token(hub, name)
    script = self_made_token(token, name, hub=hub).json()
    [login] = hub.api("GET", f"/gpulab/login-tokens/{name}").json()["login_tokens"]
    assert hub.api("DELETE", f"/gpulab/access/{name}", {"stop_servers": "yes"}).status == 400

    r = hub.api("DELETE", f"/gpulab/access/{name}", {"stop_servers": False})

    assert r.status == 200, r.text
    assert sorted(r.json()["revoked"]) == sorted([login["id"], made["id"]])
    assert r.json()["ended_access"]["api_tokens"] == [script["id"]]
    for dead in (token, made["token"], script["token"]):
        assert whoami(hub, dead) == 403
    assert hub_token_ids(hub, name) == set()
    assert not signed_in(browser)
    assert hub.api("GET", f"/users/{name}").status == 200  # the user (and her home) stay
    # members cannot end anyone's access, not even their own
    other, other_token = member(hub)
    assert hub.api("DELETE", f"/gpulab/access/{other}", {}, token=other_token).status == 403


def test_deleting_the_login_token_through_jupyterhubs_api_ends_access_too(hub, hub_log):
    name, token = member(hub)
    browser = Client(hub)
    assert browser.login(name, token).status == 302 and signed_in(browser)
    script = self_made_token(token, name, hub=hub).json()
    [login] = hub.api("GET", f"/gpulab/login-tokens/{name}").json()["login_tokens"]
    assert hub.api("DELETE", f"/users/{name}/tokens/{login['id']}").status == 204

    time.sleep(1.1)  # auth_refresh_age = 1
    assert not signed_in(browser)
    log = hub.log_path.read_text()
    assert f"User {name} has stale auth info. Login is required" in log
    assert "Failed to get current user" not in log
    # strict refresh: the script's token is refused, and it is deleted on the way
    assert whoami(hub, script["token"]) == 403
    assert hub_token_ids(hub, name) == set()


def test_an_expired_login_token_ends_access(hub, hub_log):
    name, token = member(hub, expires_in=2)
    browser = Client(hub)
    assert browser.login(name, token).status == 302 and signed_in(browser)
    script = self_made_token(token, name, hub=hub).json()
    time.sleep(2.5)
    assert not signed_in(browser)
    assert whoami(hub, script["token"]) == 403
    assert hub_token_ids(hub, name) == set()


def test_revoking_one_of_two_login_tokens_keeps_the_member_in(hub, hub_log):
    name, token = member(hub)
    spare = hub.api("POST", f"/gpulab/login-tokens/{name}", {"expires_in": 600}).json()
    browser = Client(hub)
    assert browser.login(name, token).status == 302
    script = self_made_token(token, name, hub=hub).json()
    r = hub.api("DELETE", f"/gpulab/login-tokens/{name}/{spare['id']}")
    assert r.json()["login_tokens_left"] == 1 and r.json()["ended_access"] is None
    time.sleep(1.1)
    assert signed_in(browser) and whoami(hub, script["token"]) == 200


# ------------------------------------------------------------------ throttle addresses


def fail(client: Client, username: str, headers: dict | None = None):
    return client.login(username, secrets.token_hex(16), headers=headers)


def spoofing_headers(i: int) -> dict:
    return {"X-Forwarded-For": f"203.0.113.{i}", "X-Real-Ip": f"198.51.100.{i}"}


def test_forwarded_headers_from_an_untrusted_peer_are_ignored(hub, hub_log):
    attacker = Client(hub, source="127.0.0.5")
    # every attempt claims another address; the username changes too (no name lock)
    statuses = [fail(attacker, new_name("x"), spoofing_headers(i)).status for i in range(20)]
    assert statuses[:19] == [403] * 19 and statuses[19] in (403, 429), statuses
    r = fail(attacker, new_name("x"), spoofing_headers(99))
    assert r.status == 429 and LOCKED in error_text(r.text)
    assert 0 < int(r.headers["Retry-After"]) <= 15 * 60
    # the hub's access log names the peer too, not what it claimed
    log = hub.log_path.read_text()
    assert log.count("POST /hub/login (@127.0.0.5)") >= 20  # the last may not be written yet
    assert "(@203.0.113." not in log and "(@198.51.100." not in log
    # the addresses it claimed are not locked: not from another peer claiming them ...
    r = fail(Client(hub, source="127.0.0.6"), new_name("y"), spoofing_headers(3))
    assert r.status == 403 and error_text(r.text) == INVALID_LOGIN
    # ... and not when the trusted proxy says a client with that address is calling
    r = fail(Client(hub, source=TRUSTED_PROXY), new_name("y"),
             {"X-Forwarded-For": "203.0.113.3"})
    assert r.status == 403


def test_from_the_trusted_proxy_the_rightmost_untrusted_hop_is_the_client(hub, hub_log):
    proxy = Client(hub, source=TRUSTED_PROXY)
    for i in range(20):  # the client varies what it sends; the proxy appends its address
        fail(proxy, new_name("x"), {"X-Forwarded-For": f"6.6.6.{i}, 192.0.2.20",
                                    "X-Real-Ip": f"7.7.7.{i}"})
    assert fail(proxy, new_name("x"), {"X-Forwarded-For": "192.0.2.20"}).status == 429
    # a trusted hop to the right of the client is skipped
    assert fail(proxy, new_name("x"), {"X-Forwarded-For": f"192.0.2.20, {TRUSTED_PROXY}"}
                ).status == 429
    # other clients of the same proxy, and other peers, are not locked
    assert fail(proxy, new_name("x"), {"X-Forwarded-For": "192.0.2.20, 192.0.2.21"}
                ).status == 403
    assert fail(Client(hub, source="127.0.0.7"), new_name("x")).status == 403


def test_device_cookie_keeps_the_member_in_while_her_name_and_address_are_locked(hub, hub_log):
    name, token = member(hub, "carol")
    address = "127.0.0.8"  # a lab NAT: carol and the attacker share it
    carol = Client(hub, source=address)
    assert carol.login(name, token).status == 302
    for cookie in ("jupyterhub-hub-login", "jupyterhub-session-id"):
        carol.cookies.pop(cookie)  # signed out; the device cookie stays
    assert f"gpulab-device-{name}" in carol.cookies

    attacker = Client(hub, source=address)
    for _ in range(5):
        fail(attacker, name)  # locks the name
    for _ in range(15):
        fail(attacker, new_name("x"))  # and the shared address
    assert fail(attacker, new_name("x")).status == 429
    assert attacker.get("/hub/login").status == 429
    assert Client(hub, source=address).login(name, token).status == 429  # a new browser

    assert carol.get("/hub/login").status == 200
    r = carol.login(name, token)
    assert r.status == 302, error_text(r.text)
    assert signed_in(carol)

    # her device has a lock of its own: five failures with it lock just it
    carol.cookies.pop("jupyterhub-hub-login")
    statuses = [fail(carol, name).status for _ in range(5)]
    assert statuses[:4] == [403] * 4, statuses
    assert carol.login(name, token).status == 429
    # the name's lockout was not lifted by her sign-in: the attacker is still out
    other = Client(hub, source="127.0.0.9")
    assert other.login(name, token).status == 429


def test_a_device_cookie_is_for_its_own_username_only(hub, hub_log):
    dave, dave_token = member(hub, "dave")
    erin, _ = member(hub, "erin")
    browser = Client(hub, source="127.0.0.10")
    assert browser.login(dave, dave_token).status == 302
    browser.cookies.pop("jupyterhub-hub-login")
    for _ in range(5):
        fail(browser, erin)  # dave's device cookie does not shield guesses at erin
    assert fail(browser, erin).status == 429
    assert browser.login(dave, dave_token).status == 302  # dave's name was never locked


def test_forged_device_cookie_does_not_count(hub, hub_log):
    name, token = member(hub, "fay")
    browser = Client(hub, source="127.0.0.11")
    browser.cookies[f"gpulab-device-{name}"] = "2|1:0|10:1700000000|" + "A" * 40
    for _ in range(5):
        fail(browser, name)
    assert browser.login(name, token).status == 429  # the name lock applies


# ------------------------------------------------------------------ the gpulab CLI


@pytest.fixture
def cli_env(hub, tmp_path, monkeypatch):
    """`gpulab token ...` as inside the hub container: the gpulab-admin service token."""
    token_file = tmp_path / "api-token"
    token_file.write_text(hub.admin_token + "\n")
    monkeypatch.setenv("GPULAB_HUB_API", f"http://127.0.0.1:{hub.hub_port}/hub/api")
    monkeypatch.setenv("GPULAB_API_TOKEN_FILE", str(token_file))
    return tmp_path


def gpulab(capsys, *argv) -> tuple[int, str, str]:
    from gpulab import cli

    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_issues_lists_and_revokes_through_the_admin_api(hub, hub_log, cli_env, capsys):
    name = new_name("cli")
    rc, out, _ = gpulab(capsys, "token", "issue", name, "--expires", "1h")
    assert rc == 0, out
    token = re.search(r"^    ([0-9a-f]{32})$", out, re.M).group(1)
    token_id = re.search(r"\(id (a\d+), expires ", out).group(1)
    assert Client(hub).login(name, token).status == 302

    rc, out, _ = gpulab(capsys, "token", "list", name)
    assert rc == 0 and out.split("\t")[0] == token_id and "expires 20" in out
    assert token not in out

    rc, out, err = gpulab(capsys, "token", "revoke", name, "a999999")
    assert rc == 1 and "HTTP 404" in err and "has no login token a999999" in err
    rc, out, _ = gpulab(capsys, "token", "revoke", name, token_id)
    assert rc == 0 and f"{name} has no login token left" in out
    assert Client(hub).login(name, token).status == 403


def test_cli_admin_flag_issues_for_admins_only_and_says_how(hub, hub_log, cli_env, capsys):
    """JupyterHub lets only admins grant admin, and hub.admins is applied at every start:
    `--admin` checks, and a member gets no token and no admin right, but the way there."""
    name = new_name("cli")
    rc, out, err = gpulab(capsys, "token", "issue", name, "--admin")
    assert rc == 1 and out == ""
    assert f"{name} is not a hub admin" in err and "hub.admins" in err, err
    assert hub.api("GET", f"/users/{name}").status == 404  # nothing created
    hub.api("POST", f"/users/{name}", {})
    rc, out, err = gpulab(capsys, "token", "issue", name, "--admin")
    assert rc == 1 and "is not a hub admin" in err
    assert hub.api("GET", f"/users/{name}").json()["admin"] is False

    admin = "rootadmin"  # in the hub's admin role, as hub.admins puts it there
    rc, out, err = gpulab(capsys, "token", "issue", admin, "--admin", "--expires", "1h")
    assert rc == 0 and f"Login token for {admin}" in out, err
    token_id = re.search(r"\(id (a\d+), expires ", out).group(1)
    assert gpulab(capsys, "token", "revoke", admin, token_id)[0] == 0  # as bootstrap expects


def test_cli_bootstrap_admin_issues_once(hub, hub_log, cli_env, capsys):
    name = "rootadmin"  # in the hub's admin role, as hub.admins puts it there
    config = cli_env / "gpulab.yaml"
    config.write_text(f"hub:\n  admins: [{name}]\n")
    rc, out, _ = gpulab(capsys, "bootstrap-admin", "--config", str(config))
    assert rc == 0 and f"Login token for {name}" in out
    token = re.search(r"^    ([0-9a-f]{32})$", out, re.M).group(1)
    assert hub.api("GET", f"/users/{name}").json()["admin"] is True
    assert Client(hub).login(name, token).status == 302
    rc, out, _ = gpulab(capsys, "bootstrap-admin", "--config", str(config))
    assert rc == 0 and "already has a login token" in out


def test_the_hub_client_pages_through_the_real_hubs_users(hub, hub_log):
    """gpulab.hubapi's paging against JupyterHub's own: every user once, two a page."""
    names = {new_name("page") for _ in range(5)}
    for name in names:
        assert hub.api("POST", f"/users/{name}", {}).status == 201
    api = SyncHubApi(HubApi(f"http://127.0.0.1:{hub.hub_port}/hub/api", hub.admin_token))
    listed = [u["name"] for u in api.pages("/users", limit=2)]
    assert names <= set(listed) and len(listed) == len(set(listed))
    assert listed == [u["name"] for u in api.users()]


class DeletesAfterListing(HubApi):
    """The real hub's API, where another admin deletes *victim* right after the user
    list was read (the race CI met: the members page answered 404 as a whole)."""

    def __init__(self, url: str, token: str, hub: RunningHub, victim: str):
        super().__init__(url, token)
        self.hub, self.victim = hub, victim

    async def users(self, state: str = "", *, token: str | None = None) -> list[dict]:
        listed = await super().users(state, token=token)
        assert self.hub.api("DELETE", f"/users/{self.victim}").status == 204
        return listed


def test_the_members_page_leaves_out_a_member_deleted_while_it_reads(hub, hub_log):
    stays, _ = member(hub, "stays")
    goes, _ = member(hub, "goes")
    url = f"http://127.0.0.1:{hub.hub_port}/hub/api"
    model = asyncio.run(HubMembers(DeletesAfterListing(url, hub.admin_token, hub, goes))
                        .model(hub.admin_token))
    names = [row["name"] for row in model["members"]]
    assert stays in names and goes not in names

    class NoTokenApi(HubApi):  # a 404 of the login-token API itself is still said
        async def login_tokens(self, user, *, token=None):
            return await self.request("GET", "/gpulab/no-such-api", token=token)
    with pytest.raises(MemberError, match="404"):
        asyncio.run(HubMembers(NoTokenApi(url, hub.admin_token)).model(hub.admin_token))
