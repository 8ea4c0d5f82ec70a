"""The spawn form: which environment (when the lab has several), how many GPUs a member
may ask for, and which are free.

:func:`gpu_rows` decides what each row says (who holds a GPU is for admins' eyes only)
and :func:`render_spawn_form` renders ``templates/spawn_form.html``, autoescaped like
every other page of the hub; both are pure. The spawners gather what the form shows
(:meth:`gpulab.spawn.spawner.GpulabSpawner._spawn_form`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jinja2 import Environment, PackageLoader

from gpulab.assistant.gpus import ASSISTANT
from gpulab.gpus.allocator import Gpu, Lease


@dataclass(frozen=True)
class GpuRow:
    index: int
    model: str
    pool: str
    status: str  # free, in use, shared (1/2), yours (train); for admins: held by alice, bob/train
    machine: str = ""  # on a Swarm: the machine it is in


@dataclass(frozen=True)
class SpawnForm:
    max_gpus: int  # the choices are 0 to max_gpus
    default: int  # chosen unless the member picks another
    rows: tuple[GpuRow, ...]
    culling: str = ""  # when GPUs come back (gpulab.gpus.policy.policy_note)
    landing: str = ""  # on a Swarm: where the server would start
    line: bool = False  # the lab has a line for GPUs: offer to wait in it
    waiting: int = 0  # members waiting in it now
    email: bool = False  # the lab sends e-mail: offer to tell her by e-mail when her turn comes
    budget: str = ""  # her GPU-hour budget and its use (gpulab.gpus.budget)
    resources: str = ""  # the CPUs and memory she gets (gpulab.gpus.policy.resources_note)
    environments: tuple[tuple[str, str], ...] = ()  # (name, label) to choose from, if several
    environments_without_gpus: bool = False  # one of them starts without GPUs

    @property
    def machines(self) -> bool:
        """Whether the table has a machine column (a Swarm's GPUs)."""
        return any(r.machine for r in self.rows)


def gpu_rows(inventory: Sequence[Gpu], holders: Mapping[str, Sequence[Lease]],
             is_admin: bool, member: str = "") -> tuple[GpuRow, ...]:
    """A row per GPU: free, or who holds it (admins), or in use / shared (members); the
    lab assistant's GPUs say so to everyone, and *member*'s own which server of hers."""
    rows = []
    for g in inventory:
        held = holders.get(g.uuid, [])
        mine = [le.server for le in held if member and le.user == member]
        if not held:
            status = "free"
        elif mine:
            status = "yours (" + ", ".join(s or "your default server" for s in mine) + ")"
        elif any(le.user == ASSISTANT for le in held):  # the lab's, not a member's
            status = "held for the lab assistant"
        elif is_admin:
            status = "held by " + ", ".join(
                f"{le.user}{'/' + le.server if le.server else ''}" for le in held)
        else:
            status = ("in use" if len(held) >= g.capacity
                      else f"shared ({len(held)}/{g.capacity})")
        rows.append(GpuRow(g.index, g.model, g.pool, status, g.machine))
    return tuple(rows)


@functools.cache
def _templates() -> Environment:
    return Environment(loader=PackageLoader("gpulab.spawn", "templates"), autoescape=True)


def render_spawn_form(form: SpawnForm) -> str:
    return _templates().get_template("spawn_form.html").render(form=form)
