"""Where the dashboard's numbers come from.

Primary: the exporter's ``/api/gpus`` (the full snapshot: processes, leases, errors).
Beside it: Alertmanager's active alerts (``alerts`` in the snapshot), when configured.
Fallback: Prometheus' HTTP API, querying the ``gpulab_*`` series the exporter exports
(last scraped values; no per-process memory). On a Swarm of several GPU machines
Prometheus is the one source that sees every node's exporter (each series carries its
``node`` label: monitoring/prometheus/prometheus.swarm.yml), so the dashboard runs with
``--exporter-url none`` there. Each source is a :class:`Source` with
one ``fetch()``; :func:`read_first` tries them in order and always returns a snapshot
dict, with ``source`` (who answered, None if nobody did) and ``unreachable`` (who did
not, and why). A failing source never raises out of here: the page says what is down.

:func:`snapshot_from_prometheus` (series -> snapshot dict) is pure and tested on its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpulab import notices
from gpulab.contract import (
    METRIC_LEASE,
    METRIC_MEMORY_TOTAL,
    METRIC_MEMORY_USED,
    METRIC_MIG_DEVICE,
    METRIC_UTILIZATION,
    parse_gpu_label,
)
from gpulab.dashboard.view import gpu_order
from gpulab.prometheus_api import Prometheus, PrometheusUnavailable

DEFAULT_EXPORTER_URL = "http://exporter:9445"
DEFAULT_PROMETHEUS_URL = "http://prometheus:9090"
DEFAULT_ALERTMANAGER_URL = "http://alertmanager:9093"
DEFAULT_TIMEOUT = 3.0

# Everything the exporters export, in one instant query, and whether Prometheus reaches
# each of them (on a Swarm, a node whose exporter is down still has its `up`).
PROMETHEUS_SERIES = '{__name__=~"gpulab_(gpu|exporter)_.+"} or up{job="gpulab-exporter"}'
# When Prometheus last scraped the exporter (sample time, not evaluation time).
PROMETHEUS_SCRAPED = "max(timestamp(gpulab_exporter_nvml_up))"

log = logging.getLogger(__name__)


class SourceUnreachable(Exception):
    """A source did not give a usable snapshot; the message says why, for the page."""


class Source:
    """One place to read a snapshot from. ``fetch()`` returns the exporter's
    ``/api/gpus`` shape or raises :class:`SourceUnreachable`."""

    name = "source"

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    async def fetch(self) -> dict[str, Any]:
        raise NotImplementedError

    async def _get_json(self, url: str) -> Any:
        request = HTTPRequest(url, connect_timeout=self.timeout, request_timeout=self.timeout,
                              headers={"Accept": "application/json"})
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as e:
            if e.code == 599:
                raise SourceUnreachable(f"no answer within {self.timeout:g}s") from e
            raise SourceUnreachable(f"HTTP {e.code} from {url}") from e
        except OSError as e:  # refused, unknown host, reset
            raise SourceUnreachable(f"{type(e).__name__}: {e.strerror or e}") from e
        try:
            return json.loads(response.body)
        except ValueError as e:
            raise SourceUnreachable(f"not JSON from {url}: {e}") from e


class ExporterSource(Source):
    """The exporter's ``GET /api/gpus``: the snapshot as it is."""

    name = "exporter"

    async def fetch(self) -> dict[str, Any]:
        data = await self._get_json(self.url + "/api/gpus")
        if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
            raise SourceUnreachable("answer has no 'gpus' list (is this gpulab-exporter?)")
        return data


class PrometheusSource(Source):
    """``gpulab_*`` series from Prometheus' ``/api/v1/query`` (values as last scraped)."""

    name = "prometheus"

    async def fetch(self) -> dict[str, Any]:
        series, scraped = await asyncio.gather(self._query(PROMETHEUS_SERIES),
                                               self._query(PROMETHEUS_SCRAPED))
        scraped_at = _float(scraped[0]["value"][1]) if scraped else None
        if scraped_at is None:
            raise SourceUnreachable("answers, but has no gpulab_exporter_nvml_up series: "
                                    "is it scraping the exporter (job gpulab-exporter)?")
        return snapshot_from_prometheus(series, timestamp=scraped_at)

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(url, timeout)
        self.api = Prometheus(self.url, timeout)

    async def _query(self, query: str) -> list[dict[str, Any]]:
        try:
            return await self.api.query(query)
        except PrometheusUnavailable as e:
            raise SourceUnreachable(str(e)) from e


class AlertmanagerAlerts(Source):
    """Alertmanager's active alerts that are neither silenced nor inhibited: what people
    are being told right now (``GET /api/v2/alerts``), as :func:`alert_line` rows."""

    name = "alertmanager"
    QUERY = "/api/v2/alerts?active=true&silenced=false&inhibited=false"

    async def fetch(self) -> list[dict[str, str]]:  # type: ignore[override]
        data = await self._get_json(self.url + self.QUERY)
        if not isinstance(data, list):
            raise SourceUnreachable("answer is not a list of alerts (is this Alertmanager?)")
        return sorted((alert_line(a) for a in data if isinstance(a, dict)),
                      key=lambda a: (a["severity"] != "critical", a["since"], a["name"]))


def alert_line(alert: dict[str, Any]) -> dict[str, str]:
    """One Alertmanager alert -> name, severity, summary and since (UTC, minutes)."""
    labels = alert.get("labels") or {}
    annotations = alert.get("annotations") or {}
    since = str(alert.get("startsAt") or "")
    return {"name": str(labels.get("alertname", "?")),
            "severity": str(labels.get("severity", "")),
            "summary": str(annotations.get("summary") or annotations.get("description") or ""),
            "since": since[:16].replace("T", " ")}


async def read_alerts(source: AlertmanagerAlerts | None) -> dict[str, Any]:
    """``{"alerts": [...]}``, or ``{"alerts": None, "alerts_unreachable": why}``; ``{}``
    without an Alertmanager."""
    if source is None:
        return {}
    try:
        return {"alerts": await source.fetch()}
    except SourceUnreachable as e:
        return {"alerts": None, "alerts_unreachable": f"{source.url}: {e}"}


async def read_first(sources: Sequence[Source]) -> dict[str, Any]:
    """The first snapshot any source gives, tagged with ``source`` and ``unreachable``."""
    unreachable: list[dict[str, str]] = []
    for source in sources:
        try:
            snapshot = await source.fetch()
        except SourceUnreachable as e:
            unreachable.append({"name": source.name, "url": source.url, "error": str(e)})
            continue
        return {**snapshot, "source": {"name": source.name, "url": source.url},
                "unreachable": unreachable}
    return {"gpus": [], "source": None, "unreachable": unreachable, "timestamp": None}


def _rows(read: Callable[[], list[dict[str, Any]]] | None, what: str) -> list[dict[str, Any]]:
    """Who waits in line, or the bookings (none without their file). An unreadable store
    costs its own section, never the GPU table: it is logged and left out."""
    if read is None:
        return []
    try:
        return read()
    except (OSError, sqlite3.Error) as e:
        log.warning("%s cannot be read, leaving it off the page: %s", what, e)
        return []


class SnapshotReader:
    """:func:`read_first`, at most once per ``max_age`` seconds: many open dashboards
    refreshing every few seconds cost the exporter one request, and concurrent requests
    share the one in flight."""

    def __init__(self, sources: Sequence[Source], max_age: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 alerts: AlertmanagerAlerts | None = None,
                 culler_notices: Path | None = None,
                 line: Callable[[], list[dict[str, Any]]] | None = None,
                 bookings: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self.sources = list(sources)
        self.alerts = alerts
        self.culler_notices = culler_notices
        self.line = line  # members waiting for GPUs, in the line's order
        self.bookings = bookings  # members' bookings not ended
        self.max_age = max_age
        self.clock = clock
        self._value: dict[str, Any] | None = None
        self._at = -math.inf
        self._pending: asyncio.Future | None = None

    async def read(self) -> dict[str, Any]:
        if self._value is not None and self.clock() - self._at < self.max_age:
            return self._value
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._read_both())
            self._pending.add_done_callback(self._store)
        return await asyncio.shield(self._pending)

    async def _read_both(self) -> dict[str, Any]:
        snapshot, alerts = await asyncio.gather(read_first(self.sources),
                                                read_alerts(self.alerts))
        return {**snapshot, **alerts, "cull_warnings": self.cull_warnings(),
                "line": _rows(self.line, "the line's store"),
                "bookings": _rows(self.bookings, "the bookings' store")}

    def cull_warnings(self) -> list[dict[str, Any]]:
        """The GPU culler's standing warnings (its notices file; none without one)."""
        if self.culler_notices is None:
            return []
        return [asdict(w) for w in notices.read(self.culler_notices).warnings.values()]

    def _store(self, future: asyncio.Future) -> None:
        self._pending = None
        if not future.cancelled() and future.exception() is None:
            self._value, self._at = future.result(), self.clock()


# -- Prometheus series -> snapshot ---------------------------------------------------
# gauge name -> snapshot field (collector.py's _GAUGES, plus the counters' _total names)
_PROM_FIELDS = {
    METRIC_UTILIZATION: "utilization_ratio",
    METRIC_MEMORY_USED: "memory_used_bytes",
    METRIC_MEMORY_TOTAL: "memory_total_bytes",
    "gpulab_gpu_memory_free_bytes": "memory_free_bytes",
    "gpulab_gpu_temperature_celsius": "temperature_celsius",
    "gpulab_gpu_power_watts": "power_watts",
    "gpulab_gpu_clock_sm_hertz": "clock_sm_hertz",
    "gpulab_gpu_clock_memory_hertz": "clock_memory_hertz",
    "gpulab_gpu_fan_speed_ratio": "fan_speed_ratio",
    "gpulab_gpu_energy_joules_total": "energy_joules",
}
_BYTES = {"memory_used_bytes", "memory_total_bytes", "memory_free_bytes"}


def snapshot_from_prometheus(series: Iterable[dict[str, Any]],
                             timestamp: float | None = None) -> dict[str, Any]:
    """Instant-vector samples (``{"metric": {labels}, "value": [t, "v"]}``) of the
    ``gpulab_*`` metrics -> the exporter's ``/api/gpus`` shape. Processes are listed
    only where ``gpulab_gpu_process_info`` is exported (opt-in), without memory; a
    GPU's per-user memory comes from ``gpulab_gpu_user_memory_used_bytes``.

    Series with a ``node`` label (Prometheus' target label: one per machine) give their
    GPUs a ``node`` too, and GPUs are told apart by node as well as index and UUID (every
    machine has a GPU 0). With several nodes, ``nvml_up`` is true only when NVML answers
    on all of them, and ``nodes_down`` lists each exporter Prometheus does not reach
    (``up`` 0: {"node", "instance"}), whose GPUs are then missing."""
    snap: dict[str, Any] = {"timestamp": timestamp, "nvml_up": None, "nvml_error": None,
                            "driver_version": None, "fake": False, "docker_up": None,
                            "gpus": []}
    gpus: dict[tuple[str | None, str, str], dict[str, Any]] = {}
    nvml: dict[str | None, bool] = {}  # node -> NVML answers there
    drivers: set[str] = set()
    down: list[dict[str, str]] = []

    def gpu(labels: dict[str, str]) -> dict[str, Any]:
        key = (labels.get("node"), labels.get("gpu", ""), labels.get("uuid", ""))
        if key not in gpus:
            index, mig_device = parse_gpu_label(key[1])
            gpus[key] = {"index": index, "mig_device": mig_device, "parent_uuid": None,
                         "uuid": key[2], "model": None, "up": True,
                         "error": None, "leases": [], "processes": None,
                         "user_memory_bytes": None}
            if key[0] is not None:
                gpus[key]["node"] = key[0]
        return gpus[key]

    for sample in series:
        labels = dict(sample.get("metric") or {})
        name = labels.pop("__name__", "")
        value = _float((sample.get("value") or [None, None])[1])
        if name == "up":
            if value == 0.0:
                down.append({"node": labels.get("node") or labels.get("instance", ""),
                             "instance": labels.get("instance", "")})
        elif name == "gpulab_exporter_nvml_up":
            nvml[labels.get("node")] = value == 1.0
        elif name == "gpulab_exporter_docker_up":
            snap["docker_up"] = value == 1.0 and snap["docker_up"] is not False
        elif name == "gpulab_exporter_info":
            if labels.get("driver"):
                drivers.add(labels["driver"])
            snap["fake"] = snap["fake"] or labels.get("backend") == "fake"
        elif name == "gpulab_gpu_up":
            g = gpu(labels)
            g["up"] = value != 0.0
            if not g["up"]:
                g["error"] = "gpulab_gpu_up is 0: lost or needs a reset"
        elif name == "gpulab_gpu_info":
            gpu(labels)["model"] = labels.get("model")
        elif name == METRIC_MIG_DEVICE:
            gpu(labels)["parent_uuid"] = labels.get("parent_uuid") or None
        elif name in _PROM_FIELDS and value is not None:
            field = _PROM_FIELDS[name]
            gpu(labels)[field] = int(value) if field in _BYTES else value
        elif name == METRIC_LEASE:
            gpu(labels)["leases"].append({"user": labels.get("user", ""),
                                          "server": labels.get("server", ""),
                                          "container": None,
                                          "job": labels.get("kind") == "job"})
        elif name == "gpulab_gpu_user_memory_used_bytes" and value is not None:
            g = gpu(labels)
            g["user_memory_bytes"] = {**(g["user_memory_bytes"] or {}),
                                      labels.get("user", ""): int(value)}
        elif name == "gpulab_gpu_process_info":
            g = gpu(labels)
            pid = labels.get("pid", "")
            g["processes"] = [*(g["processes"] or []), {
                "pid": int(pid) if pid.isdigit() else pid, "used_memory_bytes": None,
                "container_id": None, "container": labels.get("container") or None,
                "user": labels.get("user") or None,
                "server": labels.get("server", "") if labels.get("user") else None}]
    for g in gpus.values():
        g["leases"].sort(key=lambda le: (le["user"], le["server"]))
    snap["gpus"] = sorted(gpus.values(), key=gpu_order)
    if nvml:
        snap["nvml_up"] = all(nvml.values())
        silent = sorted(node or "" for node, up in nvml.items() if not up)
        if silent:
            where = f" on {', '.join(silent)}" if any(silent) else ""
            snap["nvml_error"] = f"gpulab_exporter_nvml_up is 0{where} (see the exporter's log)"
    snap["driver_version"] = ", ".join(sorted(drivers)) or None
    if down:
        snap["nodes_down"] = sorted(down, key=lambda d: (d["node"], d["instance"]))
    return snap


def _float(raw: Any) -> float | None:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value
