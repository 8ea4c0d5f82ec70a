"""Faults made from the host, as they happen on a lab's server, and waiting for what they
restarted: shared by test_recovery.py (the lab comes back by itself) and
test_last_good.py (it comes back on the last good settings)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess

from .stack import REPO, container_logs, docker, host_has_nvidia_gpu, wait_for
from .standin import dockerd_has_nvidia_driver


def state(container: str) -> dict:
    return json.loads(docker("inspect", container))[0]["State"]


def parent_pid(pid: int) -> int:
    """The parent of process *pid* (for a container's PID 1: its containerd shim)."""
    stat = open(f"/proc/{pid}/stat").read()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def restart_count(container: str) -> int:
    return json.loads(docker("inspect", container))[0]["RestartCount"]


def kill_from_host(container: str) -> str:
    """SIGKILL the container's PID 1 from the host; returns the StartedAt it had."""
    s = state(container)
    assert s["Running"], f"{container} is not running: {s['Status']}"
    os.kill(s["Pid"], signal.SIGKILL)
    return s["StartedAt"]


def wait_restarted(container: str, started_before: str, timeout: float = 90) -> None:
    def again():
        s = state(container)
        return s["Running"] and not s["Restarting"] and s["StartedAt"] != started_before
    try:
        wait_for(again, timeout, interval=0.2, what=f"{container} to be restarted by Docker")
    except AssertionError:
        print(container_logs(container, 40))
        raise


def hub_reaches_docker_proxy() -> bool:
    """The hub's own view: does the Docker API filter answer a ping? (A restarted
    container is "running" a moment before its process listens.)"""
    return subprocess.run(
        ["docker", "exec", "gpulab-hub", "python3", "-c",
         "import urllib.request; urllib.request.urlopen('http://docker-proxy:2375/_ping', "
         "timeout=2)"], capture_output=True, timeout=30).returncode == 0


# The engine under test: the one scripts/ensure-docker.sh starts, or the disruptive lane's
# own (tests/lane_engine.py sets both).
PIDFILE = os.environ.get("GPULAB_DOCKERD_PIDFILE", "/run/gpulab-dockerd.pid")
START = os.environ.get("GPULAB_DOCKERD_START", "")


def gpulab_dockerd_pid() -> int:
    """The PID of the engine under test's dockerd (scripts/ensure-docker.sh's, or the
    disruptive lane's own), 0 if none runs."""
    try:
        pid = int(open(PIDFILE).read().strip())
    except (OSError, ValueError):
        return 0
    try:
        if open(f"/proc/{pid}/comm").read().strip() != "dockerd":
            return 0
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return 0
    # the lane's own engine: only the dockerd started with its PID file (not a PID reused)
    own = "GPULAB_DOCKERD_PIDFILE" in os.environ
    return pid if not own or PIDFILE.encode() in argv else 0


def dockerd_environment() -> dict[str, str]:
    """What scripts/ensure-docker.sh needs to start dockerd as it runs now: with the
    stand-in GPU hook on its PATH on a host without a GPU, if it has it now. Ask while
    dockerd runs (the question starts a container)."""
    env = dict(os.environ)
    if not host_has_nvidia_gpu() and dockerd_has_nvidia_driver():
        env["GPULAB_DOCKERD_PATH"] = str(REPO / "tests" / "gpu_standin")
    return env


def start_gpulab_dockerd(env: dict[str, str] | None = None) -> None:
    """scripts/ensure-docker.sh with *env* (dockerd_environment(), asked before it
    stopped; the stand-in hook on hosts without a GPU when none is given)."""
    if START:  # the lane's own engine starts as it was, by its own command
        subprocess.run(shlex.split(START), check=True, timeout=120, cwd=REPO)
        return
    if env is None:
        env = dict(os.environ)
        if not host_has_nvidia_gpu():
            env["GPULAB_DOCKERD_PATH"] = str(REPO / "tests" / "gpu_standin")
    subprocess.run([str(REPO / "scripts" / "ensure-docker.sh")], check=True, timeout=120,
                   env=env)


def restart_gpulab_dockerd(while_down=lambda: None) -> None:
    """Stop gpulab's dockerd (SIGTERM, as an upgrade does), run *while_down*, start it
    again as it was."""
    env = dockerd_environment()
    pid = gpulab_dockerd_pid()
    os.kill(pid, signal.SIGTERM)
    try:
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 90, what="dockerd to exit")
        while_down()
    finally:
        start_gpulab_dockerd(env)
