"""The GPU culler's shell: reads the hub and Prometheus, applies :mod:`.decide`, stops
servers through the hub's API (:class:`gpulab.hubapi.HubApi`) and leaves notices
(:mod:`gpulab.notices`).

What it may do is what its service role allows (``hubconfig.GPU_CULLER_SCOPES``): list
users with their groups and servers, and stop servers. It reads no Docker and touches
no container; which GPUs a server holds comes from the exporter's
``gpulab_gpu_lease_info`` series (the containers' lease labels), so when Prometheus does
not answer nothing is culled that round, and the log says why.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpulab import live_config
from gpulab import notices as notes
from gpulab.bookings.book import Booking
from gpulab.bookings.store import booking_store
from gpulab.contract import METRIC_LEASE, METRIC_USER_MEMORY, METRIC_UTILIZATION, scrape_seconds
from gpulab.culler.decide import (
    NOTHING_RAN,
    STOP,
    WARN,
    Server,
    decide_all,
    gpu_working,
    idle_since,
    inactivity_warning,
    longest_idle_window,
    query_step,
    releases,
)
from gpulab.gpus.policy import policy_for
from gpulab.hubapi import HubApi, HubApiError, hub_time
from gpulab.prometheus_api import Prometheus, PrometheusUnavailable
from gpulab.settings import duration_text
from gpulab.yamlfile import ConfigError

log = logging.getLogger("gpulab.culler")

LEASES = METRIC_LEASE
# Per GPU, the highest utilization in each window of 2 steps: a burst between two points
# still counts, and a window always holds a scrape (15 s apart) even with jitter.
UTILIZATION = f"max by (uuid) (max_over_time({METRIC_UTILIZATION}[{{window}}s]))"


@dataclass(frozen=True)
class HubServer:
    """A ready server as the hub lists it."""

    user: str
    name: str
    started: float
    groups: tuple[str, ...]
    last_activity: float = 0.0  # the hub's, for the idle culler (0: none reported)


# ---------------------------------------------------------------- pure conversions


def hub_servers(users: Iterable[Mapping[str, Any]]) -> list[HubServer]:
    """Ready servers from the hub's ``GET /users`` models (a server that is starting or
    stopping is left alone until it is ready)."""
    out = []
    for u in users:
        for name, s in (u.get("servers") or {}).items():
            if s.get("ready") and not s.get("pending") and s.get("started"):
                out.append(HubServer(u["name"], name, hub_time(s["started"]),
                                     tuple(u.get("groups") or ()),
                                     hub_time(s.get("last_activity"))))
    return out


def servers_holding_gpus(servers: Sequence[HubServer],
                         leases: Iterable[Mapping[str, Any]]) -> list[Server]:
    """Join the hub's ready servers with the lease series (``user``, ``server``,
    ``uuid`` labels); servers that hold no GPU are not the culler's business."""
    held: dict[tuple[str, str], set[str]] = {}
    for series in leases:
        m = series.get("metric") or {}
        if m.get("uuid"):
            held.setdefault((m.get("user", ""), m.get("server", "")), set()).add(m["uuid"])
    return [Server(s.user, s.name, s.started, tuple(sorted(held[(s.user, s.name)])), s.groups)
            for s in servers if held.get((s.user, s.name))]


def users_by_uuid(series: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """GPU UUID -> the hub users whose processes hold memory there, from the
    ``gpulab_gpu_user_memory_used_bytes > 0`` series."""
    out: dict[str, set[str]] = {}
    for s in series:
        m = s.get("metric") or {}
        if m.get("uuid") and m.get("user"):
            out.setdefault(m["uuid"], set()).add(m["user"])
    return out


def samples_by_uuid(matrix: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    return {series["metric"].get("uuid", ""): [(float(t), float(v))
                                               for t, v in series.get("values", [])]
            for series in matrix}


# ---------------------------------------------------------------- the culler


class GpuCuller:
    def __init__(self, hub: HubApi, prometheus: Prometheus, gpus_file: str | Path,
                 notices_file: str | Path, bookings_file: str | Path | None = None,
                 idle_timeout: int = 0):
        self.hub = hub
        self.prometheus = prometheus
        self.gpus_file = str(gpus_file)
        self.notices_file = Path(notices_file)
        self.bookings_file = bookings_file  # members' bookings (gpulab.bookings); None: none
        # the hub's idle culler's timeout (hub.idle_timeout, as the hub started it); 0: off
        self.idle_timeout = idle_timeout

    def config(self):
        return live_config.gpus_file.load(self.gpus_file)

    async def check(self, now: float | None = None) -> list:
        """One round: returns the decisions taken (for tests and the log)."""
        now = time.time() if now is None else now
        config = self.config()
        try:
            ready = hub_servers(await self.hub.users(state="ready"))
        except HubApiError as e:
            log.warning("GPU culler: the hub did not list its servers (%s); nothing culled "
                        "this round", e)
            return []
        try:
            servers = servers_holding_gpus(ready, await self.prometheus.query(LEASES))
            policies = {s.key: policy_for(config, s.user, s.groups) for s in servers}
            idle = await self.idle_since(now, longest_idle_window(list(policies.values())),
                                         config.culling.idle_below)
            working = await self.gpu_working(servers, config.culling)
        except PrometheusUnavailable as e:
            log.warning("GPU culler: %s; nothing culled this round (which GPUs are held "
                        "and how busy they are comes from Prometheus)", e)
            return []
        active = await self.report_activity(working, now)
        before = notes.read(self.notices_file)
        decisions = decide_all(servers, policies, config.culling, idle, before.warnings, now,
                         self.bookings())
        stopped = list(before.stopped)
        warned = dict(before.warnings)  # what members' pages say while this round stops
        for d in decisions:
            w = d.warning
            if d.action == WARN and d.server.key not in before.warnings:
                log.warning("GPU culler: warned %s that their %s stops at %s UTC: %s",
                            w.user, notes.server_label(w.server), _clock(w.stop_at),
                            w.message)
            elif d.action == STOP:
                # The stop notice is written before the hub is asked: the hub lists the
                # server as gone before the culler hears back, and a member who finds it
                # gone must find why on her home page too (CI once saw the page without
                # it), in place of its warning. Taken back if the server is not stopped
                # after all.
                notice = notes.Stopped(w.user, w.server, now, w.reason, w.message)
                warning = warned.pop(d.server.key, None)
                notes.write(self.notices_file, replace(before, warnings=warned,
                                                       stopped=[*stopped, notice]))
                try:
                    stopped_now = await self.hub.stop_server(w.user, w.server)
                    if not stopped_now:
                        log.info("GPU culler: %s's %s had stopped already", w.user,
                                 notes.server_label(w.server))
                except HubApiError as e:
                    log.error("GPU culler: could not stop %s's %s: %s", w.user,
                              notes.server_label(w.server), e)
                    stopped_now = False
                if not stopped_now:
                    if warning is not None:
                        warned[d.server.key] = warning
                    notes.write(self.notices_file, replace(before, warnings=warned,
                                                           stopped=stopped))
                    continue
                log.warning("GPU culler: stopped %s's %s, warned %s ago: %s", w.user,
                            notes.server_label(w.server), duration_text(now - w.warned_at),
                            w.message)
                stopped.append(notice)
        warnings = {d.server.key: d.warning for d in decisions if d.action == WARN}
        inactive = self.inactivity_warnings(ready, active, before.warnings,
                                            config.culling.warn_before, now)
        for key, w in inactive.items():
            if key not in warnings and key not in {d.server.key for d in decisions
                                                   if d.action == STOP}:
                if key not in before.warnings:
                    log.info("GPU culler: warned %s that their %s stops at %s UTC (the idle "
                             "culler's): %s", w.user, notes.server_label(w.server),
                             _clock(w.stop_at), w.message)
                warnings[key] = w
        running = {(s.user, s.name): s.started for s in ready}
        for key, w in before.warnings.items():
            if key in warnings or key in {d.server.key for d in decisions if d.action == STOP}:
                continue
            if w.reason == notes.INACTIVE and key not in running and now >= w.stop_at:
                log.info("GPU culler: %s's %s was stopped by the idle culler, as warned",
                         w.user, notes.server_label(w.server))
                stopped.append(notes.Stopped(
                    w.user, w.server, now, notes.INACTIVE,
                    f"nothing had happened in it for {duration_text(self.idle_timeout)} "
                    f"({NOTHING_RAN})"))
            else:
                log.info("GPU culler: %s's %s is no longer due to stop; warning withdrawn",
                         w.user, notes.server_label(w.server))
        notes.write(self.notices_file, notes.Notices(
            warnings, notes.keep_stopped(stopped, running, now),
            releases(servers, policies, config.culling, idle, warnings, now)))
        return decisions

    async def gpu_working(self, servers: Sequence[Server], culling) -> list[Server]:
        """The servers whose GPUs worked since the last check (:func:`.decide.gpu_working`)."""
        if not servers:
            return []
        window = max(culling.check_every, 2 * scrape_seconds())
        utilization = await self.prometheus.query(
            f"max by (uuid) (max_over_time({METRIC_UTILIZATION}[{window}s]))")
        busy = [s["metric"].get("uuid", "") for s in utilization
                if float(s["value"][1]) >= culling.idle_below]
        if not busy:
            return []
        users_on = users_by_uuid(await self.prometheus.query(
            f"max by (uuid, user) ({METRIC_USER_MEMORY}) > 0"))
        return gpu_working(servers, busy, users_on)

    async def report_activity(self, working: Sequence[Server],
                              now: float) -> set[tuple[str, str]]:
        """Report each of *working* to the hub as active now (the idle culler then keeps
        it); the keys of those the hub took."""
        done = set()
        for s in working:
            try:
                await self.hub.report_activity(s.user, s.name, now)
                done.add(s.key)
            except HubApiError as e:
                log.error("GPU culler: could not report %s's %s as active (its GPUs work): "
                          "%s", s.user, notes.server_label(s.name), e)
        if done:
            log.debug("GPU culler: GPUs at work in %s", sorted(done))
        return done

    def inactivity_warnings(self, ready: Sequence[HubServer], active: set[tuple[str, str]],
                            standing: Mapping[tuple[str, str], notes.CullWarning],
                            warn_before: int, now: float
                            ) -> dict[tuple[str, str], notes.CullWarning]:
        """The warnings ahead of the idle culler's stops (:func:`.decide.inactivity_warning`),
        by server; none with the idle culler off."""
        out = {}
        for h in ready:
            key = (h.user, h.name)
            last = now if key in active else h.last_activity
            w = inactivity_warning(Server(h.user, h.name, h.started, ()), last,
                                   self.idle_timeout, warn_before, standing.get(key), now)
            if w is not None:
                out[key] = w
        return out

    def bookings(self) -> list[Booking]:
        """Members' bookings; none (and the log says why) when the store cannot be read:
        a broken store then stops nobody's server for a booking."""
        if not self.bookings_file:
            return []
        try:
            return booking_store(self.bookings_file).bookings()
        except (OSError, sqlite3.Error) as e:
            log.error("GPU culler: cannot read the bookings (%s): %s; no server is stopped "
                      "for a booking this round", self.bookings_file, e)
            return []

    async def idle_since(self, now: float, window: int, below: float) -> dict[str, float | None]:
        """Since when each GPU has been idle, over the last *window* seconds."""
        if not window:
            return {}
        step = query_step(window, scrape_seconds())
        matrix = await self.prometheus.query_range(
            UTILIZATION.format(window=2 * step), now - window - 2 * step, now, step)
        return {uuid: idle_since(samples, below=below, step=step, now=now)
                for uuid, samples in samples_by_uuid(matrix).items()}

    async def run(self) -> None:
        log.info("GPU culler: checking %s and Prometheus at %s", self.gpus_file,
                 self.prometheus.url)
        last = -math.inf
        while True:
            # gpus.yaml is read every second, so that a new check_every (or a shorter
            # one) takes effect at once, not after the old interval
            try:
                every = self.config().culling.check_every
            except ConfigError as e:  # never a good version since the culler started
                log.error("GPU culler: nothing culled until %s is fixed: %s", self.gpus_file, e)
                await asyncio.sleep(30)
                continue
            if time.monotonic() - last >= every:
                last = time.monotonic()
                try:
                    await self.check()
                except Exception:  # one bad round must not end the service
                    log.exception("GPU culler: the check failed")
            await asyncio.sleep(1)


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")
