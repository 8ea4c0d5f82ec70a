"""Members' GPU-hours for the line's fair share and the budgets, brought by the line
service from Prometheus into a small JSON file beside the hub's database, which the hub
reads when it orders the line and before it gives GPUs (:class:`Usage`).

* Fair share: the GPUs she held, averaged over steps across four ``line.half_life``s,
  each step weighted by one half per half-life since (:func:`decayed_gpu_hours`; Slurm's
  and KAI's decay).
* Budgets: her GPU-hours since the current week's and month's start (UTC), counted as
  the usage page counts them (:mod:`gpulab.gpu_hours`).

Numbers older than :data:`MAX_AGE` seconds, or of an earlier week or month, are not used:
the line is then first come, first served, and no budget is enforced.
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulab.gpus.budget import period_start
from gpulab.gpus.config import MONTH, WEEK, Budget, GpusConfig
from gpulab.gpus.policy import policy_for

MAX_AGE = 300  # seconds after which the hub no longer uses these numbers
MAX_POINTS = 1000  # per member and query
PERIODS = (WEEK, MONTH)


@dataclass(frozen=True)
class Usage:
    decayed: Mapping[str, float] | None = None  # fair share's; None: none recent
    periods: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # per -> user
    # when it was read (epoch seconds): the clock fair share's line.max_wait counts by;
    # None: nobody's wait counts
    now: float | None = None
    # the hub's groups as the line service last saw them: group -> its members
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @functools.cached_property
    def member_groups(self) -> Mapping[str, tuple[str, ...]]:
        """*groups* the other way round: member -> the groups she is in (once per read)."""
        out: dict[str, list[str]] = {}
        for group, names in self.groups.items():
            for name in names:
                out.setdefault(name, []).append(group)
        return {name: tuple(groups) for name, groups in out.items()}

    def used(self, user: str, per: str) -> float | None:
        """Her GPU-hours this *per* (week or month); None when not known."""
        hours = self.periods.get(per)
        return None if hours is None else hours.get(user, 0.0)

    def sharing(self, budget: Budget, user: str, config: GpusConfig) -> tuple[str, ...]:
        """Who shares *budget* with *user*: she and the members of the group whose shared
        budget it is who are bound by it (not one whose own entry, or a more generous
        group, gives her another budget); only she for her own; () when the group's
        members are not known."""
        if not budget.shared_by:
            return (user,)
        members = self.groups.get(budget.shared_by)
        if members is None:
            return ()
        bound = {m for m in members
                 if policy_for(config, m, self.member_groups.get(m, ())).budget == budget}
        return tuple(sorted({*bound, user}))

    def used_against(self, budget: Budget, user: str, config: GpusConfig) -> float | None:
        """What counts against *user*'s *budget* this period: her GPU-hours, or those of
        everyone sharing it; None when not known."""
        hours, sharing = self.periods.get(budget.per), self.sharing(budget, user, config)
        if hours is None or not sharing:
            return None
        return sum(hours.get(u, 0.0) for u in sharing)


NONE = Usage()


def window_and_step(half_life: float, scrape: float) -> tuple[int, int]:
    """The span of history asked for (four half-lives: 94 % of the weight) and the step
    (one scrape, or coarser so that a member's series stays under MAX_POINTS)."""
    window = int(4 * half_life)
    return window, int(max(scrape, math.ceil(window / MAX_POINTS)))


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


def write(path: str | os.PathLike, at: float, decayed: Mapping[str, float] | None = None,
          periods: Mapping[str, Mapping[str, float]] | None = None,
          groups: Mapping[str, Sequence[str]] | None = None) -> None:
    """Replace *path* atomically (the hub never reads half a file)."""
    path = Path(path)
    data = {"at": at, "decayed": dict(decayed) if decayed is not None else None,
            "periods": {per: {"start": period_start(at, per), "gpu_hours": dict(hours)}
                        for per, hours in (periods or {}).items()},
            "groups": {g: list(members) for g, members in (groups or {}).items()}}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read(path: str | os.PathLike, now: float) -> Usage:
    """What *path* holds that is recent enough to use at *now*."""
    try:
        data = json.loads(Path(path).read_text())
        if now - float(data["at"]) > MAX_AGE:
            return NONE
        decayed = data.get("decayed")
        periods = {per: {str(u): float(h) for u, h in p["gpu_hours"].items()}
                   for per, p in (data.get("periods") or {}).items()
                   if per in PERIODS and float(p["start"]) == period_start(now, per)}
        groups = {str(g): tuple(str(u) for u in members)
                  for g, members in (data.get("groups") or {}).items()}
        return Usage({str(u): float(h) for u, h in decayed.items()}
                     if decayed is not None else None, periods, now, groups)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return NONE
