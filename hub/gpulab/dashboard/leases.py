"""The admins' lease page: who holds which GPU since when, and releasing a stuck lease.

The table is the hub's own (:class:`gpulab.gpus.leases.LeaseBook` over the containers'
labels, read here through the same Docker socket), with two limits: leases still
*pending* in the hub process (a spawn whose container does not exist yet) are not
visible to this service, and gpus.yaml is read through :mod:`gpulab.live_config`
in this process, so a refused edit shows here as it does in the hub.

A lease is *stuck* when the hub no longer runs the server that holds it (the
container survived a crash, a failed spawn or a manual ``docker start``) or when its
container is not running. Releasing it removes the container, which is what frees a
lease (the labels are the lease). :func:`release_decision` is the rule, pure;
:class:`LeaseAdmin` does the I/O around it.

    ContainerStore     list / remove gpulab containers (DockerContainers: docker-py;
                       SwarmServices: members' services on a Swarm)
    server_active      "is this server active?", asked of the hub's REST API
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpulab import live_config
from gpulab.assistant.gpus import ASSISTANT, assistant_holds
from gpulab.contract import label_claims
from gpulab.gpus.allocator import Gpu, Lease
from gpulab.gpus.config import GpusConfig
from gpulab.gpus.leases import (
    LeaseBook,
    LeaseView,
    docker_client,
    docker_lister,
    swarm_listers,
)
from gpulab.hubapi import HubApi, HubApiError, user_path
from gpulab.line.plan import HELD
from gpulab.line.spawning import kept as kept_by_line
from gpulab.line.store import line_store
from gpulab.refusal import Refusal
from gpulab.settings import ConfigError

log = logging.getLogger("gpulab.dashboard")

# The scope the service's own token needs for server_active (GET /hub/api/users/NAME).
HUB_SCOPE = "read:servers"

# Docker states in which a container may be removed whatever the hub says: it runs
# nothing (a dead spawn, or one the hub already lost track of).
NOT_RUNNING = frozenset({"exited", "dead"})


# -- pure ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReleaseDecision:
    remove: bool
    why: str


def release_decision(container_state: str, hub_active: bool,
                     holder: str = "container") -> ReleaseDecision:
    """Whether to remove one container of the server whose lease an admin releases.

    *hub_active*: the hub lists that server as running or starting/stopping. Then only
    a container that runs nothing (exited, dead) is removed; anything else would pull
    a server from under the hub (or a spawn in progress: its container is ``created``),
    so the admin must stop the server through the hub instead. When the hub does not
    list the server, its container holds the GPU for nobody: removed in any state.
    """
    state = (container_state or "running").lower()
    if not hub_active:
        return ReleaseDecision(True, f"the hub does not run this server; {holder} {state}")
    if state in NOT_RUNNING:
        return ReleaseDecision(True, f"{holder} {state}")
    return ReleaseDecision(False, f"the hub runs this server; {holder} {state}")


def server_containers(containers: Sequence[dict[str, Any]], gpu_uuid: str, user: str,
                      server: str) -> list[dict[str, Any]]:
    """The gpulab containers of *user*'s *server* whose labels hold *gpu_uuid* (in any
    state: an exited one is removed too, so that it cannot come back with the GPU)."""
    return [c for c in containers
            if (claims := label_claims(c))[:2] == (user, server) and gpu_uuid in claims[2]]


def container_name(c: dict[str, Any]) -> str:
    names = c.get("Names") or []
    return names[0].lstrip("/") if names else str(c.get("Id", ""))[:12]


def lease_row(row: LeaseView, now: datetime) -> dict[str, Any]:
    """One lease as the page and the API show it: :meth:`LeaseView.to_json` plus how
    long it has been held (``held_seconds``) and whether it may be released from here."""
    out = row.to_json()
    since = row.lease.since
    out["held_seconds"] = max(0, int((now - since).total_seconds())) if since else None
    out["releasable"] = row.state not in ("pending", "for a service")
    return out


def inventory_rows(inventory: Sequence[Gpu], rows: Sequence[LeaseView],
                   kept: Sequence[Lease] = ()) -> list[dict[str, Any]]:
    """Every leasable GPU with its capacity, leases held and free slots, and whom the
    line keeps it for (*kept*: :func:`gpulab.line.plan.holds`)."""
    out = []
    for g in inventory:
        holders = [r.lease for r in rows if r.lease.gpu_uuid == g.uuid]
        keeps = [le for le in kept if le.gpu_uuid == g.uuid]
        out.append({
            "index": g.index, "uuid": g.uuid, "model": g.model, "pool": g.pool,
            "machine": g.machine,
            "mode": g.mode, "reserved": g.reserved, "capacity": g.capacity,
            "held": len(holders), "free": max(0, g.capacity - len(holders) - len(keeps)),
            "holders": [f"{le.user}/{le.server}" if le.server else le.user for le in holders],
            "kept_for": [kept_for(le) for le in keeps],
        })
    return out


def kept_for(lease: Lease) -> str:
    """Whom the line keeps a GPU for, in words."""
    if lease.user == HELD:
        return "a member waiting in line (for more GPUs than are free)"
    who = f"{lease.user}/{lease.server}" if lease.server else lease.user
    return f"{who}, whose turn in line it is"


def lease_model(rows: Sequence[LeaseView], inventory: Sequence[Gpu],
                config_errors: Sequence[str], now: datetime,
                holder: str = "container", kept: Sequence[Lease] = ()) -> dict[str, Any]:
    """The whole page / ``api/leases`` model, plain JSON types. *holder*: what holds a
    lease, and what a release removes ("container"; on a Swarm, "service"). *kept*: the
    GPUs the line keeps for members waiting (they are free for nobody else)."""
    gpus = inventory_rows(inventory, rows, kept)
    held = sum(1 for g in gpus if g["held"])
    return {
        "timestamp": now.timestamp(),
        "holder": holder,
        "leases": [lease_row(r, now) for r in rows],
        "gpus": gpus,
        "summary": {"gpus": len(gpus), "held": held, "leases": len(rows),
                    "orphaned": sum(1 for r in rows if r.state == "orphaned"),
                    "text": f"{len(rows)} lease{'' if len(rows) == 1 else 's'} on "
                            f"{held} of {len(gpus)} GPU{'' if len(gpus) == 1 else 's'}"},
        "config_errors": list(config_errors),
    }


# -- I/O -------------------------------------------------------------------------------
class ContainerStore:
    """gpulab's containers: ``list()`` returns docker's ``containers(all=True)`` dicts
    (``Id``, ``Names``, ``Labels``, ``State``, ``Created``); ``remove(id)`` removes one,
    stopping it first, and succeeds if it is already gone."""

    async def list(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def remove(self, container_id: str) -> None:
        raise NotImplementedError


class DockerContainers(ContainerStore):
    """Through docker-py (DOCKER_HOST or the socket). The client is made on first use,
    so the service starts, and its GPU page works, while Docker is unreachable."""

    def __init__(self, client=None):
        self._client = client
        self._list = None

    @property
    def client(self):
        if self._client is None:
            self._client = docker_client()
        return self._client

    async def list(self) -> list[dict[str, Any]]:
        if self._list is None:
            self._list = docker_lister(await asyncio.to_thread(lambda: self.client))
        return await self._list()

    async def remove(self, container_id: str) -> None:
        from docker.errors import APIError

        client = await asyncio.to_thread(lambda: self.client)
        try:
            await asyncio.to_thread(client.remove_container, container_id, force=True)
        except APIError as e:
            if e.status_code == 404:  # gone already: released
                return
            if e.status_code == 409:  # removal already in progress
                log.info("container %s is already being removed", container_id[:12])
                return
            raise


class SwarmServices(ContainerStore):
    """On a Swarm: members' services hold the leases (through the Docker proxy in front
    of the manager). ``list()`` gives each in a container's shape
    (:func:`gpulab.gpus.swarm_nodes.lease_holder`); ``remove(id)``
    removes the service, which stops its server on whatever machine it runs."""

    holder = "service"

    def __init__(self, client=None):
        self._client = client
        self._listers = None

    @property
    def client(self):
        if self._client is None:
            self._client = docker_client()
        return self._client

    async def _lister(self, which: int):
        if self._listers is None:
            self._listers = swarm_listers(await asyncio.to_thread(lambda: self.client))
        return self._listers[which]

    async def list(self) -> list[dict[str, Any]]:
        return await (await self._lister(0))()

    async def remove(self, container_id: str) -> None:
        from docker.errors import APIError

        client = await asyncio.to_thread(lambda: self.client)
        try:
            await asyncio.to_thread(client.remove_service, container_id)
        except APIError as e:
            if e.status_code == 404:  # gone already: released
                return
            raise

    async def node_gpus(self) -> list[Gpu]:
        """The GPUs the Swarm's usable machines list (their engine labels)."""
        return await (await self._lister(1))()


class HubUnavailable(Exception):
    """The hub's API could not say whether a server runs; ``str(e)`` says why."""


async def server_active(hub: HubApi, user: str, server: str) -> bool:
    """True when the hub lists *user*'s *server* ("" = default) as running, starting or
    stopping; False when it does not (or does not know the user). Asked with the
    service's own token (scope ``read:servers``)."""
    try:
        model = await hub.user(user)
    except HubApiError as e:
        if e.status == 403:
            raise HubUnavailable(
                f"the hub refused GET {e.url} (403: {e.message}): the service "
                f"'gpus' needs its JUPYTERHUB_API_TOKEN and the scope {HUB_SCOPE} "
                f"(load_roles in hubconfig)") from e
        if e.status:
            raise HubUnavailable(f"GET {e.url} answered {e.status}") from e
        raise HubUnavailable(f"GET {e.url} failed: {e.message}") from e
    if model is None:
        return False
    servers = model.get("servers")
    if servers is None:
        raise HubUnavailable(f"GET {hub.url}{user_path(user)} listed no 'servers': the "
                             f"service 'gpus' needs the scope {HUB_SCOPE}")
    return server in servers


class ReleaseRefused(Refusal):
    """An admin's release that is not done; ``status`` is the HTTP answer."""


def default_gpus_path(environ: Mapping[str, str] | None = None) -> Path:
    """gpus.yaml under GPULAB_CONFIG_DIR (the hub container's /srv/gpulab/config)."""
    env = os.environ if environ is None else environ
    return Path(env.get("GPULAB_CONFIG_DIR", "/srv/gpulab/config")) / "gpus.yaml"


def default_settings_path(environ: Mapping[str, str] | None = None) -> Path:
    """gpulab.yaml under GPULAB_CONFIG_DIR, next to gpus.yaml."""
    return default_gpus_path(environ).with_name("gpulab.yaml")


class LeaseAdmin:
    """The lease table and the release action, over a container store and the hub."""

    def __init__(self, store: ContainerStore, hub: HubApi, gpus_path: str | Path,
                 book: LeaseBook | None = None, now=lambda: datetime.now(UTC),
                 settings_path: str | Path | None = None,
                 line_path: str | Path | None = None):
        self.store = store
        self.line_path = str(line_path) if line_path else None  # the line's store
        self.hub = hub
        self.gpus_path = str(gpus_path)
        # gpulab.yaml: read only to report an invalid edit, as the hub's log does
        self.settings_path = str(settings_path) if settings_path else None
        if book is None:
            # the lab assistant's GPUs, as the hub holds them (gpulab.yaml)
            held = assistant_holds(self.settings_path) if self.settings_path else None
            book = (LeaseBook(store.list, node_gpus=store.node_gpus, for_services=held)
                    if isinstance(store, SwarmServices) else
                    LeaseBook(store.list, for_services=held))
        self.book = book
        self.holder = getattr(store, "holder", "container")
        self.now = now

    def config(self) -> tuple[GpusConfig, list[str]]:
        """gpus.yaml as the hub uses it (the last good version), and the errors of the
        edits of gpus.yaml and gpulab.yaml being ignored. A file that never validated in
        this process gives its error (and, for gpus.yaml, the defaults)."""
        never = []
        if self.settings_path:
            try:
                live_config.settings_file.load(self.settings_path)
            except ConfigError as e:
                never.append(f"{e} (no valid version was read yet)")
        try:
            config = live_config.gpus_file.load(self.gpus_path)
        except ConfigError as e:
            return GpusConfig(filename=self.gpus_path), [
                f"{e} (no valid version was read yet: GPUs shown with the defaults)", *never]
        return config, live_config.current_errors() + never

    async def model(self) -> dict[str, Any]:
        config, errors = self.config()
        rows = await self.book.view(config)
        inventory = self.book.inventory(config)
        return lease_model(rows, inventory, errors, self.now(), self.holder,
                           self.kept(config, inventory, [r.lease for r in rows]))

    def kept(self, config: GpusConfig, inventory: Sequence[Gpu],
             leases: Sequence[Lease]) -> list[Lease]:
        """The GPUs the line keeps for members waiting, as the hub's spawner counts them
        (from the line's store, which this service reads beside the hub)."""
        if not self.line_path:
            return []
        return kept_by_line(line_store(self.line_path), config, inventory, leases)

    async def release(self, gpu_uuid: str, user: str, server: str, admin: str) -> list[str]:
        """Remove the containers holding *gpu_uuid* for *user*/*server* if the lease is
        stuck; the removed containers' names, or :class:`ReleaseRefused`."""
        who = f"{user}/{server}" if server else user
        if user == ASSISTANT:
            raise ReleaseRefused(409, (
                f"Not released: GPU {gpu_uuid} is held for the lab assistant by gpulab.yaml's "
                f"assistant.gpus. Take it out of that list: the hub lets it go within "
                f"seconds, and the next `make up` takes it from the assistant's container."))
        found = server_containers(await self.store.list(), gpu_uuid, user, server)
        if not found:
            raise ReleaseRefused(404, f"No gpulab {self.holder} of {who} holds GPU {gpu_uuid}: "
                                      f"the lease is already released.")
        try:
            active = await server_active(self.hub, user, server)
        except HubUnavailable as e:
            raise ReleaseRefused(503, f"Nothing removed: cannot ask the hub whether {who} "
                                      f"runs ({e}).") from e
        decisions = [(c, release_decision(str(c.get("State", "running")), active, self.holder))
                     for c in found]
        refused = [(c, d) for c, d in decisions if not d.remove]
        if refused:
            c, d = refused[0]
            raise ReleaseRefused(409, (
                f"Not released: {d.why} ({container_name(c)}). Stop the server {who} from "
                f"the hub's admin page (/hub/admin) instead; that releases its GPUs."))
        removed = []
        for c, d in decisions:
            await self.store.remove(c["Id"])
            removed.append(container_name(c))
            log.warning("admin %s released GPU %s of %s: removed %s %s (%s)",
                        admin, gpu_uuid, who, self.holder, container_name(c), d.why)
        return removed
