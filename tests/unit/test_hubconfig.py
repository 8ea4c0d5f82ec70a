"""hubconfig.configure on a real traitlets Config, as jupyterhub_config.py calls it: the
settings a deployment depends on, checked where they are decided (the lease page once
answered 500 because its service was started without DOCKER_HOST)."""

from __future__ import annotations

import logging
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from gpulab import hubconfig, shares

REPO = Path(__file__).resolve().parents[2]


STACK_ENV = {
    "DOCKER_HOST": "tcp://docker-proxy:2375", "GPULAB_EXPORTER_URL": "http://exporter:9445",
    "GPULAB_PROMETHEUS_URL": "http://prometheus:9090",
    "GPULAB_HUB_ADDRESS": "172.30.0.2", "GPULAB_PROXY_IP": "172.30.0.3",
    "GPULAB_PROXY_API_URL": "http://172.30.0.3:8001", "GPULAB_SCRAPE_SECONDS": "15",
    "GPULAB_DEMO": "",  # docker-compose.yml always sets it; "1" in the demo
}


@contextmanager
def configured_with(tmp_path, monkeypatch, environ: dict[str, str], hub_lines: str = ""):
    """hubconfig.configure on a copy of the shipped config/ (with *hub_lines* added to
    gpulab.yaml's hub section), with made-up secrets and *environ* as the hub
    container's environment; the config object."""
    config_dir, secrets, data = tmp_path / "config", tmp_path / "secrets", tmp_path / "data"
    shutil.copytree(REPO / "config", config_dir)
    settings = config_dir / "gpulab.yaml"
    settings.write_text(settings.read_text().replace("\nhub:\n", f"\nhub:\n{hub_lines}", 1))
    secrets.mkdir()
    data.mkdir()
    for name in ("api-token", "metrics-token", "proxy-token", "ssh-gateway-token"):
        (secrets / name).write_text(name[0] * 64)
    monkeypatch.setattr(hubconfig, "CONFIG_DIR", config_dir)
    monkeypatch.setattr(hubconfig, "SECRETS_DIR", secrets)
    monkeypatch.setattr(hubconfig, "DATA_DIR", data)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    c = Config()
    try:
        hubconfig.configure(c)
        yield c
    finally:
        gpulab_log = logging.getLogger("gpulab")
        gpulab_log.handlers = [h for h in gpulab_log.handlers
                               if not isinstance(h, hubconfig._ToHubLog)]
        gpulab_log.propagate = True


@pytest.fixture
def configured(tmp_path, monkeypatch):
    environ = {**STACK_ENV, "GPULAB_CONFIG_DIR": str(tmp_path / "config"),
               "GPULAB_LAST_GOOD_DIR": str(tmp_path / "last-good")}
    with configured_with(tmp_path, monkeypatch, environ) as c:
        yield c


def test_the_proxy_is_external_and_reached_by_address(configured):
    c = configured
    assert c.ConfigurableHTTPProxy.should_start is False
    assert c.ConfigurableHTTPProxy.api_url == "http://172.30.0.3:8001"
    assert c.ConfigurableHTTPProxy.auth_token == "p" * 64
    assert c.JupyterHub.hub_connect_ip == "172.30.0.2"
    # routes re-synced after a proxy restart, once a scrape
    assert c.JupyterHub.last_activity_interval == int(STACK_ENV.get("GPULAB_SCRAPE_SECONDS", 15))


def test_the_dashboard_service_gets_docker_and_sits_where_the_proxy_reaches_it(configured):
    service = next(s for s in configured.JupyterHub.services if s["name"] == "gpus")
    assert service["environment"]["DOCKER_HOST"] == "tcp://docker-proxy:2375"
    assert set(service["environment"]) == set(hubconfig.DASHBOARD_ENV)
    assert service["url"] == f"http://172.30.0.2:{hubconfig.DASHBOARD_PORT}"


def test_login_trusts_only_gpulabs_proxy(configured):
    c = configured
    assert c.JupyterHub.authenticator_class == "gpulab-token"
    assert c.TokenAuthenticator.trusted_proxies == ["172.30.0.3/32"]
    assert c.JupyterHub.token_expires_in_max_seconds == 30 * 86400


def test_gpulab_info_lines_reach_the_hubs_log(configured, caplog):
    hub_log = logging.getLogger("JupyterHub")
    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append((record.name, record.getMessage()))

    catch = Catch()
    hub_log.addHandler(catch)
    hub_log.setLevel(logging.INFO)
    try:
        logging.getLogger("gpulab.gpus.leases").info("GPU inventory: %d GPU(s)", 2)
    finally:
        hub_log.removeHandler(catch)
    assert ("gpulab.gpus.leases", "GPU inventory: 2 GPU(s)") in seen


@pytest.mark.parametrize("idle_timeout, every", [
    (3600, 60), (120, 60), (119, 59), (30, 15), (10, 5), (3, 1), (1, 1),
])
def test_the_culler_checks_every_minute_or_every_half_timeout(idle_timeout, every):
    assert hubconfig.cull_every(idle_timeout) == every


@pytest.mark.parametrize("idle_timeout, every", [
    (3600, 300), (1200, 300), (600, 150), (60, 15), (30, 7), (12, 5),
])
def test_servers_report_their_activity_well_within_the_idle_timeout(idle_timeout, every):
    assert hubconfig.activity_every(idle_timeout) == every


def test_https_at_the_edge_adds_hsts_and_secure_xsrf_cookies():
    from gpulab.hubconfig import tornado_settings

    assert tornado_settings("") == {}
    assert tornado_settings("http://10.0.0.5:8000/") == {}
    https = tornado_settings("https://gpu.lab.example:443/")
    assert https["headers"] == {"Strict-Transport-Security": "max-age=31536000"}
    assert https["xsrf_cookie_kwargs"] == {"secure": True}


def test_the_gpu_culler_runs_with_least_privilege_and_its_notices_reach_home(configured,
                                                                              tmp_path):
    service = next(s for s in configured.JupyterHub.services if s["name"] == "gpu-culler")
    notices = str(tmp_path / "data" / "gpu-culler-notices.json")
    assert service["command"][1:] == ["-m", "gpulab.culler", "--gpus-file",
                                      str(tmp_path / "config" / "gpus.yaml"),
                                      "--notices", notices, "--bookings-file",
                                      str(tmp_path / "data" / "gpulab-bookings.sqlite"),
                                      "--idle-timeout=3600"]  # hub.idle_timeout's default
    # and a member's server reports its activity (gpulab_work's too) every 5 min then
    assert configured.GpulabSpawner.environment["JUPYTERHUB_ACTIVITY_INTERVAL"] == "300"
    assert service["environment"] == {"GPULAB_PROMETHEUS_URL": "http://prometheus:9090",
                                      "GPULAB_LAST_GOOD_DIR": str(tmp_path / "last-good"),
                                      "GPULAB_SCRAPE_SECONDS": "15"}
    assert "url" not in service  # nobody reaches it: it only calls out
    role = next(r for r in configured.JupyterHub.load_roles if r["name"] == "gpu-culler")
    assert role["services"] == ["gpu-culler"]
    assert sorted(role["scopes"]) == ["delete:servers", "list:users", "read:servers",
                                      "read:users:groups", "users:activity"]
    gpu_notices = configured.JupyterHub.template_vars["gpu_notices"]
    assert gpu_notices(None) == []


@pytest.mark.parametrize("public_url, setting, subdomain_host", [
    ("https://gpu.lab.example:443/", "", "https://gpu.lab.example"),
    ("https://gpu.lab.example:8443/", "yes", "https://gpu.lab.example:8443"),
    ("https://gpu.lab.example:443/", "no", None),  # a lab without wildcard DNS
    ("https://10.1.2.3:443/", "", None),  # no names below an IP address
    ("https://[2001:db8::1]:443/", "", None),
    ("https://gpulab:443/", "", None),  # a single label: no subdomain for a wildcard
    # plain HTTP on loopback: one origin (docs/https-and-sign-in.md, "Each member's server has an
    # origin of its own")
    ("", "yes", None),
])
def test_each_member_gets_an_origin_of_her_own_where_the_hub_has_a_name(
        public_url, setting, subdomain_host):
    assert hubconfig.user_subdomains(public_url, setting) == subdomain_host


def test_with_a_host_name_servers_go_below_it_and_services_stay_on_it(tmp_path, monkeypatch):
    environ = {"GPULAB_PUBLIC_URL": "https://gpu.lab.example:443/"}
    with configured_with(tmp_path, monkeypatch, environ) as c:
        pass
    assert c.JupyterHub.subdomain_host == "https://gpu.lab.example"
    assert c.JupyterHub.cookie_host_prefix_enabled is True
    hook = c.JupyterHub.subdomain_hook
    assert hook("alice", "gpu.lab.example", "user") == "alice.gpu.lab.example"
    assert hook("j.smith", "gpu.lab.example", "user").startswith("u-jsmith--")
    assert hook("gpus", "gpu.lab.example", "service") == "gpu.lab.example"


def test_the_line_is_wired_into_the_hub(configured, tmp_path):
    from gpulab.bookings import api as bookings_api
    from gpulab.bookings.store import booking_store
    from gpulab.gpus.allocator import Gpu
    from gpulab.gpus.config import parse_gpus_config
    from gpulab.line import api as line_api
    from gpulab.line.store import line_store
    from gpulab.spawn import servers_api

    c = configured
    data = tmp_path / "data"
    assert c.GpulabSpawner.line_file == str(data / "gpulab-line.sqlite")
    assert c.JupyterHub.tornado_settings["gpulab-line"]["file"] == c.GpulabSpawner.line_file
    wired = [*servers_api.api_handlers(), *line_api.api_handlers(),
             *bookings_api.api_handlers()]
    # the hub serves them, not the authenticator (a lab's other authenticator keeps
    # them); only the start API's wrapper must come before the hub's own routes
    assert c.JupyterHub.extra_handlers[:len(wired)] == wired
    assert c.TokenAuthenticator.more_api_handlers == servers_api.start_handlers()
    service = next(s for s in c.JupyterHub.services if s["name"] == "gpu-line")
    assert service["command"][1:3] == ["-m", "gpulab.line"]
    role = next(r for r in c.JupyterHub.load_roles if r["name"] == "gpu-line")
    assert role["services"] == ["gpu-line"] and role["scopes"] == hubconfig.LINE_SCOPES
    # a member whose access ends leaves the line and loses her bookings
    store = line_store(c.GpulabSpawner.line_file)
    store.join("alice", "", 1)
    bookings = booking_store(c.GpulabSpawner.bookings_file)
    now = time.time()
    bookings.make(parse_gpus_config(""), [Gpu(0, "GPU-0", "A100")], "alice", (), 1,
                  now + 60, now + 120, "alice")
    for forget in c.TokenAuthenticator.on_access_ended:
        forget("alice")
    assert store.entries() == [] and bookings.bookings() == []
    # bookings: the spawner, the line's plan and the API read the same store
    assert c.GpulabSpawner.bookings_file == str(data / "gpulab-bookings.sqlite")
    assert c.JupyterHub.tornado_settings["gpulab-line"]["bookings_file"] == \
        c.GpulabSpawner.bookings_file
    assert c.JupyterHub.tornado_settings["gpulab-bookings"]["file"] == \
        c.GpulabSpawner.bookings_file
    # her budget's use, from the line's usage file: not known here (nothing brought it)
    assert c.JupyterHub.tornado_settings["gpulab-bookings"]["usage"]().used("alice",
                                                                           "month") is None


def test_sharing_is_a_members_unless_the_lab_turns_it_off(tmp_path, monkeypatch):
    """hub.sharing: false leaves the `user` role without JupyterHub's share scopes (the
    share API then refuses her with a 403, and /hub/sharing says sharing is off)."""
    environ = {**STACK_ENV, "GPULAB_CONFIG_DIR": str(tmp_path / "config"),
               "GPULAB_LAST_GOOD_DIR": str(tmp_path / "last-good")}
    with configured_with(tmp_path, monkeypatch, environ, "  sharing: false\n") as c:
        user_role = next(r for r in c.JupyterHub.load_roles if r["name"] == "user")
        assert not set(shares.MEMBER_SCOPES) & set(user_role["scopes"])
        assert ("/sharing", shares.SharingPageHandler) in c.JupyterHub.extra_handlers


def test_members_and_their_servers_tokens_may_ask_the_lab_assistant(configured):
    """The scope is defined, members hold it (JupyterHub's `user` role, kept whole),
    their servers' tokens carry it beside what the `server` role gives, and the gateway
    knows where the inference server is and its key."""
    from jupyterhub.roles import get_default_roles

    from gpulab.assistant import gateway
    from gpulab.assistant.rules import ASSISTANT_SCOPE

    c = configured
    assert ASSISTANT_SCOPE in c.JupyterHub.custom_scopes
    user_role = next(r for r in c.JupyterHub.load_roles if r["name"] == "user")
    assert user_role["scopes"] == ["self", ASSISTANT_SCOPE, *shares.MEMBER_SCOPES]
    # JupyterHub's own `server` and `user` roles, each with the scope added (so that a
    # JupyterHub that changes them fails here rather than losing a scope silently)
    default = {r["name"]: r["scopes"] for r in get_default_roles()}
    # and her servers: a job's server stops itself, gpulab-job starts and lists her jobs
    assert c.GpulabSpawner.server_token_scopes == [*default["server"], "servers!user",
                                                   "read:servers!user", ASSISTANT_SCOPE]
    assert user_role["scopes"] == [*default["user"], ASSISTANT_SCOPE, *shares.MEMBER_SCOPES]
    assert all(h in c.JupyterHub.extra_handlers for h in gateway.api_handlers())
    config = c.JupyterHub.tornado_settings["gpulab-assistant"]
    assert config["key_file"].endswith("/assistant-key")
    assert config["url"] == "http://assistant:8080"



def test_named_servers_are_on_and_a_member_keeps_as_many_as_she_may_run(configured, tmp_path):
    """JupyterHub asks the limit of the one who asks (a stand-in for its handler): a
    member's is gpus.yaml's max_servers, her groups' and her own; admins' and services',
    none (0)."""
    assert configured.JupyterHub.allow_named_servers is True
    limit = configured.JupyterHub.named_server_limit_per_user
    (tmp_path / "config" / "gpus.yaml").write_text(
        "defaults: {max_servers: 3}\ngroups: {big: {max_servers: 5}}\n"
        "users: {zoe: {max_servers: 1}}\n")

    def asked_by(name="ann", admin=False, groups=(), kind="user"):
        user = SimpleNamespace(name=name, admin=admin, kind=kind,
                               groups=[SimpleNamespace(name=g) for g in groups])
        return limit(SimpleNamespace(current_user=user))

    assert asked_by() == 3
    assert asked_by(groups=("big",)) == 5
    assert asked_by("zoe", groups=("big",)) == 1
    assert asked_by(admin=True) == 0
    assert asked_by("gpulab-line", kind="service") == 0
