"""Settings + user + GPUs -> what DockerSpawner needs to create a user's container.

A pure function, tested against literal expected structures (the kubespawner
``make_pod`` pattern): no Docker daemon, no hub, no I/O. The spawner copies the result
onto DockerSpawner's traits just before creating the container.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulab.contract import (
    ASSISTANT_ON_CONFIG,
    COLLABORATION_ON_CONFIG,
    LOG_DRIVER,
    MAX_PROJECTS,
    PROJECT_INIT_SLOTS,
    PROJECTS_PATH,
    lease_labels,
    log_options,
    project_volume,
)
from gpulab.gpus.policy import ServerResources
from gpulab.gpus.sharing import alloc_conf
from gpulab.spawn.jobs import Job, job_env
from gpulab.spawn.naming import volume_name

CONTAINER_UID = 1000  # jovyan in images/singleuser


@dataclass(frozen=True)
class ContainerOptions:
    image: str
    volumes: dict[str, dict[str, str]]
    environment: dict[str, str]
    host_config: dict[str, Any]
    create_kwargs: dict[str, Any]
    mem_limit: int
    cpu_limit: float
    labels: dict[str, str] = field(default_factory=dict)


def home_volume_create(settings: Mapping[str, Any], username: str, servername: str = ""
                       ) -> dict[str, Any] | None:
    """The home volume the spawner creates before the container when ``spawn.home_size``
    limits it (docker-py's ``create_volume`` keywords: Docker's local driver takes the
    size only at creation, on XFS with project quotas), or None when there is no limit
    and Docker creates the home itself with the container."""
    return _sized_volume(volume_name(settings["spawn.home_volume"], username, servername),
                         settings["spawn.home_size"])


def project_volume_create(settings: Mapping[str, Any], project: str
                          ) -> dict[str, Any] | None:
    """A group's project folder, as :func:`home_volume_create` makes a home: created
    apart, with ``spawn.project_size``, or None when there is no limit."""
    return _sized_volume(project_volume(project), settings["spawn.project_size"])


def _sized_volume(name: str, size: int) -> dict[str, Any] | None:
    if not size:
        return None
    return {"name": name, "driver": "local", "driver_opts": {"size": str(size)}}


def project_mounts(projects: Sequence[str]) -> list[dict[str, Any]]:
    """Docker's mounts of the *projects* (at most MAX_PROJECTS, as gpus.yaml allows):
    each at /projects/NAME, and at its slot of the image's empty folders, where Docker
    gives a new volume the folder's owner and mode (the member's user, setgid, group
    writable) before anything is written in it."""
    assert len(projects) <= MAX_PROJECTS, projects
    out = []
    for slot, project in enumerate(projects):
        volume = project_volume(project)
        out += [{"Type": "volume", "Source": volume, "Target": f"{PROJECT_INIT_SLOTS}/{slot}",
                 "ReadOnly": False},
                {"Type": "volume", "Source": volume, "Target": f"{PROJECTS_PATH}/{project}",
                 "ReadOnly": False}]
    return out


def container_options(
    settings: Mapping[str, Any],
    username: str,
    servername: str = "",
    gpu_uuids: Sequence[str] = (),
    gpu_share: int = 1,
    resources: ServerResources | None = None,
    job: Job | None = None,
    projects: Sequence[str] = (),
) -> ContainerOptions:
    """Everything about a user's container that gpulab decides.

    ``gpu_uuids`` are the GPUs leased to this server: the container gets a DeviceRequest
    for exactly those, and ``NVIDIA_VISIBLE_DEVICES`` forced to them, or ``void`` when
    there are none (so an image that sets ``all`` still sees no GPU). ``gpu_share``: how
    many servers may hold the most shared of them at once (max_users; 1: none shared),
    whose PyTorch memory cap (gpulab.gpus.sharing) then applies to all of them.
    ``resources``: its CPUs and memory by its GPUs (gpulab.gpus.policy.server_resources;
    None: spawn.cpu_limit and spawn.mem_limit); OMP_NUM_THREADS says its whole CPUs, so
    that PyTorch, BLAS and ``nproc`` count the CPUs it has, not the machine's. A *job*
    (gpulab.spawn.jobs) is in its environment, for the image's runner, and its labels.
    Her groups' *projects* are mounted read-write at /projects/NAME (and at an empty
    folder of the image's, so that a new project's volume is hers to write in:
    gpulab.contract.PROJECT_INIT_SLOTS).
    """
    if resources is None:
        resources = ServerResources(settings["spawn.cpu_limit"], settings["spawn.mem_limit"])
    volumes = {
        volume_name(settings["spawn.home_volume"], username, servername): {
            "bind": settings["spawn.home_path"],
            "mode": "rw",
        }
    }
    if settings["spawn.datasets_volume"]:
        volumes[settings["spawn.datasets_volume"]] = {
            "bind": settings["spawn.datasets_path"],
            "mode": "ro",
        }

    host_config: dict[str, Any] = {
        "shm_size": settings["spawn.shm_size"],
        "pids_limit": settings["spawn.pids_limit"],
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "init": True,
        # Keep a container that exits while starting until the spawner has read its
        # log for the user; the spawner removes it on stop (DockerSpawner.remove).
        "auto_remove": False,
        # Her server's log rotates: it cannot fill the host's disk (docker-py's LogConfig).
        "log_config": {"type": LOG_DRIVER, "config": log_options()},
    }
    if gpu_uuids:
        host_config["device_requests"] = [
            {
                "Driver": "nvidia",
                "DeviceIDs": list(gpu_uuids),
                "Capabilities": [["gpu"]],
            }
        ]

    if projects:
        host_config["mounts"] = project_mounts(projects)

    labels = lease_labels(username, servername, gpu_uuids, job=job is not None)
    environment = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(gpu_uuids) if gpu_uuids else "void",
        "GPULAB_GPUS": ",".join(gpu_uuids),
        "OMP_NUM_THREADS": str(resources.threads),
        **(job_env(job, servername) if job is not None else {}),
    }
    if gpu_uuids and settings["spawn.shared_gpu_memory_cap"]:
        environment.update(alloc_conf(gpu_share))
    # JupyterLab's assistant (gpulab.assistant) and real-time collaboration, each on where
    # the lab turned it on: the image's config folders that do it, first on Jupyter's path
    turned_on = [folder for folder, on in ((ASSISTANT_ON_CONFIG, settings["assistant.model"]),
                                           (COLLABORATION_ON_CONFIG,
                                            settings["spawn.collaboration"])) if on]
    if turned_on:
        environment["JUPYTER_CONFIG_PATH"] = ":".join(turned_on)
    return ContainerOptions(
        image=settings["spawn.image"],
        volumes=volumes,
        environment=environment,
        host_config=host_config,
        create_kwargs={"user": f"{CONTAINER_UID}:{CONTAINER_UID}", "labels": labels},
        mem_limit=resources.memory,
        cpu_limit=resources.cpus,
        labels=labels,
    )
