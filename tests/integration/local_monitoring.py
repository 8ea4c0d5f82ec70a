"""Monitoring parts run as local processes, without the stack: gpulab-exporter processes
with fake GPUs, the Debian Prometheus the image ships (the same package, 2.42, on the
test host: `make test` installs it), a stand-in for a Swarm manager's Docker API (its
node and container lists) and the real dashboard app in a thread of its own (so that a
test may drive Chromium's sync API beside it)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

from tests.ports import free_port

from .stack import REPO, wait_for

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROM_CONFIG = REPO / "monitoring" / "prometheus"



def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


@contextmanager
def exporter(listen: str, uuids: list[str], control: Path, docker_url: str = "none",
             token_file: Path | None = None):
    """``python -m gpulab_exporter --fake-gpus N --fake-uuids ...`` on *listen*, its fake
    GPUs steered through *control* (its --fake-control file) and the hub's containers
    (their lease labels) read from *docker_url*, answering only *token_file*'s token
    when given (as on a Swarm's GPU server); yields its URL."""
    cmd = [sys.executable, "-m", "gpulab_exporter", "--listen", listen,
           "--fake-gpus", str(len(uuids)), "--fake-uuids", ",".join(uuids),
           "--fake-control", str(control), "--docker-url", docker_url,
           "--interval", "0.5", "--process-interval", "0.5",
           *(["--auth-token-file", str(token_file)] if token_file else [])]
    yield from _process(cmd, f"http://{listen}", "/healthz", "gpulab-exporter")


@contextmanager
def prometheus(config: dict, directory: Path, rule_files: tuple[str, ...] = ()):
    """A real Prometheus with *config* (a dict, written as YAML into *directory*, where
    the named rule files of monitoring/prometheus are copied too); yields its URL."""
    if not Path(PROMETHEUS).is_file():
        pytest.skip("prometheus not installed (apt-get install --no-install-recommends "
                    "prometheus; `make test` does)")
    for name in rule_files:
        shutil.copy(PROM_CONFIG / name, directory / name)
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    cmd = [PROMETHEUS, f"--config.file={path}", f"--storage.tsdb.path={directory / 'data'}",
           f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    yield from _process(cmd, f"http://127.0.0.1:{port}", "/-/ready", "prometheus")


def _process(cmd: list[str], url: str, ready: str, what: str):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not _answers(url + ready):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"{what} did not come up on {url}:\n{proc.communicate()[0]}")
            time.sleep(0.1)
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def query(prom_url: str, expr: str) -> list[dict]:
    r = requests.get(f"{prom_url}/api/v1/query", params={"query": expr}, timeout=10)
    r.raise_for_status()
    return r.json()["data"]["result"]


def targets(prom_url: str) -> list[dict]:
    r = requests.get(f"{prom_url}/api/v1/targets", timeout=10)
    r.raise_for_status()
    return r.json()["data"]["activeTargets"]


def wait_for_series(prom_url: str, expr: str, count: int, timeout: float = 30) -> list[dict]:
    return wait_for(lambda: (lambda r: len(r) == count and r)(query(prom_url, expr)),
                    timeout, interval=0.5, what=f"{count} series of {expr} in Prometheus")


class DockerApi:
    """What Prometheus' dockerswarm_sd (role nodes) and the exporter ask a Swarm
    manager's Docker API, answered from *nodes* and *containers* (Docker's own JSON
    shapes, any API version prefix). ``requests`` records the paths asked for."""

    def __init__(self, nodes: list[dict], containers: list[dict] = ()) -> None:
        self.nodes, self.containers, self.requests = nodes, list(containers), []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, head: bool = False):
                path = self.path.split("?", 1)[0]
                api.requests.append(self.path)
                bare = "/" + path.lstrip("/").split("/", 1)[1] if path.startswith("/v1.") \
                    else path
                body = {"/_ping": "OK", "/nodes": api.nodes,
                        "/containers/json": api.containers,
                        "/version": {"ApiVersion": "1.41", "MinAPIVersion": "1.12",
                                     "Version": "20.10.24", "Os": "linux",
                                     "Arch": "amd64"}}.get(bare)
                data = (body.encode() if isinstance(body, str) else json.dumps(body).encode())
                self.send_response(404 if body is None else 200)
                self.send_header("Api-Version", "1.41")
                self.send_header("Content-Type", "text/plain" if isinstance(body, str)
                                 else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)

            def do_GET(self):  # noqa: N802 - http.server's name
                self._answer()

            def do_HEAD(self):  # noqa: N802
                self._answer(head=True)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"tcp://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def swarm_node(hostname: str, addr: str, *, state: str = "ready",
               availability: str = "active", role: str = "worker",
               labels: dict | None = None, gpus: list[str] = ()) -> dict:
    """A node as the Docker API's GET /nodes lists it (the fields Prometheus reads); its
    GPUs in the engine label, as gpulab's Swarm nodes say them."""
    return {"ID": f"node{hostname}".ljust(25, "0")[:25],
            "Spec": {"Role": role, "Availability": availability, "Labels": labels or {}},
            "Description": {"Hostname": hostname,
                            "Platform": {"Architecture": "x86_64", "OS": "linux"},
                            "Engine": {"EngineVersion": "20.10.24",
                                       "Labels": {"gpulab.gpus": ",".join(gpus)}}},
            "Status": {"State": state, "Addr": addr}}


class Dashboard:
    """The real dashboard app (gpulab.dashboard.app.make_app) over *sources*, served on
    loopback from a thread with its own event loop; auth as in tests/unit's app tests
    (JupyterHub's HubOAuth, with the hub's token lookup answered from a table)."""

    def __init__(self, sources) -> None:
        from tests.unit.test_dashboard_app import start  # the app tests' own server setup

        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.server, self.url, _ = self.loop.run_until_complete(start(sources))
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(30), "the dashboard app did not start"

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
