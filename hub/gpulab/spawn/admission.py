"""Whether a spawn gets GPUs, and which: one pure step for every start.

The spawner (:mod:`gpulab.spawn.spawner`, and the Swarm's, which only fills in the
machine) reads what the decision needs once, into :class:`Seen`, under the lease
table's lock (:meth:`gpulab.gpus.leases.LeaseBook.locked`), calls :func:`decide`, and
records the answer before it lets go of the lock: two spawns can never take the same GPU.
Nothing here does I/O, and nothing in :mod:`gpulab.gpus` calls back into the spawner.

The order of the checks is the order of what a member is told: how many servers she
runs (gpus.yaml's ``max_servers``), her options, the
environment, the e-mail for the line, her budget, then the GPUs (policy, quota, pools,
bookings, the line's places); a spawn that finds too few free GPUs waits in line when
she asked to (:class:`JoinLine`: the shell writes her entry) or is told how to.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulab.bookings.book import Booking, first_booked, upcoming, when
from gpulab.bookings.book import holds as booking_holds
from gpulab.environments import Environment, EnvironmentRefused, gpu_count
from gpulab.gpus.allocator import (
    AllocationError,
    Gpu,
    InvalidRequest,
    Lease,
    NotEnoughGpus,
    Request,
    allocate,
    validate_user_options,
    wants_to_wait,
)
from gpulab.gpus.budget import BudgetState, budget_state
from gpulab.gpus.config import GpusConfig
from gpulab.gpus.policy import (
    Policy,
    ServerResources,
    in_environment,
    policy_for,
    server_resources,
)
from gpulab.line.order import Entry
from gpulab.line.plan import keeps
from gpulab.line.spawning import HINT
from gpulab.line.usage import NONE, Usage
from gpulab.mail import address_in_options
from gpulab.settings import bytes_text, defaults, parse_bytes
from gpulab.spawn.jobs import OPTION, Job, parse_job

_LAB = defaults()  # gpulab.yaml's own defaults, where a Seen is not given the lab's


@dataclass(frozen=True)
class Ask:
    """One start of *user*'s *server*, as she asked for it."""

    user: str
    server: str = ""  # "" for her default server
    groups: tuple[str, ...] = ()
    admin: bool = False  # admins are told who holds the busy GPUs
    options: Any = None  # user_options as they came, from the form or the REST API
    from_form: bool = True
    environment: Environment | None = None  # None: the lab's one image, with GPUs
    # On a Swarm with homes on the machines: the node her server must run on (by ID),
    # the machine the line waits for (its hostname, kept across a new ID) and its name in
    # what she is told. "": any machine.
    machine: str = ""
    line_machine: str = ""
    machine_name: str = ""
    # her other servers running or starting now ("" her default one): max_servers
    running: tuple[str, ...] = ()


@dataclass(frozen=True)
class Seen:
    """What a decision reads, read once: the config and inventory, every lease held now
    (containers and spawns in flight), the bookings, the line's entries (None: the lab
    has no line) and members' GPU-hours (:data:`gpulab.line.usage.NONE`: not known, so
    no budget is enforced)."""

    config: GpusConfig
    inventory: tuple[Gpu, ...]
    leases: tuple[Lease, ...]
    now: float
    bookings: tuple[Booking, ...] = ()
    line: tuple[Entry, ...] | None = None
    usage: Usage = NONE
    mail_on: bool = False
    lists_environments: bool = False  # the lab lists several: the line keeps hers
    # a server's CPUs and memory where gpus.yaml sets none (spawn.cpu_limit, mem_limit)
    base_cpus: float = _LAB["spawn.cpu_limit"]
    base_memory: int = _LAB["spawn.mem_limit"]


@dataclass(frozen=True)
class Admitted:
    """She gets *gpus* (possibly none). *request* and *taken* are what the lease table
    records her lease against (:meth:`gpulab.gpus.leases.Table.record`); *leaves_line*:
    she had a place in line, which she needs no more."""

    gpus: tuple[Gpu, ...]
    policy: Policy
    request: Request
    taken: tuple[Lease, ...]
    leaves_line: bool = False
    booked_note: str = ""  # another member booked one of these GPUs: when it stops
    resources: ServerResources | None = None  # its CPUs and memory, by its GPUs
    job: Job | None = None  # the command it runs and ends with (gpulab.spawn.jobs)


@dataclass(frozen=True)
class JoinLine:
    """Too few GPUs free and she asked to wait: her place in line for *count* GPUs."""

    count: int
    environment: str  # its name where the lab lists several, else ""
    email: str
    machine: str
    job: str = ""  # a job's options, as JSON, which the line starts it with ("": a server)


@dataclass(frozen=True)
class Refused:
    """No start: the HTTP *status* and what she is told; *log* is the hub log's line
    (with holders' names); *join* asks the shell to put her in line instead."""

    status: int
    message: str
    log: str = ""
    join: JoinLine | None = None
    reason: str = field(default="", compare=False)  # the allocator's stable word


def policy_of(ask: Ask, config: GpusConfig) -> Policy:
    """Her policy by gpus.yaml, with the CPUs and memory of the environment she starts in
    where it sets its own."""
    policy = policy_for(config, ask.user, ask.groups)
    if ask.environment is None:
        return policy
    return in_environment(policy, dict(ask.environment.resources))


def budget_of(ask: Ask, seen: Seen, policy: Policy) -> BudgetState | None:
    """Her budget and what she (or her group) used of it, when she has one and the use is
    known (the line service brings it from Prometheus; unknown, nothing is enforced)."""
    if policy.budget is None:
        return None
    used = seen.usage.used_against(policy.budget, ask.user, seen.config)
    return None if used is None else budget_state(policy.budget, used, seen.now)


def taken(ask: Ask, seen: Seen) -> list[Lease]:
    """Everything her spawn counts as taken: the leases, the GPUs of the bookings running
    now (hers as this server's, which she gets first), and those the line keeps for
    others (not her own entry's)."""
    capacity = {g.uuid: g.capacity for g in seen.inventory}
    booked = booking_holds(seen.bookings, seen.now, ask.user, ask.server, capacity=capacity)
    held = [*seen.leases, *booked]
    return held + keeps(seen.config, seen.inventory, held, seen.line or (), seen.usage,
                        spawning=(ask.user, ask.server))


def request_of(ask: Ask, seen: Seen, count: int | None) -> Request:
    return Request(ask.user, ask.server, ask.groups, count, machine=ask.machine,
                   booked_from=upcoming(seen.bookings, ask.user, seen.now))


def holders(ask: Ask, seen: Seen, gpu_uuids: Iterable[str]) -> dict[str, list[Lease]]:
    """Who holds each of *gpu_uuids*, as her spawn would count them (the spawn form)."""
    all_taken = taken(ask, seen)
    return {u: [le for le in all_taken if le.gpu_uuid == u] for u in gpu_uuids}


def preview(ask: Ask, seen: Seen, counts: Sequence[int]
            ) -> list[tuple[Gpu, ...] | AllocationError]:
    """What a start of each of *counts* GPUs would get now, or the AllocationError it
    would meet: where the spawn form says her server would go. Leases nothing."""
    policy, all_taken = policy_of(ask, seen.config), taken(ask, seen)
    out: list[tuple[Gpu, ...] | AllocationError] = []
    for count in counts:
        try:
            out.append(tuple(allocate(seen.config, seen.inventory, all_taken,
                                      request_of(ask, seen, count), policy=policy)))
        except AllocationError as e:
            out.append(e)
    return out


def where(ask: Ask, message: str) -> str:
    """A 409 on a Swarm with homes on the machines says which machine she waits for."""
    if not ask.machine:
        return message
    return (f"Your files are on the lab's machine {ask.machine_name or ask.machine}, so "
            f"your server runs there: {message}")


def servers_refusal(ask: Ask, policy: Policy) -> Refused | None:
    """A 403 when she runs as many servers as gpus.yaml's max_servers gives her."""
    if len(ask.running) < policy.max_servers:
        return None
    names = ", ".join(f'"{n}"' if n else "your default one" for n in ask.running)
    most = policy.max_servers
    return Refused(403, f"You already have {len(ask.running)} server"
                        f"{'' if len(ask.running) == 1 else 's'} running ({names}), the most "
                        f"the lab gives you at once (max_servers: {most}): stop one first.",
                   reason="max_servers",
                   log=f"{len(ask.running)} servers running, max_servers {most}")


def decide(ask: Ask, seen: Seen) -> Admitted | Refused:
    """Her start, admitted with its GPUs or refused with what she is told."""
    policy = policy_of(ask, seen.config)
    too_many = servers_refusal(ask, policy)
    if too_many is not None:
        return too_many
    wait, job = False, None
    try:
        count = validate_user_options(ask.options, policy.max_gpus)
        if ask.environment is not None:
            try:
                count = gpu_count(ask.environment, count, from_form=ask.from_form)
            except EnvironmentRefused as e:
                return Refused(e.status, str(e))
        gpus_asked = policy.gpus if count is None else count
        allowed = server_resources(policy, gpus_asked, seen.base_cpus, seen.base_memory)
        resources = chosen_resources(ask.options, allowed, gpus_asked)
        wait = wants_to_wait(ask.options)
        job = parse_job(ask.options, ask.server, policy.max_server_age)
        try:
            email = address_in_options(ask.options, wait, seen.mail_on,
                                       from_form=ask.from_form, job=job is not None)
        except ValueError as e:
            raise InvalidRequest(str(e)) from None
        budget = budget_of(ask, seen, policy)
        if budget is not None and budget.refuses and (policy.gpus if count is None else count):
            return Refused(403, budget.refusal(), reason="budget_spent",
                           log=f"hard budget spent ({budget.used:.2f} of "
                               f"{budget.budget.gpu_hours:g} GPU-hours)")
        all_taken = taken(ask, seen)
        request = request_of(ask, seen, count)
        gpus = allocate(seen.config, seen.inventory, all_taken, request, policy=policy)
    except NotEnoughGpus as e:
        message = e.detailed_message if ask.admin else str(e)
        if seen.line is not None and wait:
            environment = (ask.environment.name if ask.environment is not None
                           and seen.lists_environments else "")
            waits = ask.options.get(OPTION) if job is not None else None
            return Refused(409, where(ask, message), log=e.detailed_message, reason=e.reason,
                           join=JoinLine(e.requested, environment, email, ask.line_machine,
                                         json.dumps(waits) if waits is not None else ""))
        if seen.line is not None:
            message += HINT
        return Refused(e.status, where(ask, message), log=e.detailed_message, reason=e.reason)
    except AllocationError as e:
        return Refused(e.status, str(e), log=str(e), reason=e.reason)
    leaves_line = any(e.key == (ask.user, ask.server) and e.offered_at is None
                      for e in seen.line or ())
    return Admitted(tuple(gpus), policy, request, tuple(all_taken), leaves_line,
                    booked_note(ask, seen, policy, gpus), resources, job)


MIN_MEMORY = 256 << 20  # less, and JupyterLab itself does not start


def chosen_resources(options: Any, allowed: ServerResources, gpus: int) -> ServerResources:
    """The CPUs and memory she asked for (``"cpus"``, ``"memory"``; unset or empty: all
    that *gpus* GPUs bring her, *allowed*), or InvalidRequest naming the limit."""
    raw = options if isinstance(options, dict) else {}
    with_gpus = f"with {gpus} GPU{'' if gpus == 1 else 's'}"
    cpus, memory = raw.get("cpus"), raw.get("memory")
    if cpus in (None, ""):
        cpus = allowed.cpus
    else:
        if isinstance(cpus, str) and re.fullmatch(r"\s*\d+(\.\d+)?\s*", cpus):
            cpus = float(cpus)
        if isinstance(cpus, bool) or not isinstance(cpus, int | float) or not (
                0 < cpus <= allowed.cpus):
            raise InvalidRequest(f"\"cpus\" must be a number above 0 and at most "
                                 f"{allowed.cpus:g} ({with_gpus}), got {cpus!r}.")
    if memory in (None, ""):
        memory = allowed.memory
    else:
        try:
            if isinstance(memory, float):
                raise ValueError("a size")
            memory = parse_bytes(memory)
        except ValueError:
            raise InvalidRequest(f"\"memory\" must be a size such as \"4g\" or \"512m\" "
                                 f"(or whole bytes), got {memory!r}.") from None
        if not MIN_MEMORY <= memory <= allowed.memory:
            raise InvalidRequest(f"\"memory\" must be from 256m to "
                                 f"{bytes_text(allowed.memory)} ({with_gpus}), got "
                                 f"{bytes_text(memory)}.")
    return ServerResources(float(cpus), int(memory))


def booked_note(ask: Ask, seen: Seen, policy: Policy, gpus: Sequence[Gpu]) -> str:
    """Where only GPUs another member booked were free, what she is told at once: the
    server is stopped when the booking starts, unless its max_server_age ends first."""
    if not gpus:
        return ""
    booked = first_booked(seen.bookings, ask.user, [g.uuid for g in gpus], seen.now)
    age = policy.max_server_age
    if booked is None or (age and booked.start >= seen.now + age):
        return ""
    which = "this GPU" if len(gpus) == 1 else f"{booked.gpus} of these {len(gpus)} GPUs"
    return (f"Another member has booked {which} from {when(booked.start)}: this server "
            f"will be stopped then, after a warning")

