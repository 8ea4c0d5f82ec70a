"""When a member's turn in line is expected: pure functions.

It starts from when each GPU held now is expected back, which is the GPU culler's
knowledge (:func:`gpulab.culler.decide.releases`): a server's ``max_server_age`` gives
a time at the latest; a server whose GPUs are idle now gives one only if they stay
idle. GPUs whose holders no clock runs for give no estimate (a lab without
``max_server_age`` and a busy GPU: nobody knows).

Walking the line in order, each member waiting takes the GPUs she could use that come
back first (all on one machine); those before her who are being served, and she herself,
then hold theirs until their own ``max_server_age`` (if they have one; else nobody knows
when they come back). Her estimate is when the last of hers comes back.

Bookings count too: a server holding a GPU that another member booked is stopped when
the booking starts (the GPU culler's), and a booking of someone else keeps its GPUs from
her while it runs, so a GPU that would come back during one (or is free now while one
runs) comes back for her at its end (kind BOOKING).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpulab.bookings.book import BOOKED, Booking
from gpulab.gpus.allocator import Gpu, Lease, usable_gpus
from gpulab.gpus.config import GpusConfig
from gpulab.gpus.policy import policy_for
from gpulab.line.plan import HELD, OFFERED, READY, WAITING, Place

AGE, IDLE = "age", "idle"  # the culler's clocks (gpulab.culler.decide)
BOOKING = "booking"  # when a booking of the GPUs starts (its holder stopped) or ends


@dataclass(frozen=True)
class Estimate:
    at: float | None  # epoch seconds; None: no estimate
    # AGE: at the latest; IDLE: if the GPUs' holders stay idle; BOOKING: as a booking of
    # them starts or ends; "": now
    kind: str = ""


def estimates(config: GpusConfig, inventory: Sequence[Gpu], leases: Sequence[Lease],
              places: Iterable[Place], releases: Mapping[str, tuple[float, str]],
              now: float, bookings: Sequence[Booking] = ()) -> dict[int, Estimate]:
    """Each waiting entry's estimate, by entry id. *leases* are the servers' leases held
    now (not the line's or the bookings' holds: *bookings* are counted with their times);
    *places* are :func:`gpulab.line.plan.plan`'s, in line order."""
    servers = [le for le in leases if le.user not in (HELD, BOOKED)]
    load = Counter(le.gpu_uuid for le in servers)
    ahead = sorted((b for b in bookings if b.end > now), key=lambda b: (b.start, b.id))
    free_at: dict[str, tuple[float, str] | None] = {
        g.uuid: (now, "") if load[g.uuid] < g.capacity else
        stopped_for_booking(g.uuid, {le.user for le in servers if le.gpu_uuid == g.uuid},
                            releases.get(g.uuid), ahead, now)
        for g in inventory}
    out: dict[int, Estimate] = {}

    def after_bookings(uuid: str, user: str, back: tuple[float, str]) -> tuple[float, str]:
        """When a GPU back at *back* is *user*'s to take: after the bookings of others
        that hold it then."""
        t, kind = back
        for b in ahead:
            if b.user != user and uuid in b.gpus and b.start <= t < b.end:
                t, kind = b.end, BOOKING
        return t, kind

    def taken(entry, gpus: Iterable[Gpu], since: float) -> None:
        """*entry*'s server holds *gpus* from *since*: back after her max_server_age, if
        she has one; else nobody knows when."""
        age = policy_for(config, entry.user, entry.groups).max_server_age
        for g in gpus:
            free_at[g.uuid] = (since + age, AGE) if age else None

    for p in places:
        if p.state in (READY, OFFERED):
            taken(p.entry, p.gpus, p.entry.offered_at or now)
            continue
        if p.state != WAITING:
            continue
        e = p.entry
        usable = usable_gpus(config, inventory, e.request())
        best: tuple[float, str, list[Gpu]] | None = None
        for node in dict.fromkeys(g.node for g in usable):
            known = sorted(((after_bookings(g.uuid, e.user, free_at[g.uuid]), g)
                            for g in usable
                            if g.node == node and free_at.get(g.uuid) is not None),
                           key=lambda t: (t[0][0], t[1].index))
            if len(known) < e.gpus:
                continue
            chosen = known[:e.gpus]
            at = max((t for (t, _), _ in chosen), default=now)
            # what the time is (the last GPU's reason), and "if idle" if any is idle
            kinds = {kind for (_, kind), _ in chosen}
            kind = IDLE if IDLE in kinds else max(
                (k for (t, k), _ in chosen if t == at), key=(AGE, BOOKING, "").index,
                default="")
            if best is None or at < best[0]:
                best = (at, kind, [g for _, g in chosen])
        if best is None:
            out[e.id] = Estimate(None)
            continue
        out[e.id] = Estimate(best[0], best[1])
        taken(e, best[2], best[0])
    return out


def stopped_for_booking(uuid: str, holders: set[str], release: tuple[float, str] | None,
                        ahead: Sequence[Booking], now: float) -> tuple[float, str] | None:
    """When a GPU held now by *holders* comes back: at its *release* (the culler's), or
    when a booking of someone else starts before it, as the culler stops them then."""
    starts = [b.start for b in ahead if uuid in b.gpus and b.start > now
              and not holders & {b.user}]
    if starts and (release is None or min(starts) < release[0]):
        return min(starts), BOOKING
    return release
