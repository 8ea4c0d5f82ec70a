"""Bookings: pure decisions (no I/O).

A booking gives one member N GPUs for a time window. It names its GPUs when it is made
(:func:`choose`), so the hub, the line and the GPU culler all know which GPUs it keeps:

* while it runs, its GPUs are kept for her: anyone else's spawn, and the line, find them
  taken (:func:`holds`); her own spawn prefers them;
* a server of anyone else that holds one of them when it starts gets the GPU culler's
  warning ``culling.warn_before`` ahead and is stopped at its start
  (:func:`first_booked`, :mod:`gpulab.culler.decide`).

:func:`choose` refuses, with the reason, a booking that the lab cannot honour: a window
in the past, longer than ``bookings.max_length`` or further ahead than
``bookings.max_ahead``, more GPUs than she may have, overlapping one of her own, more
GPUs than are usable by her and not booked by others then (pools, reserved and pinned
GPUs as for a spawn, a server's GPUs on one machine), or over her hard budget in the
week or month it starts in (:func:`over_budget`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gpulab.gpus.allocator import Gpu, Lease, Request, usable_gpus
from gpulab.gpus.budget import period_start
from gpulab.gpus.config import HARD, Budget, GpusConfig
from gpulab.gpus.policy import policy_for
from gpulab.refusal import Refusal
from gpulab.settings import duration_text

__all__ = ["BOOKED", "Booked", "Booking", "BookingRefused", "choose", "first_booked",
           "holds", "overlapping", "upcoming", "when"]

BOOKED = "(booked by a member)"  # the holder of a GPU kept for a booking, for others
# A start this far in the past still counts as "now" (a form filled in a minute ago).
GRACE = 60


@dataclass(frozen=True)
class Booking:
    id: int
    user: str
    gpus: tuple[str, ...]  # UUIDs, chosen when it was made
    start: float  # epoch seconds
    end: float
    made_by: str = ""  # who made it (herself or an admin)
    made_at: float = 0.0

    def runs_at(self, t: float) -> bool:
        return self.start <= t < self.end

    def overlaps(self, start: float, end: float) -> bool:
        return self.start < end and start < self.end


class BookingRefused(Refusal):
    """A booking that is not made; ``str(e)`` says why, for her."""


def when(t: float) -> str:
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (OverflowError, ValueError, OSError):  # a time Python cannot print in UTC
        return f"{t:.0f} s after 1970"


def overlapping(bookings: Iterable[Booking], start: float, end: float) -> list[Booking]:
    return [b for b in bookings if b.overlaps(start, end)]


def choose(config: GpusConfig, inventory: Sequence[Gpu], bookings: Sequence[Booking],
           user: str, groups: Sequence[str], count: object, start: float, end: float,
           now: float, used: float | None = None, leases: Sequence[Lease] = (),
           machine: str = "", sharing: Collection[str] = ()) -> list[Gpu]:
    """The GPUs a new booking of *count* GPUs from *start* to *end* takes, or
    :class:`BookingRefused`. *used*: the GPU-hours counted against her budget this period
    so far (None: not known, counted as none); *sharing*: the members whose bookings
    count against it with hers (a group's shared budget). Among the GPUs free then,
    those nobody holds now (*leases*) come first, so that a booking stops nobody's
    server where it need not.
    *machine*: the node her servers must run on (a Swarm with homes on one machine), or
    "" for any."""
    limits = config.bookings
    if not limits.max_length:
        raise BookingRefused(403, f"This lab takes no bookings (bookings.max_length is 0 "
                                  f"in {config.filename}).")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise BookingRefused(400, f"\"gpus\" must be a whole number of GPUs, 1 or more, "
                                  f"got {count!r}.")
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise BookingRefused(400, "A booking must end after it starts.")
    if start < now - GRACE:
        raise BookingRefused(400, f"A booking cannot start in the past ({when(start)}).")
    if end - start > limits.max_length:
        raise BookingRefused(400, f"A booking may last at most "
                                  f"{duration_text(limits.max_length)}; this one lasts "
                                  f"{duration_text(int(end - start))}.")
    if start > now + limits.max_ahead:
        raise BookingRefused(400, f"A booking may start at most "
                                  f"{duration_text(limits.max_ahead)} ahead ({when(start)} "
                                  f"is further).")
    policy = policy_for(config, user, groups)
    if policy.no_gpu:
        raise BookingRefused(403, f"Your account has no GPU access, so it cannot book "
                                  f"GPUs; ask an admin ({config.filename}).")
    most = min(policy.max_gpus, limits.max_gpus or policy.max_gpus)
    if count > most:
        raise BookingRefused(403, f"You may book at most {most} GPU{'s' * (most != 1)} "
                                  f"at a time; you asked for {count}.")
    mine = [b for b in overlapping(bookings, start, end) if b.user == user]
    if mine:
        b = mine[0]
        raise BookingRefused(409, f"You have a booking from {when(b.start)} to "
                                  f"{when(b.end)} already, which overlaps this one; change "
                                  f"or cancel that one instead.")
    if policy.budget is not None and policy.budget.enforce == HARD:
        over_budget(policy.budget, bookings, user, count, start, end, now, used, sharing)
    usable = usable_gpus(config, inventory, Request(user, "", tuple(groups), count, machine))
    taken = {u for b in overlapping(bookings, start, end) for u in b.gpus}
    free = [g for g in usable if g.uuid not in taken]
    per_machine = Counter(g.node for g in free)
    machine = max(per_machine, key=lambda n: per_machine[n], default="")
    if per_machine[machine] < count:
        booked = len([g for g in usable if g.uuid in taken])
        raise BookingRefused(409, f"Not enough GPUs for that time: you asked for {count}; "
                                  f"of the {len(usable)} GPUs you may use, {booked} "
                                  f"{'is' if booked == 1 else 'are'} booked then"
                                  + (" (and a server's GPUs must be on one machine)"
                                     if len(per_machine) > 1 else "")
                                  + ". The lab's calendar shows when GPUs are free.")
    held = {le.gpu_uuid for le in leases}
    here = [g for g in free if g.node == machine]
    return sorted(here, key=lambda g: (g.uuid in held, g.index))[:count]


def over_budget(budget: Budget, bookings: Sequence[Booking], user: str, count: int,
                start: float, end: float, now: float, used: float | None,
                sharing: Collection[str] = ()) -> None:
    """:class:`BookingRefused` when a booking of *count* GPUs from *start* to *end* would
    take her past her hard *budget* in the week or month it starts in: what was used of
    it (*used*, this period's; None: not known, counted as 0) if that is this period, her
    other bookings' hours still to come in it (and those of the members *sharing* it),
    and this one's."""
    period = period_start(start, budget.per)
    spent = (used or 0.0) if period == period_start(now, budget.per) else 0.0
    who = {user, *sharing}
    booked = sum(len(b.gpus) * (b.end - max(b.start, now)) / 3600 for b in bookings
                 if b.user in who and b.end > now
                 and period_start(max(b.start, now), budget.per) == period)
    hours = count * (end - start) / 3600
    if spent + booked + hours > budget.gpu_hours:
        which = "this" if period == period_start(now, budget.per) else "that"
        whose = f"your group {budget.shared_by}'s" if budget.shared_by else "your"
        raise BookingRefused(403, f"This booking is {hours:.1f} GPU-hours; with {spent:.1f} "
                                  f"used and {booked:.1f} booked in {which} {budget.per} "
                                  f"(from {when(period)}), it is over {whose} budget of "
                                  f"{budget.gpu_hours:g} GPU-hours per {budget.per}.")


def holds(bookings: Iterable[Booking], now: float, user: str = "", server: str = "",
          capacity: Mapping[str, int] | None = None,
          waiting: Mapping[str, str] | None = None) -> list[Lease]:
    """The GPUs of the bookings running at *now*, as leases that a spawn of *user*'s
    *server* (or the line's plan) counts. A booked GPU is kept whole: another member's
    fill it (*capacity*: a shared GPU's users, by UUID; 1 if not given), holder
    :data:`BOOKED`; the booker's own are a lease of the server she is starting (for the
    line, *waiting*: each member in line and the server she waits with), which the
    allocator gives her first, and fill the rest."""
    since = datetime.fromtimestamp(now, UTC)
    own = dict(waiting or {})
    if user:
        own[user] = server
    out = []
    for b in bookings:
        if not b.runs_at(now):
            continue
        for uuid in b.gpus:
            slots = (capacity or {}).get(uuid, 1)
            if b.user in own:
                out.append(Lease(uuid, b.user, own[b.user], since))
                slots -= 1
            out += [Lease(uuid, BOOKED, "", since)] * slots
    return out


@dataclass(frozen=True)
class Booked:
    """The first booking of someone else on a server's GPUs (for the GPU culler)."""

    start: float
    gpus: int  # how many of the server's GPUs it takes
    booking: Booking


def upcoming(bookings: Iterable[Booking], user: str, now: float
             ) -> tuple[tuple[str, float], ...]:
    """For a spawn of *user* at *now*: each GPU that a booking of someone else takes
    later, with the seconds until the first such booking starts (``Request.booked_from``:
    the allocator gives her the GPUs nobody booked first, then those booked latest, so
    that a server is not started only to be stopped for a booking)."""
    first: dict[str, float] = {}
    for b in bookings:
        if b.user != user and b.start > now:
            for uuid in b.gpus:
                first[uuid] = min(first.get(uuid, b.start - now), b.start - now)
    return tuple(sorted(first.items()))


def first_booked(bookings: Iterable[Booking], user: str, gpus: Iterable[str],
                 now: float) -> Booked | None:
    """The earliest booking not yet ended, of a member other than *user*, that takes
    one of the GPUs *gpus* (a server's); None when there is none."""
    mine = set(gpus)
    found = [b for b in bookings if b.user != user and b.end > now and mine & set(b.gpus)]
    if not found:
        return None
    first = min(found, key=lambda b: (b.start, b.id))
    return Booked(first.start, len(mine & set(first.gpus)), first)
