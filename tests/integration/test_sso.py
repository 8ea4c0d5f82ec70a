"""Single sign-on through the real stack: the lab's OpenID Connect provider (npm's
oidc-provider, tests/idp.py) or LDAP directory (Debian's slapd), the hub in its
container, the published port, Chromium, the real OpenSSH client.

The provider runs on this host at the gateway address of the stack's monitoring network,
which both the hub's container (token and userinfo requests) and the browser (its sign-in
form) reach; gpulab.yaml gets a ``login:`` section and the hub is restarted, as an admin
does. What is tried, as a member meets it:

* she signs in with the button on the sign-in page and the provider's form, and her
  provider groups become her gpulab groups;
* her server starts; she registers an SSH key on the hub's page and ``ssh`` signs in
  with it, without a login token;
* the lab removes her from the directory: her browser session, her server's API and her
  open SSH session end within seconds (timed), and her key signs in no more.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests

from tests import idp

from .stack import HUB_URL, docker, wait_for
from .test_ssh import ssh  # noqa: F401  (fixture)

# It edits gpulab.yaml and restarts the hub.
pytestmark = pytest.mark.disruptive

PASSWORD = "a lab password"
REFRESH = 3  # login.refresh_every here, seconds
DEADLINE = 30.0  # "within seconds", with room for a loaded CI host
NAME = "ssoada"


def hub_mount(destination: str) -> Path:
    mounts = json.loads(docker("inspect", "gpulab-hub"))[0]["Mounts"]
    return Path(next(m["Source"] for m in mounts if m["Destination"] == destination))


def restart_hub(hub) -> None:
    docker("restart", "--time", "10", "gpulab-hub")
    wait_for(hub.is_ready, 90, what="the hub to come back")


@contextlib.contextmanager
def hub_signing_in_with(hub, lab_config, login: str, member: str):
    """The hub restarted with *login* (a gpulab.yaml login: section) added; afterwards
    *member* deleted and the hub restarted on the original gpulab.yaml."""
    try:
        lab_config.write("gpulab.yaml", lab_config.original("gpulab.yaml") + login)
        restart_hub(hub)
        yield
    finally:
        if hub.request("GET", f"/users/{member}").status_code == 200:
            hub.delete_user(member)
        lab_config.restore()
        restart_hub(hub)


def write_secret(path: Path, text: str) -> None:
    old_umask = os.umask(0o077)
    try:
        path.write_text(text)
    finally:
        os.umask(old_umask)


def cut_off(page, name: str, removed: float) -> tuple[float, float]:
    """Seconds from *removed* until the hub's API, then her server's API, refuse her
    browser (*page*): polled every 0.25 s."""
    hub_api = server_api = None
    while hub_api is None or server_api is None:
        now = time.monotonic() - removed
        assert now < DEADLINE, (hub_api, server_api)
        if hub_api is None and page.request.get(f"{HUB_URL}/hub/api/user").status == 403:
            hub_api = now
        if server_api is None and page.request.get(
                f"{HUB_URL}/user/{name}/api/status", max_redirects=0).status != 200:
            server_api = now
        time.sleep(0.25)
    return hub_api, server_api


@pytest.fixture(scope="module")
def provider(hub, lab_config, tmp_path_factory):
    """The provider, and the hub signing in there; everything put back afterwards."""
    idp.require()
    gateway = docker("network", "inspect", "gpulab-monitoring",
                     "-f", "{{(index .IPAM.Config 0).Gateway}}").strip()
    p = idp.OidcProvider(tmp_path_factory.mktemp("idp"), [f"{HUB_URL}/hub/oidc/oauth_callback"],
                         host=gateway)
    p.set_accounts({NAME: {"password": PASSWORD, "groups": ["gpu-users", "ml-staff"]}})
    secret = hub_mount("/srv/gpulab/secrets") / "oidc-client-secret"
    write_secret(secret, p.client_secret)
    login = "\n".join([
        "", "login:", "  provider: oidc", "  label: Lab account",
        f"  oidc_authorize_url: {p.issuer}/auth", f"  oidc_token_url: {p.issuer}/token",
        f"  oidc_userinfo_url: {p.issuer}/me", "  oidc_client_id: gpulab",
        "  oidc_scopes: [openid, profile, email, groups]", "  allowed_groups: [gpu-users]",
        "  groups: {ml-staff: staff}", f"  refresh_every: {REFRESH}s", ""])
    p.start()
    try:
        with hub_signing_in_with(hub, lab_config, login, NAME):
            yield p
    finally:
        p.stop()
        secret.unlink(missing_ok=True)


def test_a_member_signs_in_with_the_lab_account_and_loses_everything_when_removed(
        provider, hub, new_page, ssh, tmp_path):  # noqa: F811
    page = new_page()
    page.goto(f"{HUB_URL}/hub/home")
    page.get_by_role("button", name="Sign in with Lab account").click()
    page.fill("#login", NAME)
    page.fill("#password", PASSWORD)
    page.click("#submit")
    page.wait_for_url(f"{HUB_URL}/hub/home")
    model = hub.user_model(NAME)
    assert model["groups"] == ["staff"] and model["admin"] is False

    r = hub.request("POST", f"/users/{NAME}/server", json={})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: (hub.server_model(NAME) or {}).get("ready"), 180, interval=0.5,
             what="her server to be ready")
    page.goto(f"{HUB_URL}/user/{NAME}/lab")  # her server signs her in through the hub
    page.wait_for_url(f"{HUB_URL}/user/{NAME}/lab**")
    assert page.request.get(f"{HUB_URL}/user/{NAME}/api/status").status == 200

    # her SSH key, on the hub's page, in her browser
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ada@laptop",
                    "-f", str(key)], check=True)
    page.goto(f"{HUB_URL}/hub/ssh-keys")
    page.fill("#ssh-key-text", key.with_suffix(".pub").read_text())
    page.get_by_role("button", name="Add key").click()
    page.wait_for_selector("#ssh-key-list td:has-text('ada@laptop')")
    r = ssh.run_with_key(NAME, key, command="whoami")
    assert r.returncode == 0 and r.stdout.strip() == "jovyan", r

    session = subprocess.Popen(
        ssh.key_args(NAME, key) + ["while true; do echo tick; sleep 0.5; done"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert session.stdout.readline() == "tick\n"
        provider.set_accounts({})  # the lab removes her from its directory
        removed = time.monotonic()
        hub_api, server_api = cut_off(page, NAME, removed)
        session.wait(timeout=DEADLINE)
        ssh_closed = time.monotonic() - removed
        assert session.returncode == 255, session.returncode
        print(f"after her removal from the directory: hub API refused at {hub_api:.1f} s, "
              f"her server's API at {server_api:.1f} s, SSH session closed at "
              f"{ssh_closed:.1f} s (login.refresh_every {REFRESH} s)")
    finally:
        if session.poll() is None:
            session.kill()
    r = ssh.run_with_key(NAME, key, command="true")
    assert r.returncode == 255 and "Permission denied (publickey" in r.stderr, r
    r = requests.get(f"{HUB_URL}/hub/home", timeout=30, allow_redirects=False,
                     cookies={c["name"]: c["value"] for c in page.context.cookies()})
    assert r.status_code == 302 and "/hub/login" in r.headers["Location"]


LDAP_NAME = "ldapbo"


@pytest.fixture(scope="module")
def directory(hub, lab_config):
    """A throwaway OpenLDAP where the hub reaches it (the monitoring network's gateway),
    with StartTLS and a certificate for that address, and the hub signing in there."""
    idp.require_ldap()
    gateway = docker("network", "inspect", "gpulab-monitoring",
                     "-f", "{{(index .IPAM.Config 0).Gateway}}").strip()
    # its own folder, not under pytest's (mode 0700): slapd drops to the openldap user
    d = idp.Slapd(Path(tempfile.mkdtemp(prefix="gpulab-slapd-")), host=gateway)
    d.start()
    secret = hub_mount("/srv/gpulab/secrets") / "ldap-bind-password"
    ca = hub_mount("/srv/gpulab/config") / "test-ldap-ca.pem"  # as the hub sees it
    write_secret(secret, d.service_password)
    ca.write_text(d.ca_file.read_text())
    settings = {**d.settings(), "login.ldap_ca_file": f"/srv/gpulab/config/{ca.name}"}
    login = "\n".join(["", "login:", "  label: Lab LDAP",
                       *(f"  {k.split('.', 1)[1]}: {v}" for k, v in settings.items()),
                       "  allowed_groups: [gpu-users]", "  groups: {ml-staff: staff}",
                       f"  refresh_every: {REFRESH}s", ""])
    try:
        with hub_signing_in_with(hub, lab_config, login, LDAP_NAME):
            yield d
    finally:
        d.stop()
        secret.unlink(missing_ok=True)
        ca.unlink(missing_ok=True)
        shutil.rmtree(d.run_dir, ignore_errors=True)


def test_a_member_signs_in_with_her_directory_password_and_loses_access_when_removed(
        directory, hub, new_page):
    directory.set_member(LDAP_NAME, PASSWORD, ["gpu-users", "ml-staff"])
    page = new_page()
    page.goto(f"{HUB_URL}/hub/home")
    page.fill("#username_input", LDAP_NAME)
    page.fill("#password_input", PASSWORD)
    page.click("#login_submit")
    page.wait_for_url(f"{HUB_URL}/hub/home")
    assert hub.user_model(LDAP_NAME)["groups"] == ["staff"]
    r = hub.request("POST", f"/users/{LDAP_NAME}/server", json={})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: (hub.server_model(LDAP_NAME) or {}).get("ready"), 180, interval=0.5,
             what="her server to be ready")
    page.goto(f"{HUB_URL}/user/{LDAP_NAME}/lab")
    page.wait_for_url(f"{HUB_URL}/user/{LDAP_NAME}/lab**")
    assert page.request.get(f"{HUB_URL}/user/{LDAP_NAME}/api/status").status == 200

    directory.remove_member(LDAP_NAME)  # the lab removes her from its directory
    hub_api, server_api = cut_off(page, LDAP_NAME, time.monotonic())
    print(f"after her removal from the directory: hub API refused at {hub_api:.1f} s, her "
          f"server's API at {server_api:.1f} s (login.refresh_every {REFRESH} s)")
