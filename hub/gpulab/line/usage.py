"""Members' recent GPU-hours, for the line's fair share (:mod:`gpulab.line.order`).

The line service asks Prometheus for the GPUs each member held (the usage page's
recording rule, ``gpulab:user_gpus_held``), averaged over steps, across four half-lives;
:func:`decayed_gpu_hours` weighs each step by one half per ``line.half_life`` since
(Slurm's and KAI's decay), and the result goes to a small JSON file beside the hub's
database, which the hub reads when it orders the line. Data older than
:data:`MAX_AGE` seconds is not used: the line is then first come, first served.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

RECORD = "gpulab:user_gpus_held"  # monitoring/prometheus/usage.yml
MAX_AGE = 300  # seconds after which the hub no longer orders by these numbers
MAX_POINTS = 1000  # per member and query


def window_and_step(half_life: float, scrape: float) -> tuple[int, int]:
    """The span of history asked for (four half-lives: 94 % of the weight) and the step
    (one scrape, or coarser so that a member's series stays under MAX_POINTS)."""
    window = int(4 * half_life)
    return window, int(max(scrape, math.ceil(window / MAX_POINTS)))


def query(step: int) -> str:
    """PromQL: GPUs each member held on average over each *step* seconds."""
    return f"sum by (user) (avg_over_time({RECORD}[{step}s]))"


def decayed_gpu_hours(series: Mapping[str, Sequence[tuple[float, float]]], now: float,
                      half_life: float, step: float) -> dict[str, float]:
    """Per member, the GPU-hours of *series* (``(time, GPUs held on average over the
    step before it)``), each step weighted by 0.5 ** (its age / *half_life*)."""
    return {user: sum(v * step / 3600 * 0.5 ** (max(0.0, now - t) / half_life)
                      for t, v in samples)
            for user, samples in series.items()}


def by_user(matrix: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """A Prometheus range matrix as ``{user: [(t, value), ...]}``."""
    return {series["metric"].get("user", ""): [(float(t), float(v))
                                               for t, v in series.get("values", [])]
            for series in matrix}


def write(path: str | os.PathLike, gpu_hours: Mapping[str, float], at: float,
          half_life: float) -> None:
    """Replace *path* atomically (the hub never reads half a file)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"at": at, "half_life": half_life, "gpu_hours": dict(gpu_hours)}, f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read(path: str | os.PathLike, now: float) -> dict[str, float] | None:
    """The members' decayed GPU-hours in *path*, or None when there are none recent
    enough to order by (missing, unreadable, or older than MAX_AGE)."""
    try:
        data = json.loads(Path(path).read_text())
        if now - float(data["at"]) > MAX_AGE:
            return None
        return {str(u): float(h) for u, h in data["gpu_hours"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
