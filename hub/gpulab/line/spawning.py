"""What a spawn asks of the line: the GPUs it keeps from this server, a place for a
spawn that waits, the member's budget, and leaving the line once she has her GPUs.

The spawner (:mod:`gpulab.spawn.spawner`) calls these and only applies their answers;
what they decide is :mod:`gpulab.line.plan`'s, :mod:`gpulab.line.order`'s and
:mod:`gpulab.gpus.budget`'s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpulab.gpus.allocator import Gpu, Lease, Request
from gpulab.gpus.budget import BudgetState, budget_state
from gpulab.gpus.config import GpusConfig
from gpulab.gpus.policy import Policy
from gpulab.line.order import position_of
from gpulab.line.plan import holds, never_fits, plan
from gpulab.line.store import LineStore

# What the spawn form's and the 409's hint say (the form's box is labelled the same).
HINT = (" To wait in line for them instead, tick \"Wait in line\" on the form (or send "
        "\"wait\": true): your server then starts when it is your turn.")
# The class of the link to her home page in what a spawn from the form that joined the line
# says: the spawn-pending and not-running pages send her there (gpulab/templates).
LINE_HOME_LINK = "gpulab-line-home"


def kept(store: LineStore, config: GpusConfig, inventory: Sequence[Gpu],
         leases: Sequence[Lease], spawning: tuple[str, str] | None = None) -> list[Lease]:
    """The GPUs the line keeps, from its store and the leases held now: those of
    members whose turn it is, and the free ones kept for members still waiting (as
    leases; not those of *spawning*'s own entry)."""
    entries = store.entries()
    if not entries:
        return []
    return holds(plan(config, inventory, leases, entries, store.usage()), leases,
                 spawning=spawning)


@dataclass(frozen=True)
class Joined:
    """The answer to a spawn that asked to wait: ``status`` 202 (in line) or 409 (waiting
    could never serve it), and what she is told."""

    status: int
    message: str


class LineAtSpawn:
    """The line as one server's spawn sees it (*user*'s *server*, in *groups*)."""

    def __init__(self, store: LineStore, user: str, server: str, groups: Sequence[str]):
        self.store = store
        self.user = user
        self.server = server
        self.groups = tuple(groups)

    def holds(self, config: GpusConfig, inventory: Sequence[Gpu],
              leases: Sequence[Lease]) -> list[Lease]:
        """The GPUs the line keeps from this spawn (not its own entry's)."""
        return kept(self.store, config, inventory, leases, (self.user, self.server))

    def waiting(self) -> int:
        return sum(e.offered_at is None for e in self.store.entries())

    def budget(self, policy: Policy, config: GpusConfig) -> BudgetState | None:
        """Her budget and what she used of it, when she has one and her use is known (the
        line service brings it from Prometheus; unknown, nothing is enforced)."""
        if policy.budget is None:
            return None
        used = self.store.usage().used_against(policy.budget, self.user, config)
        return None if used is None else budget_state(policy.budget, used, time.time())

    def join(self, config: GpusConfig, inventory: Sequence[Gpu], count: int,
             environment: str = "", email: str = "", machine: str = "") -> Joined:
        """Put this server in line for *count* GPUs in *environment* (its name; "" where
        the lab has one), keeping its place if it is in line already, unless waiting
        could never serve it. The line starts her server in that environment, and tells
        her at *email* ("": on the hub's pages only). *machine*: the node her server must
        run on ("": any; on a Swarm, the one with her home): she waits for GPUs there."""
        never = never_fits(config, inventory, Request(self.user, self.server, self.groups,
                                                      count, machine=machine))
        if never:
            return Joined(409, never)
        entry = self.store.join(self.user, self.server, count, self.groups, environment,
                                email, machine)
        position, waiting = position_of(entry, self.store.entries(), config,
                                        self.store.usage())
        gpus = "1 GPU" if count == 1 else f"{count} GPUs"
        told = " and an e-mail tells you so" if email else ""
        return Joined(202, f"No {gpus} free now: you are number {position} in line "
                           f"({waiting} waiting). Your server starts by itself when it is "
                           f"your turn{told}; your hub home page shows your place, and you "
                           f"can leave the line there.")

    def got_gpus(self) -> bool:
        """Her spawn got its GPUs without waiting for the line to start her server: her
        waiting entry goes (True if there was one). One the line started stays until it
        is claimed."""
        entry = self.store.entry(self.user, self.server)
        if entry is None or entry.offered_at is not None:
            return False
        return self.store.remove(self.user, self.server)
