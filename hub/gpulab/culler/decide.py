"""Which servers the GPU culler keeps, warns or stops: pure functions, no I/O.

A server is judged on three clocks, whichever runs out first:

* **idle GPUs**: every GPU it holds stayed under ``culling.idle_below`` utilization for
  the user's ``gpu_idle_timeout``, counted from when they last worked (or from the
  server's start, whichever is later). A GPU with no recent data is never idle: a gap in
  Prometheus' data (exporter down, GPU lost) delays culling, it never hastens it. A
  shared GPU is idle only when nobody uses it (utilization is per GPU, not per user).
* **age**: the server has run ``max_server_age`` since it started.
* **a booking**: another member's booking of one of its GPUs starts
  (:func:`gpulab.bookings.book.first_booked`); her booking keeps them for her.

Nobody is stopped without warning: a server is warned ``warn_before`` ahead, and is
stopped only once a warning has stood that long, so a lowered timeout or a culler that
was down gives the member their warning time all the same. A warned server whose GPU
works again is kept, and its warning withdrawn.

The hub's idle culler (jupyterhub-idle-culler, ``hub.idle_timeout``) stops any server in
which nothing happened for that long, by the hub's ``last_activity``. Two things here
feed and explain it:

* :func:`gpu_working`: a server whose GPUs work is active (the culler reports it to the
  hub as the server's activity); work inside the server (a cell executing, a process
  working) is reported by the server itself (the single-user image's work watcher).
* :func:`inactivity_warning`: the member is warned ``warn_before`` ahead of that stop too,
  told what would have counted; after it, the notice says why it was stopped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpulab.bookings.book import Booking, first_booked, when
from gpulab.contract import DEFAULT_SCRAPE_SECONDS
from gpulab.gpus.config import Culling
from gpulab.gpus.policy import Policy
from gpulab.notices import INACTIVE, CullWarning
from gpulab.settings import duration_text

KEEP, WARN, STOP = "keep", "warn", "stop"
IDLE, AGE, BOOKING = "idle", "age", "booking"
NOTHING_RAN = ("no browser on it, no cell executing, no process working and no GPU busy")


@dataclass(frozen=True)
class Server:
    """A running server that holds GPUs, as the hub and Prometheus see it."""

    user: str
    name: str  # "" for the default server
    started: float  # epoch seconds (the hub's ``started``)
    gpus: tuple[str, ...]  # UUIDs of the GPUs it holds
    groups: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return self.user, self.name



@dataclass(frozen=True)
class CullDecision:
    server: Server
    action: str  # KEEP, WARN or STOP
    warning: CullWarning | None = None  # the standing warning (WARN), or the one acted on (STOP)


def idle_since(samples: Sequence[tuple[float, float]], *, below: float, step: float,
               now: float) -> float | None:
    """Since when a GPU has been idle, from a range query of its utilization.

    *samples* are ``(time, ratio)`` in time order, each the highest utilization in the
    *step* before it (``max_over_time``), so a burst between two points still counts.
    Returns the start of the trailing run of idle samples, or None when the GPU is
    working now, when its last sample is stale (no data for 3 steps: unknown is not
    idle), or when there are no samples. A gap of more than 2 steps ends the run: idle
    time is counted only where data says so.
    """
    if not samples or now - samples[-1][0] > 3 * step:
        return None
    since = None
    later = None
    for t, value in reversed(samples):
        if value >= below or (later is not None and later - t > 2 * step):
            break
        since, later = t - step, t
    return since


def cull_decision(server: Server, policy: Policy, culling: Culling,
                  gpus_idle_since: Mapping[str, float | None], standing: CullWarning | None,
                  now: float, bookings: Sequence[Booking] = ()) -> CullDecision:
    """Keep, warn or stop one *server*; *standing* is the warning it already has, if any
    (from an earlier check of the same run of the server)."""
    if standing is not None and standing.started != server.started:
        standing = None  # a warning for an earlier run of this server
    due = _due(server, policy, culling, gpus_idle_since, bookings, now)
    if due is None or now < due[0] - culling.warn_before:
        return CullDecision(server, KEEP)
    at, reason, why = due
    warned_at = standing.warned_at if standing is not None else now
    stop_at = max(at, warned_at + culling.warn_before)
    warning = CullWarning(server.user, server.name, server.started, reason, warned_at,
                       stop_at, why)
    return CullDecision(server, STOP if now >= stop_at else WARN, warning)


def _due(server: Server, policy: Policy, culling: Culling,
         gpus_idle_since: Mapping[str, float | None], bookings: Sequence[Booking] = (),
         now: float = 0.0) -> tuple[float, str, str] | None:
    """(when, why) the first of the server's clocks runs out; None if none runs."""
    clocks: list[tuple[float, str, str]] = []
    if not server.gpus:
        return None
    booked = first_booked(bookings, server.user, server.gpus, now)
    if booked is not None:
        which = ("its GPU is" if len(server.gpus) == 1 else
                 f"{booked.gpus} of its {len(server.gpus)} GPUs "
                 f"{'is' if booked.gpus == 1 else 'are'}")
        clocks.append((booked.start, BOOKING, f"{which} booked by another member from "
                                              f"{when(booked.start)}"))
    since = [gpus_idle_since.get(uuid) for uuid in server.gpus]
    if policy.gpu_idle_timeout and all(s is not None for s in since):
        idle_from = max(max(since), server.started)  # type: ignore[type-var]
        which = "its GPU" if len(server.gpus) == 1 else f"its {len(server.gpus)} GPUs"
        clocks.append((idle_from + policy.gpu_idle_timeout, IDLE,
                       f"{which} stayed under {culling.idle_below:.0%} utilization for "
                       f"{duration_text(policy.gpu_idle_timeout)}"))
    if policy.max_server_age:
        clocks.append((server.started + policy.max_server_age, AGE,
                       f"servers holding GPUs may run for "
                       f"{duration_text(policy.max_server_age)}"))
    return min(clocks) if clocks else None


def gpu_working(servers: Sequence[Server], busy: Iterable[str],
                users_on: Mapping[str, set[str]]) -> list[Server]:
    """The *servers* whose GPUs work now: one of its GPUs is *busy* (at or over
    ``culling.idle_below`` since the last check) and, where several servers share that
    GPU, her processes hold memory on it (*users_on*: GPU UUID -> the users with memory
    there). A shared GPU whose memory nobody can attribute (no *users_on* entry) counts
    for every sharer: unknown is not idle."""
    busy = set(busy)
    holders: dict[str, int] = {}
    for s in servers:
        for uuid in s.gpus:
            holders[uuid] = holders.get(uuid, 0) + 1
    return [s for s in servers
            if any(uuid in busy and (holders[uuid] == 1 or uuid not in users_on
                                     or s.user in users_on[uuid]) for uuid in s.gpus)]


def inactivity_warning(server: Server, last_activity: float, idle_timeout: int,
                       warn_before: int, standing: CullWarning | None,
                       now: float) -> CullWarning | None:
    """The warning *server* gets ahead of the hub's idle culler, which stops it once
    nothing has happened in it for *idle_timeout* after *last_activity* (hub time); None
    while that is further off than *warn_before* (at most a third of the timeout: a
    server whose work is reported every little while is never warned), or with no
    timeout. A warning already standing for the same run and the same stop keeps its
    time."""
    if not idle_timeout:
        return None
    stop_at = max(last_activity, server.started) + idle_timeout
    if now < stop_at - min(warn_before, idle_timeout / 3):
        return None
    kept = (standing is not None and standing.reason == INACTIVE
            and standing.started == server.started and standing.stop_at == stop_at)
    return CullWarning(server.user, server.name, server.started, INACTIVE,
                       standing.warned_at if kept else now, stop_at,
                       f"nothing has happened in it for "
                       f"{duration_text(max(0.0, now - max(last_activity, server.started)))}"
                       f" ({NOTHING_RAN}), and servers stop after "
                       f"{duration_text(idle_timeout)} of that")


def decide_all(servers: Sequence[Server], policies: Mapping[tuple[str, str], Policy],
         culling: Culling, gpus_idle_since: Mapping[str, float | None],
         standing: Mapping[tuple[str, str], CullWarning], now: float,
         bookings: Sequence[Booking] = ()) -> list[CullDecision]:
    """:func:`cull_decision` for every server (policies and warnings by ``(user, server)``)."""
    return [cull_decision(s, policies[s.key], culling, gpus_idle_since, standing.get(s.key),
                          now, bookings) for s in servers]


def releases(servers: Sequence[Server], policies: Mapping[tuple[str, str], Policy],
             culling: Culling, gpus_idle_since: Mapping[str, float | None],
             standing: Mapping[tuple[str, str], CullWarning], now: float
             ) -> dict[str, tuple[float, str]]:
    """When each GPU held now is expected back, if nothing changes: per GPU UUID, the
    earliest time a server holding it would be stopped, and by which clock (AGE: at the
    latest; IDLE: only if it stays idle). GPUs of servers no clock runs for are left out
    (nobody knows when they come back). The line's estimates start from these."""
    out: dict[str, tuple[float, str]] = {}
    for s in servers:
        due = _due(s, policies[s.key], culling, gpus_idle_since)
        if due is None:
            continue
        w = standing.get(s.key)
        at = w.stop_at if w is not None and w.started == s.started else max(
            due[0], now + culling.warn_before)
        for uuid in s.gpus:
            if uuid not in out or at < out[uuid][0]:
                out[uuid] = (at, due[1])
    return out


def longest_idle_window(policies: Sequence[Policy]) -> int:
    """Seconds of utilization history the check needs: the longest idle timeout in
    force (0 if none runs: then no history is needed)."""
    return max((p.gpu_idle_timeout for p in policies), default=0)


def query_step(window: float, scrape_interval: float = DEFAULT_SCRAPE_SECONDS,
               max_points: int = 1000) -> int:
    """The step of the utilization range query: the scrape interval, or coarser so that
    a long window stays under *max_points* points (Prometheus refuses over 11 000)."""
    return int(max(scrape_interval, -(-window // max_points)))
