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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpulab.bookings.book import Booking, first_booked, when
from gpulab.contract import DEFAULT_SCRAPE_SECONDS
from gpulab.gpus.config import Culling
from gpulab.gpus.policy import Policy
from gpulab.notices import CullWarning
from gpulab.settings import duration_text

KEEP, WARN, STOP = "keep", "warn", "stop"
IDLE, AGE, BOOKING = "idle", "age", "booking"


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


def plan(servers: Sequence[Server], policies: Mapping[tuple[str, str], Policy],
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
