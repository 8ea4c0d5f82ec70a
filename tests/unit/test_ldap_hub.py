"""Sign-in with the lab's LDAP directory, against a real ``jupyterhub`` and a real OpenLDAP
(Debian's slapd, tests/idp.py: StartTLS with a certificate the hub checks, the memberof
overlay), both on loopback.

The hub is configured by ``gpulab.login.auth.configure_login`` with settings
``login.provider: ldap``; the tests edit the directory while it runs. Members sign in on
the token form with their directory password, as a browser does (cookies, ``_xsrf``),
and once in headless Chromium.
"""

from __future__ import annotations

import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import provider_hub
import pytest
import requests
from provider_hub import chromium_page, form_sign_in, home_status, user_model
from real_hub import new_hub

from tests import idp

REFRESH = 2  # login.refresh_every of this hub, seconds
GRACE = 12  # login.unreachable_grace of this hub, seconds


@pytest.fixture(scope="module")
def ldap(tmp_path_factory):
    """(hub, slapd): a hub whose members sign in with their directory password."""
    idp.require_ldap()
    data = tmp_path_factory.mktemp("ldap-hub")
    # its own folder, not under pytest's (mode 0700): slapd drops to the openldap user
    directory = idp.Slapd(Path(tempfile.mkdtemp(prefix="gpulab-slapd-")))
    directory.start()
    hub = new_hub(data)
    (data / "ldap-bind-password").write_text(directory.service_password)
    (data / "crypt-key").write_text(secrets.token_hex(32))
    hub.settings = {**directory.settings(),
                    "login.label": "Lab LDAP",
                    "login.allowed_groups": ("gpu-users",),
                    "login.admin_groups": ("gpu-admins",),
                    "login.groups": {"ml-staff": ("staff",)},
                    "login.ldap_user_filter": "(!(description=disabled))",
                    "login.ldap_group_base": idp.GROUPS,
                    "login.refresh_every": REFRESH, "login.unreachable_grace": GRACE}
    try:
        hub.start()
        yield hub, directory
    finally:
        hub.stop()
        directory.stop()
        shutil.rmtree(directory.run_dir, ignore_errors=True)


@pytest.fixture
def logs(ldap, request):
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        print(f"\n----- jupyterhub log -----\n{ldap[0].log_tail(80)}")


def member(directory, *groups: str) -> tuple[str, str]:
    name, password = f"l{secrets.token_hex(3)}", secrets.token_urlsafe(12)
    directory.set_member(name, password, list(groups))
    return name, password


def sign_in(hub, name: str, password: str) -> tuple[requests.Session, requests.Response]:
    r = requests.get(f"{hub.url}/hub/login", timeout=10)
    assert "Password (Lab LDAP) or personal access token" in r.text
    assert 'id="sso-login"' not in r.text  # no button: the form takes the password
    return form_sign_in(hub, name, password)


def wait_for(check, what: str, timeout: float = REFRESH * 5) -> float:
    return provider_hub.wait_for(check, what, timeout)


def test_a_member_signs_in_with_her_directory_password_and_gets_her_groups(ldap, logs):
    hub, directory = ldap
    name, password = member(directory, "gpu-users", "gpu-admins", "ml-staff")
    s, r = sign_in(hub, name, password)
    assert r.status_code == 200 and urlsplit(r.url).path == "/hub/home", r.text[:300]
    model = user_model(hub, name)
    assert model["admin"] is True and model["groups"] == ["staff"]
    assert password not in hub.log_tail(400)  # her password is never logged


@pytest.mark.parametrize("case", ["wrong password", "no allowed group", "unknown"])
def test_who_may_not_sign_in_is_refused(ldap, logs, case):
    hub, directory = ldap
    name, password = member(directory, *(["lab-guests"] if case == "no allowed group"
                                         else ["gpu-users"]))
    if case == "wrong password":
        password = "not-" + password
    if case == "unknown":
        name = f"u{secrets.token_hex(3)}"
    _, r = sign_in(hub, name, password)
    assert r.status_code == 403, r.status_code
    if case == "no allowed group":
        assert "in none of the groups that may use this GPU hub" in r.text
    else:
        assert "Invalid username or token." in r.text
    assert user_model(hub, name) is None


def test_removed_from_the_directory_she_loses_access_within_seconds(ldap, logs):
    hub, directory = ldap
    name, password = member(directory, "gpu-users", "ml-staff")
    s, _ = sign_in(hub, name, password)
    time.sleep(REFRESH + 0.5)
    assert home_status(s, hub) == "home"  # looked up again: still there
    directory.set_member(name, password, ["gpu-users"])  # out of ml-staff
    wait_for(lambda: home_status(s, hub) == "home" and user_model(hub, name)["groups"] == [],
             "staff goes with ml-staff")
    directory.remove_member(name)
    removed = time.monotonic()
    wait_for(lambda: home_status(s, hub) == "login", "her session ends")
    print(f"session ended {time.monotonic() - removed:.1f} s after her removal")
    _, r = sign_in(hub, name, password)
    assert r.status_code == 403


def test_an_existing_account_is_not_taken_over_and_tokens_still_sign_in(ldap, logs):
    hub, directory = ldap
    name = f"t{secrets.token_hex(3)}"
    assert hub.api("POST", f"/users/{name}", {}).status == 201
    token = hub.api("POST", f"/gpulab/login-tokens/{name}", {"expires_in": 600}).json()["token"]
    directory.set_member(name, "directory-pw", ["gpu-users", "gpu-admins"])
    _, r = sign_in(hub, name, "directory-pw")
    assert r.status_code == 403 and "already that never signed in with the" in r.text
    assert user_model(hub, name)["admin"] is False
    s, r = sign_in(hub, name, token)  # her login token, on the same form
    assert urlsplit(r.url).path == "/hub/home"


def test_a_password_is_taken_as_typed_and_groups_elsewhere_do_not_count(ldap, logs):
    hub, directory = ldap
    name = f"p{secrets.token_hex(3)}"
    directory.set_member(name, "  spaces at both ends  ", ["gpu-users"])
    directory.add_group_elsewhere("gpu-admins", name)  # not under ou=groups
    _, r = sign_in(hub, name, "spaces at both ends")
    assert r.status_code == 403
    _, r = sign_in(hub, name, "  spaces at both ends  ")
    assert urlsplit(r.url).path == "/hub/home"
    assert user_model(hub, name)["admin"] is False


def test_a_disabled_account_loses_access(ldap, logs):
    """login.ldap_user_filter: how Active Directory and FreeIPA say "disabled"."""
    hub, directory = ldap
    name, password = member(directory, "gpu-users")
    s, _ = sign_in(hub, name, password)
    directory.set_attribute(name, "description", ["disabled"])
    wait_for(lambda: home_status(s, hub) == "login", "her session ends")
    _, r = sign_in(hub, name, password)
    assert r.status_code == 403


def test_a_sign_in_with_a_login_token_leaves_groups_to_the_directory(ldap, logs):
    """Review: a token sign-in set her groups from the last directory answer."""
    hub, directory = ldap
    name, password = member(directory, "gpu-users", "ml-staff")
    sign_in(hub, name, password)
    assert user_model(hub, name)["groups"] == ["staff"]
    token = hub.api("POST", f"/gpulab/login-tokens/{name}", {"expires_in": 600}).json()["token"]
    directory.set_member(name, password, ["gpu-users"])  # out of ml-staff
    s, _ = sign_in(hub, name, token)
    wait_for(lambda: home_status(s, hub) == "home" and user_model(hub, name)["groups"] == [],
             "staff goes")
    s, _ = sign_in(hub, name, token)  # again, with the token: staff stays gone
    assert user_model(hub, name)["groups"] == []


def test_a_burst_of_guesses_is_throttled_as_one_at_a_time(ldap, logs):
    """Review: 40 parallel wrong passwords got 29 directory checks past a limit of 5."""
    from concurrent.futures import ThreadPoolExecutor
    hub, directory = ldap
    name, password = member(directory, "gpu-users")
    with ThreadPoolExecutor(20) as pool:
        statuses = list(pool.map(lambda i: sign_in(hub, name, f"guess-{i}")[1].status_code,
                                 range(40)))
    tried = hub.log_tail(2000).count(f"Failed token login for '{name}'")
    assert tried <= 5 and statuses.count(429) >= 35, (tried, statuses)


def test_a_dead_directory_is_a_refused_sign_in_not_a_hang(ldap, logs):
    """Last but one: it stops slapd, then starts it again."""
    hub, directory = ldap
    name, password = member(directory, "gpu-users")
    s, _ = sign_in(hub, name, password)
    signed_in = time.monotonic()
    directory.stop()
    try:
        t0 = time.monotonic()
        _, r = sign_in(hub, name, password)
        assert r.status_code == 403 and time.monotonic() - t0 < 15
        assert "The lab's directory could not be asked" in hub.log_tail(100)
        time.sleep(REFRESH + 0.5)
        assert home_status(s, hub) == "home"  # signed in: kept while it cannot be asked
        # ... for login.unreachable_grace from her sign-in, then no longer
        ended = wait_for(lambda: home_status(s, hub) == "login",
                         "her session to end after login.unreachable_grace",
                         timeout=GRACE + REFRESH * 3)
        assert ended - signed_in >= GRACE - 0.5, ended - signed_in
    finally:
        directory.start()


def test_in_chromium_a_member_signs_in_with_her_directory_password(ldap, logs, tmp_path):
    hub, directory = ldap
    name, password = member(directory, "gpu-users")
    with chromium_page(tmp_path / "ldap.png") as page:
        page.goto(f"{hub.url}/hub/login?next=%2Fhub%2Fhome")
        page.fill("#username_input", name)
        page.fill("#password_input", password)
        page.click("#login_submit")
        page.wait_for_url(re.compile(r".*/hub/home$"))
        assert name in page.inner_text("body")
