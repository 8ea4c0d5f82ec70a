"""Snapshot -> view model for the nvidia-smi-style table. Pure: no I/O, no clock.

The input is the exporter's ``/api/gpus`` JSON (``Snapshot.to_json()``), or the same
shape rebuilt from Prometheus by :mod:`gpulab.dashboard.sources`, plus keys the
sources add: ``source`` ({"name", "url"} of whoever answered, None if nobody did),
``unreachable`` (a list of {"name", "url", "error"}, one per source that failed) and
``cull_warnings`` (the GPU culler's standing warnings: {"user", "server", "stop_at",
"message"} each), shown beside the lease they will end, and ``line`` (members waiting
for GPUs, in the line's order: {"user", "server", "gpus", "joined_at", "offered_at"}
each), shown under the table (:func:`waiting_rows`), and ``bookings`` (members' bookings
not ended: {"user", "gpus" (UUIDs), "start", "end"} each, :func:`booking_rows`).

Several machines (a Swarm's GPU nodes, read through Prometheus): each GPU carries its
``node``, and ``nodes_down`` lists the exporters Prometheus does not reach. When the data
names more than one node, the rows are grouped by node, ``nodes`` holds per-node totals
and the table gets a Node column; with one node, or none named, ``nodes`` is None and the
page is the single-machine page it always was (:func:`show_nodes`, :func:`node_totals`).

Every optional field may be missing or None (NVML NotSupported, a lost GPU, Prometheus
without the series): the row then shows "N/A" there, never 0. The model is plain JSON
types, so the page's script re-renders it exactly as the server template did.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from gpulab.assistant.gpus import ASSISTANT

MiB = 1 << 20
GiB = 1 << 30

NA = "N/A"
NO_GPUS = "No GPUs on this host"
NO_GPU_HOST = ("This host has no GPUs (make up found no NVIDIA GPU): members' servers run "
               "on CPUs. To see the GPU pages with simulated GPUs, run make up GPULAB_DEMO=1.")
# A GPU held by a server and busy less than this fraction of the time counts as
# "idle but allocated" (the kernel-duty-cycle ratio NVML reports, 0-1).
IDLE_BELOW = 0.01


def gpu_order(g: dict[str, Any]) -> tuple:
    """Table order: by machine, GPU index (unknown last), each GPU before its MIG devices."""
    return (g.get("node") or "", g.get("index") is None, g.get("index") or 0,
            g.get("mig_device") is not None, g.get("mig_device") or 0)


def build_view(snapshot: dict[str, Any], *, idle_below: float = IDLE_BELOW) -> dict[str, Any]:
    """The whole page's model: ``banners`` (strings), ``message`` (None or a plain
    sentence instead of the table), ``summary`` (counts and a line), ``gpus`` (rows),
    ``source``, ``unreachable`` and ``timestamp`` (seconds since the epoch or None)."""
    source = snapshot.get("source")
    unreachable = [_unreachable(u) for u in snapshot.get("unreachable") or ()]
    now = _number(snapshot.get("timestamp"))
    culls = {(str(w.get("user")), str(w.get("server") or "")): w
             for w in snapshot.get("cull_warnings") or ()}
    gpus = [gpu_row(g, now=now, idle_below=idle_below, culls=culls)
            for g in snapshot.get("gpus") or ()]
    gpus.sort(key=gpu_order)
    down = [{"node": str(d.get("node") or ""), "instance": str(d.get("instance") or "")}
            for d in snapshot.get("nodes_down") or ()]

    banners: list[str] = []
    if unreachable:
        banners.append("Data source unreachable: " + "; ".join(u["text"] for u in unreachable))
    if source and unreachable:
        banners.append(f"Showing data from {source.get('name')} ({source.get('url')}) instead.")
    if snapshot.get("fake"):
        banners.append("FAKE GPUs: the exporter runs with --fake-gpus; these numbers are "
                       "simulated, not hardware.")
    nvml_up = snapshot.get("nvml_up")
    by_design = snapshot.get("expects_gpus") is False  # the exporter's --no-gpus
    if source and nvml_up is False and not by_design:
        banners.append("NVML is not answering on the exporter: "
                       f"{snapshot.get('nvml_error') or 'no reason given'}.")
    for d in down:
        banners.append(f"The exporter on node {d['node'] or '?'} ({d['instance']}) is not "
                       "answering Prometheus: that node's GPUs are missing from the table.")
    if snapshot.get("docker_up") is False:
        banners.append("The exporter cannot list containers: users and lease holders may be "
                       "out of date.")
    for alert in snapshot.get("alerts") or ():
        severity = f" ({alert['severity']})" if alert.get("severity") else ""
        banners.append(f"Alert {alert['name']}{severity} since {alert['since']} UTC: "
                       f"{alert['summary']}")
    if snapshot.get("alerts_unreachable"):
        banners.append(f"Alertmanager unreachable ({snapshot['alerts_unreachable']}): "
                       "active alerts are not shown.")

    if source is None:
        message = "No GPU data: every data source is unreachable."
    elif not gpus and by_design:
        message = NO_GPU_HOST
    elif not gpus and nvml_up is False:
        message = "No GPU data: NVML is not answering on the exporter."
    elif not gpus:
        message = NO_GPUS
    else:
        message = None

    return {
        "timestamp": now,
        "source": dict(source) if source else None,
        "unreachable": unreachable,
        "banners": banners,
        "message": message,
        "driver_version": snapshot.get("driver_version"),
        "summary": summarize(gpus),
        "nodes": node_totals(gpus, down) if show_nodes(gpus, down) else None,
        "gpus": gpus,
        "line": waiting_rows(snapshot.get("line") or (), now),
        "bookings": booking_rows(snapshot.get("bookings") or (), gpus, now),
    }


def waiting_rows(line: Sequence[dict[str, Any]], now: float | None) -> list[dict[str, Any]]:
    """The line under the table, in its order: ``place`` (1, 2, ... among those waiting;
    None once the line started her server), who, how many GPUs, ``waited`` ("12m") and
    ``state_text``."""
    rows, place = [], 0
    for e in line:
        offered = e.get("offered_at") is not None
        if not offered:
            place += 1
        joined = _number(e.get("joined_at"))
        rows.append({
            "place": None if offered else place,
            "user": str(e.get("user") or ""),
            "server": str(e.get("server") or ""),
            "gpus": e.get("gpus"),
            "waited": format_duration(now - joined if now is not None and joined is not None
                                      else None) or NA,
            "state_text": ("server started, not opened yet" if offered
                           else "waiting"),
        })
    return rows


def booking_rows(bookings: Sequence[dict[str, Any]], gpus: Sequence[dict[str, Any]],
                 now: float | None) -> list[dict[str, Any]]:
    """Bookings under the line, by start: who, which GPUs (as the table names them; a
    UUID the table lacks as itself), from and until (UTC), and whether it runs now."""
    names = {g.get("uuid"): f"GPU {g.get('index')}" + (f" of {g['node']}" if g.get("node")
                                                         else "") for g in gpus}
    rows = []
    for b in sorted(bookings, key=lambda b: (_number(b.get("start")) or 0.0)):
        start, end = _number(b.get("start")), _number(b.get("end"))
        rows.append({
            "user": str(b.get("user") or ""),
            "gpus_text": ", ".join(names.get(u) or str(u) for u in b.get("gpus") or ()),
            "from": _utc(start), "until": _utc(end),
            "state_text": ("now" if now is not None and start is not None and end is not None
                           and start <= now < end else "booked"),
        })
    return rows


def _utc(t: float | None) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M") if t is not None else NA


def gpu_row(gpu: dict[str, Any], *, now: float | None = None,
            idle_below: float = IDLE_BELOW,
            culls: dict[tuple[str, str], dict[str, Any]] | None = None) -> dict[str, Any]:
    """One table row. ``state`` is "ok" or "lost" (``up`` false: NVML reports the GPU
    lost or needing a reset); a lost row keeps its last known index, UUID and model.
    ``now`` (the snapshot's time) turns a lease's ``since`` into "held for"; *culls*
    ((user, server) -> the culler's warning) says which holder is about to be stopped."""
    up = gpu.get("up", True) is not False
    util = _number(gpu.get("utilization_ratio")) if up else None
    used = _number(gpu.get("memory_used_bytes")) if up else None
    total = _number(gpu.get("memory_total_bytes")) if up else None
    mem_ratio = used / total if used is not None and total else None
    per_user = gpu.get("user_memory_bytes") if up else None
    holders = [_holder(le, now, per_user or {}, culls or {}) for le in gpu.get("leases") or ()]
    processes = gpu.get("processes")
    allocated = bool(holders)
    index, mig_device = gpu.get("index"), gpu.get("mig_device")
    return {
        "node": gpu.get("node") or None,
        "index": index,
        "mig_device": mig_device,
        # "1", or "1:0" for MIG device 0 of GPU 1 (as NVIDIA_VISIBLE_DEVICES names it)
        "label": "?" if index is None else (
            str(index) if mig_device is None else f"{index}:{mig_device}"),
        "parent_uuid": gpu.get("parent_uuid") or None,
        "uuid": gpu.get("uuid") or "",
        "model": gpu.get("model") or "unknown model",
        "state": "ok" if up else "lost",
        "state_text": "OK" if up else "LOST",
        "error": None if up else (gpu.get("error") or "GPU lost"),
        "utilization_percent": None if util is None else round(util * 100),
        "utilization_text": NA if util is None else f"{round(util * 100)}%",
        "utilization_bar": _bar(util),
        "memory_used_bytes": used,
        "memory_total_bytes": total,
        "memory_text": _memory_text(used, total),
        "memory_bar": _bar(mem_ratio),
        "temperature_text": _fmt(gpu.get("temperature_celsius"), "{:.0f}C", up),
        "power_text": _fmt(gpu.get("power_watts"), "{:.0f}W", up),
        "fan_text": _fmt(gpu.get("fan_speed_ratio"), "{:.0%}", up),
        "clocks_text": _clocks(gpu, up),
        "allocated": allocated,
        "idle_allocated": up and allocated and util is not None and util < idle_below,
        "holders": holders,
        "processes": None if processes is None else [_process(p) for p in processes],
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over the rows and the one-line summary above the table. GPUs and lost GPUs
    are whole GPUs (a MIG device is counted apart, and is lost with its GPU); allocated
    counts what is leased: whole GPUs and MIG devices."""
    gpus = [r for r in rows if r.get("mig_device") is None]
    n, devices = len(gpus), len(rows) - len(gpus)
    allocated = sum(1 for r in rows if r["allocated"])
    idle = sum(1 for r in rows if r["idle_allocated"])
    lost = sum(1 for r in gpus if r["state"] == "lost")
    line = (f"{n} GPU{'' if n == 1 else 's'}"
            + (f" ({devices} MIG device{'' if devices == 1 else 's'})" if devices else "")
            + f", {allocated} allocated, {idle} idle but allocated, {lost} lost")
    return {"gpus": n, "mig_devices": devices, "allocated": allocated,
            "idle_allocated": idle, "lost": lost, "text": line}


def show_nodes(rows: Sequence[dict[str, Any]], down: Sequence[dict[str, Any]] = ()) -> bool:
    """Whether the page needs a Node column and per-node totals: the rows (and the nodes
    whose exporter is down) name more than one node. A GPU without a node counts as a
    node of its own (shown as "?") only beside named ones."""
    return len({r.get("node") or None for r in rows} | {d.get("node") or None
                                                        for d in down}) > 1


def node_totals(rows: Sequence[dict[str, Any]],
                down: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Per node, in node order: its GPUs, GPUs held (leased), lost GPUs, memory used and
    total over the GPUs that report both, and mean utilization over those that report it
    (a lost GPU reports neither; all unknown is "N/A", never 0). A node whose exporter is
    down (*down*: {"node", "instance"}) has no GPUs and ``exporter_up`` False."""
    by_node: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_node.setdefault(r.get("node") or "", []).append(r)
    dead = {d.get("node") or "" for d in down}
    out = []
    for node in sorted(set(by_node) | dead):
        rows_here = by_node.get(node, [])
        # whole GPUs: a MIG device's memory is part of its GPU's
        mine = [r for r in rows_here if r.get("mig_device") is None]
        both = [r for r in mine if r["memory_used_bytes"] is not None
                and r["memory_total_bytes"] is not None]
        used = sum(r["memory_used_bytes"] for r in both) if both else None
        total = sum(r["memory_total_bytes"] for r in both) if both else None
        utils = [r["utilization_percent"] for r in mine if r["utilization_percent"] is not None]
        util = sum(utils) / len(utils) if utils else None
        up = node not in dead or bool(mine)
        n, held = len(mine), sum(1 for r in rows_here if r["allocated"])
        lost = sum(1 for r in mine if r["state"] == "lost")
        out.append({
            "node": node or None,
            "node_text": node or "?",
            "exporter_up": up,
            "state_text": "OK" if up else "EXPORTER DOWN",
            "gpus": n,
            "held": held,
            "lost": lost,
            "memory_used_bytes": used,
            "memory_total_bytes": total,
            "memory_text": _memory_text(used, total),
            "memory_bar": _bar(used / total if used is not None and total else None),
            "utilization_percent": None if util is None else round(util),
            "utilization_text": NA if util is None else f"{round(util)}%",
            "utilization_bar": _bar(None if util is None else util / 100),
            "text": f"{n} GPU{'' if n == 1 else 's'}, {held} held, {lost} lost",
        })
    return out


def format_bytes(n: float | None) -> str:
    """GPU memory the way operators read it: MiB below 1 GiB, GiB with one decimal above
    (nvidia-smi's "MiB" and "GiB" are binary units too)."""
    if n is None:
        return NA
    if n < GiB:
        return f"{n / MiB:.0f} MiB"
    return f"{n / GiB:.1f} GiB"


def format_duration(seconds: float | None) -> str | None:
    """``3d 4h``, ``2h 13m``, ``5m``, ``40s``; None for unknown or negative."""
    if seconds is None or seconds < 0:
        return None
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m"
    return f"{s}s"


# -- helpers -------------------------------------------------------------------------
def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _bar(ratio: float | None) -> int:
    """Bar width in percent, 0-100 (0 when unknown: the text says N/A)."""
    if ratio is None:
        return 0
    return max(0, min(100, round(ratio * 100)))


def _fmt(value: Any, pattern: str, up: bool) -> str:
    value = _number(value) if up else None
    return NA if value is None else pattern.format(value)


def _memory_text(used: float | None, total: float | None) -> str:
    if used is None and total is None:
        return NA
    return f"{format_bytes(used)} / {format_bytes(total)}"


def _clocks(gpu: dict[str, Any], up: bool) -> str:
    sm = _number(gpu.get("clock_sm_hertz")) if up else None
    mem = _number(gpu.get("clock_memory_hertz")) if up else None
    if sm is None and mem is None:
        return NA
    return f"{_mhz(sm)} / {_mhz(mem)} MHz"


def _mhz(hertz: float | None) -> str:
    return NA if hertz is None else f"{hertz / 1e6:.0f}"


def _holder(lease: dict[str, Any], now: float | None, per_user: dict[str, Any],
            culls: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    user = str(lease.get("user") or "?")
    # the lab assistant's container has one "server": its name says it all
    server = "" if user == ASSISTANT else str(lease.get("server") or "")
    since = _number(lease.get("since"))
    age = now - since if since is not None and now is not None else None
    memory = _number(per_user.get(user))
    return {
        "user": user,
        "memory_text": None if memory is None else format_bytes(memory),
        "server": server,
        "job": lease.get("job") is True,  # her server runs a job (from the exporter's labels)
        "since": since,
        "held_for": format_duration(age),
        "cull_text": _cull_text(culls.get((user, server))),
    }


def _cull_text(warning: dict[str, Any] | None) -> str | None:
    """"to be stopped at 14:05 UTC (its GPUs idle since 11:50 UTC)": the culler's
    warning for this holder, as its member reads it on their home page."""
    stop_at = _number((warning or {}).get("stop_at"))
    if stop_at is None:
        return None
    at = datetime.fromtimestamp(stop_at, UTC).strftime("%H:%M UTC")
    message = str(warning.get("message") or "").strip()
    return f"to be stopped at {at}" + (f" ({message})" if message else "")


def _process(p: dict[str, Any]) -> dict[str, Any]:
    mem = _number(p.get("used_memory_bytes"))
    return {
        "pid": p.get("pid"),
        "user": p.get("user"),
        "server": p.get("server"),
        "container": p.get("container"),
        "memory_text": format_bytes(mem),
    }


def _unreachable(u: dict[str, Any]) -> dict[str, Any]:
    name, url, error = str(u.get("name")), str(u.get("url")), str(u.get("error"))
    return {"name": name, "url": url, "error": error, "text": f"{name} at {url} ({error})"}
