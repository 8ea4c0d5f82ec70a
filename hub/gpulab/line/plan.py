"""Who in line gets GPUs now, and which free GPUs are kept for whom: pure functions.

Walking the line in its order (:mod:`gpulab.line.order`: first come, first served, or
fair share), each entry gets what :func:`gpulab.gpus.allocator.allocate` would give her
now, counting the leases held and the GPUs given to those before her. An entry that
cannot be served yet keeps every free GPU she could use: nobody behind her takes it (a
member waiting for 2 GPUs is not overtaken, one freed GPU at a time, by members asking
for 1). Members whose pools or pins she cannot use pass her by.

An entry the line has already started a server for (*offered*) keeps its GPUs, through
its pending lease or its container's, until it is claimed or its claim window ends.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gpulab.gpus.allocator import (
    AllocationError,
    Gpu,
    Lease,
    NotEnoughGpus,
    Request,
    add_leases,
    allocate,
    on_machine,
    usable_gpus,
)
from gpulab.gpus.config import GpusConfig
from gpulab.line.order import Entry, ranked
from gpulab.line.usage import Usage

__all__ = ["HELD", "OFFERED", "READY", "REFUSED", "WAITING", "Entry", "Place", "holds",
           "keeps", "never_fits", "plan"]

READY = "ready"  # GPUs are free for her now: the line service starts her server
WAITING = "waiting"  # not enough GPUs yet; the free ones she could use are kept for her
REFUSED = "refused"  # her request can no longer be met (quota, access): she leaves the line
OFFERED = "offered"  # the line started her server; its claim window runs

HELD = "(kept for a member waiting in line)"  # the holder of a GPU kept for a waiting entry

_EPOCH = datetime.fromtimestamp(0, UTC)


@dataclass(frozen=True)
class Place:
    entry: Entry
    state: str  # READY, WAITING, REFUSED or OFFERED
    position: int  # 1 = next; counts the entries still waiting or ready (0 when OFFERED)
    gpus: tuple[Gpu, ...] = ()  # READY/OFFERED: hers; WAITING: the free ones kept for her
    reason: str = ""  # REFUSED: why, for her


def plan(config: GpusConfig, inventory: Sequence[Gpu], leases: Sequence[Lease],
         entries: Iterable[Entry], usage: Usage | None = None) -> list[Place]:
    """Every entry's place, in line order (:mod:`gpulab.line.order`, with members'
    recent GPU-hours *usage* under fair share). *leases* are the leases held now
    (containers and spawns in flight)."""
    work = list(leases)
    places: list[Place] = []
    position = 0
    for e in ranked(entries, config, usage):
        request = e.request()
        offered = e.offered_at is not None
        if request.machine and not on_machine(inventory, request.machine):
            # the machine with her home is down, drained or gone for now: she waits
            if offered:
                places.append(Place(e, OFFERED, 0))
            else:
                position += 1
                places.append(Place(e, WAITING, position))
            continue
        try:
            too_many = never_fits(config, inventory, request)
            if too_many:
                raise AllocationError(too_many)
            gpus = allocate(config, inventory, work, request)
        except NotEnoughGpus:
            if offered:  # her server stopped or failed: nothing to keep
                places.append(Place(e, OFFERED, 0))
                continue
            kept = _free(work, usable_gpus(config, inventory, request))
            work += [Lease(g.uuid, HELD, "", _EPOCH) for g in kept]
            position += 1
            places.append(Place(e, WAITING, position, tuple(kept)))
        except AllocationError as err:
            places.append(Place(e, OFFERED if offered else REFUSED, 0, reason=err.message))
        else:
            work = add_leases(work, request, gpus, _EPOCH)
            if offered:
                places.append(Place(e, OFFERED, 0, tuple(gpus)))
            else:
                position += 1
                places.append(Place(e, READY, position, tuple(gpus)))
    return places


def never_fits(config: GpusConfig, inventory: Sequence[Gpu], request: Request) -> str:
    """Why *request* could never be served however long it waited (more GPUs than any
    one machine has for her), or "" when it could."""
    per_machine = Counter(g.node for g in usable_gpus(config, inventory, request))
    most = max(per_machine.values(), default=0)
    if (request.count or 0) <= most:
        return ""
    return (f"You asked for {request.count} GPUs, but "
            + ("no GPU is available to you" if not most else
               f"at most {most} {'is' if most == 1 else 'are'} available to you"
               + (" on any one machine" if len(per_machine) > 1 else ""))
            + ", however long you wait. Ask for fewer.")


def _free(leases: Sequence[Lease], usable: Sequence[Gpu]) -> list[Gpu]:
    load = Counter(le.gpu_uuid for le in leases)
    return [g for g in usable if load[g.uuid] < g.capacity]


def holds(places: Iterable[Place], leases: Sequence[Lease],
          spawning: tuple[str, str] | None = None) -> list[Lease]:
    """The GPUs the line keeps, as leases that a spawn must count as taken: those of the
    entries whose turn it is, and the free GPUs kept for those still waiting. A spawn of
    *spawning* (user, server) does not count its own entry's. GPUs an entry already
    holds through *leases* (its server's container, its spawn in flight) are not
    counted twice."""
    held = {(le.gpu_uuid, le.user, le.server) for le in leases}
    out: list[Lease] = []
    for p in places:
        if p.entry.key == spawning or p.state == REFUSED:
            continue
        if p.state == WAITING:
            out += [Lease(g.uuid, HELD, "", _EPOCH) for g in p.gpus]
        else:
            out += [Lease(g.uuid, p.entry.user, p.entry.server, _EPOCH) for g in p.gpus
                    if (g.uuid, p.entry.user, p.entry.server) not in held]
    return out


def keeps(config: GpusConfig, inventory: Sequence[Gpu], leases: Sequence[Lease],
          entries: Sequence[Entry], usage: Usage | None = None,
          spawning: tuple[str, str] | None = None) -> list[Lease]:
    """The GPUs the line of *entries* keeps, given the leases held now: those of members
    whose turn it is, and the free ones kept for members still waiting (as leases; not
    those of *spawning*'s own entry)."""
    if not entries:
        return []
    return holds(plan(config, inventory, leases, entries, usage), leases, spawning=spawning)
