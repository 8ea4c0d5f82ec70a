"""GPU leases: who may have which GPU, decided by pure functions.

No I/O here: the hub keeps the lease table (rebuilt after a restart from the running
containers' labels with :func:`leases_from_labels`), discovers GPUs with NVML, and
calls these functions with what it found. Everything is deterministic, so the tests
can replay any sequence of spawns.

The rules, in one place:

* A GPU has a capacity: 1 lease if ``exclusive``, ``max_users`` leases if ``shared``.
  :func:`allocate` never returns a GPU whose leases (other than the requesting
  server's own) already fill it.
* A server that already holds leases gets the same GPUs back (an idempotent restart);
  they come first, then the user's pinned GPUs, then the least-loaded GPUs of the
  user's pools, lowest index first, preferring GPUs the user does not already use.
* A pinned GPU, or a ``reserved`` one, is given only to the users and groups that pin
  it. A GPU no longer in the inventory is never given again; leases on it stay until
  their server stops (:func:`reconcile` reports them).
* ``max_gpus`` counts every lease of the user, over all of their servers.
* A server's GPUs are all on one machine (``Gpu.node``: the Swarm node; "" on a single
  host, where this changes nothing). Among equally loaded GPUs, those of the machine
  with the fewest leases come first, so members spread over machines (their CPUs and
  memory too). Machines are tried in the order their first GPU comes in the order
  above (a restarting server's own machine first, then its pins'), and the first with
  enough free GPUs for the whole request gets it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpulab.contract import label_claims
from gpulab.gpus.config import DEFAULT_POOL, EXCLUSIVE, MAX_GPUS_LIMIT, GpusConfig, Pin
from gpulab.gpus.policy import Policy, all_pins, pin_matches, policy_for, user_override
from gpulab.refusal import Refusal

__all__ = [
    "AllocationError",
    "BusyGpu",
    "Gpu",
    "InvalidRequest",
    "Lease",
    "NoGpuAccess",
    "NotEnoughGpus",
    "QuotaExceeded",
    "Request",
    "add_leases",
    "allocate",
    "leases_from_labels",
    "on_machine",
    "reconcile",
    "release",
    "resolve_inventory",
    "usable_gpus",
    "pinned_gpus",
    "validate_user_options",
    "wants_to_wait",
]


# ---------------------------------------------------------------- types


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML index, as `nvidia-smi -L` prints it
    uuid: str
    model: str
    pool: str = DEFAULT_POOL
    mode: str = EXCLUSIVE
    max_users: int = 1  # leases this GPU takes at once: 1 when exclusive
    reserved: bool = False  # given only to the users and groups that pin it
    node: str = ""  # the machine (Swarm node ID) it is in; "" on a single host
    machine: str = ""  # that machine's name (hostname), for people; "" on a single host

    @property
    def capacity(self) -> int:
        return 1 if self.mode == EXCLUSIVE else self.max_users

    def label(self) -> str:
        where = self.machine or self.node
        return (f"GPU {self.index}" + (f" of {where}" if where else "")
                + (f" ({self.model})" if self.model else ""))


@dataclass(frozen=True)
class Lease:
    gpu_uuid: str
    user: str
    server: str  # "" for the user's default server
    since: datetime | None  # None: held by configuration (gpulab.assistant.gpus)

    @property
    def by_configuration(self) -> bool:
        """Held for a service of the lab's by its configuration (the lab assistant's
        GPUs), not by a container or a spawn."""
        return self.since is None


@dataclass(frozen=True)
class Request:
    user: str
    server: str = ""
    groups: Iterable[str] = ()  # the user's JupyterHub group names
    count: int | None = None  # None = the user's default (Policy.gpus)
    # the machine its GPUs must be on, by node ID or hostname ("": any; a Swarm's
    # node-local homes)
    machine: str = ""
    # (GPU UUID, seconds until someone else's booking of it starts): of the free GPUs,
    # those nobody booked before her max_server_age ends come first, then those booked
    # latest, on the machine with the fewest booked (gpulab.bookings.book.upcoming)
    booked_from: tuple[tuple[str, float], ...] = ()


# ---------------------------------------------------------------- errors


class AllocationError(Refusal):
    """A request that policy or capacity refuses; ``str(e)`` is safe to show the user.

    ``status`` is the HTTP status to answer with, ``reason`` a stable machine-readable
    word (for logs, metrics and JupyterHub's ``SpawnException(reason=...)``).
    """

    status = 400
    reason = "allocation_error"

    def __init__(self, message: str):
        super().__init__(self.status, message)


class InvalidRequest(AllocationError):
    status = 400
    reason = "invalid_request"


class QuotaExceeded(AllocationError):
    status = 403
    reason = "quota_exceeded"


class NoGpuAccess(AllocationError):
    status = 403
    reason = "no_gpu_access"


@dataclass(frozen=True)
class BusyGpu:
    """A GPU the user could have had, and who fills it (``holders``: user/server)."""

    gpu: Gpu
    used: int
    holders: tuple[str, ...]


class NotEnoughGpus(AllocationError):
    """Fewer GPUs free than asked for.

    ``message`` (and ``str(e)``) says how many are free and which are busy, without
    names; ``holders`` maps each busy GPU's uuid to the ``user`` or ``user/server``
    entries holding it, and ``detailed_message`` is the message with those names, for
    admins (or for everyone, if the lab's policy is to show who holds what).
    """

    status = 409
    reason = "not_enough_gpus"

    def __init__(self, message: str, requested: int, free: int, busy: Sequence[BusyGpu] = ()):
        super().__init__(message)
        self.requested = requested
        self.free = free
        self.busy = tuple(busy)
        self.holders: dict[str, tuple[str, ...]] = {b.gpu.uuid: b.holders for b in self.busy}

    @property
    def detailed_message(self) -> str:
        if not self.busy:
            return self.message
        who = "; ".join(f"{b.gpu.label()}: {', '.join(b.holders)}" for b in self.busy)
        return f"{self.message} Held by: {who}."


# ---------------------------------------------------------------- inventory


def _found(d: Any) -> tuple[str, int, str, str, str]:
    """(node, index, uuid, model, machine) from an (index, uuid, model) tuple, an
    nvml_discovery.DiscoveredGpu (node "": this host) or a :class:`Gpu` of a Swarm node."""
    if isinstance(d, tuple):
        return ("", *d, "")
    return getattr(d, "node", ""), d.index, d.uuid, d.model, getattr(d, "machine", "")


def resolve_inventory(
    config: GpusConfig,
    discovered: Iterable[Any] | None = None,
) -> tuple[list[Gpu], list[str]]:
    """The GPUs that can be leased, and warnings for the admin (the hub logs them).

    *discovered* is what NVML sees: :class:`gpulab.gpus.discovery.DiscoveredGpu`
    objects or (index, uuid, model) tuples; None = not looked (trust the file).
    With ``inventory: auto``
    every discovered GPU goes to pool ``default``. With an explicit inventory the file
    decides; if *discovered* is given, listed GPUs that are not present are left out
    (and warned about), as are present GPUs the file does not list. Reserved GPUs are
    included, marked ``reserved``. Pins that match no GPU are warned about.
    """
    found = sorted(_found(d) for d in discovered or ())
    warnings: list[str] = []
    gpus: list[Gpu] = []
    if config.auto:
        pool_of = {machine: p for p in config.pools.values() for machine in p.machines}
        gpus = [Gpu(i, u, m, pool.name, pool.mode, pool.max_users, node=n, machine=h)
                for n, i, u, m, h in found
                for pool in [pool_of.get(h, config.pools[DEFAULT_POOL])]]
        machines = sorted({h for *_, h in found if h})
        for p in config.pools.values():
            for machine in p.machines:
                if machine not in machines:
                    warnings.append(
                        f"{config.filename}: pools.{p.name}.machines: no machine "
                        f"{machine} lists GPUs"
                        + (f" (machines with GPUs: {', '.join(machines)})" if machines else
                           " (this hub is not on a Swarm, or no machine lists GPUs)"))
    else:
        present = {u: (i, m, n, h) for n, i, u, m, h in found}
        for e in config.gpus:
            if discovered is not None and e.uuid not in present:
                warnings.append(
                    f"{config.filename}:{e.line}: GPU {e.index} ({e.uuid}) is listed but not "
                    f"present on this host; it will not be given out"
                )
                continue
            pool = config.pools[e.pool]
            mode = e.mode or pool.mode
            max_users = 1 if mode == EXCLUSIVE else (e.max_users or pool.max_users)
            _, found_model, node, machine = present.get(e.uuid, (0, "", "", ""))
            gpus.append(Gpu(e.index, e.uuid, e.model or found_model, e.pool, mode, max_users,
                            e.reserved, node, machine))
            if discovered is not None and present[e.uuid][0] != e.index:
                warnings.append(
                    f"{config.filename}:{e.line}: GPU {e.uuid} is listed with index {e.index} "
                    f"but NVML reports index {present[e.uuid][0]}; check inventory"
                )
        listed = {e.uuid for e in config.gpus}
        for _n, i, u, m, _h in found:
            if u not in listed:
                warnings.append(
                    f"{config.filename}: GPU {i} ({m}, {u}) is present but not listed under "
                    f"inventory; it will not be given out"
                )
        gpus.sort(key=lambda g: (g.node, g.index))
    for pin in all_pins(config):
        if isinstance(pin.ref, int) and not pin.machine and any(g.node for g in gpus):
            warnings.append(
                f"{config.filename}:{pin.line}: pinned GPU {pin}: every machine has a GPU "
                f"{pin.ref}, so on several machines a pin names a GPU by UUID or as "
                f"MACHINE:{pin.ref}; this one is ignored"
            )
        elif not any(pin_matches(pin, g.index, g.uuid, g.machine) for g in gpus):
            warnings.append(
                f"{config.filename}:{pin.line}: pinned GPU {pin} is not available on this "
                f"host; users pinned to it get other GPUs"
            )
    return gpus, warnings


# ---------------------------------------------------------------- allocation


def _who(lease: Lease) -> str:
    return f"{lease.user}/{lease.server}" if lease.server else lease.user


def _count_of(count: Any) -> int | None:
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, int):
        raise InvalidRequest(f"The number of GPUs must be a whole number, got {count!r}.")
    if count < 0:
        raise InvalidRequest(f"The number of GPUs cannot be negative, got {count}.")
    return count


def _plural(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def allocate(
    config: GpusConfig,
    inventory: Sequence[Gpu],
    leases: Sequence[Lease],
    request: Request,
    policy: Policy | None = None,
) -> list[Gpu]:
    """The GPUs to give *request*'s server, or an :class:`AllocationError` saying why not.

    *leases* is every lease held now, including this server's own (which are not
    counted as busy, and are preferred so that a restart keeps its GPUs). The caller
    records the result with :func:`add_leases`, under the same lock it read *leases*
    with. *policy*: the user's, where the caller has it already (policy_for otherwise).
    """
    if policy is None:
        policy = policy_for(config, request.user, request.groups)
    asked = _count_of(request.count)
    if request.machine:
        inventory = on_machine(inventory, request.machine)
    if policy.no_gpu:
        if asked:
            raise NoGpuAccess(
                f"Your account has no GPU access; start the server with 0 GPUs, "
                f"or ask an admin for access ({config.filename})."
            )
        return []
    count = policy.gpus if asked is None else asked

    own = [le for le in leases if le.user == request.user and le.server == request.server]
    others = [le for le in leases if not (le.user == request.user and le.server == request.server)]
    elsewhere = [le for le in others if le.user == request.user]
    if count > policy.max_gpus:
        raise QuotaExceeded(
            f"You asked for {_plural(count)}; you may use at most {policy.max_gpus}."
        )
    if count + len(elsewhere) > policy.max_gpus:
        servers = sorted({le.server or "default" for le in elsewhere})
        raise QuotaExceeded(
            f"You asked for {_plural(count)}, but you already hold {len(elsewhere)} on "
            f"server(s) {', '.join(servers)} and may use at most {policy.max_gpus} in total. "
            f"Stop one of those servers or ask for fewer GPUs."
        )
    if count == 0:
        return []

    load = Counter(le.gpu_uuid for le in others)
    node_of = {g.uuid: g.node for g in inventory}
    node_load = Counter(node_of.get(le.gpu_uuid) for le in others)
    mine_elsewhere = {le.gpu_uuid for le in elsewhere}
    pinned_uuids = pinned_gpus(policy.pinned, inventory)
    by_uuid = {g.uuid: g for g in inventory}
    eligible = _eligibility(config, inventory, policy)

    def free(g: Gpu) -> bool:
        return load[g.uuid] < g.capacity

    candidates = [g for g in inventory if eligible(g)]
    ordered: list[Gpu] = []
    ordered += [by_uuid[le.gpu_uuid] for le in own if le.gpu_uuid in by_uuid]
    ordered += [by_uuid[u] for u in pinned_uuids]
    age = policy.max_server_age  # a booking after her server must stop anyway: no matter
    booked_from = {u: s for u, s in request.booked_from if not age or s < age}
    ordered += sorted(
        candidates,
        key=lambda g: (g.uuid in mine_elsewhere, -booked_from.get(g.uuid, math.inf),
                       load[g.uuid], node_load[g.node], g.index),
    )
    most = 0  # the most free GPUs any one machine had
    fits: list[list[Gpu]] = []  # per machine that can serve it, in the order above
    for node in dict.fromkeys(g.node for g in ordered):
        chosen: list[Gpu] = []
        for g in ordered:
            if len(chosen) == count:
                break
            if g.node == node and g not in chosen and eligible(g) and free(g):
                chosen.append(g)
        if len(chosen) == count:
            fits.append(chosen)
        most = max(most, len(chosen))
    if fits:  # the first machine, unless another needs fewer GPUs someone booked
        return min(fits, key=lambda gpus: sum(g.uuid in booked_from for g in gpus))
    raise _not_enough(config, policy, candidates, others, count, most)


def _eligibility(config: GpusConfig, inventory: Sequence[Gpu], policy: Policy):
    """Whether a GPU may go to the holder of *policy*: one she pins, or else one of her
    pools that is neither reserved nor pinned by anyone."""
    pinned_uuids = set(pinned_gpus(policy.pinned, inventory))
    pinned_by_anyone = set(pinned_gpus(all_pins(config), inventory))

    def eligible(g: Gpu) -> bool:
        if g.uuid in pinned_uuids:
            return True
        return not g.reserved and g.uuid not in pinned_by_anyone and g.pool in policy.pools

    return eligible


def on_machine(inventory: Sequence[Gpu], machine: str) -> list[Gpu]:
    """The GPUs of *machine*: its Swarm node ID, or its hostname (which a machine keeps
    when it leaves the Swarm and joins again, under a new ID)."""
    return [g for g in inventory if machine in (g.node, g.machine)]


def usable_gpus(config: GpusConfig, inventory: Sequence[Gpu], request: Request) -> list[Gpu]:
    """The GPUs of *inventory* that :func:`allocate` may ever give *request*'s user (busy
    or not): what a member waiting in line waits for (:mod:`gpulab.line.plan`)."""
    policy = policy_for(config, request.user, request.groups)
    if policy.no_gpu:
        return []
    if request.machine:
        inventory = on_machine(inventory, request.machine)
    eligible = _eligibility(config, inventory, policy)
    return [g for g in inventory if eligible(g)]


def pinned_gpus(pins: Iterable[Pin], inventory: Sequence[Gpu]) -> list[str]:
    """UUIDs of the inventory GPUs that *pins* name, in pin order."""
    out: list[str] = []
    for pin in pins:
        for g in inventory:
            # An index is a GPU of one host; across machines only a UUID is (see
            # resolve_inventory's warning).
            if isinstance(pin.ref, int) and not pin.machine and g.node:
                continue
            if pin_matches(pin, g.index, g.uuid, g.machine) and g.uuid not in out:
                out.append(g.uuid)
    return out


def _busy_text(b: BusyGpu) -> str:
    """``GPU 0 (A100) 1/1 in use``, and why when no member's server is the reason: the
    placeholder holders ``(booked by a member)``, ``(kept for a member waiting in
    line)``, which name nobody. A GPU held by a server and kept for a booking counts
    once."""
    why = sorted({h for h in b.holders if h.startswith("(")})
    return (f"{b.gpu.label()} {min(b.used, b.gpu.capacity)}/{b.gpu.capacity} in use"
            + "".join(f" {w}" for w in why))


def _not_enough(
    config: GpusConfig,
    policy: Policy,
    candidates: Sequence[Gpu],
    others: Sequence[Lease],
    count: int,
    free: int,
) -> NotEnoughGpus:
    if not candidates:
        pools = ", ".join(policy.pools) or "none"
        return NotEnoughGpus(
            f"You asked for {_plural(count)}, but no GPU is available to you on this host "
            f"(your pools: {pools}). Start the server with 0 GPUs, or ask an admin "
            f"({config.filename}).",
            requested=count,
            free=0,
        )
    if count > len(candidates):
        return NotEnoughGpus(
            f"You asked for {_plural(count)}, but only {_plural(len(candidates))} "
            f"{'is' if len(candidates) == 1 else 'are'} available to you on this host. "
            f"Ask for fewer GPUs.",
            requested=count,
            free=free,
        )
    holders: dict[str, list[str]] = {}
    for le in others:
        holders.setdefault(le.gpu_uuid, []).append(_who(le))
    busy = [
        BusyGpu(g, len(holders[g.uuid]), tuple(sorted(holders[g.uuid])))
        for g in candidates
        if g.uuid in holders and len(holders[g.uuid]) >= g.capacity
    ]
    listing = ", ".join(_busy_text(b) for b in busy)
    free_anywhere = len(candidates) - len(busy)
    if free_anywhere > free:  # enough in all, but split over machines
        return NotEnoughGpus(
            f"You asked for {_plural(count)}; {free_anywhere} of the GPUs available to you "
            f"are free, but at most {free} on any one machine, and a server's GPUs must "
            f"be in one machine. Ask for {free} or fewer, or try again when one is "
            f"released.",
            requested=count,
            free=free,
            busy=busy,
        )
    return NotEnoughGpus(
        f"You asked for {_plural(count)}, but only {free} of the {len(candidates)} GPUs "
        f"available to you {'is' if free == 1 else 'are'} free. Busy: {listing}. "
        f"Ask for fewer GPUs, or try again when one is released.",
        requested=count,
        free=free,
        busy=busy,
    )


def add_leases(
    leases: Sequence[Lease], request: Request, gpus: Sequence[Gpu], now: datetime
) -> list[Lease]:
    """*leases* with *request*'s server holding exactly *gpus* (a lease it already had on
    one of them keeps its ``since``)."""
    before = {le.gpu_uuid: le for le in leases
              if le.user == request.user and le.server == request.server}
    kept = release(leases, request.user, request.server)
    return kept + [before.get(g.uuid) or Lease(g.uuid, request.user, request.server, now)
                   for g in gpus]


def release(leases: Sequence[Lease], user: str, server: str = "") -> list[Lease]:
    """*leases* without those of *user*'s *server* (releasing nothing is not an error)."""
    return [le for le in leases if not (le.user == user and le.server == server)]


def reconcile(
    config: GpusConfig, inventory: Sequence[Gpu], leases: Sequence[Lease]
) -> tuple[list[Lease], list[Lease]]:
    """Split *leases* after a config reload (or a hub restart) into (kept, orphaned).

    Orphaned leases hold a GPU that will not be given to their holder again: it is no
    longer in the inventory, or it became ``reserved`` and the holder does not pin it
    (in ``users:``; a pin in any group counts, since group membership is not known
    here). The caller keeps both lists in its table, so that the GPU stays taken until
    the server stops and the user's quota still counts it, and logs the orphans.
    """
    by_uuid = {g.uuid: g for g in inventory}
    group_pins = pinned_gpus((p for g in config.groups for p in (g.pinned or ())), inventory)
    kept: list[Lease] = []
    orphaned: list[Lease] = []
    for le in leases:
        gpu = by_uuid.get(le.gpu_uuid)
        ok = gpu is not None
        if gpu is not None and gpu.reserved and gpu.uuid not in group_pins:
            own = user_override(config, le.user)
            ok = own is not None and gpu.uuid in pinned_gpus(own.pinned or (), inventory)
        (kept if ok else orphaned).append(le)
    return kept, orphaned


# ---------------------------------------------------------------- user input


_DIGITS = re.compile(r"[0-9]{1,6}")
# What user_options may hold (environment: checked by gpulab.environments; email, where
# she is told of her turn in line, by gpulab.mail).
OPTIONS = ("gpus", "wait", "environment", "email", "cpus", "memory", "job")


def wants_to_wait(raw: Any) -> bool:
    """Whether ``user_options`` ask to wait in line when the GPUs are not free:
    ``"wait": true`` (false or absent: no), or the spawn form's ticked box ("on");
    anything else raises :class:`InvalidRequest`."""
    if not isinstance(raw, Mapping):
        return False
    value = raw.get("wait", False)
    if value is None or isinstance(value, bool):
        return bool(value)
    if value == "on":  # an HTML checkbox
        return True
    raise InvalidRequest(f"\"wait\" must be true or false, got {value!r}.")


def validate_user_options(raw: Any, max_gpus: int) -> int | None:
    """The GPU count asked for in JupyterHub ``user_options``, or None for the default.

    ``user_options`` comes from the spawn form or straight from the REST API, so
    nothing in it is trusted: ``gpus`` is a whole number from 0 to *max_gpus* (a
    string of digits from an HTML form is accepted; ``null`` means the default), and
    ``wait`` is checked by :func:`wants_to_wait`. Anything else raises
    :class:`InvalidRequest`, or :class:`QuotaExceeded` for a sensible number above
    *max_gpus*.
    """
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise InvalidRequest(
            f"Server options must be an object such as {{\"gpus\": 1}}, got {type(raw).__name__}."
        )
    unknown = sorted(str(k) for k in raw if k not in OPTIONS)
    if unknown:
        raise InvalidRequest(
            f"Unknown server option(s): {', '.join(unknown)}. The options are "
            f"\"gpus\": the number of GPUs (0 to {max_gpus}; GPUs are chosen by the hub), "
            f"\"wait\": true to wait in line when they are not free, \"email\": where "
            f"you are told when your turn in line comes, \"environment\": the name of "
            f"one of the lab's environments, \"cpus\" and \"memory\" (such as 2 and "
            f"\"8g\"): fewer than your GPUs bring, and \"job\": a command a named server "
            f"runs and ends with."
        )
    wants_to_wait(raw)
    value = raw.get("gpus")
    if value is None:
        return None
    wanted = f"a whole number from 0 to {max_gpus}"
    if isinstance(value, str):
        if not _DIGITS.fullmatch(value.strip()):
            raise InvalidRequest(f"\"gpus\" must be {wanted}, got {value!r}.")
        value = int(value.strip())
    elif isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"\"gpus\" must be {wanted}, got {value!r}.")
    if value < 0 or value > MAX_GPUS_LIMIT:
        raise InvalidRequest(f"\"gpus\" must be {wanted}, got {value}.")
    if value > max_gpus:
        raise QuotaExceeded(
            f"You asked for {_plural(value)}; you may use at most {max_gpus}."
        )
    return value


# ---------------------------------------------------------------- restart


_HOLDING_STATES = {"running", "created", "restarting", "paused"}


def leases_from_labels(containers: Iterable[Mapping[str, Any]]) -> list[Lease]:
    """Leases held by containers, from their gpulab labels (docker's ``containers()``
    output: ``{"Labels": {...}, "Created": epoch_seconds, "State": "running"}``).

    Containers without a user label, without GPUs, or exited/dead are skipped; a
    missing ``State`` counts as running (``containers()`` without ``all=True`` lists
    only running ones). Sorted by (since, user, server, GPU order) for determinism.
    """
    out: dict[tuple[str, str, str], Lease] = {}
    for c in containers:
        user, server, gpus = label_claims(c)
        if not user or str(c.get("State", "running")).lower() not in _HOLDING_STATES:
            continue
        created = c.get("Created")
        since = datetime.fromtimestamp(
            created if isinstance(created, int | float) else 0, tz=UTC
        )
        for uuid in gpus:
            out.setdefault((uuid, user, server), Lease(uuid, user, server, since))
    return sorted(out.values(), key=lambda le: (le.since, le.user, le.server))

