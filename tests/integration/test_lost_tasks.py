"""scripts/lost-tasks.sh (run by every `make up`) against the real dockerd and containerd:
a container that Docker says has exited while containerd still runs it is ended, named,
and starts again; running containers are left alone.

The state is the one CI saw after a dockerd restart (test_recovery.py's reboot, before it
killed the shims as a power cut does): `docker start` failing with "id already in use"
because containerd ran the task of a container that Docker had marked exited. dockerd had
taken the late exit report of the container's old process, sent by its shim once
containerd was back, for the exit of the process it had just started. Here that late
report is sent as a shim sends it (`containerd publish`), for a running container."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from .stack import REPO, docker

# the containerd of the engine under test: a lane's (tests/lane_engine.py), else the main one
SOCKET = Path(os.environ.get("GPULAB_CONTAINERD_SOCKET",
                             "/var/run/docker/containerd/containerd.sock"))
pytestmark = pytest.mark.skipif(
    not (shutil.which("ctr") and shutil.which("containerd") and SOCKET.exists()),
    reason="needs containerd's ctr and the containerd that dockerd started")


def ctr(*args: str, check: bool = True) -> str:
    return subprocess.run(["ctr", "--address", str(SOCKET), "--namespace", "moby", *args],
                          capture_output=True, text=True, timeout=60, check=check).stdout


def task_of(container_id: str) -> str:
    """containerd's status of the task under *container_id*, "" if there is none."""
    out = ctr("task", "ls")
    for line in out.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == container_id:
            return fields[-1]
    return ""


def _protobuf(*fields: tuple[int, int | bytes]) -> bytes:
    """Protocol Buffers' encoding of (field number, varint or bytes) pairs."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)
    out = b""
    for number, value in fields:
        if isinstance(value, int):
            out += varint(number << 3) + varint(value)
        else:
            out += varint(number << 3 | 2) + varint(len(value)) + value
    return out


def send_late_exit(container_id: str, pid: int) -> None:
    """What a shim sends containerd when the process *pid* of *container_id* exits
    (containerd.events.TaskExit, status 137), as containerd's shims send it."""
    exited_at = _protobuf((1, int(time.time())))
    event = _protobuf((1, container_id.encode()), (2, container_id.encode()), (3, pid),
                      (4, 137), (5, exited_at))
    subprocess.run(["containerd", "--address", str(SOCKET), "publish", "--topic", "/tasks/exit",
                    "--namespace", "moby"], check=True, timeout=60,
                   input=_protobuf((1, b"containerd.events.TaskExit"), (2, event)))


def lost_tasks(*args: str) -> str:
    return subprocess.run([str(REPO / "scripts" / "lost-tasks.sh"), *args],
                          capture_output=True, text=True, timeout=120, check=True).stdout


def lose(container: str) -> None:
    """Put *container* (running) in the state dockerd left: exited for Docker, running
    for containerd, its next start refused."""
    send_late_exit(container, int(docker("inspect", "-f", "{{.State.Pid}}", container)))
    deadline = time.monotonic() + 30
    while docker("inspect", "-f", "{{.State.Status}}", container).strip() != "exited":
        assert time.monotonic() < deadline, "dockerd never took the late exit"
        time.sleep(0.2)
    assert task_of(container) == "RUNNING"


@pytest.mark.parametrize("how", ["make up", "after dockerd starts"])
def test_a_container_docker_lost_track_of_is_ended_and_starts_again(how):
    """make up's pass looks twice, a second apart; the one ensure-docker.sh starts in the
    background after it starts dockerd looks every second for a minute (here: 4 s)."""
    image = docker("inspect", "-f", "{{.Config.Image}}", "gpulab-hub").strip()
    lost = docker("run", "-d", "--name", "gpulab-test-lost", "--restart", "unless-stopped",
                  image, "sleep", "600").strip()
    plain = docker("run", "-d", "--name", "gpulab-test-lost-plain", image, "sleep", "600").strip()
    running = docker("run", "-d", "--name", "gpulab-test-running", image,
                     "sleep", "600").strip()
    try:
        old_pid = docker("inspect", "-f", "{{.State.Pid}}", lost).strip()
        lose(lost)
        lose(plain)
        failed = subprocess.run(["docker", "start", plain], capture_output=True, text=True,
                                timeout=60)
        assert "id already in use" in failed.stderr, failed

        out = lost_tasks() if how == "make up" else lost_tasks("--watch", "4")
        for name in ("gpulab-test-lost", "gpulab-test-lost-plain"):
            assert f"{name}: Docker says it has exited, but its processes still run" in out, out
        assert "gpulab-test-running" not in out, out
        assert task_of(running) == "RUNNING"
        # its restart policy says it runs: started again, as a new process
        assert "gpulab-test-lost started again (restart policy unless-stopped)" in out, out
        assert docker("inspect", "-f", "{{.State.Status}}", lost).strip() == "running"
        assert docker("inspect", "-f", "{{.State.Pid}}", lost).strip() != old_pid
        # no restart policy: ended, left stopped, and it starts when asked
        assert task_of(plain) == ""
        docker("start", plain)
        assert docker("inspect", "-f", "{{.State.Status}}", plain).strip() == "running"
        assert "gpulab-test-" not in lost_tasks()  # nothing left to end
    finally:
        docker("rm", "-f", lost, plain, running, check=False)
        for container in (lost, plain):
            if task_of(container):  # this test failed while Docker had lost track of it
                ctr("task", "delete", "--force", container, check=False)
                ctr("container", "delete", container, check=False)
