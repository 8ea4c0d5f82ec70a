"""Login tokens and the login throttle on the real stack (findings 1 and 2).

* A member's self-made token cannot sign in, whatever its note, and its lifetime is
  capped by hub.member_token_max_age (JupyterHub's token_expires_in_max_seconds).
* `gpulab token revoke` of a member's last login token ends her browser session at
  the next page load and kills the tokens she made herself.
* From inside a member's own container (which reaches the hub's port 8081 directly),
  X-Forwarded-For and X-Real-Ip choose nothing: the failures count against the
  container's address, and the addresses it claims are not locked.

Failed sign-ins count in the hub's login throttle. The module puts back the counters
it changed: the host's address counter (as test_browser.py does, unless a real
lockout happened meanwhile), and, after the container test, the container's address
and the usernames it tried, so that later tests (or a later container with the same
address) are not locked out.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from datetime import UTC, datetime
from urllib.parse import urlsplit

import pytest
import requests

from gpulab.settings import load_settings

from .browser import session_cookies, submit_login
from .stack import HUB_URL, docker, form_login
from .test_browser import HUB_CONTAINER, INVALID_LOGIN
from .throttle_rows import failures_undone, throttle

HUB_PORT_IN_NETWORK = "http://gpulab-hub:8081"

# ------------------------------------------------------------- login throttle hygiene

FAILED_USERNAMES: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def throttle_hygiene(hub):
    with failures_undone(hub, FAILED_USERNAMES):
        yield


# ------------------------------------------------------------------------- helpers


def login_error_text(html: str) -> str:
    m = re.search(r'class="login_error[^"]*">([^<]*)<', html)
    return m.group(1).strip() if m else ""


def as_member(user, method: str, path: str, **kw) -> requests.Response:
    return requests.request(method, f"{user.hub.api}{path}", timeout=30,
                            headers={"Authorization": f"token {user.token}"}, **kw)


def member_token_max_age(lab_config) -> int:
    return load_settings(lab_config.dir / "gpulab.yaml")["hub.member_token_max_age"]


def seconds_until(iso: str) -> float:
    return (datetime.fromisoformat(iso.replace("Z", "+00:00")) - datetime.now(UTC)
            ).total_seconds()


# --------------------------------------------------------------------------- tests


def test_a_self_made_token_cannot_sign_in_and_its_lifetime_is_capped(hub, lab_user,
                                                                     lab_config):
    alice = lab_user("selfmade")
    max_age = member_token_max_age(lab_config)
    assert max_age > 0, "hub.member_token_max_age is 0 on this stack: tokens are not capped"

    r = as_member(alice, "POST", f"/users/{alice.name}/tokens",
                  json={"note": "gpulab-login: x", "expires_in": None})
    assert r.status_code == 201, r.text
    made = r.json()
    # JupyterHub turns "never" into the maximum, and refuses more than it
    assert made["expires_at"] is not None
    assert max_age - 120 < seconds_until(made["expires_at"]) <= max_age
    r = as_member(alice, "POST", f"/users/{alice.name}/tokens",
                  json={"note": "x", "expires_in": max_age + 1})
    assert r.status_code == 400, r.text

    FAILED_USERNAMES.append(alice.name)
    r = form_login(alice.name, made["token"])
    assert r.status_code == 403, r.status_code
    assert login_error_text(r.text) == INVALID_LOGIN
    assert "jupyterhub-hub-login" not in r.session_cookies
    # nor can she issue herself a login token through the admin endpoint
    r = as_member(alice, "POST", f"/gpulab/login-tokens/{alice.name}", json={"expires_in": None})
    assert r.status_code == 403, r.text
    # while her admin-issued token still signs in
    assert form_login(alice.name, alice.token).status_code == 302


def test_revoking_her_login_token_ends_her_session_and_her_tokens(hub, lab_user, new_page):
    alice = lab_user("revoke")
    page = new_page()
    response = submit_login(page, alice.name, alice.token, next_url="/hub/home")
    assert response.status == 200 and urlsplit(page.url).path == "/hub/home", page.url
    assert session_cookies(page)
    r = as_member(alice, "POST", f"/users/{alice.name}/tokens", json={"note": "my script"})
    assert r.status_code == 201, r.text
    script = r.json()["token"]
    assert requests.get(f"{hub.api}/user", headers={"Authorization": f"token {script}"},
                        timeout=30).status_code == 200

    listing = docker("exec", HUB_CONTAINER, "gpulab", "token", "list", alice.name)
    token_ids = [line.split("\t")[0] for line in listing.splitlines() if line.strip()]
    assert len(token_ids) == 1, listing
    out = docker("exec", HUB_CONTAINER, "gpulab", "token", "revoke", alice.name, token_ids[0])
    assert "no login token left" in out, out

    page.goto(f"{HUB_URL}/hub/home")
    assert urlsplit(page.url).path == "/hub/login", page.url
    for token in (script, alice.token):
        r = requests.get(f"{hub.api}/user", headers={"Authorization": f"token {token}"},
                         timeout=30)
        assert r.status_code == 403, (r.status_code, r.text)


CONTAINER_ATTACK = r'''
import json, re, urllib.error, urllib.request, uuid

HUB = HUB_URL

def call(req):
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()

def attempt(i):
    # as a browser would: the login page for the _xsrf cookie and field, then the form
    spoof = {"X-Forwarded-For": f"203.0.113.{i}", "X-Real-Ip": f"198.51.100.{i}",
             "User-Agent": "gpulab-test", "Sec-Fetch-Mode": "navigate"}
    _, headers, page = call(urllib.request.Request(HUB + "/hub/login", headers=spoof))
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page).group(1)
    cookie = next(c.split(";")[0] for c in headers.get_all("Set-Cookie")
                  if c.startswith("_xsrf="))
    name = "nobody" + uuid.uuid4().hex[:10]
    body = f"_xsrf={xsrf}&username={name}&password={uuid.uuid4().hex}".encode()
    post = urllib.request.Request(HUB + "/hub/login", data=body, headers={
        **spoof, "Cookie": cookie, "Sec-Fetch-Site": "same-origin",
        "Content-Type": "application/x-www-form-urlencoded"})
    return name, call(post)[0]

results = [attempt(i) for i in range(21)]
print(json.dumps({"names": [n for n, _ in results], "statuses": [s for _, s in results]}))
'''


def test_forwarded_headers_from_a_user_container_choose_nothing(hub, lab_user):
    alice = lab_user("spoof")
    alice.start_server()
    ip = json.loads(docker("inspect", alice.container))[0]["NetworkSettings"]["Networks"][
        "gpulab"]["IPAddress"]
    throttle("forget", addresses=[ip], users=[])  # a count left by an earlier container
    result = None
    try:
        out = alice.run_code(CONTAINER_ATTACK.replace("HUB_URL", repr(HUB_PORT_IN_NETWORK)))
        result = json.loads(out.strip().splitlines()[-1])
        statuses = result["statuses"]
        # 20 failures from the container's own address lock it, whatever it claims
        assert statuses[:19] == [403] * 19, statuses
        assert statuses[19:] == [429, 429], statuses

        rows = throttle("read")
        assert rows[f"address|{ip}"][2] > time.time()  # locked_until
        claimed = [k for k in rows if k.split("|", 1)[1].startswith(("203.0.113.",
                                                                     "198.51.100."))]
        assert claimed == [], claimed
        # a client that really has a claimed address is not locked: a plain refusal
        FAILED_USERNAMES.append(f"nobody{secrets.token_hex(5)}")
        r = form_login(FAILED_USERNAMES[-1], secrets.token_hex(16),
                       headers={"X-Forwarded-For": "203.0.113.3", "X-Real-Ip": "203.0.113.3"})
        assert r.status_code == 403, r.status_code
        assert login_error_text(r.text) == INVALID_LOGIN
    finally:
        names = result["names"] if result else []
        throttle("forget", addresses=[ip], users=names)


def test_someone_elses_failures_never_lock_a_member_out_of_her_own_browser(hub, lab_user,
                                                                           new_page):
    """Through the published port, in Chromium: a browser that signed in as alice before
    carries her device cookie; five wrong tokens for her username from elsewhere lock the
    username for everyone else, not for that browser."""
    alice = lab_user("device")
    FAILED_USERNAMES.append(alice.name)
    mine = new_page()
    submit_login(mine, alice.name, alice.token, next_url="/hub/home")
    assert urlsplit(mine.url).path == "/hub/home", mine.url
    mine.goto(f"{HUB_URL}/hub/logout")
    assert not session_cookies(mine)
    assert any(c["name"] == f"gpulab-device-{alice.name}" for c in mine.context.cookies())

    for _ in range(5):  # an attacker guessing her token
        assert form_login(alice.name, secrets.token_hex(16)).status_code in (403, 429)
    assert form_login(alice.name, alice.token).status_code == 429  # locked for them...

    fresh = new_page()
    response = submit_login(fresh, alice.name, alice.token)
    assert response.status == 429  # ... and for a browser she never used

    response = submit_login(mine, alice.name, alice.token, next_url="/hub/home")
    assert response.status == 200 and urlsplit(mine.url).path == "/hub/home", mine.url
    assert session_cookies(mine)
