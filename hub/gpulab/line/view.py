"""What a member's hub home page says about her place in line (``template_vars``), and
the whole line in its order for the operators' GPU dashboard."""

from __future__ import annotations

import os
from typing import Any

from gpulab import live_config
from gpulab.gpus.config import GpusConfig
from gpulab.line.order import Entry, position_of, ranked
from gpulab.line.store import line_store
from gpulab.line.usage import Usage
from gpulab.notices import shown_time
from gpulab.settings import duration_text


def line_rows(entries: list[Entry], user: str, config: GpusConfig,
              usage: Usage | None = None) -> list[dict[str, Any]]:
    """One row per server of *user* in line: waiting (her place, in the line's order),
    starting for her (how long she will have to open it), or up (until when she has)."""
    rows = []
    for e in entries:
        if e.user != user:
            continue
        row = {"server": e.server, "gpus": e.gpus, "joined": shown_time(e.joined_at),
               "environment": e.environment}
        if e.offered_at is None:
            row["state"] = "waiting"
            row["position"], row["waiting"] = position_of(e, entries, config, usage)
        elif e.ready_at is None:
            row["state"] = "starting"
            row["window"] = duration_text(config.line.claim_window)
        else:
            row["state"] = "offered"
            row["deadline"] = shown_time(e.ready_at + config.line.claim_window)
        rows.append(row)
    return rows


def home_page_line(line_path: str | os.PathLike, gpus_path: str | os.PathLike):
    """``c.JupyterHub.template_vars["gpu_line"]``: called with whoever opens a page."""

    def gpu_line(user) -> list[dict[str, Any]]:
        if user is None:
            return []
        store = line_store(line_path)
        entries = store.entries()
        if not any(e.user == user.name for e in entries):
            return []
        config = live_config.gpus_or_defaults(gpus_path)
        return line_rows(entries, user.name, config, store.usage())

    return gpu_line


def line_in_order(line_path: str | os.PathLike, gpus_path: str | os.PathLike):
    """For the operators' GPU dashboard (``SnapshotReader(line=...)``): everyone in line,
    in the line's order, as {"user", "server", "gpus", "joined_at", "offered_at"}."""

    def read() -> list[dict[str, Any]]:
        store = line_store(line_path)
        config = live_config.gpus_or_defaults(gpus_path)
        return [{"user": e.user, "server": e.server, "gpus": e.gpus,
                 "joined_at": e.joined_at, "offered_at": e.offered_at}
                for e in ranked(store.entries(), config, store.usage())]

    return read
