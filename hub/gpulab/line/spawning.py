"""What a spawn asks of the line: a place for a spawn that waits (:class:`LineAtSpawn`),
and the GPUs the line keeps (:func:`kept`, for the admins' lease page). Whether a spawn
waits, and what the line keeps from it, is decided with everything else a spawn
decides, in :mod:`gpulab.spawn.admission`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpulab.gpus.allocator import Gpu, Lease, Request
from gpulab.gpus.config import GpusConfig
from gpulab.line.order import position_of
from gpulab.line.plan import keeps, never_fits
from gpulab.line.store import LineStore

# What the spawn form's and the 409's hint say (the form's box is labelled the same).
HINT = (" To wait in line for them instead, tick \"Wait in line\" on the form (or send "
        "\"wait\": true): your server then starts when it is your turn.")
# The class of the link to her home page in what a spawn from the form that joined the line
# says: the spawn-pending and not-running pages send her there (gpulab/templates).
LINE_HOME_LINK = "gpulab-line-home"


def kept(store: LineStore, config: GpusConfig, inventory: Sequence[Gpu],
         leases: Sequence[Lease]) -> list[Lease]:
    """The GPUs the line in *store* keeps, given the leases held now (:func:`keeps`)."""
    return keeps(config, inventory, leases, store.entries(), store.usage())


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

    def join(self, config: GpusConfig, inventory: Sequence[Gpu], count: int,
             environment: str = "", email: str = "", machine: str = "",
             job: str = "") -> Joined:
        """Put this server in line for *count* GPUs in *environment* (its name; "" where
        the lab has one), keeping its place if it is in line already, unless waiting
        could never serve it. The line starts her server in that environment, and tells
        her at *email* ("": on the hub's pages only). *machine*: the node her server must
        run on ("": any; on a Swarm, the one with her home): she waits for GPUs there.
        *job*: the job's options as JSON, which the line starts it with ("": a server)."""
        never = never_fits(config, inventory, Request(self.user, self.server, self.groups,
                                                      count, machine=machine))
        if never:
            return Joined(409, never)
        entry = self.store.join(self.user, self.server, count, self.groups, environment,
                                email, machine, job)
        position, waiting = position_of(entry, self.store.entries(), config,
                                        self.store.usage())
        gpus = "1 GPU" if count == 1 else f"{count} GPUs"
        told = " and an e-mail tells you so" if email else ""
        return Joined(202, f"No {gpus} free now: you are number {position} in line "
                           f"({waiting} waiting). Your {'job' if job else 'server'} starts "
                           f"by itself when it is your turn{told}; your hub home page shows "
                           f"your place, and you can leave the line there.")
