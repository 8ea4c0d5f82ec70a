"""The hub's lease table: who holds which GPU, never double-booked, restart-safe.

Docker is the ground truth. Every gpulab container carries its user, server and GPU
UUIDs in labels (:mod:`gpulab.spawn.containers`), so the table is rebuilt from the
containers at every allocation: a hub restart, a container that died on its own, a
server removed behind the hub's back are all seen as they are. The only state kept in
memory is the *pending* leases of spawns whose container does not exist yet; they and
the allocation itself sit under one lock, so two concurrent spawns can never take the
same GPU. The decisions are :mod:`gpulab.gpus.allocator`'s pure functions; this module
only does the I/O around them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpulab.contract import LABEL_MANAGED, is_job, label_claims
from gpulab.gpus.allocator import (
    Gpu,
    Lease,
    Request,
    add_leases,
    leases_from_labels,
    reconcile,
    resolve_inventory,
)
from gpulab.gpus.config import GpusConfig
from gpulab.gpus.discovery import discover_gpus

log = logging.getLogger(__name__)

STOPPING = "(a server that is stopping)"  # the holder of a cooling GPU (LeaseBook.cool)

ListContainers = Callable[[], Awaitable[list[dict[str, Any]]]]
ListNodes = Callable[[], Awaitable[list[Gpu]]]
# The leases the lab's own services hold by configuration, given the inventory: the lab
# assistant's GPUs (gpulab.assistant.gpus.assistant_holds). Taken for every spawn, like a
# container's, and shown in the lease table as "for a service", never released there.
ServicesHold = Callable[[Sequence[Gpu]], list[Lease]]


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class LeaseView:
    """One row of the admins' lease table."""

    lease: Lease
    gpu: Gpu | None  # None: the GPU is no longer in the inventory
    # "active", "pending" (container not created yet), "orphaned", or "for a service" (held
    # for a service of the lab's by its configuration: the lab assistant)
    state: str
    # The container whose labels hold the lease: docker's Id and State ("running",
    # "created", "paused", "restarting"); None for a pending lease.
    container_id: str | None = None
    container_state: str | None = None
    job: bool = False  # the server runs a job (contract.LABEL_JOB), not a notebook

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu_uuid": self.lease.gpu_uuid,
            "gpu_index": self.gpu.index if self.gpu else None,
            "model": self.gpu.model if self.gpu else None,
            "pool": self.gpu.pool if self.gpu else None,
            "machine": self.gpu.machine if self.gpu else None,  # "" on one host
            "user": self.lease.user,
            "server": self.lease.server,
            "since": self.lease.since.isoformat() if self.lease.since else None,
            "state": self.state,
            "container_id": self.container_id,
            "container_state": self.container_state,
            "job": self.job,
        }


def lease_containers(containers: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], dict]:
    """(gpu_uuid, user, server) -> the container dict that holds that lease, the first
    in *containers* order, as :func:`leases_from_labels` picks its ``since``."""
    held = {(le.gpu_uuid, le.user, le.server) for le in leases_from_labels(containers)}
    out: dict[tuple[str, str, str], dict] = {}
    for c in containers:
        user, server, gpus = label_claims(c)
        for uuid in gpus:
            if (uuid, user, server) in held:
                out.setdefault((uuid, user, server), c)
    return out


@dataclass(frozen=True)
class Table:
    """The lease table as one spawn sees it under the lock (:meth:`LeaseBook.locked`)."""

    book: LeaseBook
    leases: tuple[Lease, ...]  # containers' (or services'), spawns in flight, the lab's

    def record(self, request: Request, gpus: Sequence[Gpu], taken: Sequence[Lease]) -> None:
        """*request*'s server holds *gpus* from now on (leased against *taken*), until
        its container carries the lease in its labels (:meth:`LeaseBook.settle`)."""
        assert self.book._lock.locked(), "a lease is recorded under the lock it was decided in"
        key = (request.user, request.server)
        self.book._pending[key] = [le for le in add_leases(taken, request, gpus,
                                                           self.book._now())
                                   if (le.user, le.server) == key]


def log_orphans(config: GpusConfig, inventory: Sequence[Gpu], leases: Sequence[Lease]) -> None:
    """Say which leases *config* no longer allows (the lab's services' are named by the
    admin: never orphans); they are released when their servers stop."""
    _, orphaned = reconcile(config, inventory, [le for le in leases if not le.by_configuration])
    for le in orphaned:
        log.warning("Lease of %s by %s/%s is orphaned (GPU no longer available under %s); "
                    "it is released when that server stops",
                    le.gpu_uuid, le.user, le.server or "default", config.filename)


class LeaseBook:
    """*list_containers* lists whatever holds leases in its labels (containers on one
    host, services on a Swarm). *node_gpus*, on a Swarm, lists the GPUs of the usable
    nodes (:func:`gpulab.gpus.swarm_nodes.inventory_from_nodes`); it is asked again before
    every allocation, since machines come and go. Without it, NVML is asked once."""

    def __init__(self, list_containers: ListContainers, discover=discover_gpus, now=utcnow,
                 node_gpus: ListNodes | None = None, for_services: ServicesHold | None = None):
        self._list_containers = list_containers
        self._for_services = for_services
        self._node_gpus = node_gpus
        self._discover = discover
        self._now = now
        self._lock = asyncio.Lock()
        self._pending: dict[tuple[str, str], list[Lease]] = {}
        self._discovered: list | None = None
        # GPUs of removed Swarm services whose containers may still be stopping:
        # uuid -> until when (time.monotonic()); see cool().
        self._cooling: dict[str, float] = {}

    # ------------------------------------------------------------- inventory

    async def current_inventory(self, config: GpusConfig) -> list[Gpu]:
        """:meth:`inventory`, with a Swarm's nodes asked again first."""
        if self._node_gpus is not None:
            self._discovered = await self._node_gpus()
        return self.inventory(config)

    def inventory(self, config: GpusConfig, quiet: bool = False) -> list[Gpu]:
        """The leasable GPUs under *config*; NVML is asked once per hub process (on a
        Swarm: the nodes' GPUs as :meth:`current_inventory` last found them). Its
        warnings are logged unless *quiet*."""
        swarm = self._node_gpus is not None
        if config.auto and not swarm and not self._discovered:
            # An empty answer (NVML not ready, driver loading) is asked again next time.
            self._discovered = self._discover()
            log.info("GPU inventory: %d GPU(s) discovered", len(self._discovered))
        # On a Swarm the nodes are always asked: a GPU the file lists on a machine that
        # is down is not given out. On one host an explicit file is trusted as written.
        found = (self._discovered or []) if config.auto or swarm else None
        gpus, warnings = resolve_inventory(config, found)
        for w in () if quiet else warnings:
            log.warning("%s", w)
        return gpus

    # ------------------------------------------------------------- the table

    async def _table(self, inventory: Sequence[Gpu] = (),
                     containers: list[dict[str, Any]] | None = None) -> list[Lease]:
        if containers is None:
            containers = await self._list_containers()
        leases = leases_from_labels(containers) + self.for_services(inventory)
        for (user, server), pending in self._pending.items():
            leases = [le for le in leases if (le.user, le.server) != (user, server)] + pending
        now = time.monotonic()
        self._cooling = {u: t for u, t in self._cooling.items() if t > now}
        held = {le.gpu_uuid for le in leases}
        leases += [Lease(u, STOPPING, "", self._now()) for u in self._cooling if u not in held]
        return leases

    def for_services(self, inventory: Sequence[Gpu]) -> list[Lease]:
        """The leases the lab's own services hold by configuration, of *inventory*'s GPUs."""
        return self._for_services(inventory) if self._for_services is not None else []

    def cool(self, gpu_uuids: Sequence[str], seconds: float) -> None:
        """Keep *gpu_uuids* busy for *seconds* more: a removed Swarm service's lease is
        gone from the manager at once, while its container on the machine is still being
        stopped (up to the stop grace period) and may hold the GPU's memory. Busy for
        everyone, the same member included; not counted in anyone's quota."""
        until = time.monotonic() + seconds
        for uuid in gpu_uuids:
            self._cooling[uuid] = max(self._cooling.get(uuid, 0.0), until)

    async def view(self, config: GpusConfig) -> list[LeaseView]:
        inventory = await self.current_inventory(config)
        by_uuid = {g.uuid: g for g in inventory}
        async with self._lock:
            containers = await self._list_containers()
            leases = await self._table(inventory, containers)
            pending = {id(le) for group in self._pending.values() for le in group}
        holding = lease_containers(containers)
        _, orphaned = reconcile(config, inventory, leases)
        orphan_ids = {id(le) for le in orphaned}
        rows = []
        for le in leases:
            state = ("pending" if id(le) in pending else
                     "for a service" if le.by_configuration else
                     "orphaned" if id(le) in orphan_ids else "active")
            c = holding.get((le.gpu_uuid, le.user, le.server)) if state != "pending" else None
            rows.append(LeaseView(le, by_uuid.get(le.gpu_uuid), state,
                                  c.get("Id") if c else None,
                                  str(c.get("State", "running")).lower() if c else None,
                                  bool(c) and is_job(c)))
        rows.sort(key=lambda r: ((0, r.gpu.machine, r.gpu.index) if r.gpu else (1, "", 0),
                                 r.lease.user))
        return rows

    # ------------------------------------------------------------- leasing

    @asynccontextmanager
    async def locked(self, inventory: Sequence[Gpu]) -> AsyncIterator[Table]:
        """The table under the lock: read it, decide (pure, no await), record the lease,
        all before the lock goes, so that two spawns never take the same GPU."""
        async with self._lock:
            yield Table(self, tuple(await self._table(inventory)))

    async def snapshot(self, config: GpusConfig) -> tuple[list[Gpu], list[Lease]]:
        """The inventory and every lease held now (containers and spawns in flight), for
        what plans ahead of spawns (the line, :mod:`gpulab.line.plan`)."""
        inventory = await self.current_inventory(config)
        async with self._lock:
            return inventory, await self._table(inventory)

    def settle(self, user: str, server: str = "") -> None:
        """The spawn's container exists now (its labels hold the lease), or the spawn
        failed and nothing holds it: either way, drop the in-memory pending lease."""
        self._pending.pop((user, server), None)

def docker_client():
    """The one way gpulab's hub-side code talks to Docker: the engine DOCKER_HOST names
    (in the hub's container, the Docker proxy), the API version it speaks."""
    import docker

    return docker.APIClient(version="auto", **docker.utils.kwargs_from_env())


def docker_lister(client=None) -> ListContainers:
    """List gpulab's containers (any state) through the Docker API, off the event loop."""
    client = client or docker_client()

    async def list_containers() -> list[dict[str, Any]]:
        return await asyncio.to_thread(
            client.containers, all=True, filters={"label": f"{LABEL_MANAGED}=true"}
        )

    return list_containers


_book: LeaseBook | None = None
_services: ServicesHold | None = None


def hold_for_services(held: ServicesHold | None) -> None:
    """What the hub process's lease tables count as held by the lab's own services (the
    hub's configuration sets it: the lab assistant's GPUs)."""
    global _services
    _services = held


def _held_for_services(inventory: Sequence[Gpu]) -> list[Lease]:
    return _services(inventory) if _services is not None else []


def lease_book() -> LeaseBook:
    """The hub process's one lease table (created on first use)."""
    global _book
    if _book is None:
        _book = LeaseBook(docker_lister(), for_services=_held_for_services)
    return _book


def swarm_listers(client=None) -> tuple[ListContainers, ListNodes]:
    """On a Swarm (through the Docker proxy in front of the manager): members' services
    as lease holders, and the GPUs of the usable nodes, off the event loop."""
    from gpulab.gpus.swarm_nodes import inventory_from_nodes, lease_holder

    client = client or docker_client()

    async def list_services() -> list[dict[str, Any]]:
        services = await asyncio.to_thread(
            client.services, filters={"label": f"{LABEL_MANAGED}=true"})
        return [lease_holder(s) for s in services]

    async def node_gpus() -> list[Gpu]:
        return inventory_from_nodes(await asyncio.to_thread(client.nodes))

    return list_services, node_gpus


_swarm_book: LeaseBook | None = None


def swarm_lease_book() -> LeaseBook:
    """The hub process's one lease table on a Swarm (created on first use)."""
    global _swarm_book
    if _swarm_book is None:
        list_services, node_gpus = swarm_listers()
        _swarm_book = LeaseBook(list_services, node_gpus=node_gpus,
                                for_services=_held_for_services)
    return _swarm_book
