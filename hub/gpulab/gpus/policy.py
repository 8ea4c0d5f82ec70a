"""What one user may have: the GPU policy of ``config/gpus.yaml``, as pure functions.

The parser (:mod:`gpulab.gpus.config`) reads the file into data; this module decides
with it, and the allocator (:mod:`gpulab.gpus.allocator`) calls it, never the other way
round: parsing, policy and allocation are called downward only.

Precedence: a user's groups combine generously (highest ``gpus``/``max_gpus``/
``max_servers``, union of
``pools`` and ``pinned``, the longest ``gpu_idle_timeout``/``max_server_age``, where 0,
never, is the longest, the highest ``line_priority``), except that ``no_gpu: true`` in
any of them wins; then every field set under ``users:`` replaces the combined value
(``no_gpu: false`` there lifts a group's ``no_gpu``); CPUs and memory (``cpus:``,
``memory:``, their ``_per_gpu`` and ``max_``) likewise, key by key. Pinned GPUs always fit in the
quota (the effective ``max_gpus`` is at least the number of pins) and are kept for the
users and groups that pin them.
Usernames are not case-sensitive.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpulab.gpus.config import (
    DEFAULT_GPU_IDLE_TIMEOUT,
    DEFAULT_MAX_SERVER_AGE,
    DEFAULT_MAX_SERVERS,
    LIMIT_KEYS,
    RESOURCE_KEYS,
    Budget,
    Culling,
    GpusConfig,
    Override,
    Pin,
)
from gpulab.settings import duration_text

__all__ = ["Policy", "ServerResources", "all_pins", "pin_matches", "policy_for", "policy_note",
           "cpus_text", "in_environment", "memory_text", "resources_note", "server_resources",
           "sizes_note", "user_override"]


@dataclass(frozen=True)
class Policy:
    """What one user may have, after defaults, groups and the user's own entry."""

    gpus: int  # default count when the user does not choose (already within max_gpus)
    max_gpus: int  # most GPUs over all of the user's servers (>= len(pinned))
    pools: tuple[str, ...]  # pools the user may draw from
    pinned: tuple[Pin, ...] = ()
    no_gpu: bool = False
    # Seconds a server's GPUs may sit idle / a server holding GPUs may run before the
    # culler stops it; 0 = never.
    gpu_idle_timeout: int = DEFAULT_GPU_IDLE_TIMEOUT
    max_server_age: int = DEFAULT_MAX_SERVER_AGE
    line_priority: int = 0  # higher goes first in line (gpulab.line.order)
    max_servers: int = DEFAULT_MAX_SERVERS  # most servers she runs at once, hers by default too
    budget: Budget | None = None  # GPU-hours per week or month; None: no budget
    # CPUs and memory (gpus.config.RESOURCE_KEYS) as set for her; unset: the lab's
    # spawn.cpu_limit and spawn.mem_limit, nothing per GPU, no cap
    resources: Mapping[str, float] = field(default_factory=dict)
    # her groups' project folders (gpus.yaml groups: projects:), mounted in her servers
    projects: tuple[str, ...] = ()


def pin_matches(pin: Pin, index: int, uuid: str, machine: str = "") -> bool:
    """Whether *pin* names the GPU *index*/*uuid* of *machine* ("" on a single host): a
    UUID names one GPU anywhere, an index one GPU of one machine."""
    if isinstance(pin.ref, str):
        return pin.ref == uuid
    return pin.ref == index and pin.machine == machine


def user_override(config: GpusConfig, user: str) -> Override | None:
    """*user*'s own entry under ``users:``, if any."""
    key = user.lower()
    return next((u for u in config.users if u.name == key), None)


def all_pins(config: GpusConfig) -> tuple[Pin, ...]:
    """Every pin in the file (users' and groups'), in file order."""
    return tuple(p for o in (*config.groups, *config.users) for p in (o.pinned or ()))


def policy_for(config: GpusConfig, user: str, groups: Iterable[str] = ()) -> Policy:
    """The effective policy of *user*, member of *groups* (see the module docstring)."""
    member = set(groups)
    mine = [g for g in config.groups if g.name in member]
    gpus, max_gpus = config.default_gpus, config.default_max_gpus
    pools = config.default_pools
    pinned: list[Pin] = []
    no_gpu = any(g.no_gpu for g in mine)
    if any(g.gpus is not None for g in mine):
        gpus = max(g.gpus for g in mine if g.gpus is not None)
    if any(g.max_gpus is not None for g in mine):
        max_gpus = max(g.max_gpus for g in mine if g.max_gpus is not None)
    if any(g.pools is not None for g in mine):
        pools = tuple(dict.fromkeys(p for g in mine for p in (g.pools or ())))
    for g in mine:
        seen = {(q.ref, q.machine) for q in pinned}
        pinned.extend(p for p in (g.pinned or ()) if (p.ref, p.machine) not in seen)
    limits = {key: _longest([getattr(g, key) for g in mine if getattr(g, key) is not None],
                            getattr(config, f"default_{key}"))
              for key in LIMIT_KEYS}
    servers = [g.max_servers for g in mine if g.max_servers is not None]
    max_servers = max(servers, default=config.default_max_servers)
    priorities = [g.line_priority for g in mine if g.line_priority is not None]
    line_priority = max(priorities, default=0)
    budget = _most_generous_budget(mine, config.default_budget)
    resources = dict(config.default_resources)  # groups: the most of each; hers: hers
    resources.update({key: max(g.resources[key] for g in mine if key in g.resources)
                      for key in RESOURCE_KEYS if any(key in g.resources for g in mine)})
    projects = tuple(sorted({p for g in mine for p in g.projects}))
    own = user_override(config, user)
    if own is not None:
        if own.line_priority is not None:
            line_priority = own.line_priority
        if own.budget is not None or own.no_budget:
            budget = own.budget
        gpus = own.gpus if own.gpus is not None else gpus
        max_gpus = own.max_gpus if own.max_gpus is not None else max_gpus
        max_servers = own.max_servers if own.max_servers is not None else max_servers
        pools = own.pools if own.pools is not None else pools
        pinned = list(own.pinned) if own.pinned is not None else pinned
        no_gpu = own.no_gpu if own.no_gpu is not None else no_gpu
        limits.update({k: getattr(own, k) for k in LIMIT_KEYS if getattr(own, k) is not None})
        resources.update(own.resources)
    if no_gpu:
        return Policy(gpus=0, max_gpus=0, pools=(), pinned=(), no_gpu=True,
                      max_servers=max_servers, line_priority=line_priority, budget=budget,
                      resources=resources, projects=projects, **limits)
    max_gpus = max(max_gpus, len(pinned))
    gpus = min(max(gpus, len(pinned)), max_gpus)
    return Policy(
        gpus=gpus,
        max_gpus=max_gpus,
        max_servers=max_servers,
        pools=tuple(config.pools) if pools is None else pools,
        pinned=tuple(pinned),
        line_priority=line_priority,
        budget=budget,
        resources=resources,
        projects=projects,
        **limits,
    )


@dataclass(frozen=True)
class ServerResources:
    """What one server gets: CPUs (a CFS quota: 2.5 is two and a half cores' time) and
    memory (bytes); *threads*: the threads its libraries should start (OMP_NUM_THREADS:
    PyTorch, NumPy's BLAS, and `nproc`, which reads it), its whole CPUs, at least 1."""

    cpus: float
    memory: int

    @property
    def threads(self) -> int:
        return max(1, math.floor(self.cpus))


def server_resources(policy: Policy, gpus: int, base_cpus: float, base_memory: int
                     ) -> ServerResources:
    """CPUs and memory for her server holding *gpus* GPUs: her base (the lab's
    spawn.cpu_limit and spawn.mem_limit unless gpus.yaml sets cpus: and memory:), plus
    cpus_per_gpu and memory_per_gpu for each GPU, within max_cpus and max_memory."""
    r = policy.resources
    cpus = r.get("cpus", base_cpus) + gpus * r.get("cpus_per_gpu", 0.0)
    memory = int(r.get("memory", base_memory) + gpus * r.get("memory_per_gpu", 0))
    return ServerResources(min(cpus, r.get("max_cpus", math.inf)),
                           int(min(memory, r.get("max_memory", math.inf))))


def in_environment(policy: Policy, sizes: Mapping[str, float]) -> Policy:
    """*policy* for a server of an environment that sets its own CPUs and memory (*sizes*,
    gpulab.yaml's spawn.environments): its cpus, memory and per-GPU values replace
    gpus.yaml's, and its caps hold where they are lower than hers (an environment never
    lifts her max_cpus or max_memory)."""
    if not sizes:
        return policy
    mine = dict(policy.resources)
    merged = {**mine, **{k: v for k, v in sizes.items() if not k.startswith("max_")}}
    for cap in ("max_cpus", "max_memory"):
        if cap in sizes:
            merged[cap] = min(sizes[cap], mine.get(cap, math.inf))
    return replace(policy, resources=merged)


def resources_note(policy: Policy, base_cpus: float, base_memory: int,
                   where: str = "") -> str:
    """What the spawn form says she gets in CPUs and memory, by GPU count (*where*: "in
    NAME", for an environment's own)."""
    r = policy.resources
    none = server_resources(policy, 0, base_cpus, base_memory)
    said = (f"{'A server' if not where else f'{where[0].upper()}{where[1:]}, a server'} gets "
            f"{cpus_text(none.cpus)} and {memory_text(none.memory)} of memory")
    per_cpu, per_mem = r.get("cpus_per_gpu", 0.0), int(r.get("memory_per_gpu", 0))
    if policy.max_gpus and (per_cpu or per_mem):
        adds = [x for x in (per_cpu and cpus_text(per_cpu),
                            per_mem and f"{memory_text(per_mem)} of memory") if x]
        said += f", and {' and '.join(adds)} more for each GPU"
        caps = [x for x in ("max_cpus" in r and cpus_text(r["max_cpus"]),
                            "max_memory" in r and memory_text(int(r["max_memory"]))) if x]
        if caps:
            said += f" (at most {' and '.join(caps)})"
    return said + "."


def sizes_note(policy: Policy, environments: Sequence[Any], base_cpus: float,
               base_memory: int) -> str:
    """The spawn form's sentence on CPUs and memory: gpus.yaml's, then that of each
    environment she may choose that sets its own (its ``resources`` pairs; of one
    environment only, that one's alone)."""
    own = [e for e in environments if e.resources]
    if len(environments) == 1 and own:
        return resources_note(in_environment(policy, dict(own[0].resources)), base_cpus,
                              base_memory)
    notes = [resources_note(policy, base_cpus, base_memory)]
    notes += [resources_note(in_environment(policy, dict(e.resources)), base_cpus,
                             base_memory, where=f"in {e.name}") for e in own]
    return " ".join(notes)


def memory_text(size: int) -> str:
    """8589934592 -> '8 GB', 536870912 -> '512 MB' (binary units, as Docker counts)."""
    for unit, word in ((1 << 40, "TB"), (1 << 30, "GB"), (1 << 20, "MB")):
        if size >= unit:
            return f"{round(size / unit, 1):g} {word}"
    return f"{size} bytes"


def cpus_text(cpus: float) -> str:
    n = f"{cpus:g}"
    return f"{n} CPU" if cpus == 1 else f"{n} CPUs"


def _most_generous_budget(groups: Sequence[Override], default: Budget | None
                          ) -> Budget | None:
    """Of the groups that set a budget (``none`` included, the most generous of all), the
    most GPU-hours per day; *default* when no group sets one."""
    setting = [g for g in groups if g.budget is not None or g.no_budget]
    if not setting:
        return default
    if any(g.no_budget for g in setting):
        return None
    return max((g.budget for g in setting), key=lambda b: b.per_day)


def _longest(limits: Sequence[int], default: int) -> int:
    """The most generous of the groups' time limits (0 = never, the most generous of
    all); *default* when no group sets one."""
    if not limits:
        return default
    return 0 if 0 in limits else max(limits)


def policy_note(policy: Policy, culling: Culling) -> str:
    """What a member is told on the spawn form about when their GPUs come back ("" when
    neither clock runs for them)."""
    rules = []
    if policy.gpu_idle_timeout:
        rules.append(f"when its GPUs stay under {culling.idle_below:.0%} utilization for "
                     f"{duration_text(policy.gpu_idle_timeout)}")
    if policy.max_server_age:
        rules.append(f"{duration_text(policy.max_server_age)} after it starts")
    if not rules:
        return ""
    warning = (f", after a warning {duration_text(culling.warn_before)} ahead on your hub "
               f"home page" if culling.warn_before else "")
    return (f"A server holding GPUs is stopped {' or '.join(rules)}{warning}. "
            f"Your files stay in your home.")
