"""A real ``jupyterhub`` process on loopback, configured by gpulab's configure_login.

As jupyterhub-idle-culler's tests do: a subprocess, polled until it answers, with a
deadline, and its log in the failure message. Clients talk to the hub's own port
(what a user container does with http://gpulab-hub:8081), so configurable-http-proxy
is not needed: :class:`RouteTableProxy` keeps JupyterHub's route table in memory and
forwards nothing.

:class:`Client` is a small HTTP client that can connect *from* a chosen loopback
address (127.0.0.2 is a trusted proxy in these hubs, 127.0.0.x others are not), keeps
cookies like a browser, and fetches the ``_xsrf`` form value as a browser would.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import urlencode

from jupyterhub.proxy import Proxy
from traitlets import default

from tests.ports import free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TRUSTED_PROXY = "127.0.0.2"  # the stand-in for gpulab's own proxy / a reverse proxy
ADMIN_SCOPES = ["admin:users", "admin:servers", "tokens", "groups", "list:users",
                "read:hub", "read:metrics"]  # gpulab.hubconfig.ADMIN_SERVICE_SCOPES


class RouteTableProxy(Proxy):
    """No proxy process: JupyterHub's routes in a dict; clients use the hub's port."""

    @default("should_start")
    def _should_start_default(self):
        return False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.routes = {}

    async def add_route(self, routespec, target, data):
        self.routes[routespec] = {"routespec": routespec, "target": target, "data": data}

    async def delete_route(self, routespec):
        self.routes.pop(routespec, None)

    async def get_all_routes(self):
        return dict(self.routes)


CONFIG = """
from pathlib import Path
from gpulab.login.auth import configure_login
from gpulab.hubconfig import TEMPLATES
from gpulab.settings import Settings, defaults

data = Path({data!r})
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {proxy_port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.JupyterHub.db_url = f"sqlite:///{{data}}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = str(data / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(data / "jupyterhub.pid")
c.JupyterHub.proxy_class = "real_hub.RouteTableProxy"
c.JupyterHub.template_paths = [str(TEMPLATES)]
c.JupyterHub.cleanup_servers = False
c.JupyterHub.log_level = "DEBUG"
settings = Settings({{**defaults(), "hub.member_token_max_age": {max_age}, **{settings!r}}})
configure_login(c, settings, data, [{trusted!r}], secrets_dir=data)
c.JupyterHub.services = [
    {{"name": "gpulab-admin", "api_token": {admin_token!r}}},
    {{"name": "not-admin", "api_token": {weak_token!r}}},
    {{"name": "gpulab-ssh", "api_token": {ssh_token!r}}},
    {{"name": "oauth-probe", "api_token": {oauth_token!r}, "oauth_no_confirm": True,
      "oauth_client_id": "service-oauth-probe",
      "oauth_redirect_uri": "http://127.0.0.1:9/oauth_callback"}},
]
c.JupyterHub.load_roles = [
    {{"name": "gpulab-admin", "scopes": {admin_scopes!r}, "services": ["gpulab-admin"]}},
    # every scope the admin service has except admin:users
    {{"name": "not-admin", "scopes": {weak_scopes!r}, "services": ["not-admin"]}},
    # the first admin from hub.admins, as gpulab.login.roles loads it (for bootstrap-admin)
    {{"name": "admin", "users": ["rootadmin"]}},
    # members may open the oauth-probe service (as they open their own servers)
    {{"name": "user", "scopes": ["self", "access:services!service=oauth-probe"]}},
    # mallory holds admin:users and tokens, but filtered to herself
    {{"name": "self-admin", "scopes": ["admin:users!user=mallory", "tokens!user=mallory"],
      "users": ["mallory"]}},
]
"""


@dataclass
class RunningHub:
    data: Path
    hub_port: int
    admin_token: str
    weak_token: str
    oauth_token: str
    max_age: int
    ssh_token: str = field(default_factory=lambda: secrets.token_hex(32))
    # more settings (gpulab.settings keys, parsed values); secrets they need go in data
    settings: dict = field(default_factory=dict)
    extra_config: str = ""  # appended to the config file
    process: subprocess.Popen | None = None
    log_path: Path = field(init=False)

    def __post_init__(self):
        self.log_path = self.data / "jupyterhub.log"

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.hub_port}"

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self, timeout: float = 60) -> None:
        config = self.data / "jupyterhub_config.py"
        config.write_text(CONFIG.format(
            data=str(self.data), proxy_port=free_port(), hub_port=self.hub_port,
            max_age=self.max_age, settings=self.settings, trusted=TRUSTED_PROXY, admin_token=self.admin_token,
            weak_token=self.weak_token, oauth_token=self.oauth_token,
            ssh_token=self.ssh_token,
            admin_scopes=ADMIN_SCOPES,
            weak_scopes=[s for s in ADMIN_SCOPES if s != "admin:users"]) + self.extra_config)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(HERE), str(REPO), str(REPO / "hub"), os.environ.get("PYTHONPATH", "")])}
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(config)],
            cwd=self.data, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyterhub exited with {self.process.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                if Client(self).get("/hub/api/").status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"jupyterhub did not answer within {timeout} s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.2)

    def stop(self, timeout: float = 30) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)

    def api(self, method: str, path: str, body=None, token: str | None = None) -> Response:
        """A REST call as the gpulab-admin service (or with *token*)."""
        return Client(self).request(method, f"/hub/api{path}", json_body=body,
                                    token=token or self.admin_token)


def new_hub(data: Path, max_age: int = 3600) -> RunningHub:
    data.mkdir(parents=True, exist_ok=True)
    return RunningHub(data=data, hub_port=free_port(), admin_token=secrets.token_hex(32),
                      weak_token=secrets.token_hex(32), oauth_token=secrets.token_hex(32),
                      max_age=max_age)


@dataclass
class Response:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.body)

    @property
    def location(self) -> str:
        return self.headers.get("Location", "")


class Client:
    """HTTP/1.1 to the hub from *source* (a loopback address), keeping cookies."""

    def __init__(self, hub: RunningHub, source: str = "127.0.0.1",
                 user_agent: str = "gpulab-tests"):
        self.hub = hub
        self.source = source
        self.user_agent = user_agent
        self.cookies: dict[str, str] = {}

    def request(self, method: str, path: str, *, form: dict | None = None,
                json_body=None, token: str | None = None,
                headers: dict | None = None) -> Response:
        conn = http.client.HTTPConnection(self.hub.host, self.hub.hub_port, timeout=30,
                                          source_address=(self.source, 0))
        hdrs = {"User-Agent": self.user_agent, **(headers or {})}
        body = None
        if form is not None:
            body = urlencode(form)
            hdrs["Content-Type"] = "application/x-www-form-urlencoded"
        elif json_body is not None:
            body = json.dumps(json_body)
            hdrs["Content-Type"] = "application/json"
        if token:
            hdrs["Authorization"] = f"token {token}"
        if self.cookies:
            hdrs["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            response = Response(resp.status, resp.headers, resp.read())
        finally:
            conn.close()
        for header in response.headers.get_all("Set-Cookie") or []:
            for name, morsel in SimpleCookie(header).items():
                if morsel.value in ("", '""') or morsel["max-age"] == "0":
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
        return response

    def get(self, path: str, **kw) -> Response:
        return self.request("GET", path, **kw)

    def login(self, username: str, token: str, headers: dict | None = None) -> Response:
        """The login form as a browser submits it: GET for the _xsrf field, then POST
        (both with *headers*: JupyterHub's anonymous xsrf id hashes the client address
        tornado sees, which follows X-Forwarded-For)."""
        nav = {"Sec-Fetch-Mode": "navigate", **(headers or {})}
        page = self.get("/hub/login", headers=nav)
        match = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
        assert match, (page.status, page.text[:500])
        return self.request(
            "POST", "/hub/login",
            form={"_xsrf": match.group(1), "username": username, "password": token},
            headers={**nav, "Sec-Fetch-Site": "same-origin"})
