"""A member's server on a Swarm, as pure functions: the service the hub asks for, and
whether it runs, from the Swarm's own objects (no I/O).

On a single host the spawner creates a container (:mod:`gpulab.spawn.containers`); on a Swarm
it creates a service of one task, placed on the node whose GPUs it leased. The service
is the same server: :func:`service_spec` starts from
:func:`gpulab.spawn.containers.container_options` and says it in a Swarm service spec, the
shape :mod:`gpulab.dockerapi.swarm_policy` (the Docker proxy in front of the manager) lets
through. Where a service cannot say what a container says, it says the nearest thing:

* GPUs: no DeviceRequest (Swarm has none); ``NVIDIA_VISIBLE_DEVICES`` set to exactly the
  leased UUIDs, with NVIDIA's runtime as every GPU node's default runtime (NVIDIA's
  documented Swarm setup; not generic resources, because every node update makes Swarm
  reject the running tasks that hold one).
* ``/dev/shm``: a tmpfs mount of ``spawn.shm_size`` at ``/dev/shm``.
* The image: by its ID, so that the machine runs exactly the manager's build and asks no
  registry (a service names its image, and each machine looks the name up first).
* ``no-new-privileges``: API 1.41 has no such setting for services, and dockerd drops
  ``Privileges.NoNewPrivileges``; each node's ``daemon.json`` must set
  ``"no-new-privileges": true`` (docs/swarm.md).

Leases live in the service's labels (:data:`~gpulab.contract.LABEL_GPUS`,
:data:`~gpulab.contract.LABEL_NODE`), read back with the nodes' GPUs by
:mod:`gpulab.gpus.swarm_nodes`. :func:`server_state` says whether a member's server is
running, starting or stopped (and why: its machine went down or was drained, or its
task ended), from its service, tasks and node: a stopped server's service is then
removed by the hub, which releases its lease.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulab.contract import LABEL_NODE, LOG_DRIVER, log_options
from gpulab.gpus.policy import ServerResources
from gpulab.gpus.sharing import merged_env
from gpulab.gpus.swarm_nodes import node_name, node_usable
from gpulab.spawn.containers import CONTAINER_UID, container_options
from gpulab.spawn.jobs import Job
from gpulab.spawn.naming import container_name

DEV_SHM = "/dev/shm"


def service_spec(
    settings: Mapping[str, Any],
    username: str,
    servername: str,
    gpu_uuids: Sequence[str],
    node_id: str,
    image_id: str,
    env: Mapping[str, str] | None = None,
    command: Sequence[str] | None = None,
    gpu_share: int = 1,
    resources: ServerResources | None = None,
    job: Job | None = None,
    projects: Sequence[str] = (),
) -> dict[str, Any]:
    """The service create body (Docker API 1.41) for *username*'s server on node
    *node_id* with the GPUs *gpu_uuids* of that node, running *image_id*: the ID
    ``spawn.image`` has on the manager, which no machine asks a registry for (by name,
    every start would, and would run what the registry sent). *env* is what JupyterHub
    gives every server (its API token, URLs); gpulab's own variables win over it, as in
    :func:`gpulab.gpus.sharing.merged_env`. *gpu_share*, *resources*, *job*, *projects*:
    as in container_options."""
    opts = container_options(settings, username, servername, gpu_uuids, gpu_share, resources,
                             job, projects)
    environment = merged_env(env or {}, opts.environment)
    mounts = [{"Type": "volume", "Source": name, "Target": v["bind"],
               "ReadOnly": v["mode"] == "ro"} for name, v in opts.volumes.items()]
    mounts += opts.host_config.get("mounts", [])  # her groups' projects (this machine's)
    mounts.append({"Type": "tmpfs", "Target": DEV_SHM,
                   "TmpfsOptions": {"SizeBytes": settings["spawn.shm_size"]}})
    container = {
        "Image": image_id,
        "Labels": dict(opts.labels),
        "Env": [f"{k}={v}" for k, v in environment.items()],
        "User": f"{CONTAINER_UID}:{CONTAINER_UID}",
        "Init": True,
        "CapabilityDrop": ["ALL"],
        "Mounts": mounts,
    }
    if command:
        container["Args"] = list(command)
    return {
        "Name": container_name(username, servername),
        "Labels": {**opts.labels, LABEL_NODE: node_id},
        "TaskTemplate": {
            "ContainerSpec": container,
            "Resources": {"Limits": {
                "MemoryBytes": opts.mem_limit,
                "NanoCPUs": round(opts.cpu_limit * 1e9),
                "Pids": settings["spawn.pids_limit"],
            }},
            "RestartPolicy": {"Condition": "none"},
            "Placement": {"Constraints": [f"node.id=={node_id}"]},
            "Networks": [{"Target": settings["spawn.network"]}],
            "LogDriver": {"Name": LOG_DRIVER, "Options": log_options()},
        },
        "Mode": {"Replicated": {"Replicas": 1}},
        "EndpointSpec": {"Mode": "dnsrr"},
    }







def node_for_cpu_server(nodes: Iterable[Mapping[str, Any]],
                        services: Iterable[Mapping[str, Any]]) -> str:
    """The node for a server with no GPU: the usable node running the fewest members'
    servers (ties: by hostname), or "" when none is usable."""
    load: dict[str, int] = {}
    for s in services:
        node = ((s.get("Spec") or {}).get("Labels") or {}).get(LABEL_NODE, "")
        load[node] = load.get(node, 0) + 1
    usable = [n for n in nodes if node_usable(n)]
    if not usable:
        return ""
    best = min(usable, key=lambda n: (load.get(n.get("ID", ""), 0), node_name(n)))
    return str(best.get("ID") or "")


def landing_note(homes: str, home_machine: str, landings: Mapping[int, str],
                 home_up: bool = True) -> str:
    """What the spawn form says about where a member's server will run. *homes* is
    ``spawn.swarm_homes``; *home_machine* the machine that holds her home ("" before her
    first server, or with shared homes), *home_up* whether it can take servers now;
    *landings* maps each GPU count she may ask for to the machine the hub would pick for
    it now ("" when none could take it)."""
    if home_machine and homes == "machine":
        if not home_up:
            return (f"Your files are on {home_machine}, which is down or out of service: "
                    f"your server cannot start until it is back.")
        return (f"Your files are on {home_machine}, so your server starts there, with "
                f"GPUs of {home_machine}.")
    def where(count: int, machine: str) -> str:
        gpus = "no GPU" if count == 0 else f"{count} GPU{'s' if count > 1 else ''}"
        return f"with {gpus} on {machine}" if machine else f"with {gpus} nowhere right now"
    now = "; ".join(where(n, m) for n, m in sorted(landings.items()))
    if homes == "machine":
        return (f"Your server would start {now}. Your files are then kept on that machine, "
                f"and your server goes back to it every time.")
    return f"Your server would start {now}. Your files are on the lab's shared storage."



def task_address(task: Mapping[str, Any], network: str) -> str:
    """The task's address on *network* (by name), without its prefix length; "" when the
    task is not attached to it (yet)."""
    for attachment in task.get("NetworksAttachments") or ():
        if ((attachment.get("Network") or {}).get("Spec") or {}).get("Name") == network:
            for address in attachment.get("Addresses") or ():
                return address.split("/", 1)[0]
    return ""


RUNNING, STARTING, STOPPED = "running", "starting", "stopped"
NO_SUCH_IMAGE = "No such image"  # dockerd's error for a task whose image is not there
# swarmkit's task states before "running" (api/types.proto: TaskState)
_BEFORE_RUNNING = {"new", "pending", "assigned", "accepted", "preparing", "ready",
                   "starting"}


@dataclass(frozen=True)
class ServerState:
    state: str  # RUNNING, STARTING or STOPPED
    reason: str = ""  # why it stopped, in words a member reads


def server_state(service: Mapping[str, Any], tasks: Iterable[Mapping[str, Any]],
                 nodes: Iterable[Mapping[str, Any]]) -> ServerState:
    """A member's server from the Swarm's view of it: *service* (its object), *tasks*
    (those of this service) and *nodes* (all of them, from the node list)."""
    node_id = ((service.get("Spec") or {}).get("Labels") or {}).get(LABEL_NODE, "")
    node = next((n for n in nodes if n.get("ID") == node_id), None)
    if node is None:
        return ServerState(STOPPED, "the machine it ran on has left the cluster")
    where = node_name(node)
    # Only "down" (its heartbeats stopped) is a dead machine. "unknown" is what every node
    # reads right after the manager restarts or the leader changes, until it reports in
    # again; "disconnected" is a machine leaving: neither means its servers stopped.
    if (node.get("Status") or {}).get("State") == "down":
        return ServerState(STOPPED, f"the machine it ran on ({where}) is down")
    # Drain stops a machine's tasks; pause only keeps new ones away.
    if (node.get("Spec") or {}).get("Availability") == "drain":
        return ServerState(STOPPED, f"an admin took its machine ({where}) out of service")
    newest = max(tasks, key=lambda t: (t.get("Version") or {}).get("Index", 0), default=None)
    if newest is None:
        return ServerState(STARTING)
    status = newest.get("Status") or {}
    state = status.get("State", "")
    if newest.get("DesiredState") == "running" and state == "running":
        return ServerState(RUNNING)
    if newest.get("DesiredState") == "running" and state in _BEFORE_RUNNING:
        return ServerState(STARTING)
    detail = status.get("Err") or status.get("Message") or state
    if str(detail).startswith(NO_SUCH_IMAGE):  # services name the manager's image by ID
        image = str(detail)[len(NO_SUCH_IMAGE):].strip(": ")
        return ServerState(STOPPED, f"{where} does not have the lab's server image as the "
                                    f"Swarm's manager has it ({image[:19]}); an admin must "
                                    f"copy it there (docs/swarm.md, the images)")
    return ServerState(STOPPED, f"it ended on {where}: {detail}")


def ran_a_container(tasks: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any of a service's *tasks* got as far as a container on its machine (one
    rejected before, for want of the image, never held its GPUs there)."""
    return any(((t.get("Status") or {}).get("ContainerStatus") or {}).get("ContainerID")
               for t in tasks)
