"""GPU-hours per member and per group, per day and per month: the PI's usage page.

Prometheus records every 15 s how many GPUs each hub user holds
(``gpulab:user_gpus_held``, monitoring/prometheus/usage.yml); the GPU-hours of a day are
the sum of that day's samples times 15 s. A held GPU counts whether or not it is busy:
this is who kept which GPUs from the others, the number a PI shares out.

`gpu_hours_query`, `month_days`, `month_window`, `usage_model` and `usage_csv` are pure;
`PrometheusUsage` asks Prometheus for one month (one query per day, each an instant
``sum_over_time`` ending at the day's end, or now for today), or for any period
(``gpu_hours``: the dashboard's history uses it for its hour, day or week).
"""

from __future__ import annotations

import asyncio
import csv
import io
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from gpulab.gpu_hours import JOB_RECORD, RECORD, gpu_hours_query, waiting_minutes_query
from gpulab.hubapi import HubApi, HubApiError
from gpulab.prometheus_api import Prometheus, PrometheusUnavailable


class UsageUnavailable(Exception):
    """Prometheus did not answer with usage; the message says why."""


def parse_month(text: str | None, today: date) -> date:
    """'2026-11' -> date(2026, 11, 1); None/'' -> this month. ValueError when malformed."""
    if not text:
        return today.replace(day=1)
    try:
        month = datetime.strptime(text, "%Y-%m").date()
    except ValueError:
        raise ValueError(f"month: expected YYYY-MM, got {text!r}") from None
    if month > today:
        raise ValueError(f"month: {text} has not begun")
    return month


def month_days(month: date, now: datetime) -> list[tuple[date, datetime, int]]:
    """The days of *month* until *now* (UTC): (day, end of the window, seconds in it)."""
    days = []
    day = month
    while day.month == month.month and datetime.combine(day, time(), UTC) <= now:
        start = datetime.combine(day, time(), UTC)
        end = min(start + timedelta(days=1), now)
        days.append((day, end, int((end - start).total_seconds())))
        day += timedelta(days=1)
    return days


def month_window(month: date, now: datetime) -> tuple[datetime, int] | None:
    """(end, seconds) of *month* so far: from its first midnight (UTC) to its end or *now*;
    None for a month that has not begun."""
    days = month_days(month, now)
    if not days:
        return None
    end = days[-1][1]
    return end, int((end - datetime.combine(month, time(), UTC)).total_seconds())


def usage_model(month: date, per_day: dict[date, dict[str, float]],
                groups: dict[str, list[str]],
                waited: dict[str, float] | None = None,
                jobs: dict[str, float] | None = None) -> dict[str, Any]:
    """*per_day*: {day: {user: GPU-hours}}; *groups*: {group: [users]}; *waited*: {user:
    minutes her servers waited in line in the month}; *jobs*: {user: GPU-hours of the
    month held by her jobs}. Rows per member (a column per day, the month's total, her
    jobs' share of it and her waiting time) and per group, busiest first."""
    waited, jobs = waited or {}, jobs or {}
    days = sorted(per_day)
    users = sorted({u for hours in per_day.values() for u in hours} | set(waited))
    members = [{"user": u,
                "days": [round(per_day[d].get(u, 0.0), 2) for d in days],
                "total": round(sum(per_day[d].get(u, 0.0) for d in days), 2),
                "job_hours": round(jobs.get(u, 0.0), 2),
                "waited_minutes": round(waited.get(u, 0.0), 1)}
               for u in users]
    members.sort(key=lambda m: (-m["total"], m["user"]))
    totals = {m["user"]: m["total"] for m in members}
    group_rows = [{"group": g, "members": len(names),
                   "total": round(sum(totals.get(u, 0.0) for u in names), 2)}
                  for g, names in sorted(groups.items())]
    group_rows.sort(key=lambda r: (-r["total"], r["group"]))
    return {"month": month.strftime("%Y-%m"), "days": [d.isoformat() for d in days],
            "members": members, "groups": group_rows,
            "total": round(sum(totals.values()), 2)}


def usage_csv(model: dict[str, Any]) -> str:
    """One row per member and day with any use, then one per member for the month."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["period", "user", "gpu_hours"])
    for m in model["members"]:
        for day, hours in zip(model["days"], m["days"], strict=True):
            if hours:
                writer.writerow([day, m["user"], f"{hours:.2f}"])
    for m in model["members"]:
        writer.writerow([model["month"], m["user"], f"{m['total']:.2f}"])
    for g in model["groups"]:
        writer.writerow([model["month"], f"group:{g['group']}", f"{g['total']:.2f}"])
    return out.getvalue()


class PrometheusUsage:
    """Per-day GPU-hours from Prometheus' HTTP API."""

    def __init__(self, url: str, timeout: float = 10.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    async def _query(self, expr: str, at: datetime) -> list[dict[str, Any]]:
        try:
            return await Prometheus(self.url, self.timeout).query(expr, at.timestamp())
        except PrometheusUnavailable as e:
            raise UsageUnavailable(str(e)) from None


    async def gpu_hours(self, end: datetime, seconds: int,
                        record: str = RECORD) -> dict[str, float]:
        """{user: GPU-hours} held in the *seconds* before *end* (a day here; the
        dashboard's history asks for its hour, day or week); by her jobs only, with
        *record* JOB_RECORD."""
        expr = gpu_hours_query(seconds, record=record)
        return {s["metric"].get("user", ""): float(s["value"][1])
                for s in await self._query(expr, end)}

    async def month(self, month: date, now: datetime) -> dict[date, dict[str, float]]:
        days = month_days(month, now)
        hours = await asyncio.gather(*(self.gpu_hours(end, seconds) for _, end, seconds in days))
        return {day: h for (day, _, _), h in zip(days, hours, strict=True)}

    async def job_hours(self, month: date, now: datetime) -> dict[str, float]:
        """{user: GPU-hours her jobs held} in *month* (until *now*)."""
        window = month_window(month, now)
        return await self.gpu_hours(*window, JOB_RECORD) if window else {}

    async def waited(self, month: date, now: datetime) -> dict[str, float]:
        """{user: minutes her servers waited in line} in *month* (until *now*)."""
        window = month_window(month, now)
        if window is None:
            return {}
        end, seconds = window
        return {s["metric"].get("user", ""): float(s["value"][1])
                for s in await self._query(waiting_minutes_query(seconds), end)}


async def hub_groups(hub: HubApi) -> dict[str, list[str]]:
    """The hub's groups and their members (the service's scope ``read:groups``)."""
    try:
        groups = await hub.groups()
    except HubApiError as e:
        raise UsageUnavailable(f"the hub did not list its groups: {e}") from None
    return {g["name"]: list(g.get("users") or []) for g in groups}
