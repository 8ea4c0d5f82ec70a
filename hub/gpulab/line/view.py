"""What a member's hub home page says about her place in line (``template_vars``)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from gpulab import live_config
from gpulab.line.plan import Entry, position_of
from gpulab.line.store import line_store
from gpulab.yamlfile import ConfigError


def _when(t: float) -> dict[str, str]:
    at = datetime.fromtimestamp(t, UTC)
    return {"iso": at.isoformat(), "utc": at.strftime("%Y-%m-%d %H:%M")}


def line_rows(entries: list[Entry], user: str, claim_window: float) -> list[dict[str, Any]]:
    """One row per server of *user* in line: waiting (her place) or started for her
    (until when she has to open it)."""
    rows = []
    for e in entries:
        if e.user != user:
            continue
        row = {"server": e.server, "gpus": e.gpus, "joined": _when(e.joined_at)}
        if e.offered_at is None:
            row["state"] = "waiting"
            row["position"], row["waiting"] = position_of(e, entries)
        else:
            row["state"] = "offered"
            row["deadline"] = _when(e.offered_at + claim_window)
        rows.append(row)
    return rows


def home_page_line(line_path: str | os.PathLike, gpus_path: str | os.PathLike):
    """``c.JupyterHub.template_vars["gpu_line"]``: called with whoever opens a page."""

    def gpu_line(user) -> list[dict[str, Any]]:
        if user is None:
            return []
        entries = line_store(line_path).entries()
        if not any(e.user == user.name for e in entries):
            return []
        try:
            window = live_config.gpus_file.load(gpus_path).line.claim_window
        except ConfigError:
            window = 0
        return line_rows(entries, user.name, window)

    return gpu_line
