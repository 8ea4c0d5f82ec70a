"""Headless Chromium for the integration tests: Debian's chromium-headless-shell driven by
Playwright (which one and why: tests/chromium.py).

The fixtures ``browser`` (one Chromium per test module) and ``new_page`` (a page in its
own context, i.e. its own cookies; screenshots of every page of a failed test go to
``artifacts/``) are made available to every module by tests/integration/conftest.py.
Needs the browser and the ``playwright`` package (never ``playwright install``: the
system's browser is used); without them the tests skip, and under CI=true a skip fails
the run (tests/conftest.py).
"""

from __future__ import annotations

import functools
import re
import time
import warnings
from urllib.parse import urlsplit

import pytest
import requests

from ..chromium import CHROMIUM, CHROMIUM_ARGS, missing
from .stack import HUB_URL, REPO

ARTIFACTS = REPO / "artifacts"
SESSION_COOKIES = {"jupyterhub-session-id", "jupyterhub-hub-login"}


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (`make test` installs it: scripts/test-host.sh)."""
    why = missing()
    if why:
        pytest.skip(why)
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def new_page(browser, request):
    """Factory: a page in its own browser context (its own cookies).

    When the test fails, every page it opened is saved to artifacts/ as a screenshot.
    """
    contexts, pages = [], []

    def make():
        context = browser.new_context(viewport={"width": 1280, "height": 860})
        context.set_default_timeout(30_000)
        page = context.new_page()
        # every page.goto and page.reload of a test outlives a network change on this
        # host, as a member's reload would (seen in CI: ERR_NETWORK_CHANGED at
        # /services/gpus/leases when another lane's container started)
        page.goto = functools.partial(_retrying, page, page.goto)
        page.reload = functools.partial(_retrying, page, page.reload)
        contexts.append(context)
        pages.append(page)
        return page

    yield make
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for i, page in enumerate(pages):
            path = ARTIFACTS / f"browser-FAILED-{request.node.name}-{i}.png"
            try:
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(path), full_page=True)
                print(f"\nscreenshot of {page.url}: {path}")
            except Exception as e:  # a crashed page must not hide the test's own error
                print(f"\nno screenshot of page {i}: {e}")
    for context in contexts:
        context.close()


def screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def session_cookies(page) -> set[str]:
    return {c["name"] for c in page.context.cookies()} & SESSION_COOKIES


def submit_login(page, username: str, token: str, next_url: str | None = None,
                 hub_url: str = HUB_URL):
    """Open the login page, fill the form like a person would, submit; the response."""
    url = f"{hub_url}/hub/login"
    if next_url is not None:
        url += "?" + requests.compat.urlencode({"next": next_url})
    page.goto(url)
    page.fill("#username_input", username)
    page.fill("#password_input", token)
    with page.expect_navigation() as nav:
        page.click("#login_submit")
    return nav.value


def gpu_table(page) -> list[tuple[str, str]]:
    """(GPU index, status) per row of the spawn form's GPU table."""
    rows = page.locator("#gpulab-gpu-table tbody tr")
    return [(r.locator("td").nth(0).inner_text(), r.locator("td").nth(3).inner_text())
            for r in rows.all()]


def login_error(page) -> str:
    return page.locator("#login-error-area").inner_text().strip()


def wait_for_lab_url(page, hub_url: str, username: str, timeout_ms: float = 120_000) -> None:
    """Wait for the navigation after "Sign in" to reach *username*'s JupyterLab. CI saw it
    abort with net::ERR_NETWORK_CHANGED: Chromium drops navigations in flight when the
    host's interfaces change, and Docker adds a veth on this host as her container
    starts (a member's browser on another machine never sees that); the error page it
    then commits can interrupt the next navigation too. A member opens her lab again;
    so does this, up to 3 times, with a warning."""
    from playwright.sync_api import Error

    lab = re.compile(rf"/user/{re.escape(username)}/lab")
    transient = ("ERR_NETWORK_CHANGED", "interrupted by another navigation")
    try:
        page.wait_for_url(lab, timeout=timeout_ms)
        return
    except Error as e:
        # Still on the hub's progress page: its event stream (the same veth change) was
        # dropped and the page waits for news that never comes (CI saw it under
        # HTTPS, her server up for two minutes). A member reloads the page: once.
        if "spawn-pending" in urlsplit(page.url).path:
            warnings.warn(f"the progress page stopped hearing from the hub ({e}); "
                          f"reloaded it once", stacklevel=2)
            page.reload()
            page.wait_for_url(lab, timeout=timeout_ms)
            return
        if not any(t in str(e) for t in transient):
            raise
        first = e
    for attempt in range(3):
        page.wait_for_timeout(1000)  # let the error page commit
        try:
            page.goto(f"{hub_url}/user/{username}/lab")
            page.wait_for_url(lab, timeout=timeout_ms)
            break
        except Error as e:
            if attempt == 2 or not any(t in str(e) for t in transient):
                raise
    warnings.warn(f"the navigation after sign-in failed ({first}); opened the lab again "
                  f"({attempt + 1} time(s))", stacklevel=2)


def jupyterlab_shows(page, timeout_ms: float) -> bool:
    """Whether JupyterLab draws its launcher, or the notebook it restores, in time."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.locator("#jp-main-dock-panel").wait_for(state="visible", timeout=timeout_ms)
        page.locator(".jp-Launcher, .jp-NotebookPanel").first.wait_for(
            state="visible", timeout=timeout_ms)
        return True
    except PlaywrightTimeout:
        return False


NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"


def goto_through_network_changes(page, url: str, tries: int = 3):
    """``page.goto(url)``, opened again (up to *tries* times, with a warning) only when
    Chromium aborted it with net::ERR_NETWORK_CHANGED: it drops navigations in flight
    when this host's interfaces change, and the other lanes of make test start and stop
    containers (veths) all the time. Any other error, a refused certificate included,
    is raised at once. Pages from the ``new_page`` fixture navigate (and reload) this way
    already."""
    return _retrying(page, page.goto, url, tries=tries)


def _retrying(page, navigate, *args, tries: int = 3, **kw):
    """*navigate* (a page's goto or reload) as goto_through_network_changes says."""
    from playwright.sync_api import Error

    for attempt in range(tries):
        try:
            return navigate(*args, **kw)
        except Error as e:
            if NETWORK_CHANGED not in str(e) or attempt == tries - 1:
                raise
            what = args[0] if args else f"reload of {page.url}"
            warnings.warn(f"{what}: {NETWORK_CHANGED}; once more", stacklevel=3)
            page.wait_for_timeout(1000)  # let the error page commit


class FailedRequests:
    """The requests a page lost, with Chromium's reason (``requestfailed``)."""

    def __init__(self, page):
        self.failed: list[str] = []
        page.on("requestfailed",
                lambda r: self.failed.append(f"{r.failure} {r.method} {r.url}"))

    def network_changed(self) -> list[str]:
        return [f for f in self.failed if NETWORK_CHANGED in f]


def lab_shows_or_reload_once(page, failed: FailedRequests, timeout_ms: float,
                             record=lambda: "", grace_ms: float = 10_000) -> None:
    """Wait until JupyterLab shows. Chromium drops the requests it has in flight when
    the host's interfaces change (Docker adds and removes veths as containers come and
    go: a member's browser on another machine never sees it), and a JupyterLab that lost
    chunks that way stays blank; a member reloads, and so does this, once, with a
    warning, but only when a request failed with net::ERR_NETWORK_CHANGED, *grace_ms*
    after it failed (not at the end of *timeout_ms*: CI waited 90 s for a page that
    could not come). A blank page for any other reason fails, with what the browser saw
    (*record()* adds more)."""
    if _lab_shows_unless_lost(page, failed, timeout_ms, grace_ms):
        return
    lost = failed.network_changed()
    if not lost:
        raise AssertionError(f"JupyterLab did not show, and no request failed with "
                             f"{NETWORK_CHANGED}: failed requests {failed.failed}\n{record()}")
    seen = f"lost to {NETWORK_CHANGED}: {lost}\n{record()}"
    page.reload()
    if not jupyterlab_shows(page, timeout_ms * 1.5):
        raise AssertionError(f"JupyterLab did not show, even after a reload.\n{seen}\n"
                             f"after the reload: {failed.failed}\n{record()}")
    warnings.warn(f"JupyterLab showed only after a reload; {seen}", stacklevel=2)


def _lab_shows_unless_lost(page, failed: FailedRequests, timeout_ms: float,
                           grace_ms: float) -> bool:
    """Whether JupyterLab shows within *timeout_ms*; False as soon as it has not shown
    *grace_ms* after a request was lost to a network change."""
    deadline = time.monotonic() + timeout_ms / 1000
    lost_at = None
    while time.monotonic() < deadline:
        if jupyterlab_shows(page, 1000):
            return True
        if lost_at is None and failed.network_changed():
            lost_at = time.monotonic()
        if lost_at is not None and time.monotonic() - lost_at > grace_ms / 1000:
            return False
    return False


def start_without_a_gpu_if_asked(page) -> None:
    """Where gpus.yaml offers GPUs (the other lane of make test may have put the stand-in
    inventory there), the hub shows the spawn form after sign-in: she starts without a
    GPU. Nothing when the page is not the form."""
    path = urlsplit(page.url).path
    if path == "/hub/spawn" or (path.startswith("/hub/spawn/")):
        form = page.locator("#spawn_form")
        if form.count():
            if page.locator("#gpulab-gpus").count():
                page.select_option("#gpulab-gpus", "0")
            form.locator("[type=submit]").click()


def sign_in_to_lab(page, username: str, token: str) -> float:
    """Sign in on the login page as a member does and wait until JupyterLab shows its
    launcher, or the notebook it restores from their last session; returns the
    time.monotonic() at which "Sign in" was pressed. (See :func:`wait_for_lab_url` and
    :func:`lab_shows_or_reload_once` for what Docker's veths do to the browser here.)"""
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    failed = FailedRequests(page)
    page.goto(f"{HUB_URL}/hub/login")
    page.fill("#username_input", username)
    page.fill("#password_input", token)
    pressed = time.monotonic()
    page.click("#login_submit")
    page.wait_for_url(re.compile(rf"/hub/spawn|/user/{re.escape(username)}/"), timeout=90_000)
    start_without_a_gpu_if_asked(page)
    # (the spawn is in there: 90 s, for a host busy with the other lanes of make test)
    wait_for_lab_url(page, HUB_URL, username, 90_000)
    lab_shows_or_reload_once(page, failed, 60_000, lambda: f"console errors: {errors}")
    return pressed


def run_in_new_notebook(page, code: str, output: str | re.Pattern[str]) -> float:
    """From JupyterLab's launcher: open a Python 3 notebook, type *code* in its first cell,
    run it with Shift+Enter once the kernel is idle, and wait until an output containing
    *output* appears. Returns the time.monotonic() at which Shift+Enter was pressed."""
    page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
    editor = page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
    editor.wait_for(state="visible")
    editor.click()
    page.keyboard.insert_text(code)
    # As a member does: run once the status bar says the new kernel is idle (JupyterLab
    # drops a run that comes while the kernel is still connecting, seen here).
    page.locator(".jp-StatusBar-TextItem", has_text="| Idle").first.wait_for(state="visible")
    pressed = time.monotonic()
    page.keyboard.press("Shift+Enter")
    page.locator(".jp-OutputArea-output", has_text=output).first.wait_for(state="visible")
    return pressed


def answer_shown(page, api_url: str, click) -> str:
    """Run *click* (which makes the page call *api_url*) and return "STATUS text": the
    answer's HTTP status and what the page then shows in its ``#result``. The text is
    read inside the page in one step, once the page has put it there: the answer arrives
    before the page's script has read it, an earlier answer's text may still stand, and
    the page may reload itself a second after a success (the leases page does)."""
    page.evaluate("() => { const r = document.querySelector('#result');"
                  " if (r) { r.textContent = ''; r.hidden = true; } }")
    with page.expect_response(lambda r: r.url == api_url) as answer:
        click()
    text = page.wait_for_function(
        "() => { const r = document.querySelector('#result');"
        " return r && !r.hidden && r.textContent ? r.textContent : null; }").json_value()
    return f"{answer.value.status} {text}"
