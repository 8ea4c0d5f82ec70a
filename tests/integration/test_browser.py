"""Token login in a real browser: Debian's Chromium driven by Playwright.

A lab member opens the hub, signs in with their username and personal access token,
watches the spawn progress page and lands in JupyterLab; wrong, revoked and other
users' tokens get nowhere; repeated failures are throttled with HTTP 429; the page
neither redirects off the hub after sign-in nor runs markup typed into the form.

Needs `/usr/bin/chromium-headless-shell` (`apt-get install chromium-headless-shell`;
tests/chromium.py) and the `playwright` package (never `playwright install`: the
system's browser is used). Without them the tests
are skipped, except under CI=true, where a skip fails the run (tests/conftest.py).

Screenshots: of every open page when a test fails, and of the login page, the spawn
progress page and JupyterLab when the sign-in test passes, in `artifacts/`.

Failed sign-ins count against the test client's address in the hub's login throttle
(20 per 15 minutes lock the address). This module makes 8 such failures; it restores
the address's counter afterwards when no lockout happened meanwhile, so that running
the suite a few times in a row does not lock every later sign-in out.
"""

from __future__ import annotations

import os
import re
import secrets
from urllib.parse import urlsplit

import pytest
import requests

from .browser import (
    SESSION_COOKIES,
    login_error,
    screenshot,
    session_cookies,
    start_without_a_gpu_if_asked,
    submit_login,
)
from .stack import HUB_URL
from .throttle_rows import failures_undone

HUB_CONTAINER = os.environ.get("GPULAB_HUB_CONTAINER", "gpulab-hub")
INVALID_LOGIN = "Invalid username or token."
PROGRESS_STREAM = re.compile(r"/hub/api/users/[^/]+/server/progress")
XSS_NAME = '"><script>alert(1)</script>'


# ------------------------------------------------------------- login throttle hygiene

FAILED_USERNAMES: list[str] = []  # usernames this module failed to sign in as


@pytest.fixture(scope="module", autouse=True)
def address_throttle(browser, hub):
    """Refuse to start when the client address is locked; undo this module's failures
    (tests/integration/throttle_rows.py)."""
    with failures_undone(hub, FAILED_USERNAMES):
        yield


# ------------------------------------------------------------------------------ tests


def test_member_signs_in_sees_progress_and_lands_in_jupyterlab(hub, lab_user, new_page):
    user = lab_user("browser")
    page = new_page()

    # The hub's front page sends a stranger to the sign-in form.
    page.goto(f"{HUB_URL}/")
    assert urlsplit(page.url).path == "/hub/login", page.url
    assert page.title() == "Sign in - gpulab"
    assert page.locator("label[for=username_input]").inner_text() == "Username"
    assert page.locator("label[for=password_input]").inner_text() == "Personal access token"
    assert page.get_attribute("#password_input", "type") == "password"
    assert "gpulab token issue" in page.locator("#token-help").inner_text()
    assert session_cookies(page) == set()
    screenshot(page, "browser-login-page.png")

    # Hold the spawn's progress event stream until the progress page has been checked:
    # the page leaves for the server only when that stream says "ready".
    held = []
    page.route(PROGRESS_STREAM, lambda route: held.append(route))

    page.fill("#username_input", user.name)
    page.fill("#password_input", user.token)
    with page.expect_response(
        lambda r: "/hub/spawn-pending/" in r.url and r.request.is_navigation_request(),
        timeout=90_000,
    ) as pending:
        page.click("#login_submit")
        page.wait_for_url(re.compile(r"/hub/spawn"), timeout=60_000)
        start_without_a_gpu_if_asked(page)  # the form, where gpus.yaml offers GPUs
    assert pending.value.status == 200
    assert urlsplit(page.url).path == f"/hub/spawn-pending/{user.name}", page.url
    bar = page.locator("#progress-bar.progress-bar[role=progressbar]")
    bar.wait_for(state="attached")
    assert bar.get_attribute("aria-valuemin") == "0"
    assert bar.get_attribute("aria-valuemax") == "100"
    assert session_cookies(page) == SESSION_COOKIES
    for _ in range(300):  # sleep inside Playwright, so that its route handler runs
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "the spawn-pending page never opened its progress event stream"
    screenshot(page, "browser-spawn-pending.png")

    # Let the progress stream through: the bar fills and the page moves on to the lab.
    for route in held:
        route.continue_()
    page.unroute(PROGRESS_STREAM)
    page.wait_for_url(re.compile(rf"/user/{re.escape(user.name)}/lab"), timeout=120_000)
    page.locator("#jp-main-dock-panel").wait_for(state="visible", timeout=120_000)
    page.locator(".jp-LabShell").wait_for(state="attached")
    page.locator(".jp-Launcher").first.wait_for(state="visible", timeout=60_000)
    assert (hub.server_model(user.name) or {}).get("ready") is True
    screenshot(page, "browser-jupyterlab.png")


def test_wrong_token_is_refused_without_a_session(hub, lab_user, new_page):
    user = lab_user("browser")
    page = new_page()
    wrong = secrets.token_hex(16)
    FAILED_USERNAMES.append(user.name)

    response = submit_login(page, user.name, wrong)

    assert response.status == 403
    assert urlsplit(page.url).path == "/hub/login"
    assert login_error(page) == INVALID_LOGIN
    assert session_cookies(page) == set()
    # the username is kept for a second try; the token is neither kept nor echoed
    assert page.input_value("#username_input") == user.name
    assert page.input_value("#password_input") == ""
    assert wrong not in page.content()
    # and the hub home is still out of reach
    page.goto(f"{HUB_URL}/hub/home")
    assert urlsplit(page.url).path == "/hub/login"


def test_revoked_token_is_refused(hub, lab_user, new_page):
    user = lab_user("browser")

    # the token works before it is revoked ...
    first = new_page()
    response = submit_login(first, user.name, user.token, next_url="/hub/home")
    assert response.status == 200 and urlsplit(first.url).path == "/hub/home", first.url
    assert session_cookies(first) == SESSION_COOKIES

    r = hub.request("GET", f"/users/{user.name}/tokens")
    assert r.status_code == 200, r.text
    login_tokens = [t for t in r.json()["api_tokens"]
                    if (t.get("note") or "").startswith("gpulab-login")]
    assert len(login_tokens) == 1, r.json()
    r = hub.request("DELETE", f"/users/{user.name}/tokens/{login_tokens[0]['id']}")
    assert r.status_code == 204, r.text

    # ... and not after
    FAILED_USERNAMES.append(user.name)
    page = new_page()
    response = submit_login(page, user.name, user.token)
    assert response.status == 403
    assert login_error(page) == INVALID_LOGIN
    assert session_cookies(page) == set()
    assert requests.get(f"{hub.api}/user", timeout=30,
                        headers={"Authorization": f"token {user.token}"}).status_code == 403


def test_member_cannot_open_another_members_server(hub, lab_user, new_page):
    alice, bob = lab_user("browser"), lab_user("browser")
    bob.start_server()

    page = new_page()
    submit_login(page, alice.name, alice.token, next_url="/hub/home")
    assert urlsplit(page.url).path == "/hub/home", page.url

    response = page.goto(f"{HUB_URL}/user/{bob.name}/lab")
    # Bob's server sends Alice through the hub's OAuth, which refuses her.
    assert response.status == 403, (response.status, page.url)
    assert urlsplit(page.url).path == "/hub/api/oauth2/authorize", page.url
    body = page.locator("body").inner_text()
    assert f"You do not have permission to access Server at /user/{bob.name}/" in body
    assert page.locator("#jp-main-dock-panel").count() == 0
    # no login cookie for Bob's server (only the OAuth state cookie of the attempt)
    assert f"jupyterhub-user-{bob.name}" not in {c["name"] for c in page.context.cookies()}

    status = f"{bob.server_url}/api/status"
    r = requests.get(status, headers={"Authorization": f"token {alice.token}"}, timeout=30)
    assert r.status_code == 403, r.text
    r = requests.get(status, headers={"Authorization": f"token {bob.token}"}, timeout=30)
    assert r.status_code == 200, r.text  # the server is up: the 403 was about Alice


def test_repeated_failures_lock_the_username_with_429(hub, lab_user, new_page):
    user = lab_user("brute")
    FAILED_USERNAMES.append(user.name)
    page = new_page()

    statuses = [submit_login(page, user.name, secrets.token_hex(16)).status for _ in range(5)]
    # four plain refusals; the fifth failure locks the name (and may already say so)
    assert statuses[:4] == [403] * 4, statuses
    assert statuses[4] in (403, 429), statuses

    # even the right token is refused now, with when to try again
    response = submit_login(page, user.name, user.token)
    assert response.status == 429
    retry_after = int(response.headers["retry-after"])
    assert 0 < retry_after <= 15 * 60, retry_after
    message = login_error(page)
    match = re.search(r"Try again after (\d\d):(\d\d) UTC \(in (\d+) minutes?\)", message)
    assert match, message
    assert int(match.group(3)) == -(-retry_after // 60), (message, retry_after)
    assert session_cookies(page) == set()
    assert user.token not in page.content()
    screenshot(page, "browser-login-locked-429.png")

    # the lock is on the name: another member signs in from the same address
    other = lab_user("browser")
    page2 = new_page()
    response = submit_login(page2, other.name, other.token, next_url="/hub/home")
    assert response.status == 200 and urlsplit(page2.url).path == "/hub/home", page2.url


EVIL_NEXT = ["https://evil.example/", "//evil.example/", "/\\evil.example/",
             "https:evil.example", "/%2F%2Fevil.example/"]


def test_no_redirect_off_the_hub_after_sign_in(hub, lab_user, new_page):
    user = lab_user("browser")
    page = new_page()
    off_hub = []
    page.context.route(lambda url: urlsplit(url).hostname == "evil.example",
                       lambda route: (off_hub.append(route.request.url), route.abort()))

    def on_this_hub(url: str) -> bool:
        # JupyterHub replaces a refused ?next= by its default (the user's own server,
        # by way of the spawn page); gpulab's second check falls back to /hub/home
        here = urlsplit(url)
        return (here.scheme, here.netloc) == ("http", urlsplit(HUB_URL).netloc) and (
            here.path.startswith(("/hub/", f"/user/{user.name}/")))

    response = submit_login(page, user.name, user.token, next_url=EVIL_NEXT[0])

    assert response.status == 200
    assert on_this_hub(page.url), page.url
    assert session_cookies(page) == SESSION_COOKIES
    # once signed in, the login page redirects at once: it must be just as careful
    for evil in EVIL_NEXT:
        page.goto(f"{HUB_URL}/hub/login?" + requests.compat.urlencode({"next": evil}))
        assert on_this_hub(page.url), (evil, page.url)
    assert off_hub == []


def test_markup_in_the_username_is_shown_escaped(hub, new_page):
    page = new_page()
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    scripts_with_alert = "[...document.scripts].filter(s => s.text.includes('alert(1)')).length"

    # echoed from the query string (no sign-in attempt) ...
    page.goto(f"{HUB_URL}/hub/login?" + requests.compat.urlencode({"username": XSS_NAME}))
    assert page.input_value("#username_input") == XSS_NAME
    assert page.evaluate(scripts_with_alert) == 0
    assert "<script>alert(1)</script>" not in page.content()

    # ... and from a refused sign-in
    response = submit_login(page, XSS_NAME, secrets.token_hex(16))
    assert response.status == 403
    assert "lowercase letters a-z and digits" in login_error(page)
    assert page.input_value("#username_input") == XSS_NAME
    assert page.evaluate(scripts_with_alert) == 0
    html = page.content()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert dialogs == []
    assert session_cookies(page) == set()



def test_operator_sees_the_gpu_dashboard_and_a_member_is_refused(hub, lab_user, new_page):
    operator, member = lab_user("ops"), lab_user("plain")
    r = hub.request("POST", "/groups/operators/users", json={"users": [operator.name]})
    assert r.status_code == 200, r.text
    try:
        page = new_page()
        submit_login(page, operator.name, operator.token, next_url="/services/gpus/")
        page.goto(f"{HUB_URL}/services/gpus/")
        page.wait_for_selector("#summary", timeout=30_000)
        assert "/services/gpus/" in page.url
        # One row per GPU the dashboard's own API reports, and there are GPUs: `make test`
        # runs the exporter with fake ones on hosts without (a page that lost its rows
        # must fail here, not pass as "No GPUs on this host").
        api = requests.get(f"{HUB_URL}/services/gpus/api/gpus", timeout=30,
                           headers={"Authorization": f"token {operator.token}"}).json()
        assert api["gpus"], "the exporter reports no GPU (stack not started by `make test`?)"
        rows = page.locator("#gpu-rows tr.gpu")
        assert rows.count() == len(api["gpus"]), page.locator("#summary").inner_text()
        assert page.locator("#message").is_hidden()
        assert rows.first.locator("td").nth(1).inner_text().split("\n")[0] == api["gpus"][0]["model"]
        assert page.locator("#summary").inner_text().startswith(f"{len(api['gpus'])} GPU")
        before = page.locator("#updated").inner_text()
        page.wait_for_function(  # refreshed live, without reloading the page
            "t => document.querySelector('#updated').textContent !== t", arg=before,
            timeout=20_000)
        screenshot(page, "browser-gpu-dashboard.png")

        other = new_page()
        submit_login(other, member.name, member.token)
        response = other.goto(f"{HUB_URL}/services/gpus/")
        assert response.status == 403
        assert "permission" in other.content().lower()
        assert other.locator("#gpu-rows").count() == 0
    finally:
        hub.request("DELETE", "/groups/operators/users", json={"users": [operator.name]})
