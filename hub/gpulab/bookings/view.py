"""What a member's hub home page says about her bookings (``template_vars``)."""

from __future__ import annotations

import os
import time
from typing import Any

from gpulab.bookings.store import booking_store
from gpulab.notices import shown_time


def home_page_bookings(path: str | os.PathLike):
    """``c.JupyterHub.template_vars["gpu_bookings"]``: called with whoever opens a page;
    her bookings not ended, the running one first."""

    def gpu_bookings(user) -> list[dict[str, Any]]:
        if user is None:
            return []
        now = time.time()
        return [{"gpus": len(b.gpus), "start": shown_time(b.start), "end": shown_time(b.end),
                 "running": b.runs_at(now)}
                for b in booking_store(path).bookings(user.name) if b.end > now]

    return gpu_bookings


def bookings_for_dashboard(path: str | os.PathLike):
    """For the operators' GPU dashboard (``SnapshotReader(bookings=...)``): every booking
    not ended, as {"user", "gpus" (UUIDs), "start", "end"}."""

    def read() -> list[dict[str, Any]]:
        now = time.time()
        return [{"user": b.user, "gpus": list(b.gpus), "start": b.start, "end": b.end}
                for b in booking_store(path).bookings() if b.end > now]

    return read
