"""The line in Prometheus: what operators watch and alert on.

:func:`families` is pure (the line's entries, the settings, the time -> metric
families); :class:`LineCollector` reads the line's store and the last good gpus.yaml
at each scrape. The hub registers it, so the families ride on the hub's own
``/hub/metrics``, which Prometheus already scrapes (job ``gpulab-hub``):

``gpulab_line_waiting``
    members' servers waiting for GPUs (not yet started for them);
``gpulab_line_offered``
    servers the line started for the member at the head, not yet opened (their claim
    window runs);
``gpulab_line_wait_seconds{user, server, state}``
    how long each entry has been in line (``state``: ``waiting`` or ``offered``);
``gpulab_line_alert_after_seconds``
    gpus.yaml's ``line.alert_after`` (absent when 0: never);
``gpulab_line_idle_below_ratio``
    gpus.yaml's ``culling.idle_below`` (named for the line's alert that reads it: the
    ``gpulab_gpu_*`` names are the exporter's, one series per GPU).

``GpulabWaitingWhileGpuIdle`` (monitoring/prometheus/alerts.yml) compares the last
three with the exporter's utilization, so an admin changes the limit in gpus.yaml,
without touching Prometheus.

Where gpus.yaml sets budgets, from the GPU-hours the line service brings (its usage
file; none while that is over five minutes old, as the hub then enforces none either):

``gpulab_budget_used_gpu_hours{user, period}``
    each member's GPU-hours this calendar week or month (UTC), as budgets count them;
``gpulab_budget_gpu_hours{user, period, enforce}``
    the budget of each member the line service has seen (in a group, or with GPU-hours
    this period), after her groups and her own entry (``enforce``: ``soft`` or
    ``hard``); members without one, or whose budget is a group's shared one, have none;
``gpulab_group_used_gpu_hours{group, period}``
    the sum of a group's members' GPU-hours (all of them: against a shared budget only
    those bound by it count, :meth:`gpulab.line.usage.Usage.sharing`);
``gpulab_group_budget_gpu_hours{group, period, enforce}``
    a group's ``shared`` budget (its members' GPU-hours together); a group's budget that
    is not shared is each member's own, under her name.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from gpulab import live_config
from gpulab.gpus.config import GpusConfig
from gpulab.gpus.policy import policy_for
from gpulab.line import usage as line_usage
from gpulab.line.order import Entry
from gpulab.line.store import line_store
from gpulab.line.usage import Usage

__all__ = ["LineCollector", "budget_families", "families", "register"]

log = logging.getLogger(__name__)


def families(entries: Sequence[Entry], config: GpusConfig, now: float) -> list[Metric]:
    waiting = GaugeMetricFamily("gpulab_line_waiting",
                                "Members' servers waiting in line for GPUs.")
    offered = GaugeMetricFamily(
        "gpulab_line_offered",
        "Servers the line started for the member whose turn came, not opened yet.")
    waits = GaugeMetricFamily("gpulab_line_wait_seconds",
                              "How long each member's server has been in line.",
                              labels=["user", "server", "state"])
    for e in sorted(entries, key=lambda e: (e.joined_at, e.id)):
        state = "waiting" if e.offered_at is None else "offered"
        waits.add_metric([e.user, e.server, state], max(0.0, now - e.joined_at))
    waiting.add_metric([], sum(e.offered_at is None for e in entries))
    offered.add_metric([], sum(e.offered_at is not None for e in entries))
    out: list[Metric] = [waiting, offered, waits]
    if config.line.alert_after:
        limit = GaugeMetricFamily(
            "gpulab_line_alert_after_seconds",
            "gpus.yaml's line.alert_after: how long someone may wait while a GPU is idle "
            "before operators are alerted.")
        limit.add_metric([], config.line.alert_after)
        out.append(limit)
    idle = GaugeMetricFamily("gpulab_line_idle_below_ratio",
                             "gpus.yaml's culling.idle_below: utilization under which a "
                             "GPU counts as idle.")
    idle.add_metric([], config.culling.idle_below)
    out.append(idle)
    return out


def budget_families(config: GpusConfig, usage: Usage) -> list[Metric]:
    """Budget use per member and group, in each period whose use *usage* knows."""
    used = GaugeMetricFamily(
        "gpulab_budget_used_gpu_hours",
        "Each member's GPU-hours this budget period (calendar week or month, UTC).",
        labels=["user", "period"])
    budgets = GaugeMetricFamily(
        "gpulab_budget_gpu_hours", "Each member's budget: GPU-hours per period.",
        labels=["user", "period", "enforce"])
    group_used = GaugeMetricFamily(
        "gpulab_group_used_gpu_hours",
        "The sum of a group's members' GPU-hours this budget period.",
        labels=["group", "period"])
    shared = GaugeMetricFamily(
        "gpulab_group_budget_gpu_hours",
        "A group's shared budget: its members' GPU-hours together per period.",
        labels=["group", "period", "enforce"])
    groups_of = usage.member_groups
    members = sorted({*groups_of, *(u for hours in usage.periods.values() for u in hours)})
    for member in members:
        budget = policy_for(config, member, groups_of.get(member, ())).budget
        if budget is not None and not budget.shared_by and budget.per in usage.periods:
            budgets.add_metric([member, budget.per, budget.enforce], budget.gpu_hours)
        for per in sorted(usage.periods):
            used.add_metric([member, per], usage.used(member, per))
    for group in sorted(usage.groups):
        for per in sorted(usage.periods):
            group_used.add_metric([group, per], sum(usage.used(m, per)
                                                    for m in set(usage.groups[group])))
    for group in config.groups:
        b = group.budget
        if b is not None and b.shared_by and b.per in usage.periods:
            shared.add_metric([group.name, b.per, b.enforce], b.gpu_hours)
    return [used, budgets, group_used, shared]


class LineCollector:
    """Registered in the hub's process (``prometheus_client.REGISTRY``); collected
    at each scrape of ``/hub/metrics``."""

    def __init__(self, line_path: str | os.PathLike, gpus_path: str | os.PathLike,
                 usage_path: str | os.PathLike | None = None,
                 now: Callable[[], float] = time.time):
        self.line_path, self.gpus_path, self.now = line_path, gpus_path, now
        self.usage_path = usage_path

    def collect(self) -> Iterator[Metric]:
        """The families; none while the store cannot be read (logged), so that the hub's
        own metrics are still served."""
        config, now = live_config.gpus_or_defaults(self.gpus_path), self.now()
        if self.usage_path is not None:
            yield from budget_families(config, line_usage.read(self.usage_path, now))
        try:
            entries = line_store(self.line_path).entries()
        except (OSError, sqlite3.Error) as e:
            log.warning("the line's store cannot be read, its metrics are left out: %s", e)
            return
        yield from families(entries, config, now)

    def describe(self) -> Iterable[Metric]:
        return []  # collected at each scrape, never at registration


# registry -> the collector it has. Weak keys: a registry gone (a test's) takes its entry
# with it; keyed by id(), a new registry at a dead one's address was handed the dead one's
# collector to unregister (KeyError, seen in CI).
_registered: weakref.WeakKeyDictionary[CollectorRegistry, LineCollector] = (
    weakref.WeakKeyDictionary())


def register(line_path: str | os.PathLike, gpus_path: str | os.PathLike,
             registry: CollectorRegistry = REGISTRY, *,
             usage_path: str | os.PathLike | None = None) -> LineCollector:
    """Register the line's collector in *registry* (the hub's process-wide one), in
    place of one registered before: a config file loaded twice adds no second copy."""
    old = _registered.pop(registry, None)
    if old is not None:
        registry.unregister(old)
    collector = _registered[registry] = LineCollector(line_path, gpus_path, usage_path)
    registry.register(collector)
    return collector
