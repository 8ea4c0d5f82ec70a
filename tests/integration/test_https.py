"""`make up GPULAB_HOSTNAME=...`: the hub on HTTPS, as a lab serves it on its network.

The stack is brought up the way an admin does it (`make up` with a host name and a bind
address; a local CA is made in secrets/tls/), tried with curl and in Chromium the way a
member meets it, and put back on plain HTTP on loopback afterwards, whatever happens.

The "lab network" is one the test makes: a network namespace (a lab member's machine)
joined to the host by a veth pair in 198.18.0.0/15 (reserved for benchmarks), the
hub bound to the host's end only. The name `gpulab.test` (a reserved test domain) is
pointed at that address in each client (curl --resolve, Chromium's host resolver
rules); the certificate is checked against the local CA, which Chromium trusts through
its NSS database as a member's browser does after importing ca.crt: no client here
ignores certificate errors.

It restarts the stack (about a minute each way), so it is marked ``stack_restart`` and
runs after the other tests.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gpulab.spawn.naming import container_name

from ..chromium import CHROMIUM, CHROMIUM_ARGS
from .browser import (
    FailedRequests,
    goto_through_network_changes,
    lab_shows_or_reload_once,
    screenshot,
    wait_for_lab_url,
)
from .stack import REPO, Hub, container_logs, docker, exporter_flags, make, wait_for
from .throttle_rows import throttle

pytestmark = pytest.mark.stack_restart

HOST = "gpulab.test"
HTTPS_PORT, HTTP_PORT = 443, 80
URL = f"https://{HOST}"
CA = REPO / "secrets" / "tls" / "ca.crt"
NETNS, HOST_END, CLIENT_END = "gpulab-test-lan", "gplt-host", "gplt-client"
HUB_IP, CLIENT_IP = "198.18.203.1", "198.18.203.2"
RESOLVE = ["--resolve", f"{HOST}:{HTTPS_PORT}:{HUB_IP}", "--resolve", f"{HOST}:{HTTP_PORT}:{HUB_IP}"]


def curl(*args: str, check: bool = True, netns: str | None = None) -> subprocess.CompletedProcess:
    where = ["ip", "netns", "exec", netns] if netns else []
    out = subprocess.run([*where, "curl", "-sS", "--max-time", "20", *RESOLVE, *args],
                         capture_output=True, text=True, timeout=60)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def ip(*args: str, check: bool = True) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 or not check, f"ip {' '.join(args)}: {out.stderr}"


@pytest.fixture(scope="module")
def lab_network():
    """A member's machine (network namespace NETNS at CLIENT_IP) on a link to the host
    (HUB_IP), made for this module and removed after it."""
    ip("netns", "del", NETNS, check=False)
    ip("link", "del", HOST_END, check=False)
    try:
        ip("netns", "add", NETNS)
        ip("link", "add", HOST_END, "type", "veth", "peer", "name", CLIENT_END)
        ip("link", "set", CLIENT_END, "netns", NETNS)
        ip("addr", "add", f"{HUB_IP}/30", "dev", HOST_END)
        ip("link", "set", HOST_END, "up")
        ip("netns", "exec", NETNS, "ip", "addr", "add", f"{CLIENT_IP}/30", "dev", CLIENT_END)
        ip("netns", "exec", NETNS, "ip", "link", "set", CLIENT_END, "up")
        yield NETNS
    finally:
        ip("netns", "del", NETNS, check=False)
        ip("link", "del", HOST_END, check=False)


@pytest.fixture(scope="module")
def https_stack(lab_network):
    flags = exporter_flags()
    try:
        out = make("up", flags, GPULAB_HOSTNAME=HOST, GPULAB_BIND_ADDRESS=HUB_IP)
        assert f"HTTPS for {HOST}" in out and str(CA) in out, out[-2000:]
        yield out
    finally:
        # back to plain HTTP on loopback:8000
        make("up", flags, GPULAB_HOSTNAME="", GPULAB_BIND_ADDRESS="")
        wait_for(Hub().is_up, 120, what="the hub on plain HTTP again")


def test_curl_verifies_the_chain_with_the_local_ca_and_only_with_it(https_stack):
    answer = curl("--cacert", str(CA), "-o", "/dev/null", "-w", "%{http_code}",
                  f"{URL}/hub/login")
    assert answer.stdout == "200"
    unverified = curl("-o", "/dev/null", f"{URL}/hub/login", check=False)
    assert unverified.returncode == 60, unverified  # curl: peer certificate cannot be verified
    chain = subprocess.run(["openssl", "verify", "-CAfile", str(CA),
                            str(CA.with_name("server.crt"))], capture_output=True, text=True)
    assert chain.returncode == 0, chain.stdout + chain.stderr


def test_plain_http_only_redirects_to_https(https_stack):
    head = curl("-D", "-", "-o", "/dev/null", f"http://{HOST}/hub/login?next=%2Fhub%2Fhome").stdout
    assert re.match(r"HTTP/1\.1 301", head), head
    location = re.search(r"(?im)^location: (\S+)", head).group(1)
    assert location in (f"{URL}/hub/login?next=%2Fhub%2Fhome",
                        f"{URL}:{HTTPS_PORT}/hub/login?next=%2Fhub%2Fhome"), location
    # no page, no cookie over plain HTTP
    assert "set-cookie" not in head.lower()


def test_a_members_machine_gets_https_and_the_throttle_sees_its_own_address(https_stack,
                                                                           lab_network):
    page = curl("--cacert", str(CA), "-o", "/dev/null", "-w", "%{http_code}",
                f"{URL}/hub/login", netns=lab_network)
    assert page.stdout == "200"
    jar = "/tmp/gpulab-test-lan-cookies"
    curl("--cacert", str(CA), "-c", jar, "-o", "/dev/null", f"{URL}/hub/login",
         netns=lab_network)
    xsrf = next(line.split("\t")[6] for line in Path(jar).read_text().splitlines()
                if "\t_xsrf\t" in line)
    try:
        refused = curl("--cacert", str(CA), "-b", jar, "-o", "/dev/null", "-w", "%{http_code}",
                       "--data-urlencode", "username=lan-probe",
                       "--data-urlencode", f"password={'0' * 40}",
                       "--data-urlencode", f"_xsrf={xsrf}", f"{URL}/hub/login",
                       netns=lab_network)
        assert refused.stdout == "403"
        rows = throttle("read")
        # counted against the member's machine, not the proxy or Docker's gateway
        assert rows.get(f"address|{CLIENT_IP}", [0])[0] == 1, rows
    finally:
        throttle("forget", addresses=[CLIENT_IP], users=["lan-probe"])
        Path(jar).unlink(missing_ok=True)


def served_certificate() -> str:
    """The SHA-256 fingerprint of the certificate the proxy serves."""
    out = subprocess.run(
        f"openssl s_client -connect {HUB_IP}:{HTTPS_PORT} -servername {HOST} </dev/null "
        "2>/dev/null | openssl x509 -noout -fingerprint -sha256",
        shell=True, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Fingerprint" in out.stdout, out.stderr
    return out.stdout.strip().split("=", 1)[1]


def file_certificate() -> str:
    out = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in",
                          str(CA.with_name("server.crt"))], capture_output=True, text=True)
    return out.stdout.strip().split("=", 1)[1]


def test_a_new_certificate_is_served_after_make_up(https_stack):
    before = served_certificate()
    assert before == file_certificate()
    CA.with_name("server.crt").unlink()  # as a renewal, or a new host name, would replace it
    out = make("up", exporter_flags(), GPULAB_HOSTNAME=HOST, GPULAB_BIND_ADDRESS=HUB_IP)
    assert "certificate made" in out, out[-2000:]
    after = served_certificate()
    assert after == file_certificate() and after != before


def test_hub_pages_send_hsts_and_only_secure_cookies(https_stack):
    head = curl("--cacert", str(CA), "-D", "-", "-o", "/dev/null", f"{URL}/hub/login").stdout
    assert re.search(r"(?im)^strict-transport-security: max-age=31536000\s*$", head), head
    cookies = re.findall(r"(?im)^set-cookie: (.+)$", head)
    assert cookies and all("; Secure" in c for c in cookies), cookies


@pytest.fixture
def trusting_home(tmp_path: Path) -> Path:
    """A HOME whose NSS database trusts the local CA, as a member's browser does once
    they imported ca.crt."""
    nssdb = tmp_path / ".pki" / "nssdb"
    nssdb.mkdir(parents=True)
    for args in (["-N", "--empty-password"],
                 ["-A", "-t", "C,,", "-n", "gpulab local CA", "-i", str(CA)]):
        out = subprocess.run(["certutil", "-d", f"sql:{nssdb}", *args],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
    return tmp_path


def chromium(playwright, home: Path):
    # the hub's name and every name below it (each member's server has its own)
    args = [*CHROMIUM_ARGS, f"--host-resolver-rules=MAP {HOST} {HUB_IP}, "
                            f"MAP *.{HOST} {HUB_IP}"]
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=args,
                                      env={"HOME": str(home), "PATH": "/usr/bin:/bin"})


class Trouble:
    """What a page's browser saw go wrong: console errors, failed and unanswered requests."""

    def __init__(self, page):
        self.console, self.failed, self.pending = [], [], {}
        page.on("console", lambda m: m.type in ("error", "warning")
                and self.console.append(f"{m.type}: {m.text[:300]}"))
        page.on("request", lambda r: self.pending.__setitem__(id(r), r.url))
        page.on("requestfinished", lambda r: self.pending.pop(id(r), None))
        page.on("requestfailed", lambda r: (self.pending.pop(id(r), None), self.failed.append(
            f"{r.url}: {r.failure}")))

    def report(self, name: str) -> str:
        return ("console:\n  " + "\n  ".join(self.console[-20:]) +
                "\nfailed requests:\n  " + "\n  ".join(self.failed[-20:]) +
                "\nunanswered requests:\n  " + "\n  ".join(list(self.pending.values())[-20:]) +
                f"\n----- proxy log -----\n{container_logs('gpulab-proxy', 30)}"
                f"\n----- hub log -----\n{container_logs('gpulab-hub', 30)}")


def test_chromium_signs_in_over_https_with_the_ca_trusted(https_stack, trusting_home,
                                                          tmp_path_factory):
    from playwright.sync_api import Error, sync_playwright

    name = f"https-{uuid.uuid4().hex[:8]}"  # a fresh member: no home left by an earlier run
    member = subprocess.run(
        ["docker", "exec", "gpulab-hub", "gpulab", "token", "issue", name,
         "--expires", "1h"], capture_output=True, text=True, timeout=60)
    assert member.returncode == 0, member.stderr
    token = re.search(r"\b[0-9a-f]{32,}\b", member.stdout).group(0)

    with sync_playwright() as p:
        # without the CA, Chromium refuses the page: the check below is not a formality
        untrusting = chromium(p, tmp_path_factory.mktemp("untrusting-home"))
        try:
            with pytest.raises(Error, match="ERR_CERT_AUTHORITY_INVALID"):
                # (retried only if a lane's veth aborted it: CI saw ERR_NETWORK_CHANGED)
                goto_through_network_changes(untrusting.new_page(), f"{URL}/hub/login")
        finally:
            untrusting.close()

        browser = chromium(p, trusting_home)
        try:
            page = browser.new_page()
            trouble = Trouble(page)
            failed = FailedRequests(page)
            goto_through_network_changes(page, f"http://{HOST}/hub/login")  # no https://
            assert page.url.startswith(f"{URL}"), page.url
            assert page.evaluate("window.isSecureContext") is True
            assert "hidden" in page.get_attribute("#insecure-login-warning", "class")
            page.fill("#username_input", name)
            page.fill("#password_input", token)
            page.click("#login_submit")
            try:
                wait_for_lab_url(page, URL, name)  # CI once saw ERR_NETWORK_CHANGED here too
                # CI saw JupyterLab's chunks fail with net::ERR_NETWORK_CHANGED twice here:
                # reloaded once for that reason only (browser.lab_shows_or_reload_once).
                lab_shows_or_reload_once(page, failed, 90_000, lambda: trouble.report(name))
            except Exception:
                screenshot(page, "https-FAILED-jupyterlab.png")
                print(f"\n----- log of gpulab-user-{name} -----\n"
                      f"{container_logs(f'gpulab-user-{name}', 80)}")
                raise
            screenshot(page, "https-jupyterlab.png")
            # Her server has an origin of its own, below the hub's name.
            assert urlsplit(page.url).hostname == f"{name}.{HOST}", page.url
            cookies = page.context.cookies()
            where = {c["name"]: c["domain"] for c in cookies}
            # The hub's sign-in cookie is __Host- (no subdomain can toss one for it) and
            # on the hub's host alone; her server's is on her host alone.
            assert where.get("__Host-jupyterhub-hub-login") == HOST, where
            assert where.get(f"__Host-jupyterhub-user-{name}") == f"{name}.{HOST}", where
            insecure = [c["name"] for c in cookies if not c["secure"]]
            assert insecure == [], f"cookies without Secure over HTTPS: {insecure}"
        finally:
            browser.close()
            subprocess.run(["docker", "exec", "gpulab-hub", "python3", "-c",
                            DELETE_MEMBER.replace("httpsmember", name)],
                           capture_output=True, text=True, timeout=120)
            docker("volume", "rm", "-f", f"gpulab-home-{name}", check=False)


START_SERVER = """
import time
from gpulab.cli import hub_from_env
hub = hub_from_env()
hub.request("POST", "/users/httpsmember/server", {}, ok=(201, 202))
for _ in range(120):
    if (hub.request("GET", "/users/httpsmember")[1]["servers"].get("") or {}).get("ready"):
        break
    time.sleep(1)
else:
    raise SystemExit("httpsmember's server did not get ready")
"""


def test_ssh_from_a_members_machine_through_the_https_proxy(https_stack, lab_network,
                                                            tmp_path):
    """gpulab-ssh on the lab's address reaches the hub and the member's server through the
    proxy's TLS port, trusting exactly the certificate the proxy serves; it tells a member
    the hub's https:// address and counts her failures against her own machine."""
    from .test_ssh import SSH, SSH_CONTAINER, SSH_THROTTLE

    name = f"https-ssh-{uuid.uuid4().hex[:6]}"
    issued = subprocess.run(["docker", "exec", "gpulab-hub", "gpulab", "token", "issue", name,
                             "--expires", "1h"], capture_output=True, text=True, timeout=60)
    assert issued.returncode == 0, issued.stderr
    token = re.search(r"\b[0-9a-f]{32,}\b", issued.stdout).group(0)
    ssh = SSH(tmp_path)
    assert (ssh.host, ssh.port) == (HUB_IP, 2222)
    try:
        r = ssh.run(name, token, command="true", netns=lab_network)
        assert r.returncode == 1 and (f"Your server is not running; start it at {URL}:443"
                                      f"/hub/home") in r.stderr, r
        docker("exec", "gpulab-hub", "python3", "-c", START_SERVER.replace("httpsmember", name))
        r = ssh.run(name, token, command="whoami; hostname", netns=lab_network)
        hostname = json.loads(docker("inspect", container_name(name)))[0]["Config"]["Hostname"]
        assert (r.returncode, r.stdout.split()) == (0, ["jovyan", hostname]), r
        r = ssh.run(name, "0" * 40, command="true", netns=lab_network)
        assert r.returncode == 255, r
        rows = throttle("read", container=SSH_CONTAINER, path=SSH_THROTTLE)
        assert rows.get(f"address|{CLIENT_IP}", [0])[0] == 1, rows
    finally:
        throttle("forget", container=SSH_CONTAINER, path=SSH_THROTTLE,
                 addresses=[CLIENT_IP], users=[name])
        subprocess.run(["docker", "exec", "gpulab-hub", "python3", "-c",
                        DELETE_MEMBER.replace("httpsmember", name)],
                       capture_output=True, text=True, timeout=120)
        docker("volume", "rm", "-f", f"gpulab-home-{name}", check=False)


# The member's server and account go through the hub's own API from inside its
# container (the host's loopback:8000 is not served while HTTPS is on).
DELETE_MEMBER = """
import time
from gpulab.cli import hub_from_env
from gpulab.hubapi import HubApiError
hub = hub_from_env()
hub.request("DELETE", "/users/httpsmember/server", ok=(202, 204, 404))
for _ in range(60):
    try:
        hub.request("DELETE", "/users/httpsmember", ok=(204, 404))
        break
    except HubApiError:  # 400 while the server is still stopping
        time.sleep(1)
"""


# What a member's own page tries against whoever opens it: read the hub's and the
# dashboard's pages, make the visitor a token (JupyterHub's API, and the members page's
# API with an _xsrf cookie tossed onto the hub's domain), and read the visitor's cookies.
ATTACK_PAGE = """<!doctype html><title>running</title><script>
const hub = "__HUB__", admin = "__ADMIN__", results = {};
async function attempt(what, request) {
  try { const r = await request(); results[what] = r.status + " " + (await r.text()).slice(0, 200); }
  catch (e) { results[what] = "blocked: " + e; }
}
(async () => {
  await attempt("hub API", () => fetch(hub + "/hub/api/user", {credentials: "include"}));
  await attempt("members page", () => fetch(hub + "/services/gpus/members", {credentials: "include"}));
  await attempt("hub token", () => fetch(hub + "/hub/api/users/" + admin + "/tokens",
    {method: "POST", credentials: "include", body: "{}"}));
  document.cookie = "_xsrf=tossed; Domain=__HOST__; Path=/; Secure";
  await attempt("tossed hub token", () => fetch(hub + "/hub/api/users/" + admin + "/tokens?_xsrf=tossed",
    {method: "POST", credentials: "include", body: "{}"}));
  await attempt("tossed login token", () => fetch(hub + "/services/gpus/api/members?_xsrf=tossed",
    {method: "POST", credentials: "include", body: JSON.stringify({name: "mallory-friend"})}));
  results.cookies = document.cookie;
  window.results = results; document.title = "done";
})();
</script>"""

# The admin's tokens, but those her browser got by letting a server identify her (OAuth
# tokens of a server's client): opening mallory's server makes one, as it should.
ADMIN_TOKENS = """
import json, sys
from gpulab.cli import hub_from_env
hub = hub_from_env()
tokens = hub.request("GET", "/users/" + sys.argv[1] + "/tokens")[1]["api_tokens"]
print(json.dumps({t["id"]: [t.get("note"), t.get("oauth_client")] for t in tokens}))
"""


def test_a_members_page_cannot_act_as_an_admin_who_opens_it(https_stack, trusting_home,
                                                             tmp_path_factory):
    """The finding: a member's page served through jupyter-server-proxy shared the hub's
    origin, so an admin who opened it ran her script as the hub. With a host name, her
    server is on NAME.gpulab.test, another origin: the script, run in a signed-in admin's
    Chromium, reads none of the hub's or the dashboard's pages, makes the admin no token
    (also with an _xsrf cookie tossed onto the hub's domain), and sees none of the hub's
    cookies."""
    from playwright.sync_api import sync_playwright

    from gpulab.settings import load_settings

    admin = load_settings(REPO / "config" / "gpulab.yaml")["hub.admins"][0]
    mallory = f"mallory-{uuid.uuid4().hex[:6]}"
    tokens = {}
    for who in (admin, mallory):
        out = subprocess.run(["docker", "exec", "gpulab-hub", "gpulab", "token", "issue", who,
                              "--expires", "1h"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        tokens[who] = (re.search(r"\b[0-9a-f]{32,}\b", out.stdout).group(0),
                       re.search(r"\(id (\w+),", out.stdout).group(1))

    def admin_tokens() -> dict[str, list]:
        return json.loads(docker("exec", "gpulab-hub", "python3", "-c", ADMIN_TOKENS, admin))

    try:
        docker("exec", "gpulab-hub", "python3", "-c", START_SERVER.replace("httpsmember",
                                                                          mallory))
        # Her page, served by her own server (as she would from a terminal).
        page_html = ATTACK_PAGE.replace("__HUB__", URL).replace("__ADMIN__", admin) \
            .replace("__HOST__", HOST)
        container = container_name(mallory)
        subprocess.run(["docker", "exec", "-i", "-u", "1000", container, "sh", "-c",
                        "mkdir -p /tmp/site && cat > /tmp/site/index.html"],
                       input=page_html, text=True, check=True, timeout=60)
        docker("exec", "-d", "-u", "1000", container, "python3", "-m", "http.server", "8765",
               "--bind", "127.0.0.1", "--directory", "/tmp/site")
        before = admin_tokens()
        with sync_playwright() as p:
            browser = chromium(p, trusting_home)
            try:
                page = browser.new_page()
                # to her home page, not her lab: the test starts no server of the admin's
                goto_through_network_changes(page, f"{URL}/hub/login?next=%2Fhub%2Fhome")
                page.fill("#username_input", admin)
                page.fill("#password_input", tokens[admin][0])
                with page.expect_navigation():
                    page.click("#login_submit")
                # signed in to the dashboard too
                goto_through_network_changes(page, f"{URL}/services/gpus/members")
                assert page.locator("#member-table").count() == 1, page.content()[:500]
                link = f"https://{mallory}.{HOST}/user/{mallory}/proxy/8765/"
                # the admin opens the link the member sent her
                goto_through_network_changes(page, link)
                # JupyterHub first asks her to let mallory's server identify her (her
                # server is not the admin's own); she clicks Authorize, as people do.
                assert "/hub/api/oauth2/authorize" in page.url, page.url
                with page.expect_navigation():
                    page.locator("form [type=submit]").first.click()
                try:
                    page.wait_for_function("document.title === 'done'", timeout=60_000)
                except Exception:
                    screenshot(page, "https-FAILED-member-page-as-admin.png")
                    print(f"the admin's tab: {page.url}\n{page.content()[:1500]}")
                    raise
                results = page.evaluate("window.results")
                screenshot(page, "https-member-page-as-admin.png")
            finally:
                browser.close()
        print(f"the member's page, opened by a signed-in admin, got: {results}")
        for what in ("hub API", "members page", "hub token", "tossed hub token",
                     "tossed login token"):
            assert results[what].startswith("blocked"), (what, results[what])
        for cookie in ("jupyterhub-hub-login", "jupyterhub-session-id", "jupyterhub-services"):
            assert cookie not in results["cookies"], results["cookies"]
        # No token was made for the admin, but the two her own clicks made: her browser
        # signing in to the dashboard and to mallory's server (OAuth, seen so).
        made = {i: t for i, t in admin_tokens().items() if i not in before}
        print(f"tokens of the admin's made meanwhile: {made}")
        assert {client for _note, client in made.values()} <= {
            "JupyterHub service gpus", f"Server at /user/{mallory}/"}, made
        out = subprocess.run(["docker", "exec", "gpulab-hub", "gpulab", "token", "list",
                              "mallory-friend"], capture_output=True, text=True, timeout=60)
        assert "mallory-friend" not in out.stdout and "\t" not in out.stdout, out
    finally:
        subprocess.run(["docker", "exec", "gpulab-hub", "gpulab", "token", "revoke", admin,
                        tokens[admin][1]], capture_output=True, text=True, timeout=60)
        subprocess.run(["docker", "exec", "gpulab-hub", "python3", "-c",
                        DELETE_MEMBER.replace("httpsmember", mallory)],
                       capture_output=True, text=True, timeout=120)
        docker("volume", "rm", "-f", f"gpulab-home-{mallory}", check=False)
