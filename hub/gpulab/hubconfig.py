"""Wire gpulab into a JupyterHub config object.

``hub/jupyterhub_config.py`` calls :func:`configure` and nothing else: every decision
is here or in the settings files, so the config file holds no logic.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpulab import compat, live_config, shares
from gpulab.assistant import gateway as assistant_api
from gpulab.assistant.gpus import assistant_holds
from gpulab.assistant.rules import ASSISTANT_SCOPE, ASSISTANT_SCOPE_HELP
from gpulab.bookings import api as bookings_api
from gpulab.bookings.store import booking_store
from gpulab.bookings.view import home_page_bookings
from gpulab.contract import (
    BOOKINGS_FILE,
    CULLER_NOTICES_FILE,
    CULLER_SERVICE,
    DASHBOARD_SERVICE,
    DEMO_ENV,
    LINE_FILE,
    LINE_NOTICES_FILE,
    LINE_SERVICE,
    LINE_USAGE_FILE,
    PROXY_API_PORT,
    PROXY_IP,
    SCRAPE_SECONDS_ENV,
    SERVER_NOTICES_FILE,
    scrape_seconds,
)
from gpulab.gpus.leases import hold_for_services
from gpulab.gpus.policy import policy_for
from gpulab.line import api as line_api
from gpulab.line import metrics as line_metrics
from gpulab.line.store import line_store
from gpulab.line.view import home_page_line
from gpulab.login import logscrub
from gpulab.login.auth import configure_login, default_trusted_proxies
from gpulab.login.roles import prune_hub_db, roles_from_settings
from gpulab.login.sshkeys import SSH_SERVICE
from gpulab.login.tokens import ADMIN_SCOPES as LOGIN_TOKEN_SCOPES
from gpulab.mail import MailSettings
from gpulab.notices import home_page_notices
from gpulab.settings import ConfigError, Settings
from gpulab.spawn import servers_api

# Paths inside the hub container (docker-compose.yml mounts them).
CONFIG_DIR = Path(os.environ.get("GPULAB_CONFIG_DIR", "/srv/gpulab/config"))
SECRETS_DIR = Path(os.environ.get("GPULAB_SECRETS_DIR", "/srv/gpulab/secrets"))
DATA_DIR = Path(os.environ.get("GPULAB_DATA_DIR", "/srv/jupyterhub"))
TEMPLATES = Path(__file__).parent / "templates"

# What JupyterHub's `server` role gives a server's own token (JUPYTERHUB_API_TOKEN), and
# her servers to start, stop and see: a job's server stops itself when its command ends,
# and gpulab-job in any of her servers (a terminal, ssh) starts, lists and cancels her
# jobs (gpulab.spawn.jobs). Only hers: the same member's, as she could from her browser.
SERVER_ROLE_SCOPES = ["users:activity!user", "access:servers!server", "servers!user",
                      "read:servers!user"]
# The service that `gpulab` commands and the test suite use to manage users and tokens.
ADMIN_SERVICE = "gpulab-admin"
ADMIN_SERVICE_SCOPES = [
    "admin:users",
    "admin:servers",
    "tokens",
    "groups",
    "list:users",
    "read:hub",
    "read:metrics",
]
# Prometheus scrapes /hub/metrics with this service's token, which may do nothing else.
METRICS_SERVICE = "prometheus"
# The operators' GPU dashboard (gpulab.dashboard), at /services/gpus/.
DASHBOARD_PORT = 9447
# What the dashboard service needs from the hub's environment: where Docker (the filtering
# proxy), the config files, the exporter and Prometheus are.
DASHBOARD_ENV = ("DOCKER_HOST", "GPULAB_CONFIG_DIR", "GPULAB_EXPORTER_URL",
                 "GPULAB_PROMETHEUS_URL", live_config.LAST_GOOD_DIR_ENV, SCRAPE_SECONDS_ENV,
                 DEMO_ENV)
# jupyterhub-idle-culler's documented least-privilege scopes (it culls servers, not users).
CULLER_SCOPES = ["list:users", "read:users:activity", "read:servers", "delete:servers"]
# The GPU culler (gpulab.culler) judges by GPU use and by the member's groups (gpus.yaml);
# it reports servers whose GPUs work as active (users:activity), for the idle culler, and
# reads their activity to warn ahead of that culler. It reaches Prometheus, never Docker.
GPU_CULLER_SCOPES = ["list:users", "read:users:groups", "read:servers", "delete:servers",
                     "users:activity"]
# The line service (gpulab.line) starts, looks at and stops members' servers, and reads
# and changes the line (whose API asks for unfiltered admin:servers); it reads the groups'
# members for the budgets' metrics.
LINE_SCOPES = ["admin:servers", "read:users:activity", "list:groups", "read:groups"]


# Seconds a member's server trusts the hub's answer about a token (HubOAuth.cache_max_age).
SERVER_TOKEN_CACHE_SECONDS = 5


def cull_every(idle_timeout: int) -> int:
    """Seconds between the idle culler's checks for *idle_timeout*: 60, or half the
    timeout when that is shorter, so that a server is stopped at most 1.5 timeouts after
    its last activity."""
    return max(1, min(60, idle_timeout // 2))


def activity_every(idle_timeout: int) -> int:
    """Seconds between a member's server's reports of its activity to the hub
    (``JUPYTERHUB_ACTIVITY_INTERVAL``) for *idle_timeout*: JupyterHub's 300, or a quarter of
    the timeout when that is shorter, so that work seen in the server (the image's
    gpulab_work, every 10 s) reaches the hub well before the idle culler would stop it."""
    return max(5, min(300, idle_timeout // 4))


def tornado_settings(public_url: str) -> dict:
    """The hub's web settings. With HTTPS at the edge (GPULAB_PUBLIC_URL https://...,
    docker-compose.https.yml): HSTS, so that a browser which has seen the hub once never
    sends a token to it over plain HTTP again (not includeSubDomains: other hosts of a
    lab's domain may still serve plain HTTP), and a Secure XSRF cookie (JupyterHub marks
    its session cookies Secure itself, from the proxy's X-Forwarded-Proto)."""
    if not public_url.startswith("https://"):
        return {}
    return {"headers": {"Strict-Transport-Security": "max-age=31536000"},
            "xsrf_cookie_kwargs": {"secure": True}}


def user_subdomains(public_url: str, setting: str = "") -> str | None:
    """The ``subdomain_host`` that gives every member's server an origin of its own
    (``https://alice.gpu.lab.example``), or None to keep them under the hub's origin.

    On when the hub has a public DNS name (GPULAB_HOSTNAME, HTTPS) unless the lab says
    ``GPULAB_SUBDOMAINS=no`` (no wildcard DNS); never for an IP address or without a
    public URL, where no names below the hub's exist. JupyterHub's docs: "Subdomains are
    the only way to reliably isolate user servers from each other": on one origin, a
    page a member serves (jupyter-server-proxy) runs with the session of whoever opens it.
    """
    if not public_url or setting.strip().lower() in ("no", "false", "0", "off"):
        return None
    parts = urlsplit(public_url)
    host = parts.hostname or ""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if "." not in host:
        return None
    port = "" if parts.port in (None, 443 if parts.scheme == "https" else 80) else f":{parts.port}"
    return f"{parts.scheme}://{host}{port}"


def services_on_the_hubs_host(name: str, domain: str, kind: str) -> str:
    """JupyterHub's subdomain_hook: members' servers on NAME.<domain> (its idna rule:
    a safe DNS label, or u-NAME--HASH), services (the GPU dashboard, at /services/gpus/)
    on the hub's own host, where every link to them points."""
    from jupyterhub.utils import subdomain_hook_idna

    return domain if kind == "service" else subdomain_hook_idna(name, domain, kind)


def named_servers_limit(gpus_path: Path):
    """JupyterHub's ``named_server_limit_per_user``: a member may keep as many named
    servers as gpus.yaml's ``max_servers`` lets her run at once (the spawn refuses more
    running: :mod:`gpulab.spawn.admission`); admins and services, any (0)."""
    def limit(handler) -> int:
        user = handler.current_user
        if getattr(user, "kind", "") != "user" or user.admin:
            return 0
        config = live_config.gpus_file.load(gpus_path)
        return policy_for(config, user.name, [g.name for g in user.groups]).max_servers
    return limit


def read_secret(name: str) -> str:
    path = SECRETS_DIR / name
    try:
        value = path.read_text().strip()
    except FileNotFoundError:
        raise SystemExit(
            f"gpulab: secret {path} is missing. `make up` creates it; or write a random "
            f"value there: python3 -c 'import secrets; print(secrets.token_hex(32))'"
        ) from None
    if len(value) < 32:
        raise SystemExit(f"gpulab: secret {path} is too short (at least 32 characters)")
    return value


class _ToHubLog(logging.Handler):
    """Hands gpulab's log records to JupyterHub's own logger, so that they appear in the
    hub's log with its format (without a handler, Python prints only warnings)."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger("JupyterHub").handle(record)


def route_logs_to_hub() -> None:
    log = logging.getLogger("gpulab")
    if not any(isinstance(h, _ToHubLog) for h in log.handlers):
        log.addHandler(_ToHubLog())
    log.setLevel(logging.INFO)
    log.propagate = False


@dataclass(frozen=True)
class LabFiles:
    """Where the hub and its services find the lab's config and keep their state: one
    derivation for :func:`configure` and :func:`hub_services` alike."""

    settings: Path  # config/gpulab.yaml
    gpus: Path  # config/gpus.yaml
    culler_notices: Path  # the GPU culler's warnings and stop notices, for her home page
    server_notices: Path  # the hub's own: a Swarm machine gone, a job's end
    line: Path  # the line for GPUs (sqlite)
    line_notices: Path  # the line service's notices
    line_usage: Path  # GPU-hours the line's fair share reads
    bookings: Path  # members' bookings


def lab_files() -> LabFiles:
    return LabFiles(CONFIG_DIR / "gpulab.yaml", CONFIG_DIR / "gpus.yaml",
                    DATA_DIR / CULLER_NOTICES_FILE, DATA_DIR / SERVER_NOTICES_FILE,
                    DATA_DIR / LINE_FILE, DATA_DIR / LINE_NOTICES_FILE,
                    DATA_DIR / LINE_USAGE_FILE, DATA_DIR / BOOKINGS_FILE)


def configure(c) -> None:
    route_logs_to_hub()
    logscrub.install()  # tornado's own lines about failed requests carry raw URLs
    files = lab_files()
    settings_path, gpus_path = files.settings, files.gpus
    try:  # refuse to start on a bad file, saying file:line, not with a traceback
        settings = live_config.settings_file.load(settings_path)
        live_config.gpus_file.load(gpus_path)
    except ConfigError as e:
        raise SystemExit(f"gpulab: {e}") from None

    # configurable-http-proxy runs in its own container (gpulab-proxy), as in Zero to
    # JupyterHub: a hub restart or crash never drops users' routes, and no PID file of a
    # proxy the hub started can outlive the hub's container and stop it coming back.
    c.JupyterHub.bind_url = "http://:8000"  # the proxy's public port (compose publishes it)
    c.ConfigurableHTTPProxy.should_start = False
    c.ConfigurableHTTPProxy.api_url = os.environ.get("GPULAB_PROXY_API_URL",
                                                     f"http://{PROXY_IP}:{PROXY_API_PORT}")
    c.ConfigurableHTTPProxy.auth_token = read_secret("proxy-token")
    # A restarted proxy starts with no routes; the hub puts them back at every activity
    # check (update_last_activity -> check_routes), so make that often: once a scrape
    # (the lab's clock, 15 s; the test stack's 2 s).
    try:
        c.JupyterHub.last_activity_interval = scrape_seconds()
    except ValueError as e:
        raise SystemExit(f"gpulab: {e}") from None
    c.JupyterHub.hub_ip = "0.0.0.0"
    # Where the proxy and users' servers reach the hub (its fixed address in the stack).
    hub_host = os.environ.get("GPULAB_HUB_ADDRESS", "gpulab-hub")
    c.JupyterHub.hub_connect_ip = hub_host
    c.JupyterHub.db_url = f"sqlite:///{DATA_DIR}/jupyterhub.sqlite"
    c.JupyterHub.cookie_secret_file = str(DATA_DIR / "jupyterhub_cookie_secret")
    c.JupyterHub.cleanup_servers = False  # servers keep running across hub restarts
    # Several servers per member ("writing" beside "train"), as many running at once as
    # gpus.yaml's max_servers; her GPUs (max_gpus) and budget count over all of them.
    c.JupyterHub.allow_named_servers = True
    c.JupyterHub.named_server_limit_per_user = named_servers_limit(gpus_path)
    c.JupyterHub.template_paths = [str(TEMPLATES)]
    notices_path, server_notices_path = files.culler_notices, files.server_notices
    line_path, line_notices_path = files.line, files.line_notices
    bookings_path = files.bookings
    c.JupyterHub.template_vars = {
        "gpu_notices": home_page_notices(notices_path, server_notices_path,
                                         line_notices_path),
        "gpu_line": home_page_line(line_path, gpus_path),
        "gpu_bookings": home_page_bookings(bookings_path)}
    public_url = os.environ.get("GPULAB_PUBLIC_URL", "")
    c.JupyterHub.tornado_settings = {
        **tornado_settings(public_url),
        # what gpulab.line.api's handlers read
        "gpulab-line": {"file": str(line_path), "gpus_file": str(gpus_path),
                        "releases_file": str(notices_path),
                        "bookings_file": str(bookings_path),
                        "swarm": bool(settings["hub.swarm"])},
        # where gpulab.spawn.servers_api writes that a job ended (her home page shows it),
        # and how it mails her, where she gave an address (gpulab.yaml mail.*)
        "gpulab-jobs": {"notices_file": str(server_notices_path),
                        "mail": MailSettings(str(settings_path), str(SECRETS_DIR),
                                             public_url
                                             or os.environ.get("GPULAB_MEMBER_URL", ""))},
        # what gpulab.bookings.api's handlers read
        "gpulab-bookings": {"file": str(bookings_path), "gpus_file": str(gpus_path),
                            "settings_file": str(settings_path),
                            "usage": lambda: line_store(line_path).usage(),
                            "swarm": bool(settings["hub.swarm"])},
        # what gpulab.assistant.gateway's handlers read: the inference server on the
        # internal network only the hub and it are on, and the key it answers to
        "gpulab-assistant": {"settings_file": str(settings_path),
                             "url": os.environ.get("GPULAB_ASSISTANT_URL",
                                                   "http://assistant:8080"),
                             "key_file": str(SECRETS_DIR / "assistant-key"),
                             # assistant.endpoint's key, if the lab's server takes one
                             "endpoint_key_file": str(SECRETS_DIR / "assistant-endpoint-key")}}
    if public_url:
        # Users' servers learn it too (JUPYTERHUB_PUBLIC_URL): their XSRF cookie is then
        # Secure (images/singleuser/jupyter_server_config.py).
        c.JupyterHub.public_url = public_url
    subdomain_host = user_subdomains(public_url, os.environ.get("GPULAB_SUBDOMAINS", ""))
    if subdomain_host:
        # One origin per member's server; the proxy routes by host name
        # (docker-compose.https.yml passes it --host-routing). __Host- cookies: no server
        # on a subdomain can toss a cookie for the hub's own host.
        c.JupyterHub.subdomain_host = subdomain_host
        c.JupyterHub.subdomain_hook = services_on_the_hubs_host
        c.JupyterHub.cookie_host_prefix_enabled = True

    # Token login (admin-issued login tokens, the throttle, trusted proxies); admins and
    # operators come from the settings file, exactly.
    try:
        configure_login(c, settings, DATA_DIR, default_trusted_proxies(settings),
                        secrets_dir=SECRETS_DIR, public_url=public_url)
    except ValueError as e:  # a bad GPULAB_PROXY_IP or hub.trusted_proxies entry, a
        # missing secret of the identity provider's
        raise SystemExit(f"gpulab: {e}") from None
    # gpulab's own routes under /hub/: the jobs', line's, bookings' and assistant's REST
    # APIs, the bookings and sharing pages. The hub serves them whatever authenticator
    # signs members in (JupyterHub's extra_handlers: see gpulab.compat). Only the start
    # API's wrapper goes through the authenticator, the one place before the hub's own.
    c.JupyterHub.extra_handlers = [*servers_api.api_handlers(),
                                   *line_api.api_handlers(),
                                   *bookings_api.api_handlers(),
                                   *assistant_api.api_handlers(),
                                   *shares.page_handlers()]
    compat.quiet_extra_handlers_warning()
    c.TokenAuthenticator.more_api_handlers = servers_api.start_handlers()
    # Members whose access ends leave the line and lose their bookings.
    c.TokenAuthenticator.on_access_ended = [
        lambda name: line_store(line_path).forget_user(name),
        lambda name: booking_store(bookings_path).forget_user(name)]
    # The line's length and waits, and budget use, on the hub's /hub/metrics, which
    # Prometheus scrapes.
    line_metrics.register(line_path, gpus_path, usage_path=files.line_usage)
    roles = roles_from_settings(settings["hub.admins"], settings["hub.operators"])
    # No c.Authenticator.admin_users: the `admin` role in load_roles is the exact list,
    # so removing a name from hub.admins removes the right at the next start.
    c.JupyterHub.load_groups = roles.load_groups
    prune_hub_db(c.JupyterHub.db_url, roles.load_groups)

    # One host: a container per server. hub.swarm: a Swarm service per server, on the
    # machine whose GPUs it leased (the Docker proxy then fronts the Swarm's manager).
    c.JupyterHub.spawner_class = "gpulab-swarm" if settings["hub.swarm"] else "gpulab"
    c.GpulabSpawner.settings_file = str(settings_path)
    c.GpulabSpawner.gpus_file = str(gpus_path)
    c.GpulabSpawner.line_file = str(line_path)
    c.GpulabSpawner.bookings_file = str(bookings_path)
    # members' GPU-hours (the line service writes them): budgets, with or without a line
    c.GpulabSpawner.usage_file = str(files.line_usage)
    c.GpulabSwarmSpawner.notices_file = str(server_notices_path)
    c.GpulabSpawner.remove = True  # each spawn gets current settings; home persists
    c.GpulabSpawner.pull_policy = "never"  # images are built locally; no registry
    # start_timeout comes from spawn.start_timeout, read at each spawn (pre-spawn hook).
    c.GpulabSpawner.http_timeout = 60
    # Tokens never travel in URLs to user servers (JupyterHub's default since 5.0; pinned).
    c.GpulabSpawner.environment = {"JUPYTERHUB_ALLOW_TOKEN_IN_URL": "0"}
    if settings["hub.idle_timeout"]:
        c.GpulabSpawner.environment["JUPYTERHUB_ACTIVITY_INTERVAL"] = str(
            activity_every(settings["hub.idle_timeout"]))
    # A member's server asks the hub again about a token after 5 s, not JupyterHub's 300:
    # once an admin ends her access, her server refuses her within seconds (the access
    # guard in the image closes her open websockets on the same schedule). On the command
    # line, so that no config file in her home can lengthen it.
    c.GpulabSpawner.args = [f"--HubOAuth.cache_max_age={SERVER_TOKEN_CACHE_SECONDS}"]
    # The lab assistant's GPUs (assistant.gpus) are held for it in the lease table.
    hold_for_services(assistant_holds(settings_path))
    # The lab assistant (gpulab.assistant): members may ask it (the `user` role below),
    # and a server's own token may, so that JupyterLab asks as its member with no key.
    c.JupyterHub.custom_scopes = {ASSISTANT_SCOPE: {"description": ASSISTANT_SCOPE_HELP}}
    c.GpulabSpawner.server_token_scopes = [*SERVER_ROLE_SCOPES, ASSISTANT_SCOPE]

    c.JupyterHub.services, c.JupyterHub.load_roles = hub_services(
        settings, roles.load_roles, hub_host=hub_host, public_url=public_url)


def hub_services(settings: Settings, member_roles: list[dict], *, hub_host: str,
                 public_url: str) -> tuple[list[dict], list[dict]]:
    """The hub's services (gpulab's CLI, Prometheus, the SSH gateway, the GPU dashboard,
    the GPU culler, the line, JupyterHub's idle culler) with their commands, and the
    roles that say what each may do, with *member_roles* (admins, operators) among them:
    JupyterHub's ``services`` and ``load_roles``."""
    files = lab_files()
    settings_path, gpus_path = files.settings, files.gpus
    notices_path, line_path, line_notices_path = (files.culler_notices, files.line,
                                                  files.line_notices)
    bookings_path = files.bookings
    services = [
        {"name": ADMIN_SERVICE, "api_token": read_secret("api-token")},
        {"name": METRICS_SERVICE, "api_token": read_secret("metrics-token")},
        # The SSH gateway, for key sign-ins only: no JupyterHub scope; gpulab's
        # /hub/api/gpulab/ssh-sign-in answers this service alone (gpulab.login.sshkeys).
        {"name": SSH_SERVICE, "api_token": read_secret("ssh-gateway-token")},
        {
            # Admins and the operators group (roles.OPERATOR_SCOPES) may open it.
            "name": DASHBOARD_SERVICE,
            # The proxy (its own container) reaches it at the hub's name; users'
            # containers cannot (gpulab-netguard lets them reach only port 8081).
            "url": f"http://{hub_host}:{DASHBOARD_PORT}",
            "command": [sys.executable, "-m", "gpulab.dashboard",
                        "--culler-notices", str(notices_path),
                        "--line-file", str(line_path),
                        "--bookings-file", str(bookings_path),
                        *(["--swarm"] if settings["hub.swarm"] else [])],
            # JupyterHub starts a managed service with only the environment it is given:
            # without DOCKER_HOST the lease page would look for a Docker socket it has not.
            "environment": {k: os.environ[k] for k in DASHBOARD_ENV if k in os.environ},
            "oauth_no_confirm": True,
            # The members page acts as the signed-in admin: its OAuth token carries what
            # the login-token API needs (the hub drops it for anyone not an admin).
            # (and ends a member's access, stopping her server when the admin asks).
            "oauth_client_allowed_scopes": [*LOGIN_TOKEN_SCOPES, "admin:servers"],
            "display": True,
        },
    ]
    load_roles = [
        {
            "name": ADMIN_SERVICE,
            "description": "gpulab's own CLI: manage users, servers and login tokens",
            "scopes": ADMIN_SERVICE_SCOPES,
            "services": [ADMIN_SERVICE],
        },
        {
            "name": METRICS_SERVICE,
            "description": "Prometheus: read the hub's metrics, nothing else",
            "scopes": ["read:metrics"],
            "services": [METRICS_SERVICE],
        },
        {
            "name": "gpus-service",
            "description": "GPU dashboard: check whether a server runs before releasing "
                           "a stuck GPU lease; group members for the usage page",
            "scopes": ["read:servers", "list:groups", "read:groups"],
            "services": [DASHBOARD_SERVICE],
        },
        # JupyterHub's own `user` role, plus asking the lab assistant (which members
        # of the groups gpulab.yaml's assistant.groups names only may, checked per request)
        {"name": "user", "description": "Standard user privileges, the lab assistant, "
                                        "and sharing her servers (hub.sharing)",
         "scopes": ["self", ASSISTANT_SCOPE,
                    *(shares.MEMBER_SCOPES if settings["hub.sharing"] else ())]},
        *member_roles,
    ]
    # What the GPU culler and the line service need of the hub's environment (JupyterHub
    # starts a managed service with only the environment it is given).
    gpu_services_env = {k: os.environ[k] for k in ("GPULAB_PROMETHEUS_URL",
                                                   live_config.LAST_GOOD_DIR_ENV,
                                                   SCRAPE_SECONDS_ENV)
                        if k in os.environ}
    # Servers whose GPUs sit idle, or that are too old (gpus.yaml: gpu_idle_timeout,
    # max_server_age, culling), are warned, then stopped: their GPUs come back.
    services.append({
        "name": CULLER_SERVICE,
        "command": [sys.executable, "-m", "gpulab.culler", "--gpus-file", str(gpus_path),
                    "--notices", str(notices_path), "--bookings-file", str(bookings_path),
                    f"--idle-timeout={settings['hub.idle_timeout']}"],
        "environment": gpu_services_env,
    })
    load_roles.append({
        "name": CULLER_SERVICE,
        "description": "Stop servers whose GPUs sit idle or that are too old, by gpus.yaml",
        "scopes": GPU_CULLER_SCOPES,
        "services": [CULLER_SERVICE],
    })
    # Members waiting in line for GPUs: their server is started when it is their turn,
    # and stopped again if they do not open it within gpus.yaml's line.claim_window.
    services.append({
        "name": LINE_SERVICE,
        "command": [sys.executable, "-m", "gpulab.line", "--gpus-file", str(gpus_path),
                    "--notices", str(line_notices_path),
                    "--usage-file", str(files.line_usage),
                    "--interval", str(min(5, scrape_seconds())),
                    # e-mail to a member whose turn came (gpulab.yaml mail.*)
                    "--settings-file", str(settings_path), "--secrets-dir", str(SECRETS_DIR),
                    "--hub-url", public_url or os.environ.get("GPULAB_MEMBER_URL", "")],
        "environment": gpu_services_env,
    })
    load_roles.append({
        "name": LINE_SERVICE,
        "description": "Start the server of the member whose turn in line it is; stop it "
                       "if she does not open it in time",
        "scopes": LINE_SCOPES,
        "services": [LINE_SERVICE],
    })
    if settings["hub.idle_timeout"]:
        # An idle server must not hold a GPU forever. Checked every minute, or every half
        # timeout when that is shorter (the culler's own default is timeout/2).
        timeout = settings["hub.idle_timeout"]
        services.append({
            "name": "idle-culler",
            "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                        f"--timeout={timeout}", f"--cull-every={cull_every(timeout)}"],
        })
        load_roles.append({
            "name": "idle-culler",
            "description": "Stop idle servers so that they release their GPUs",
            "scopes": CULLER_SCOPES,
            "services": ["idle-culler"],
        })
    return services, load_roles
