"""The line's order: pure functions.

``line.order`` in ``config/gpus.yaml`` says how, and every member's ``line_priority``
(groups and users, default 0) comes first whatever the order:

1. entries the line already started a server for (their turn came);
2. members whose ``soft`` budget is spent (:mod:`gpulab.gpus.budget`) after everyone
   within theirs;
3. higher ``line_priority`` first;
4. ``fair_share`` only: fewer recent GPU-hours first. A member's GPU-hours are the GPUs
   she held, hour by hour, each hour weighted by one half for every ``line.half_life``
   since (:mod:`gpulab.line.usage`); without recent usage data the line falls back to
   first come, first served, and says so. Once an entry has waited ``line.max_wait``,
   her GPU-hours no longer count (as if she had none), so fair share keeps nobody
   waiting for ever;
5. who joined first; then the entry's number.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpulab.gpus.allocator import Request
from gpulab.gpus.config import FAIR_SHARE, GpusConfig
from gpulab.gpus.policy import policy_for
from gpulab.line.usage import NONE, Usage

__all__ = ["Entry", "Standing", "position_of", "ranked", "standing"]


@dataclass(frozen=True)
class Entry:
    """One member's place in line for one of her servers."""

    id: int
    user: str
    server: str  # "" for her default server
    gpus: int
    joined_at: float  # epoch seconds
    groups: tuple[str, ...] = ()  # her JupyterHub groups when she joined
    offered_at: float | None = None  # when the line started her server (epoch seconds)
    environment: str = ""  # the environment she waits in (spawn.environments); "": the lab's one
    email: str = ""  # where she is told that her turn came ("": on the hub's pages only)
    # the node her server must run on ("": any): on a Swarm, the one that holds her home
    # (spawn.swarm_homes: machine), so that her turn comes with GPUs there
    machine: str = ""
    # when her server, started by the line, was first seen up (epoch seconds; None: not
    # yet): her claim window runs from then, since she cannot open it before
    ready_at: float | None = None
    # a job's options ({"command", "time"}, as JSON; "": a server): the line starts the
    # job when her turn comes, which is hers at once (nobody opens a job)
    job: str = ""

    def request(self) -> Request:
        return Request(self.user, self.server, self.groups, self.gpus, machine=self.machine)

    @property
    def key(self) -> tuple[str, str]:
        return (self.user, self.server)



@dataclass(frozen=True)
class Standing:
    """What places one member's entry: for her, and for admins asking why."""

    priority: int
    gpu_hours: float | None  # her decayed GPU-hours; None: not ranked by use
    over_budget: bool = False  # her soft budget is spent: behind those within theirs
    waited_out: bool = False  # waited line.max_wait: her GPU-hours count as none


def standing(entry: Entry, config: GpusConfig | None, usage: Usage | None) -> Standing:
    if config is None:
        return Standing(0, None)
    usage = usage or NONE
    policy = policy_for(config, entry.user, entry.groups)
    used = usage.used_against(policy.budget, entry.user, config) if policy.budget else None
    over = bool(policy.budget and used is not None and used >= policy.budget.gpu_hours)
    decayed = usage.decayed if config.line.order == FAIR_SHARE else None
    hours = None if decayed is None else decayed.get(entry.user, 0.0)
    waited_out = bool(hours is not None and config.line.max_wait and usage.now is not None
                      and usage.now - entry.joined_at >= config.line.max_wait)
    return Standing(policy.line_priority, 0.0 if waited_out else hours, over, waited_out)


def ranked(entries: Iterable[Entry], config: GpusConfig | None = None,
           usage: Usage | None = None) -> list[Entry]:
    """*entries* in line order (see the module docstring); with no *config*, first come,
    first served."""
    def key(e: Entry):
        s = standing(e, config, usage)
        return (e.offered_at is None, s.over_budget, -s.priority, s.gpu_hours or 0.0,
                e.joined_at, e.id)

    return sorted(entries, key=key)


def position_of(entry: Entry, entries: Iterable[Entry], config: GpusConfig | None = None,
                usage: Usage | None = None) -> tuple[int, int]:
    """(her place, how many wait) among the entries not yet offered, in line order."""
    waiting = [e for e in ranked(entries, config, usage) if e.offered_at is None]
    ids = [e.id for e in waiting]
    return (ids.index(entry.id) + 1 if entry.id in ids else 0), len(waiting)
