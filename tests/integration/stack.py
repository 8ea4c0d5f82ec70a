"""Clients for the real stack, used by the integration tests and bench/.

``Hub`` talks to the hub's REST API as the gpulab-admin service (its token is the
file `make up` generated); ``LabUser`` is one lab member with their own token, who
starts a server and runs code in a kernel over the Jupyter websocket protocol.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import requests
import websocket

from gpulab.spawn.naming import container_name, volume_name

REPO = Path(__file__).resolve().parents[2]
HUB_URL = os.environ.get("GPULAB_URL", "http://127.0.0.1:8000").rstrip("/")
TOKEN_FILE = Path(os.environ.get("GPULAB_API_TOKEN_FILE", REPO / "secrets" / "api-token"))


class StackError(AssertionError):
    pass


def wait_for(predicate, timeout: float, interval: float = 0.2, what="condition"):
    """Poll *predicate* until it returns a truthy value; fail after *timeout* seconds,
    saying *what* was awaited (a string, or a callable that says it then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise StackError(f"timed out after {timeout:.0f} s waiting for {said}")
        time.sleep(interval)


def form_login(username: str, token: str, headers: dict | None = None) -> requests.Response:
    """The login form through the published port, as a browser submits it."""
    s = requests.Session()
    nav = {"Sec-Fetch-Mode": "navigate", **(headers or {})}
    page = s.get(f"{HUB_URL}/hub/login", headers=nav, timeout=30)
    m = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
    assert m and "_xsrf" in s.cookies, (page.status_code, page.text[:300])
    r = s.post(f"{HUB_URL}/hub/login",
               data={"_xsrf": m.group(1), "username": username, "password": token},
               headers={**nav, "Sec-Fetch-Site": "same-origin",
                        "Referer": f"{HUB_URL}/hub/login"},
               allow_redirects=False, timeout=30)
    r.session_cookies = set(s.cookies.keys())
    r.session = s  # signed in, when the form accepted her (302)
    return r


def docker(*args: str, check: bool = True) -> str:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if check and out.returncode != 0:
        raise StackError(f"docker {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout.strip()


def prometheus_query(expr: str) -> str:
    """The stack's Prometheus' answer to *expr* now, as promtool prints it."""
    return docker("exec", "gpulab-prometheus", "promtool", "query", "instant",
                  "http://127.0.0.1:9090", expr)


def container_gone(name: str) -> bool:
    """No container of that exact name, running or not."""
    return docker("ps", "-aq", "--filter", f"name=^{name}$") == ""


def container_logs(name: str, tail: int = 60) -> str:
    """A container's log, stdout and stderr interleaved as docker stored them."""
    out = subprocess.run(["docker", "logs", "--tail", str(tail), name],
                         capture_output=True, text=True, timeout=60)
    return (out.stdout + out.stderr).strip()


def host_has_nvidia_gpu() -> bool:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


class Hub:
    """The hub's REST API, as the gpulab-admin service."""

    def __init__(self, url: str = HUB_URL, token: str | None = None):
        self.url = url
        self.api = f"{url}/hub/api"
        self.session = requests.Session()
        if token is None:
            token = TOKEN_FILE.read_text().strip()
        self.session.headers["Authorization"] = f"token {token}"

    def is_up(self) -> bool:
        try:
            return requests.get(f"{self.api}/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def is_ready(self) -> bool:
        """The hub answers and has finished starting: the proxy routes its GPU dashboard
        service to the service. JupyterHub answers its API before its managed services are
        up, and a hub that stops deletes the dashboard's route on the way out (its last
        route check runs after the service ended); until the new hub puts it back, the
        proxy sends /services/gpus/ to the hub, which redirects it to a 404 under /hub/
        (CI's lease page test got that 404 right after a hub restart)."""
        return self.is_up() and dashboard_routed(self.url)

    def request(self, method: str, path: str, **kw) -> requests.Response:
        kw.setdefault("timeout", 60)
        return self.session.request(method, f"{self.api}{path}", **kw)

    def create_user(self, prefix: str = "test", name: str | None = None) -> LabUser:
        name = name or f"{prefix}-{uuid.uuid4().hex[:8]}"
        r = self.request("POST", f"/users/{name}", json={})
        assert r.status_code == 201, r.text
        # a login token, through the admin-only endpoint (gpulab.login.tokens)
        r = self.request("POST", f"/gpulab/login-tokens/{name}", json={"expires_in": 3600})
        assert r.status_code == 201, r.text
        return LabUser(self, name, r.json()["token"])

    def delete_user(self, name: str) -> None:
        self.delete_users([name])

    def delete_users(self, names: Sequence[str]) -> None:
        """Stop their servers (named ones too: the hub refuses to delete a member while one
        runs), all at once, then delete them. A stop is asked again while
        a server is there and not stopping: one may have been starting when asked (the
        hub then refuses to stop it), and the line may start one at any moment (seen in
        CI: the line started carol's server as the teardown deleted bob, who held the
        GPU, and the one stop asked before it was ready left it running). The delete is
        asked again until she is gone: the line can also start her server between the
        last look and the delete, which the hub then refuses with a 500 ("Spawner ... is
        active", seen in CI: her server kept the GPU for the next module)."""
        left, said = list(names), {}

        def gone(name: str) -> bool:
            r = self.request("GET", f"/users/{name}")
            if r.status_code == 404:
                return True
            servers = r.json()["servers"]  # her default one and her named ones
            for server, model in servers.items():
                if model.get("pending") != "stop":
                    self.request("DELETE", f"/users/{name}/servers/{server}" if server
                                 else f"/users/{name}/server")
            if servers:
                return False
            r = self.request("DELETE", f"/users/{name}")
            said[name] = f"{r.status_code} {r.text[:200]}"
            return r.status_code in (204, 404)

        def all_gone() -> bool:
            left[:] = [name for name in left if not gone(name)]
            return not left

        wait_for(all_gone, 60, interval=0.25,
                 what=lambda: f"{', '.join(left)} to be stopped and deleted (last: {said})")

    def user_model(self, name: str) -> dict:
        r = self.request("GET", f"/users/{name}")
        assert r.status_code == 200, r.text
        return r.json()

    def server_model(self, name: str, server: str = "") -> dict | None:
        return self.user_model(name)["servers"].get(server)


@dataclass
class LabUser:
    hub: Hub
    name: str
    token: str

    @property
    def container(self) -> str:
        return container_name(self.name)

    def container_of(self, server: str = "") -> str:
        """The container of her *server* ("" her default one)."""
        return container_name(self.name, server)

    def server_path(self, server: str = "") -> str:
        return (f"{self.hub.api}/users/{self.name}/servers/{server}" if server
                else f"{self.hub.api}/users/{self.name}/server")

    @property
    def home_volume(self) -> str:
        return volume_name("gpulab-home-{username}", self.name)

    @property
    def server_url(self) -> str:
        return f"{self.hub.url}/user/{self.name}"

    def _headers(self) -> dict:
        return {"Authorization": f"token {self.token}"}

    def ask_server(self, server: str, options: dict, token: str | None = None
                   ) -> requests.Response:
        """Her start of *server* through the REST API, as it is answered (with *token*:
        as someone else asks it)."""
        return requests.post(self.server_path(server), json=options, timeout=120,
                             headers={"Authorization": f"token {token or self.token}"})

    def start_server(self, options: dict | None = None, timeout: float = 180,
                     server: str = "") -> float:
        """Start her *server* ("" the default one) and wait until the hub says it is
        ready; seconds taken."""
        t0 = time.monotonic()
        r = requests.post(self.server_path(server), json=options or {},
                          headers=self._headers(), timeout=timeout)
        if r.status_code not in (201, 202):
            raise StackError(f"spawn of {self.name} failed: HTTP {r.status_code} {r.text}")
        wait_for(lambda: (self.hub.server_model(self.name, server) or {}).get("ready"),
                 timeout, interval=0.1, what=f"{self.name}'s server {server!r} to be ready")
        return time.monotonic() - t0

    def stop_server(self, timeout: float = 60, server: str = "") -> None:
        r = requests.delete(self.server_path(server), headers=self._headers(),
                            timeout=timeout)
        assert r.status_code in (202, 204), r.text
        wait_for(lambda: self.hub.server_model(self.name, server) is None, timeout,
                 what=f"{self.name}'s server {server!r} to stop")

    def api(self, method: str, path: str, **kw) -> requests.Response:
        kw.setdefault("timeout", 60)
        return requests.request(method, f"{self.server_url}/api{path}",
                                headers=self._headers(), **kw)

    def start_kernel(self) -> str:
        r = self.api("POST", "/kernels", json={"name": "python3"})
        assert r.status_code == 201, f"kernel create failed: {r.status_code} {r.text}"
        return r.json()["id"]

    def execute(self, kernel_id: str, code: str, timeout: float = 120) -> str:
        """Run *code* in kernel *kernel_id* over the websocket; return its stdout."""
        return _execute(self, kernel_id, code, timeout)

    def run_code(self, code: str, timeout: float = 120) -> str:
        """Run *code* in a new kernel over the websocket; return its stdout. Errors raise."""
        kernel_id = self.start_kernel()
        try:
            return self.execute(kernel_id, code, timeout)
        finally:
            self.api("DELETE", f"/kernels/{kernel_id}")


def _execute(user: LabUser, kernel_id: str, code: str, timeout: float) -> str:
    ws_url = user.server_url.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
    ws = websocket.create_connection(ws_url, header=user._headers(), timeout=timeout)
    msg_id = uuid.uuid4().hex
    try:
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": user.name,
                       "session": uuid.uuid4().hex, "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }))
        stdout, error, deadline = [], None, time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = json.loads(ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                stdout.append(content["text"])
            elif kind == "error":
                trace = "\n".join(content["traceback"])
                error = f"{content['ename']}: {content['evalue']}\n{trace}"
            elif kind == "status" and content["execution_state"] == "idle":
                break
        else:
            raise StackError(f"kernel did not finish within {timeout} s")
    finally:
        ws.close()
    if error:
        raise StackError(f"kernel raised {error}")
    return "".join(stdout)


class LabConfig:
    """The config files the running hub reads (wherever its checkout is), edited the way
    an admin edits them; every file touched is put back by the fixture.

    Each original is also kept beside the file (`.NAME.before-tests.PID`) until it is
    put back, so that a test run killed mid-test (no teardown) does not leave the
    admin's config edited: the next LabConfig puts back what a dead process left."""

    SUFFIX = ".before-tests."

    def __init__(self):
        mounts = json.loads(docker("inspect", "gpulab-hub"))[0]["Mounts"]
        self.dir = Path(next(m["Source"] for m in mounts
                             if m["Destination"] == "/srv/gpulab/config"))
        self._originals: dict[Path, str] = {}
        for backup in self.dir.glob(f".*{self.SUFFIX}*"):
            name, _, pid = backup.name[1:].rpartition(self.SUFFIX)
            if not pid.isdigit() or _alive(int(pid)):
                continue  # a backup being written, or a file still being edited (by
                # another test process or a bench)
            warnings.warn(f"{self.dir / name} was left edited by a test run that was "
                          f"killed; putting back the original kept in {backup.name}",
                          stacklevel=2)
            (self.dir / name).write_text(backup.read_text())
            backup.unlink()

    def _backup(self, path: Path) -> Path:
        return path.with_name(f".{path.name}{self.SUFFIX}{os.getpid()}")

    def write(self, name: str, text: str) -> Path:
        path = self.dir / name
        if path not in self._originals:
            self._originals[path] = path.read_text()
            _replace(self._backup(path), self._originals[path])
        _replace(path, text)
        return path

    def original(self, name: str) -> str:
        path = self.dir / name
        return self._originals.get(path) or path.read_text()

    def restore(self) -> None:
        for path, text in self._originals.items():
            _replace(path, text)
            self._backup(path).unlink(missing_ok=True)
        self._originals.clear()


def _replace(path: Path, text: str) -> None:
    """*path* with *text*, in one step: the other lanes' hub reads these files at every
    spawn, and a file truncated and then written can be read empty in between (valid:
    the defaults); the disruptive lane's engine reads the backups (tests/lane_engine.py)."""
    new = path.with_name(f".{path.name}.new.{os.getpid()}")
    new.write_text(text)
    if path.exists():
        shutil.copymode(path, new)
    os.replace(new, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


EXPORTER_COMMAND = ["--listen", "0.0.0.0:9445", "--docker-url", "tcp://docker-proxy-ro:2375"]


def exporter_flags() -> str:
    """GPULAB_EXPORTER_FLAGS the running exporter was started with (`make test`: fake GPUs
    on hosts without), so that a `make up` in a test starts the same stack again."""
    args = json.loads(docker("inspect", "gpulab-exporter"))[0]["Args"]
    assert args[:len(EXPORTER_COMMAND)] == EXPORTER_COMMAND, args
    return " ".join(args[len(EXPORTER_COMMAND):])


def scrape_seconds() -> int:
    """Prometheus' scrape interval on the running stack (GPULAB_SCRAPE_SECONDS in its
    container: 2 on the stack `make test` starts, 15 on a lab's), which the usage,
    history and culler tests count with: make test's setting, else what the running
    Prometheus was given, else what it was given when this process last saw it (a test
    that runs make down, then make up, brings the stack back as it found it), else 15."""
    if os.environ.get("GPULAB_SCRAPE_SECONDS", "").isdigit():
        return int(os.environ["GPULAB_SCRAPE_SECONDS"])
    found = subprocess.run(["docker", "inspect", "gpulab-prometheus"], capture_output=True,
                           text=True, timeout=60)
    if found.returncode == 0:
        for entry in json.loads(found.stdout)[0]["Config"]["Env"]:
            key, _, value = entry.partition("=")
            if key == "GPULAB_SCRAPE_SECONDS" and value.isdigit():
                _seen_scrape_seconds[:] = [int(value)]
    return (_seen_scrape_seconds or [15])[-1]


_seen_scrape_seconds: list[int] = []  # scrape_seconds(): what the running stack last had


def make(target: str, flags: str, **env: str) -> str:
    """`make -s TARGET` in the checkout, as an admin runs it, with GPULAB_EXPORTER_FLAGS
    *flags*, the running stack's scrape interval, the images already built (`make test`
    built them: BUILD_IMAGES=no, unless *env* says otherwise), and the other variables
    in *env* (an empty value unsets one)."""
    environ = {**os.environ, "GPULAB_EXPORTER_FLAGS": flags, "BUILD_IMAGES": "no",
               "GPULAB_SCRAPE_SECONDS": str(scrape_seconds()), **env}
    environ = {key: value for key, value in environ.items() if value != ""}
    out = subprocess.run(["make", "-s", target], cwd=REPO, capture_output=True, text=True,
                         timeout=900, env=environ)
    assert out.returncode == 0, f"make {target} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout + out.stderr


def dashboard_routed(url: str = HUB_URL) -> bool:
    """Does the proxy send the GPU dashboard's path to the service itself (which answers,
    if only with a redirect to the hub's OAuth), rather than fail (502/503 while the
    service starts) or fall through to the hub (a redirect under /hub/services/)?"""
    try:
        r = requests.get(f"{url}/services/gpus/", timeout=5, allow_redirects=False)
    except requests.RequestException:
        return False
    if r.status_code in (502, 503, 504):
        return False
    return "/hub/services/" not in r.headers.get("Location", "")
