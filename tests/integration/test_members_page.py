"""The admins' members page (/services/gpus/members), used as an admin uses it: in
Chromium, signed in through the login form. A token issued on the page signs a new
member in; revoking it on the page ends the member's session; nobody but an admin gets
the page, and a POST without the page's XSRF token changes nothing.
"""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import pytest

from .browser import screenshot, submit_login
from .stack import HUB_URL, container_logs, wait_for

pytestmark = pytest.mark.integration

MEMBERS = f"{HUB_URL}/services/gpus/members"
MEMBERS_API = f"{HUB_URL}/services/gpus/api/members"


@pytest.fixture
def new_name(hub):
    name = f"page-{uuid.uuid4().hex[:8]}"
    yield name
    hub.delete_user(name)


def open_members(page, admin):
    """As an admin finds it: signed in, from the GPU dashboard's header."""
    submit_login(page, admin.name, admin.token, next_url="/hub/home")
    assert page.goto(f"{HUB_URL}/services/gpus/").status == 200
    with page.expect_navigation() as nav:
        page.click("#members-link")
    response = nav.value
    assert response.status == 200, (response.status, page.url)
    assert urlsplit(page.url).path == "/services/gpus/members", page.url


def signed_in(page) -> bool:
    page.goto(f"{HUB_URL}/hub/home")
    return urlsplit(page.url).path == "/hub/home"


def test_an_admin_adds_a_member_who_signs_in_until_the_admin_revokes(hub, hub_admin, new_page,
                                                                     new_name):
    admin_page = new_page()
    open_members(admin_page, hub_admin)
    assert admin_page.locator("#member-table td.user", has_text=hub_admin.name).count() == 1

    admin_page.fill("#issue-name", new_name)
    admin_page.fill("#issue-expires", "1h")
    admin_page.click("#issue-form button[type=submit]")
    admin_page.locator("#new-token:not([hidden])").wait_for()
    token = admin_page.inner_text("#new-token-value").strip()
    assert len(token) >= 32 and admin_page.inner_text("#new-token-user") == new_name
    assert "Login token" in admin_page.inner_text("#result")
    screenshot(admin_page, "members-page-issued.png")
    # the hub created the member and recorded who issued the token
    assert hub.user_model(new_name)["name"] == new_name
    wait_for(lambda: f"admin {hub_admin.name} issued login token" in
             container_logs("gpulab-hub", 400), 10, what="the admin's action in the log")

    member_page = new_page()
    response = submit_login(member_page, new_name, token, next_url="/hub/home")
    assert response.status == 200 and urlsplit(member_page.url).path == "/hub/home"

    # the member is not an admin (nor an operator): the hub itself refuses them the service
    response = member_page.goto(MEMBERS)
    assert response.status == 403, response.status
    assert "permission to access JupyterHub service gpus" in member_page.inner_text("body")

    admin_page.reload()
    row = admin_page.locator("tr.member", has=admin_page.locator("td.user", has_text=new_name))
    assert row.count() == 1 and row.locator("td.token-id").count() == 1
    admin_page.once("dialog", lambda dialog: dialog.accept())
    row.locator("button.revoke").click()
    admin_page.locator("#result.ok").wait_for()
    assert "Revoked login token" in admin_page.inner_text("#result")
    screenshot(admin_page, "members-page-revoked.png")

    assert not signed_in(member_page)  # the member's session ended at once
    assert submit_login(member_page, new_name, token).status == 403


def test_a_post_without_the_pages_xsrf_token_changes_nothing(hub, hub_admin, new_page, new_name):
    page = new_page()
    open_members(page, hub_admin)
    status = page.evaluate("""([url, name]) => fetch(url, {method: "POST",
        credentials: "same-origin", headers: {"Content-Type": "application/json"},
        body: JSON.stringify({name: name, expires: "1h"})}).then(r => r.status)""",
        [MEMBERS_API, new_name])
    assert status in (401, 403), status
    assert hub.request("GET", f"/users/{new_name}").status_code == 404
    hub.request("POST", f"/users/{new_name}", json={})  # for the fixture to delete


def test_bad_input_gets_a_clear_error_on_the_page(hub_admin, new_page):
    page = new_page()
    open_members(page, hub_admin)
    page.fill("#issue-name", "x")
    page.fill("#issue-expires", "soon")
    page.click("#issue-form button[type=submit]")
    page.locator("#result:not([hidden])").wait_for()
    assert "expires: expected a duration" in page.inner_text("#result")
    assert page.locator("#new-token").is_hidden()
