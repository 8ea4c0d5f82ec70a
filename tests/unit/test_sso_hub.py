"""Single sign-on with the lab's OpenID Connect provider, against a real ``jupyterhub`` and a
real provider (npm's oidc-provider, tests/idp.py), both on loopback.

The hub is configured by ``gpulab.login.auth.configure_login`` with settings
``login.provider: oidc`` as the hub container is; the provider's directory is a JSON file
the tests edit while it runs ("the lab removed her"). Members sign in as a browser does:
the hub's button, the provider's form, back to the hub, cookies kept (``requests``), and
once in headless Chromium.
"""

from __future__ import annotations

import re
import secrets
import time
from urllib.parse import urljoin, urlsplit

import provider_hub
import pytest
import requests
from provider_hub import chromium_page, form_sign_in, home_status, user_model
from real_hub import new_hub

from tests import idp

REFRESH = 2  # login.refresh_every of this hub, seconds
GRACE = 8  # login.unreachable_grace of this hub, seconds
ACCESS_TTL = 4  # seconds the provider's access tokens last; it gives refresh tokens too
PASSWORD = "correct horse"


def account(*groups: str, **more) -> dict:
    return {"password": PASSWORD, "groups": list(groups), **more}


DIRECTORY = {
    "ada": account("gpu-users", "gpu-admins", "ml-staff"),
    "bo": account("gpu-users", "ml-staff"),
    "cy": account("lab-guests"),  # in no allowed group
    "mallet": account("gpu-users", username="bo"),  # another identity claiming bo's name
    "Not Valid": account("gpu-users"),
}


@pytest.fixture(scope="module")
def sso(tmp_path_factory):
    """(hub, provider): a hub whose members sign in at the provider."""
    idp.require()
    data = tmp_path_factory.mktemp("sso-hub")
    hub = new_hub(data)
    # as Keycloak's (5 minutes, with refresh tokens), but seconds: every check after the
    # first few seconds of a sign-in goes through a refresh
    provider = idp.OidcProvider(data / "idp", [f"{hub.url}/hub/oidc/oauth_callback"],
                                access_ttl=ACCESS_TTL, refresh_tokens=True)
    provider.run_dir.mkdir(parents=True)
    provider.set_accounts(DIRECTORY)
    (data / "oidc-client-secret").write_text(provider.client_secret)
    (data / "crypt-key").write_text(secrets.token_hex(32))
    hub.settings = {**provider.settings(),
                    "login.label": "Lab account",
                    "login.allowed_groups": ("gpu-users",),
                    "login.admin_groups": ("gpu-admins",),
                    "login.operator_groups": ("gpu-ops",),
                    "login.groups": {"ml-staff": ("staff",), "students": ("students",)},
                    "login.refresh_every": REFRESH, "login.unreachable_grace": GRACE}
    hub.extra_config = '\nc.JupyterHub.load_groups = {"extra": {"users": []}}\n'
    provider.start()
    try:
        hub.start()
        yield hub, provider
    finally:
        hub.stop()
        provider.stop()


@pytest.fixture
def logs(sso, request):
    """The ends of the hub's and the provider's logs when the test fails."""
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        hub, provider = sso
        print(f"\n----- jupyterhub log -----\n{hub.log_tail(80)}"
              f"\n----- oidc-provider log -----\n{provider.log_tail()}")


def sign_in(hub, name: str, password: str = PASSWORD) -> tuple[requests.Session, requests.Response]:
    """Through the hub's button and the provider's form; the last response."""
    s = requests.Session()
    r = s.get(f"{hub.url}/hub/login?next=%2Fhub%2Fhome", timeout=10)
    assert r.status_code == 200
    button = re.search(r'id="sso-login"[^>]*href="([^"]+)"', r.text)
    assert button, "no 'Sign in with' button on the sign-in page"
    r = s.get(urljoin(r.url, button.group(1).replace("&amp;", "&")), timeout=10)
    assert r.status_code == 200 and "Lab directory" in r.text, r.text[:500]
    form = re.search(r'action="(/interaction/[^"]+)"', r.text).group(1)
    r = s.post(urljoin(r.url, form), data={"prompt": "login", "login": name,
                                           "password": password}, timeout=10)
    return s, r


def own_token(s: requests.Session, hub, name: str) -> str:
    """A token she makes for a script with her browser session."""
    xsrf = s.cookies.get("_xsrf")
    r = s.post(f"{hub.url}/hub/api/users/{name}/tokens", json={"note": "my script"},
               headers={"X-XSRFToken": xsrf, "Referer": f"{hub.url}/hub/token"}, timeout=10)
    assert r.status_code == 201, r.text
    return r.json()["token"]


def whoami(hub, token: str) -> int:
    return requests.get(f"{hub.url}/hub/api/user", timeout=10,
                        headers={"Authorization": f"token {token}"}).status_code


def wait_for(check, what: str, timeout: float = REFRESH * 5) -> float:
    return provider_hub.wait_for(check, what, timeout)


def test_a_member_signs_in_with_the_lab_account_and_gets_her_groups(sso, logs):
    hub, provider = sso
    s, r = sign_in(hub, "bo")
    assert r.status_code == 200 and urlsplit(r.url).path == "/hub/home", (r.url, r.text[:300])
    assert home_status(s, hub) == "home"
    model = user_model(hub, "bo")
    assert model["admin"] is False
    assert model["groups"] == ["staff"]  # ml-staff -> staff; gpu-users is not mapped


def test_the_admin_group_makes_an_admin(sso, logs):
    hub, _ = sso
    _, r = sign_in(hub, "ada")
    assert urlsplit(r.url).path == "/hub/home"
    assert user_model(hub, "ada")["admin"] is True


@pytest.mark.parametrize("name, password, status, says", [
    ("cy", PASSWORD, 403, "in none of the groups that may use this GPU hub"),
    ("ada", "wrong", 401, "Invalid username or password"),  # the provider refuses
    ("Not Valid", PASSWORD, 403, "cannot use"),  # a name gpulab cannot use
])
def test_who_may_not_sign_in_is_refused(sso, logs, name, password, status, says):
    hub, _ = sso
    _, r = sign_in(hub, name, password)
    assert r.status_code == status, (r.url, r.text[:500])
    assert says in r.text
    if name == "cy":
        assert user_model(hub, "cy") is None


def test_another_identity_with_her_name_is_refused(sso, logs):
    hub, _ = sso
    sign_in(hub, "bo")  # bo's identity is bound to the name bo
    _, r = sign_in(hub, "mallet")  # the provider calls mallet "bo" too
    assert r.status_code == 403 and "another identity" in r.text


def test_her_binding_survives_a_sign_in_with_a_login_token(sso, logs):
    """JupyterHub saves a token sign-in's (empty) auth_state: the binding is not in it."""
    hub, provider = sso
    name = f"b{secrets.token_hex(3)}"
    provider.set_accounts({**DIRECTORY, name: account("gpu-users"),
                           f"imp{name}": account("gpu-users", username=name)})
    sign_in(hub, name)
    token = hub.api("POST", f"/gpulab/login-tokens/{name}", {"expires_in": 600}).json()["token"]
    _, r = form_sign_in(hub, name, token)
    assert urlsplit(r.url).path == "/hub/home"
    _, r = sign_in(hub, f"imp{name}")
    assert r.status_code == 403 and "another identity" in r.text


def test_an_account_that_never_signed_in_there_is_not_taken_over(sso, logs):
    """Whoever the provider names like an existing account (made with login tokens, or
    an admin's) does not get it, unless login.link_existing_accounts says so."""
    hub, provider = sso
    name = f"e{secrets.token_hex(3)}"
    assert hub.api("POST", f"/users/{name}", {}).status == 201
    provider.set_accounts({**DIRECTORY, name: account("gpu-users", "gpu-admins")})
    _, r = sign_in(hub, name)
    assert r.status_code == 403 and "already that never signed in with the" in r.text
    assert user_model(hub, name)["admin"] is False


def test_the_provider_still_decides_rights_of_a_member_with_a_login_token(sso, logs):
    hub, provider = sso
    name = f"r{secrets.token_hex(3)}"
    provider.set_accounts({**DIRECTORY, name: account("gpu-users", "gpu-admins", "ml-staff")})
    s, _ = sign_in(hub, name)
    assert user_model(hub, name)["admin"] is True
    assert hub.api("POST", f"/gpulab/login-tokens/{name}", {"expires_in": 600}).status == 201
    provider.set_accounts({**DIRECTORY, name: account("gpu-users")})  # no longer an admin
    wait_for(lambda: home_status(s, hub) == "home" and not user_model(hub, name)["admin"]
             and user_model(hub, name)["groups"] == [], "her admin right and staff go")
    provider.set_accounts(DIRECTORY)  # removed: her login token still lets her in
    time.sleep(REFRESH + 0.5)
    assert home_status(s, hub) == "home"


def test_a_check_on_the_sign_in_routes_themselves_works(sso, logs):
    """There the handler's authenticator is the provider's part (manage_groups): a
    check's answer must carry her groups (it raised ValueError before: review)."""
    hub, provider = sso
    name = f"o{secrets.token_hex(3)}"
    provider.set_accounts({**DIRECTORY, name: account("gpu-users", "ml-staff")})
    s, _ = sign_in(hub, name)
    time.sleep(REFRESH + 0.5)
    r = s.get(f"{hub.url}/hub/oidc/oauth_login", allow_redirects=False, timeout=10)
    assert r.status_code == 302, r.status_code
    assert "Failed to get current user" not in hub.log_tail(40)
    assert user_model(hub, name)["groups"] == ["staff"] and home_status(s, hub) == "home"


def test_an_admin_who_ends_her_access_ends_it_for_the_lab_account_too(sso, logs):
    hub, provider = sso
    name = f"x{secrets.token_hex(3)}"
    provider.set_accounts({**DIRECTORY, name: account("gpu-users")})
    s, _ = sign_in(hub, name)
    r = hub.api("DELETE", f"/gpulab/access/{name}", {"stop_servers": False})
    assert r.status == 200, r.text
    assert home_status(s, hub) == "login"
    _, r = sign_in(hub, name)
    assert r.status_code == 403 and "An admin ended the access" in r.text
    # an admin gives it back: a login token; the lab account signs in again too
    assert hub.api("POST", f"/gpulab/login-tokens/{name}", {"expires_in": 600}).status == 201
    _, r = sign_in(hub, name)
    assert r.status_code == 200 and urlsplit(r.url).path == "/hub/home"


def test_a_member_removed_from_the_directory_loses_access_within_seconds(sso, logs):
    hub, provider = sso
    name = f"m{secrets.token_hex(3)}"
    provider.set_accounts({**DIRECTORY, name: account("gpu-users")})
    s, r = sign_in(hub, name)
    assert urlsplit(r.url).path == "/hub/home"
    token = own_token(s, hub, name)
    assert whoami(hub, token) == 200
    time.sleep(REFRESH + 0.5)
    assert home_status(s, hub) == "home"  # asked again, and still vouched for

    provider.set_accounts(DIRECTORY)  # the lab removes her
    removed = time.monotonic()
    ended = wait_for(lambda: home_status(s, hub) == "login", "her session ends")
    print(f"session ended {ended - removed:.1f} s after her removal")
    assert whoami(hub, token) == 403
    _, r = sign_in(hub, name)  # and she cannot sign in again
    assert r.status_code == 401


def test_leaving_the_allowed_groups_ends_access_and_group_changes_follow(sso, logs):
    hub, provider = sso
    name = f"g{secrets.token_hex(3)}"
    provider.set_accounts({**DIRECTORY, name: account("gpu-users", "students")})
    s, _ = sign_in(hub, name)
    assert user_model(hub, name)["groups"] == ["students"]
    # an admin puts her in a group the mapping does not decide: it stays hers
    assert hub.api("POST", "/groups/extra/users", {"users": [name]}).status == 200

    provider.set_accounts({**DIRECTORY, name: account("gpu-users", "ml-staff", "gpu-ops")})
    wait_for(lambda: home_status(s, hub) == "home"
             and sorted(user_model(hub, name)["groups"]) == ["extra", "operators", "staff"],
             "students -> staff, and operators, at a check")

    provider.set_accounts({**DIRECTORY, name: account("ml-staff")})  # out of gpu-users
    wait_for(lambda: home_status(s, hub) == "login", "her session ends")


def test_login_tokens_still_sign_in_beside_the_lab_account(sso, logs):
    hub, _ = sso
    name = f"t{secrets.token_hex(3)}"
    assert hub.api("POST", f"/users/{name}", {}).status == 201
    token = hub.api("POST", f"/gpulab/login-tokens/{name}", {"expires_in": 600}).json()["token"]
    s, r = form_sign_in(hub, name, token)
    assert r.status_code == 200 and urlsplit(r.url).path == "/hub/home"
    time.sleep(REFRESH + 0.5)
    assert home_status(s, hub) == "home"  # the provider is never asked about her


def test_in_chromium_a_member_signs_in_with_the_button(sso, logs, tmp_path):
    hub, _ = sso
    with chromium_page(tmp_path / "sso.png") as page:
        page.goto(f"{hub.url}/hub/home")  # signed out: to the sign-in page
        page.get_by_role("button", name="Sign in with Lab account").click()
        page.fill("#login", "bo")
        page.fill("#password", PASSWORD)
        page.click("#submit")
        page.wait_for_url(re.compile(r".*/hub/home$"))
        assert "bo" in page.inner_text("body")


def ed25519_public() -> str:
    import asyncssh
    return asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()


def gateway_sign_in(hub, name: str, line: str) -> int:
    """What the SSH gateway is told when a client offers *line* for *name*."""
    return hub.api("POST", "/gpulab/ssh-sign-in", {"user": name, "key": line, "check": True},
                   token=hub.ssh_token).status


def test_a_member_of_the_lab_account_registers_an_ssh_key_on_the_page(sso, logs):
    hub, provider = sso
    name = f"k{secrets.token_hex(3)}"
    provider.set_accounts({**DIRECTORY, name: account("gpu-users")})
    s, _ = sign_in(hub, name)
    page = s.get(f"{hub.url}/hub/ssh-keys", timeout=10)
    assert page.status_code == 200 and 'id="ssh-key-form"' in page.text
    api = f"{hub.url}/hub/api/gpulab/ssh-keys/{name}"
    line = ed25519_public()
    # without the page's XSRF token, her browser session may not add one (JupyterHub's check)
    assert s.post(api, json={"key": line}, timeout=10).status_code == 403
    xsrf = {"X-XSRFToken": s.cookies.get("_xsrf")}
    r = s.post(api, json={"key": line}, headers=xsrf, timeout=10)
    assert r.status_code == 201, r.text
    assert [k["fingerprint"] for k in s.get(api, headers=xsrf, timeout=10).json()["ssh_keys"]] \
        == [r.json()["fingerprint"]]
    assert gateway_sign_in(hub, name, line) == 200  # no login token: the provider vouches

    provider.set_accounts(DIRECTORY)  # the lab removes her
    time.sleep(REFRESH + 0.5)
    assert gateway_sign_in(hub, name, line) == 403


def test_an_expired_access_token_is_refreshed_and_she_keeps_access(sso, logs):
    hub, provider = sso
    s, _ = sign_in(hub, "bo")
    token = own_token(s, hub, "bo")

    def refreshes() -> int:
        return provider.log_tail(100_000).count("grant.success refresh_token")
    before = refreshes()
    for _ in range(2):  # past the access token's life, twice: the refreshed one is refreshed
        time.sleep(ACCESS_TTL + REFRESH)
        assert home_status(s, hub) == "home" and whoami(hub, token) == 200
    assert refreshes() - before >= 2, provider.log_tail()
    assert "Refreshing oauth access token for bo" in hub.log_tail(400)
    assert "gave no refresh token" not in hub.log_tail(100_000)


def test_while_the_provider_is_down_members_keep_access_for_the_grace_and_no_longer(sso, logs):
    """Last in the module: it stops the provider (and starts it again)."""
    hub, provider = sso
    s, _ = sign_in(hub, "bo")
    signed_in = time.monotonic()
    token = own_token(s, hub, "bo")
    provider.stop()
    time.sleep(REFRESH + 0.5)
    assert home_status(s, hub) == "home" and whoami(hub, token) == 200
    assert "Could not ask the lab's sign-in about bo" in hub.log_tail(200)
    # login.unreachable_grace after the provider last vouched for her (her sign-in),
    # her access ends as a removed member's does: session and token
    ended = wait_for(lambda: home_status(s, hub) == "login", "bo's session to end after "
                     "the grace", timeout=GRACE + REFRESH * 3)
    assert ended - signed_in >= GRACE - 0.5, ended - signed_in
    assert whoami(hub, token) == 403
    assert "longer than login.unreachable_grace (8 s)" in hub.log_tail(200)
    # what Prometheus alerts on (GpulabLoginProviderUnreachable)
    metrics = hub.api("GET", "/metrics").text
    counts = dict(re.findall(
        r'^gpulab_login_provider_checks_total\{result="(\w+)"\} (\S+)$', metrics, re.M))
    assert float(counts["unreachable"]) >= 1 and float(counts["vouched"]) >= 1, counts
    # the provider back: she signs in again, as before
    provider.start()
    again, _ = sign_in(hub, "bo")
    assert home_status(again, hub) == "home"
