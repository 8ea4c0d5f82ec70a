"""Who is using a GPU: host PID -> container ID -> JupyterHub user and server.

* PID -> container: the container ID is the 64-hex name in ``/proc/<pid>/cgroup``
  (:func:`container_id_from_cgroup`, a pure function over that text). NVML reports
  host PIDs, so the exporter needs the host's PID namespace (``pid: host``).
* container -> user: the labels the hub's spawner puts on every user container
  (``org.gpulab.user``, ``org.gpulab.server``, ``org.gpulab.gpus``), read through a
  :class:`ContainerDirectory`. ``org.gpulab.gpus`` also says who holds a lease on a GPU
  when no process runs on it (allocated but idle).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

LABEL_USER = "org.gpulab.user"
LABEL_SERVER = "org.gpulab.server"
LABEL_GPUS = "org.gpulab.gpus"
LABEL_JOB = "org.gpulab.job"  # "true" on a job's container: a server that runs her command

# A 64-hex container ID not embedded in a longer hex run. It may stand alone
# (`/docker/<id>`), or inside a systemd scope (`docker-<id>.scope`, `cri-containerd-...`,
# `libpod-...`), or after `..` segments when the exporter has a private cgroup namespace.
_CONTAINER_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")


def container_id_from_cgroup(text: str) -> str | None:
    """The container ID in the text of a ``/proc/<pid>/cgroup`` file, or None for a
    process outside any container. Handles cgroup v1 (``4:memory:/docker/<id>``),
    v2 with the cgroupfs driver (``0::/docker/<id>``) or the systemd driver
    (``0::/system.slice/docker-<id>.scope``), and relative paths (``0::/../../<...id...>``)
    seen from a private cgroup namespace."""
    for line in text.splitlines():
        # hierarchy-ID:controller-list:cgroup-path; the path may itself contain ':'.
        parts = line.split(":", 2)
        path = parts[2] if len(parts) == 3 else line
        found = _CONTAINER_ID.findall(path)
        if found:
            return found[-1]  # the innermost container, if they nest
    return None


def container_of(pid: int, proc: str = "/proc") -> str | None:
    """The container ID of host process ``pid``, or None when it is in no container,
    has exited, or its cgroup file cannot be read."""
    try:
        with open(os.path.join(proc, str(pid), "cgroup"), encoding="utf-8") as f:
            return container_id_from_cgroup(f.read())
    except OSError:  # gone (ENOENT/ESRCH), or not ours to read
        return None


@dataclass(frozen=True)
class Container:
    """A hub-spawned user container, as its labels describe it."""

    id: str  # full 64-hex ID
    name: str
    user: str
    server: str  # "" for the default server
    gpus: tuple[str, ...]  # GPU UUIDs (or indices) leased to it
    job: bool = False  # a job's server (org.gpulab.job), not a notebook


def container_from_labels(cid: str, name: str, labels: dict[str, str]) -> Container | None:
    """A :class:`Container` from Docker labels, or None when it is not a hub user
    container (no ``org.gpulab.user`` label)."""
    user = labels.get(LABEL_USER)
    if not user:
        return None
    gpus = tuple(g.strip() for g in labels.get(LABEL_GPUS, "").split(",") if g.strip())
    return Container(id=cid, name=name, user=user, server=labels.get(LABEL_SERVER, ""), gpus=gpus,
                     job=labels.get(LABEL_JOB) == "true")


class ContainerDirectory(Protocol):
    """Lists the running hub user containers. May raise on failure; the poller then
    keeps the previous list and reports ``gpulab_exporter_docker_up 0``."""

    def containers(self) -> list[Container]: ...


class StaticContainerDirectory:
    """A fixed list of containers: for tests, demos and hosts without Docker."""

    def __init__(self, containers: list[Container] | None = None) -> None:
        self.items = list(containers or [])
        self.error: Exception | None = None

    def containers(self) -> list[Container]:
        if self.error is not None:
            raise self.error
        return list(self.items)


class DockerContainerDirectory:
    """The real directory: Docker's container list (one API call, no inspect per
    container), filtered on the ``org.gpulab.user`` label. Needs the Docker socket,
    read-only is enough."""

    def __init__(self, base_url: str = "unix:///var/run/docker.sock", timeout: float = 5.0):
        self.base_url = base_url
        self.timeout = timeout
        self._api = None

    def containers(self) -> list[Container]:
        if self._api is None:
            import docker  # imported late: fake-only runs and tests need no Docker

            self._api = docker.APIClient(base_url=self.base_url, timeout=self.timeout)
        found = []
        for c in self._api.containers(filters={"label": LABEL_USER, "status": "running"}):
            names = c.get("Names") or [""]
            item = container_from_labels(c["Id"], names[0].lstrip("/"), c.get("Labels") or {})
            if item is not None:
                found.append(item)
        return found

    def close(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None
