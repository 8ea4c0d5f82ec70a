"""The dashboard's history: each GPU's utilization, memory and holders over the last hour,
day or week, and each member's GPU-hours over the same range, from Prometheus.

Pure, and tested on their own: :func:`parse_range`, :func:`choose_step`,
:func:`time_grid`, :func:`queries` (PromQL strings), :func:`matrix_series` (a
``query_range`` matrix -> series split at their gaps), :func:`holder_spans` and
:func:`history_model` (everything -> the page's model, plain JSON types).
:class:`PrometheusHistory` is the thin I/O shell (``/api/v1/query_range`` through
:mod:`gpulab.prometheus_api`); the GPU-hours come from the usage page's own
query (:meth:`gpulab.dashboard.usage.PrometheusUsage.gpu_hours`).

Every point is a ``max_over_time`` over the step before it (at least two scrapes), so a
burst between two points is not lost: a GPU busy for 20 s of a 5-minute step shows that
step as busy. A GPU without samples in a step (lost, the exporter down) has no point
there: its lines break, they never drop to zero.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from gpulab.contract import (
    METRIC_LEASE,
    METRIC_MEMORY_TOTAL,
    METRIC_MEMORY_USED,
    METRIC_UTILIZATION,
    parse_gpu_label,
    scrape_seconds,
)
from gpulab.dashboard.sources import Source, SourceUnreachable, _float
from gpulab.dashboard.usage import PrometheusUsage, UsageUnavailable
from gpulab.prometheus_api import Prometheus, PrometheusUnavailable

# The ranges the page offers, in seconds, in the selector's order.
RANGES: dict[str, int] = {"1h": 3600, "1d": 86400, "1w": 7 * 86400}
RANGE_WORDS = {"1h": "hour", "1d": "day", "1w": "week"}  # "the last ..." on the page
DEFAULT_RANGE = "1h"
POINTS = 300  # about this many points per line, whatever the range
SCRAPE_SECONDS = scrape_seconds()  # Prometheus' (GPULAB_SCRAPE_SECONDS; 15 unless set)

# Segment = [[t, value], ...], consecutive points one step apart.
Segment = list[list[float]]


def parse_range(text: str | None) -> str:
    """'1h', '1d' or '1w' (None/'' -> the default); ValueError naming the choices."""
    if not text:
        return DEFAULT_RANGE
    if text not in RANGES:
        raise ValueError(f"range: expected one of {', '.join(RANGES)}, got {text!r}")
    return text


def choose_step(range_seconds: int, points: int = POINTS,
                scrape_seconds: int = SCRAPE_SECONDS) -> int:
    """Seconds between points: about *points* over the range, never below the scrape
    interval, and a multiple of it (so each point covers whole scrapes)."""
    wanted = math.ceil(range_seconds / points)
    return max(scrape_seconds, math.ceil(wanted / scrape_seconds) * scrape_seconds)


def window(step: int, scrape_seconds: int = SCRAPE_SECONDS) -> int:
    """The ``max_over_time`` window behind each point: the step (no burst between two
    points is lost), and at least two scrapes, so scrape jitter never leaves a window
    empty (a false gap); a gap then shows when two or more scrapes are missing."""
    return max(step, 2 * scrape_seconds)


def time_grid(now: float, range_seconds: int, step: int) -> tuple[int, int]:
    """(start, end) of the range ending at *now*, on multiples of *step*: reloads within
    a step ask for the same points."""
    end = int(now // step * step)
    return end - range_seconds, end


def queries(step: int) -> dict[str, str]:
    """PromQL for each line and the holders, at *step* seconds per point."""
    w = f"[{window(step)}s]"
    return {
        "utilization": f"max_over_time({METRIC_UTILIZATION}{w})",
        "memory": (f"max_over_time({METRIC_MEMORY_USED}{w}) / "
                   f"max_over_time({METRIC_MEMORY_TOTAL}{w})"),
        "holders": f"max_over_time({METRIC_LEASE}{w})",
    }


def matrix_series(result: Iterable[dict[str, Any]], step: float) -> list[dict[str, Any]]:
    """A ``query_range`` matrix (``[{"metric": {...}, "values": [[t, "v"], ...]}]``) ->
    ``[{"labels": {...}, "segments": [[[t, v], ...], ...]}]``. A new segment starts
    wherever a point is missing (more than a step since the previous one) or is NaN;
    series without a single number are left out."""
    out = []
    for sample in result:
        segments: list[Segment] = []
        previous = None
        for t_raw, v_raw in sample.get("values") or ():
            t, v = _float(t_raw), _float(v_raw)
            if t is None or v is None or math.isinf(v):
                previous = None
                continue
            if previous is None or t - previous > step * 1.5:
                segments.append([])
            segments[-1].append([t, v])
            previous = t
        if segments:
            labels = {k: v for k, v in (sample.get("metric") or {}).items() if k != "__name__"}
            out.append({"labels": labels, "segments": segments})
    return out


def gpu_key(labels: dict[str, str]) -> tuple[int | None, str]:
    """(index, uuid) of a GPU series (a MIG device's index is its GPU's); the index is None
    when the label is neither a number nor INDEX:SLOT."""
    return parse_gpu_label(labels.get("gpu", ""))[0], labels.get("uuid", "")


def holder_spans(series: Iterable[dict[str, Any]], step: float,
                 start: float, end: float) -> dict[str, list[dict[str, Any]]]:
    """Lease series (:func:`matrix_series` of ``gpulab_gpu_lease_info``) -> per GPU UUID,
    who held it when: ``{"user", "server", "start", "end"}``, oldest first. A point at t
    says "held during the step before t", so a run of points from t0 to t1 is the span
    (t0 - step, t1], cut to the range."""
    spans: dict[str, list[dict[str, Any]]] = {}
    for s in series:
        labels = s["labels"]
        for segment in s["segments"]:
            spans.setdefault(labels.get("uuid", ""), []).append({
                "user": labels.get("user", ""), "server": labels.get("server", ""),
                "start": max(start, segment[0][0] - step), "end": min(end, segment[-1][0])})
    for rows in spans.values():
        rows.sort(key=lambda r: (r["start"], r["user"], r["server"]))
    return spans


def history_model(range_name: str, start: float, end: float, step: int,
                  utilization: list[dict[str, Any]], memory: list[dict[str, Any]],
                  holders: list[dict[str, Any]],
                  hours: dict[str, float] | None) -> dict[str, Any]:
    """The history section's model: one entry per GPU seen in any series (by index),
    with its ``utilization`` and ``memory`` segments (ratios 0-1), and ``holders``;
    ``members``: GPU-hours per member over the range, most first (None: not known)."""
    gpus: dict[str, dict[str, Any]] = {}

    def gpu(labels: dict[str, str]) -> dict[str, Any]:
        index, uuid = gpu_key(labels)
        if uuid not in gpus:
            gpus[uuid] = {"index": index, "uuid": uuid, "utilization": [], "memory": [],
                          "holders": []}
        return gpus[uuid]

    for field, series in (("utilization", utilization), ("memory", memory)):
        for s in series:
            gpu(s["labels"])[field].extend(s["segments"])
    for s in holders:
        gpu(s["labels"])
    for uuid, spans in holder_spans(holders, step, start, end).items():
        gpus[uuid]["holders"] = spans
    for g in gpus.values():
        for field in ("utilization", "memory"):
            g[field].sort(key=lambda seg: seg[0][0])
        g["has_data"] = bool(g["utilization"] or g["memory"])
    members = None
    if hours is not None:
        # as the usage page, to 0.01 GPU-hours; holds that round to 0 are left out
        members = [{"user": u, "hours": round(h, 2)} for u, h in hours.items()
                   if round(h, 2) > 0]
        members.sort(key=lambda m: (-m["hours"], m["user"]))
    return {
        "range": range_name, "ranges": list(RANGES), "start": start, "end": end,
        "step": step, "error": None,
        "gpus": sorted(gpus.values(), key=lambda g: (g["index"] is None, g["index"] or 0,
                                                     g["uuid"])),
        "members": members,
        "total_hours": None if members is None else round(sum(m["hours"] for m in members), 2),
        "hours_error": None,
    }


def unavailable_model(range_name: str, why: str) -> dict[str, Any]:
    """The model when Prometheus did not answer: no GPUs, and *why* for the page."""
    return {"range": range_name, "ranges": list(RANGES), "start": None, "end": None,
            "step": None, "error": why, "gpus": [], "members": None, "total_hours": None,
            "hours_error": None}


class PrometheusHistory(Source):
    """Range queries against Prometheus' HTTP API; GPU-hours through *usage*."""

    name = "prometheus"

    def __init__(self, url: str, usage: PrometheusUsage | None = None,
                 timeout: float = 5.0) -> None:
        super().__init__(url, timeout=timeout)
        self.usage = usage or PrometheusUsage(url, timeout=timeout)

    async def query_range(self, expr: str, start: int, end: int,
                          step: int) -> list[dict[str, Any]]:
        try:
            return await Prometheus(self.url, self.timeout).query_range(expr, start, end, step)
        except PrometheusUnavailable as e:
            raise SourceUnreachable(str(e)) from e

    async def read(self, range_name: str, now: float) -> dict[str, Any]:
        """The model for *range_name* ending at *now*; a Prometheus that does not answer
        gives :func:`unavailable_model` (never raises :class:`SourceUnreachable`)."""
        seconds = RANGES[range_name]
        step = choose_step(seconds)
        start, end = time_grid(now, seconds, step)
        q = queries(step)
        try:
            util, mem, leases, (hours, hours_error) = await asyncio.gather(
                *(self.query_range(q[k], start, end, step)
                  for k in ("utilization", "memory", "holders")),
                self._hours(end, seconds))
        except SourceUnreachable as e:
            return unavailable_model(range_name, f"Prometheus at {self.url}: {e}")
        model = history_model(range_name, start, end, step, matrix_series(util, step),
                              matrix_series(mem, step), matrix_series(leases, step), hours)
        model["hours_error"] = hours_error
        return model

    async def _hours(self, end: int, seconds: int) -> tuple[dict[str, float] | None, str | None]:
        """({user: GPU-hours}, None), or (None, why) when Prometheus would not say."""
        try:
            return await self.usage.gpu_hours(datetime.fromtimestamp(end, UTC), seconds), None
        except UsageUnavailable as e:
            return None, str(e)
