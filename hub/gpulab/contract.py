"""What gpulab's processes agree on, spelled once: container labels, names and metrics.

The hub writes these labels on every user container (:mod:`gpulab.spawn.containers`), the
lease table and the admins' lease page read them back, the Docker proxy refuses
per-container calls on containers without :data:`LABEL_MANAGED` and creates whose
name or labels break these rules, and the exporter (its own package, which cannot
import this one) keeps a copy that ``tests/unit/test_contract.py`` compares with this.

Standard library only: every gpulab process imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# Labels on every user container (and member's Swarm service): the lease table is
# rebuilt from them after a restart.
LABEL_MANAGED = "org.gpulab.managed"  # "true" on every container the hub created
LABEL_USER = "org.gpulab.user"  # the hub user who owns it
LABEL_SERVER = "org.gpulab.server"  # their named server ("" for the default one)
LABEL_GPUS = "org.gpulab.gpus"  # comma-separated UUIDs of the GPUs it holds
# "true" on a job's container or service (gpulab.spawn.jobs): a named server that runs
# her command and ends with it; the lease page and the dashboard say "job"
LABEL_JOB = "org.gpulab.job"
# On a member's Swarm service (multi-node): the Swarm node ID its GPUs are on, the node
# its placement constraint names (node.id==<id>); a lease is (node, GPU UUIDs).
LABEL_NODE = "org.gpulab.node"

# A GPU as NVML names it (`nvidia-smi -L`): GPU-<hex groups>, or MIG-<hex groups> for a
# MIG device. gpus.yaml, gpulab.yaml and the Docker proxy all accept exactly this, and
# LABEL_GPUS holds these. Hex only, so a UUID is never a path, option or shell word.
GPU_UUID = re.compile(r"(GPU|MIG)-[0-9A-Fa-f]+(-[0-9A-Fa-f]+)*")


def lease_labels(user: str, server: str, gpu_uuids: Sequence[str],
                 job: bool = False) -> dict[str, str]:
    """The labels of *user*'s *server* ("" = the default one) holding *gpu_uuids*: the
    lease, as the hub writes it on a container or a member's service; and whether the
    server runs a *job*."""
    return {
        LABEL_MANAGED: "true",
        LABEL_USER: user,
        LABEL_SERVER: server,
        LABEL_GPUS: ",".join(gpu_uuids),
        **({LABEL_JOB: "true"} if job else {}),
    }


def is_job(container: Mapping[str, Any]) -> bool:
    """Whether docker's container (or service) dict is a job's (:data:`LABEL_JOB`)."""
    return (container.get("Labels") or {}).get(LABEL_JOB) == "true"


def label_claims(container: Mapping[str, Any]) -> tuple[str, str, list[str]]:
    """(user, server, GPU UUIDs) a container's labels claim; the inverse of
    :func:`lease_labels`. Takes docker's ``containers()`` dicts."""
    labels = container.get("Labels") or {}
    gpus = [u.strip() for u in (labels.get(LABEL_GPUS) or "").split(",") if u.strip()]
    return labels.get(LABEL_USER) or "", labels.get(LABEL_SERVER) or "", gpus


# A group's project folders (gpus.yaml groups: NAME: {projects: [...]}): each project is
# the named volume PROJECT_VOLUME_PREFIX + its name, mounted at PROJECTS_PATH/NAME in
# every server of the group's members. A new volume's root is root's; mounted (also) at
# one of the image's PROJECT_INIT_SLOTS, an empty folder of the member's user, Docker
# gives the new volume that folder's owner and mode (setgid, group-writable), so members
# can write in it: the image has MAX_PROJECTS of them, hence at most that many projects.
PROJECT_VOLUME_PREFIX = "gpulab-project-"
PROJECTS_PATH = "/projects"
PROJECT_INIT_SLOTS = "/srv/gpulab/projects"  # /0, /1, ... in images/singleuser
MAX_PROJECTS = 16
PROJECT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")


def project_volume(project: str) -> str:
    return PROJECT_VOLUME_PREFIX + project


# On a Swarm: the engine label (dockerd --label) each GPU node carries, its GPUs' UUIDs
# comma-separated, in NVML index order; the hub's inventory of that node.
ENGINE_LABEL_GPUS = "gpulab.gpus"

# The users' network and the stack's fixed addresses on it (members' servers reach only
# the hub there, and only the hub and the proxy reach them: gpulab-netguard). Docker (or
# a Swarm) hands members' servers addresses from USERS_IP_RANGE; the hub and the proxy
# sit above it. docker-compose*.yml, the Makefile and scripts/preflight.sh spell their
# own defaults (GPULAB_SUBNET, GPULAB_IP_RANGE, GPULAB_HUB_IP, GPULAB_PROXY_IP):
# tests/unit/test_contract.py holds them equal to these.
USERS_SUBNET = "172.30.0.0/24"
USERS_IP_RANGE = "172.30.0.0/25"
HUB_IP = "172.30.0.250"
PROXY_IP = "172.30.0.251"
PROXY_API_PORT = 8001  # configurable-http-proxy's REST API, which the hub drives

# The GPU exporter's port (monitoring/exporter's --listen default; published on each GPU
# server of a Swarm for the manager's Prometheus).
EXPORTER_PORT = 9445

# User containers are named USER_CONTAINER_PREFIX + a slug of the username (gpulab.spawn.naming);
# nothing else gpulab runs starts with it, so no username can take an infrastructure
# container's name (or its DNS name on the users' network).
USER_CONTAINER_PREFIX = "gpulab-user-"

# In the single-user image: the config folder that turns JupyterLab's assistant
# (jupyter-ai) on, asking the lab's model through the hub; the hub points
# JUPYTER_CONFIG_PATH at it while gpulab.yaml's assistant.model names one
# (images/singleuser/assistant-on/). An image without it starts without the assistant.
ASSISTANT_ON_CONFIG = "/opt/venv/share/gpulab/assistant-on"
# ... and the one that turns JupyterLab's real-time collaboration (jupyter-collaboration)
# on, while gpulab.yaml's spawn.collaboration is true (images/singleuser/collaboration-on/).
COLLABORATION_ON_CONFIG = "/opt/venv/share/gpulab/collaboration-on"

# How much log every container gpulab starts may keep on the Docker host: the stack's
# (docker-compose.yml's x-hardened logging) and members' servers, containers and Swarm
# services (gpulab.spawn). Docker's json-file driver rotates it: LOG_MAX_FILES files of
# at most LOG_MAX_SIZE, the oldest dropped. Without it a log grows until the disk that
# homes and the hub's database share is full. The Docker proxy refuses any other.
LOG_DRIVER = "json-file"
LOG_MAX_SIZE = "10m"
LOG_MAX_FILES = 3


def log_options() -> dict[str, str]:
    """The json-file driver's options for :data:`LOG_MAX_SIZE` and :data:`LOG_MAX_FILES`."""
    return {"max-size": LOG_MAX_SIZE, "max-file": str(LOG_MAX_FILES)}


# The containers of the stack itself (docker-compose.yml's container_name values).
HUB_CONTAINER = "gpulab-hub"
PROXY_CONTAINER = "gpulab-proxy"
INFRA_CONTAINERS = (
    HUB_CONTAINER,
    PROXY_CONTAINER,
    "gpulab-docker-proxy",
    "gpulab-docker-proxy-ro",
    "gpulab-netguard",
    "gpulab-exporter",
    "gpulab-prometheus",
    "gpulab-alertmanager",
    "gpulab-ssh",
    "gpulab-backup",
    "gpulab-assistant",
)

# The stack's own volumes: no user's home volume may ever be given one of these names.
INFRA_VOLUMES = ("gpulab-hub-data", "gpulab-prometheus-data", "gpulab-alertmanager-data",
                 "gpulab-ssh-data", "gpulab-datasets", "gpulab-last-good",
                 # `make restore`'s scratch volume (gpulab.backup.restore), while it runs
                 "gpulab-restore-scratch")

# JupyterHub service names.
DASHBOARD_SERVICE = "gpus"  # the operators' GPU dashboard and the admins' lease page
# The GPU culler service (gpulab.culler), and the file in the hub's data folder where it
# leaves warnings and stop notices for members' home pages (gpulab.notices).
CULLER_SERVICE = "gpu-culler"
CULLER_NOTICES_FILE = "gpu-culler-notices.json"
# On a Swarm, the hub's own notices of servers it found stopped (their machine went
# down): same format, shown the same way (gpulab.spawn.swarm_spawner).
SERVER_NOTICES_FILE = "gpulab-server-notices.json"
# The line for GPUs (gpulab.line): its store in the hub's data folder, the service that
# starts the server of the member whose turn it is, and that service's notices.
LINE_FILE = "gpulab-line.sqlite"
LINE_SERVICE = "gpu-line"
LINE_NOTICES_FILE = "gpu-line-notices.json"
LINE_USAGE_FILE = "gpulab-line-usage.json"  # members' recent GPU-hours (fair share)
# Bookings of GPUs for a time window (gpulab.bookings), in the hub's data folder: written
# by the hub's REST API, read by its spawner and the GPU culler.
BOOKINGS_FILE = "gpulab-bookings.sqlite"

# Prometheus' scrape interval in seconds (docker-compose.yml sets it on Prometheus and the
# hub alike; 15 unless GPULAB_SCRAPE_SECONDS says otherwise: `make test` runs at 2). The
# usage page, the history and the GPU culler count with it.
SCRAPE_SECONDS_ENV = "GPULAB_SCRAPE_SECONDS"
DEFAULT_SCRAPE_SECONDS = 15


def scrape_seconds(environ: dict[str, str] | None = None) -> int:
    """GPULAB_SCRAPE_SECONDS from *environ* (default: this process's), 15 when unset;
    ValueError for anything but whole seconds from 1 to 300."""
    import os

    raw = (os.environ if environ is None else environ).get(SCRAPE_SECONDS_ENV, "").strip()
    if not raw:
        return DEFAULT_SCRAPE_SECONDS
    if not raw.isdigit() or not 1 <= int(raw) <= 300:
        raise ValueError(f"{SCRAPE_SECONDS_ENV} must be whole seconds from 1 to 300, "
                         f"not {raw!r}")
    return int(raw)


# Prometheus metrics the hub queries (the GPU culler, the dashboard's table and history).
# The exporter writes them (gpulab_exporter.collector, which cannot import this module);
# tests/unit/test_contract.py checks that it does, and that every gpulab_* name the hub's
# code mentions is one it produces.
METRIC_UTILIZATION = "gpulab_gpu_utilization_ratio"
METRIC_MEMORY_USED = "gpulab_gpu_memory_used_bytes"
METRIC_MEMORY_TOTAL = "gpulab_gpu_memory_total_bytes"
METRIC_LEASE = "gpulab_gpu_lease_info"  # one series per (GPU, holder), value 1
METRIC_USER_MEMORY = "gpulab_gpu_user_memory_used_bytes"  # per (GPU, hub user)
METRIC_MIG_DEVICE = "gpulab_gpu_mig_device_info"  # per MIG device: its GPU's parent_uuid


def parse_gpu_label(label: str) -> tuple[int | None, int | None]:
    """The exporter's ``gpu`` label -> (GPU index, MIG device slot): "1" is GPU 1, "1:0"
    MIG device 0 of GPU 1 (as NVIDIA_VISIBLE_DEVICES names it); (None, None) for anything
    else."""
    index, colon, slot = label.partition(":")
    if not index.isdigit() or (colon and not slot.isdigit()):
        return None, None
    return int(index), int(slot) if colon else None


# The demo for a host without GPUs (`make up GPULAB_DEMO=1`): the hub finds this many
# simulated GPUs (gpulab.gpus.discovery) with the UUIDs the exporter gives its
# `--fake-gpus` (gpulab_exporter.fake_nvml.fake_uuid), and the stand-in GPU runtime
# (tests/gpu_standin) lets dockerd start containers that ask for them.
DEMO_ENV = "GPULAB_DEMO"
DEMO_GPUS = 2


def demo_gpu_uuid(index: int) -> str:
    return f"GPU-fa4e0000-0000-4000-8000-{index:012x}"


# On a Swarm whose homes are on the machines, a member's server remembers in its saved
# state (JupyterHub's spawner state) the node its home volume is on, and its hostname.
def shared_home(states: Mapping[str, Mapping[str, Any] | None], server: str | None
                ) -> tuple[str, str]:
    """(node ID, hostname) of her home as her servers' saved *states* (by server name)
    remember it, other than *server*'s ("", "" if none does): a new server of hers runs
    there, and her bookings' GPUs are there."""
    for name, state in sorted(states.items()):
        if name != server and (state or {}).get("home_node"):
            return str(state["home_node"]), str(state.get("home_machine") or "")
    return "", ""
