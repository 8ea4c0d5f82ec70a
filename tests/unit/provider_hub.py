"""What the single sign-on tests of a real hub (test_sso_hub.py, test_ldap_hub.py) do alike:
read a member back, see whether her browser session holds, wait for a check, sign in on
the token form, drive Chromium."""

from __future__ import annotations

import contextlib
import time
from urllib.parse import urlsplit

import pytest
import requests

from tests.chromium import CHROMIUM, CHROMIUM_ARGS, missing


def user_model(hub, name: str) -> dict | None:
    r = hub.api("GET", f"/users/{name}")
    return r.json() if r.status == 200 else None


def home_status(s: requests.Session, hub) -> str:
    """"home" while her session holds, "login" once she must sign in again."""
    r = s.get(f"{hub.url}/hub/home", allow_redirects=False, timeout=10,
              headers={"Sec-Fetch-Mode": "navigate"})
    if r.status_code == 200:
        return "home"
    assert r.status_code == 302, r.status_code
    return "login" if urlsplit(r.headers["Location"]).path == "/hub/login" else r.headers["Location"]


def wait_for(check, what: str, timeout: float) -> float:
    """Polls *check* until true; when it was."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.25)
    return time.monotonic()


def form_sign_in(hub, name: str, secret: str) -> tuple[requests.Session, requests.Response]:
    """The sign-in form, as a browser posts it (login token, or directory password)."""
    s = requests.Session()
    s.get(f"{hub.url}/hub/login", timeout=10)
    r = s.post(f"{hub.url}/hub/login?next=%2Fhub%2Fhome", timeout=15, data={
        "username": name, "password": secret, "_xsrf": s.cookies.get("_xsrf")})
    return s, r


@contextlib.contextmanager
def chromium_page(screenshot):
    """A page in headless Chromium (tests/chromium.py, driven by Playwright); *screenshot*
    (a path) gets the page if the block fails."""
    why = missing()
    if why:
        pytest.skip(why)
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(20_000)
            try:
                yield page
            except Exception:
                page.screenshot(path=str(screenshot))
                raise
        finally:
            browser.close()
