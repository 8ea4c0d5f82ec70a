"""The admin's GPU allocation file (``config/gpus.yaml``): which GPUs, shared how, for whom.

Parsed once into frozen dataclasses by :func:`gpus_config_from_yaml`; anything wrong is
a :class:`~gpulab.yamlfile.ConfigError` naming the file, line and field and saying what
is allowed. This module only reads and checks the file, and its dataclasses are data:
what one user may have (the precedence below) is :mod:`gpulab.gpus.policy`'s, which GPU
they get :mod:`gpulab.gpus.allocator`'s.

Schema (every key optional; an empty or missing file means the defaults)::

    inventory: auto            # or a list of GPUs, see below
    pools:                     # named pools; "default" exists even when not listed
      <name>: {mode: exclusive | shared, max_users: N, description: "...",
               machines: [<hostname>, ...]}   # a Swarm's machines whose GPUs are here
    defaults:                  # what every user gets
      gpus: 0                  # GPUs given when the user does not choose (default 0)
      max_gpus: 1              # most GPUs one user may hold, all servers together
      max_servers: 2           # most servers one user may run at once (her default one
                               # and named ones, e.g. "writing" beside "train"); 1: one
      pools: [<pool>, ...]     # pools users may draw from (default: all pools)
      gpu_idle_timeout: 2h     # stop a server whose GPUs sat idle this long (0: never)
      max_server_age: 0        # stop a server holding GPUs this long after its start
      budget: none             # or {gpu_hours: 100, per: week | month, enforce: soft | hard}
                               # (a group's, with shared: true, its members' together)
    groups:                    # JupyterHub groups; see "precedence" below
      <group>: {gpus, max_gpus, max_servers, pinned, pools, no_gpu, gpu_idle_timeout,
                max_server_age, line_priority, budget}
                               # line_priority: higher goes first in line (0)
    users:                     # one user's own settings win over everything else
      <user>: {the same keys as groups}
    culling:                   # how idle GPUs are found (gpulab.culler)
      idle_below: 5            # percent utilization under which a GPU counts as idle
      warn_before: 15m         # members are warned this long before their server stops
      check_every: 1m
    line:                      # members waiting for GPUs (gpulab.line)
      claim_window: 10m        # a server started for the member at the head of the line
                               # is stopped if she does not open it within this time
                               # of it being up
      order: first_come        # or fair_share: those who used fewer GPU-hours lately first
      half_life: 7d            # fair_share: GPU-hours this long ago count half
      max_wait: 1d             # fair_share: after this long in line, her GPU-hours no
                               # longer count against her (0: they always do)
      alert_after: 30m         # operators are alerted when someone has waited this long
                               # while a GPU sat idle (GpulabWaitingWhileGpuIdle); 0: never

An explicit inventory entry is ``{index, uuid, model?, pool?, mode?, max_users?,
reserved?}``: ``index`` and ``uuid`` as ``nvidia-smi -L`` prints them; a GPU left out
of the list is never given to anyone; ``reserved: true`` keeps a GPU for the users and
groups that pin it. A GPU in MIG mode is listed as its MIG devices: each its own entry,
its ``MIG-...`` uuid under its GPU's index (as ``nvidia-smi -L`` shows them).

How ``defaults:``, a user's ``groups:`` and their own ``users:`` entry combine is
:mod:`gpulab.gpus.policy`'s (its docstring: precedence).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulab.contract import GPU_UUID, MAX_PROJECTS, PROJECT_NAME
from gpulab.settings import parse_bool, parse_duration
from gpulab.sizes import RESOURCE_CHECKS, RESOURCE_KEYS, base_above_cap
from gpulab.yamlfile import ConfigError, LocatedYaml, Path_, dotted, parse_yaml, read_yaml

__all__ = [
    "ConfigError",
    "Budget",
    "Culling",
    "FAIR_SHARE",
    "FIRST_COME",
    "Line",
    "DEFAULT_POOL",
    "EXCLUSIVE",
    "GpuEntry",
    "GpusConfig",
    "DEFAULT_GPU_IDLE_TIMEOUT",
    "DEFAULT_MAX_SERVER_AGE",
    "MAX_GPUS_LIMIT",
    "LIMIT_KEYS",
    "RESOURCE_KEYS",
    "Override",
    "Pin",
    "Pool",
    "SHARED",
    "gpus_config_from_yaml",
    "load_gpus_config",
    "parse_gpus_config",
]

EXCLUSIVE = "exclusive"
SHARED = "shared"
MODES = (EXCLUSIVE, SHARED)
DEFAULT_POOL = "default"
# Upper bound for any GPU count in the file or in a request: far above any real host,
# low enough that a typo (1000 instead of 10) is caught.
MAX_GPUS_LIMIT = 64
MAX_USERS_LIMIT = 1024

_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
_MACHINE_PIN = re.compile(rf"(?P<machine>{_HOSTNAME.pattern}):(?P<index>[0-9]{{1,3}})")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

_TOP_KEYS = ("inventory", "pools", "defaults", "groups", "users", "culling", "line",
             "bookings")
_POOL_KEYS = ("mode", "max_users", "description", "machines")
_GPU_KEYS = ("index", "uuid", "model", "pool", "mode", "max_users", "reserved")
# Per-user time limits, set in defaults:, groups: and users: alike.
LIMIT_KEYS = ("gpu_idle_timeout", "max_server_age")
# A server's CPUs and memory (gpulab.sizes), set in defaults:, groups: and users: alike.
_DEFAULT_KEYS = ("gpus", "max_gpus", "max_servers", "pools", *LIMIT_KEYS, "budget", *RESOURCE_KEYS)
_OVERRIDE_KEYS = ("gpus", "max_gpus", "max_servers", "pinned", "pools", "no_gpu", *LIMIT_KEYS,
                  "line_priority", "budget", *RESOURCE_KEYS)
_BUDGET_KEYS = ("gpu_hours", "per", "enforce", "shared")
WEEK, MONTH = "week", "month"  # a budget's period (UTC: from Monday 00:00, from the 1st)
SOFT, HARD = "soft", "hard"  # spent: she waits behind the others in line / GPUs refused
_CULLING_KEYS = ("idle_below", "warn_before", "check_every")
_LINE_KEYS = ("claim_window", "order", "half_life", "max_wait", "alert_after")
_BOOKINGS_KEYS = ("max_length", "max_ahead", "max_gpus")
FIRST_COME, FAIR_SHARE = "first_come", "fair_share"  # line.order

# Where the file says nothing: a GPU idle for 2 hours comes back; servers may run for ever;
# a member may run two servers at once (a notebook for writing beside a training server).
DEFAULT_GPU_IDLE_TIMEOUT = 2 * 3600
DEFAULT_MAX_SERVER_AGE = 0
DEFAULT_MAX_SERVERS = 2
MAX_SERVERS_LIMIT = 100


# ---------------------------------------------------------------- the parsed file


@dataclass(frozen=True)
class Pool:
    name: str
    mode: str = EXCLUSIVE
    max_users: int = 1  # users per GPU; always 1 for exclusive
    description: str = ""
    # On a Swarm with `inventory: auto`: the machines (hostnames) whose GPUs are in this
    # pool; the GPUs of a machine no pool names are in pool "default".
    machines: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuEntry:
    """One GPU of an explicit inventory, as declared (mode/max_users None = the pool's)."""

    index: int
    uuid: str
    model: str = ""
    pool: str = DEFAULT_POOL
    mode: str | None = None
    max_users: int | None = None
    reserved: bool = False
    line: int | None = None


@dataclass(frozen=True)
class Pin:
    """A pinned GPU: its uuid or its NVML index, and where the file says so (which GPU
    of an inventory it names: :func:`gpulab.gpus.policy.pin_matches`)."""

    ref: int | str
    line: int | None = None
    machine: str = ""  # "gpu-server-2:0": index 0 of that machine (a Swarm)

    def __str__(self) -> str:
        if self.machine:
            return f"{self.machine}:{self.ref}"
        return self.ref if isinstance(self.ref, str) else f"index {self.ref}"


@dataclass(frozen=True)
class Budget:
    """GPU-hours a member may use per week or month (each member's own, also when set
    for a group, unless the group's is ``shared``: then its members' use together counts
    against it); what happens once they are spent: ``soft``, she goes behind everyone
    within their budget in line; ``hard``, she gets no GPU until the next period."""

    gpu_hours: float
    per: str = "month"  # WEEK or MONTH
    enforce: str = "soft"  # SOFT or HARD
    shared_by: str = ""  # a group whose members share these GPU-hours; "": her own

    @property
    def per_day(self) -> float:
        return self.gpu_hours / (7 if self.per == WEEK else 30)


@dataclass(frozen=True)
class Override:
    """A ``groups:`` or ``users:`` entry; None = not set there."""

    name: str
    gpus: int | None = None
    max_gpus: int | None = None
    max_servers: int | None = None
    pinned: tuple[Pin, ...] | None = None
    pools: tuple[str, ...] | None = None
    no_gpu: bool | None = None
    gpu_idle_timeout: int | None = None  # seconds; 0 = never
    max_server_age: int | None = None  # seconds; 0 = never
    line_priority: int | None = None  # higher goes first in line (gpulab.line.order)
    budget: Budget | None = None
    no_budget: bool = False  # ``budget: none``: her own entry lifts her groups' budget
    # the RESOURCE_KEYS set here: CPUs (a number), memory (bytes)
    resources: Mapping[str, float] = field(default_factory=dict)
    projects: tuple[str, ...] = ()  # a group's project folders (gpulab.contract)
    line: int | None = None



@dataclass(frozen=True)
class Culling:
    """How the GPU culler finds idle GPUs (``culling:``); who is culled when is in
    each user's :class:`gpulab.gpus.policy.Policy`."""

    idle_below: float = 0.05  # utilization ratio (the file says percent) under which a GPU is idle
    warn_before: int = 15 * 60  # seconds between the warning and the stop
    check_every: int = 60  # seconds between the culler's checks


@dataclass(frozen=True)
class Line:
    """Members waiting in line for GPUs (``line:``, :mod:`gpulab.line`)."""

    # seconds the member at the head has to open the server started for her
    claim_window: int = 10 * 60
    order: str = "first_come"  # or "fair_share" (gpulab.line.order)
    half_life: int = 7 * 86400  # fair_share: seconds after which GPU-hours count half
    # fair_share: seconds in line after which her GPU-hours count as none; 0: never
    max_wait: int = 86400
    # seconds someone may wait while a GPU sits idle before operators are alerted; 0: never
    alert_after: int = 30 * 60


@dataclass(frozen=True)
class Bookings:
    """Members booking GPUs for a time window (``bookings:``, :mod:`gpulab.bookings`)."""

    max_length: int = 8 * 3600  # seconds a booking may last at most; 0: no bookings
    max_ahead: int = 14 * 86400  # seconds ahead a booking may start at most
    max_gpus: int = 0  # GPUs one booking may take at most; 0: the member's max_gpus


@dataclass(frozen=True)
class GpusConfig:
    filename: str = "<defaults>"
    auto: bool = True  # inventory: auto (NVML discovery) vs the explicit list below
    gpus: tuple[GpuEntry, ...] = ()
    pools: Mapping[str, Pool] = field(default_factory=lambda: {DEFAULT_POOL: Pool(DEFAULT_POOL)})
    default_gpus: int = 0
    default_max_gpus: int = 1
    default_max_servers: int = DEFAULT_MAX_SERVERS
    default_pools: tuple[str, ...] | None = None  # None = every pool
    groups: tuple[Override, ...] = ()
    users: tuple[Override, ...] = ()
    default_gpu_idle_timeout: int = DEFAULT_GPU_IDLE_TIMEOUT
    default_max_server_age: int = DEFAULT_MAX_SERVER_AGE
    default_budget: Budget | None = None
    # the RESOURCE_KEYS defaults: sets; unset, gpulab.yaml's spawn.cpu_limit and
    # spawn.mem_limit, and nothing per GPU
    default_resources: Mapping[str, float] = field(default_factory=dict)
    culling: Culling = field(default_factory=Culling)
    line: Line = field(default_factory=Line)
    bookings: Bookings = field(default_factory=Bookings)


def _union(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


# ---------------------------------------------------------------- value checks
# Each raises ValueError with a message saying what is allowed; the caller adds file:line.


def _gpu_count(value: Any, what: str = "a number of GPUs") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GPUS_LIMIT:
        raise ValueError(
            f"expected {what}, a whole number from 0 to {MAX_GPUS_LIMIT}, got {value!r}"
        )
    return value


def _server_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (
            1 <= value <= MAX_SERVERS_LIMIT):
        raise ValueError(f"expected a number of servers run at once, a whole number from 1 "
                         f"(her default server only) to {MAX_SERVERS_LIMIT}, got {value!r}")
    return value


def _resources(r: _Reader, path: Path_, body: Mapping[str, Any]) -> dict[str, float]:
    """The RESOURCE_KEYS *body* sets, checked; a base above its own cap is refused."""
    out = {key: r.check(path + (key,), RESOURCE_CHECKS[key], body[key])
           for key in RESOURCE_KEYS if key in body}
    base = base_above_cap(out)
    if base is not None:
        cap = f"max_{base}"
        raise r.doc.error(path + (base,), f"{base}: {body[base]} is more than "
                                          f"{cap}: {body[cap]} here")
    return out


def _max_users(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_USERS_LIMIT:
        raise ValueError(
            f"expected the number of users who may share one GPU, a whole number from 1 "
            f"to {MAX_USERS_LIMIT}, got {value!r}"
        )
    return value


def _mode(value: Any) -> str:
    if value not in MODES:
        raise ValueError(f"expected one of {', '.join(MODES)}, got {value!r}")
    return value



def _name(value: Any, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"expected {what}, got {value!r}")
    s = str(value)
    if not _NAME.fullmatch(s):
        raise ValueError(
            f"expected {what} made of letters, digits, '_', '.' and '-', got {value!r}"
        )
    return s


def _list(value: Any) -> list:
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {value!r}")
    return value


def _machine(value: Any) -> str:
    if not isinstance(value, str) or not _HOSTNAME.fullmatch(value):
        raise ValueError(f"expected a machine's hostname as `docker node ls` shows it, "
                         f"got {value!r}")
    return value


def _uuid(value: Any) -> str:
    if not isinstance(value, str) or not GPU_UUID.fullmatch(value.strip()):
        raise ValueError(
            f"expected a GPU UUID as `nvidia-smi -L` prints it (GPU-xxxxxxxx-... or "
            f"MIG-...), got {value!r}"
        )
    return value.strip()


def _percent(value: Any) -> float:
    """``5`` or ``"5%"`` -> 0.05."""
    number = value
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            number = float(value.strip()[:-1])
        except ValueError:
            number = value
    if isinstance(number, bool) or not isinstance(number, int | float) or not 0 < number < 100:
        raise ValueError(f"expected a percentage of GPU utilization above 0 and under 100 "
                         f"(for example 5 or 5%), got {value!r}")
    return number / 100


def _seconds(value: Any, zero_means: str = "never") -> int:
    try:
        return parse_duration(value)
    except ValueError as e:
        raise ValueError(f"{e} (0 means {zero_means})") from None


def _positive_seconds(value: Any) -> int:
    seconds = parse_duration(value)
    if seconds == 0:
        raise ValueError(f"expected a duration above 0 such as 30s or 1m, got {value!r}")
    return seconds


def _index(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"expected the GPU's index as `nvidia-smi -L` prints it (0, 1, ...), got {value!r}"
        )
    return value


# ---------------------------------------------------------------- the parser


class _Reader:
    """Walks a LocatedYaml, turning ValueError into ConfigError at the right line."""

    def __init__(self, doc: LocatedYaml):
        self.doc = doc

    def check(self, path: Path_, parse, value: Any):
        try:
            return parse(value)
        except ValueError as e:
            raise self.doc.error(path, str(e)) from None

    def mapping(
        self, path: Path_, value: Any, allowed: Sequence[str] | None, what: str
    ) -> dict:
        """*value* as a dict (None = empty) whose keys are in *allowed* (None = any)."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.doc.error(path, f"expected {what}, got {value!r}")
        for key in value:
            if allowed is not None and str(key) not in allowed:
                raise self.doc.error(
                    path + (str(key),), _unknown_key(str(key), allowed, path)
                )
        return value

    def pool_list(self, path: Path_, value: Any, pools: Mapping[str, Pool]) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value:
            raise self.doc.error(path, f"expected a list of pool names, got {value!r}")
        for i, name in enumerate(value):
            self.known_pool(path + (i,), name, pools)
        return _union(value)

    def known_pool(self, path: Path_, name: Any, pools: Mapping[str, Pool]) -> str:
        if name not in pools:
            raise self.doc.error(path, _unknown_pool(name, pools))
        return name


def _unknown_key(key: str, allowed: Sequence[str], parent: Path_) -> str:
    close = difflib.get_close_matches(key, list(allowed), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    where = f"{dotted(parent)}" if parent else "the top level"
    return f"unknown key; {hint}allowed at {where}: {', '.join(allowed)}"


def _unknown_pool(name: Any, pools: Mapping[str, Pool]) -> str:
    close = difflib.get_close_matches(str(name), list(pools), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return (
        f"unknown pool {name!r}; {hint}pools declared under pools: "
        f"{', '.join(sorted(pools))}"
    )


def gpus_config_from_yaml(doc: LocatedYaml) -> GpusConfig:
    """Validate a parsed ``gpus.yaml``; raise ConfigError at the first problem."""
    r = _Reader(doc)
    top = r.mapping((), doc.data, _TOP_KEYS, "a mapping with inventory:, pools:, defaults:, "
                    "groups: and users: at the top level")

    # pools first: everything else refers to them
    pools: dict[str, Pool] = {DEFAULT_POOL: Pool(DEFAULT_POOL)}
    raw_pools = r.mapping(("pools",), top.get("pools"), None,
                          "a mapping of pool name -> {mode, max_users}")
    for raw_name, body in raw_pools.items():
        path: Path_ = ("pools", str(raw_name))
        name = r.check(path, lambda v: _name(v, "a pool name"), raw_name)
        body = r.mapping(path, body, _POOL_KEYS, "a mapping with mode:, max_users:, "
                         "description: and machines:")
        pools[name] = _pool(r, path, name, body)

    owner: dict[str, str] = {}
    for pool in pools.values():
        for i, machine in enumerate(pool.machines):
            if machine in owner:
                raise doc.error(("pools", pool.name, "machines", i),
                                f"machine {machine} is in pool {owner[machine]} already; "
                                f"a machine's GPUs are in one pool")
            owner[machine] = pool.name

    # inventory
    raw_inv = top.get("inventory", "auto")
    auto = raw_inv == "auto"
    if owner and not auto:
        name = owner[next(iter(owner))]
        raise doc.error(("pools", name, "machines"),
                        "machines: is for `inventory: auto`; an explicit inventory gives "
                        "each GPU its pool (pool: on its entry)")
    gpus: tuple[GpuEntry, ...] = ()
    if not auto:
        if not isinstance(raw_inv, list):
            raise doc.error(
                ("inventory",),
                f"expected `auto` (discover GPUs with NVML) or a list of GPUs "
                f"({{index, uuid, model, pool, mode, max_users, reserved}}), got {raw_inv!r}",
            )
        gpus = _inventory(r, raw_inv, pools)

    # defaults
    d = r.mapping(("defaults",), top.get("defaults"), _DEFAULT_KEYS,
                  "a mapping with gpus:, max_gpus:, max_servers:, pools:, "
                  "gpu_idle_timeout:, max_server_age:, budget:, cpus:, memory: and their "
                  "_per_gpu and max_")
    default_gpus = r.check(("defaults", "gpus"), _gpu_count, d.get("gpus", 0))
    default_max = r.check(("defaults", "max_gpus"), _gpu_count, d.get("max_gpus", 1))
    if default_gpus > default_max:
        raise doc.error(
            ("defaults", "gpus"),
            f"default of {default_gpus} GPUs is more than defaults.max_gpus ({default_max}); "
            f"lower gpus or raise max_gpus",
        )
    default_servers = r.check(("defaults", "max_servers"), _server_count,
                              d.get("max_servers", DEFAULT_MAX_SERVERS))
    default_pools = (
        r.pool_list(("defaults", "pools"), d["pools"], pools) if "pools" in d else None
    )
    default_idle = r.check(("defaults", "gpu_idle_timeout"), _seconds,
                           d.get("gpu_idle_timeout", DEFAULT_GPU_IDLE_TIMEOUT))
    default_age = r.check(("defaults", "max_server_age"), _seconds,
                          d.get("max_server_age", DEFAULT_MAX_SERVER_AGE))
    default_budget = _budget(r, ("defaults", "budget"), d.get("budget"))
    default_resources = _resources(r, ("defaults",), d)
    culling = _culling(r, top.get("culling"))
    line = _line(r, top.get("line"))
    bookings = _bookings(r, top.get("bookings"))

    groups = _overrides(r, "groups", top.get("groups"), pools, gpus, auto, lower=False)
    users = _overrides(r, "users", top.get("users"), pools, gpus, auto, lower=True)
    return GpusConfig(
        filename=doc.filename,
        auto=auto,
        gpus=gpus,
        pools=pools,
        default_gpus=default_gpus,
        default_max_gpus=default_max,
        default_max_servers=default_servers,
        default_pools=default_pools,
        groups=groups,
        users=users,
        default_gpu_idle_timeout=default_idle,
        default_max_server_age=default_age,
        default_budget=default_budget,
        default_resources=default_resources,
        culling=culling,
        line=line,
        bookings=bookings,
    )


def _culling(r: _Reader, raw: Any) -> Culling:
    path: Path_ = ("culling",)
    body = r.mapping(path, raw, _CULLING_KEYS,
                     "a mapping with idle_below:, warn_before: and check_every:")
    default = Culling()
    return Culling(
        idle_below=r.check(path + ("idle_below",), _percent, body["idle_below"])
        if "idle_below" in body else default.idle_below,
        warn_before=r.check(path + ("warn_before",), lambda v: _seconds(v, "no warning"),
                            body.get("warn_before", default.warn_before)),
        check_every=r.check(path + ("check_every",), _positive_seconds,
                            body.get("check_every", default.check_every)),
    )


def _line(r: _Reader, raw: Any) -> Line:
    path: Path_ = ("line",)
    body = r.mapping(path, raw, _LINE_KEYS,
                     "a mapping with claim_window:, order:, half_life:, max_wait: and "
                     "alert_after:")
    default = Line()
    return Line(
        claim_window=r.check(path + ("claim_window",), _positive_seconds,
                             body.get("claim_window", default.claim_window)),
        order=r.check(path + ("order",), _order, body.get("order", default.order)),
        half_life=r.check(path + ("half_life",), _positive_seconds,
                          body.get("half_life", default.half_life)),
        max_wait=r.check(path + ("max_wait",), _seconds,
                         body.get("max_wait", default.max_wait)),
        alert_after=r.check(path + ("alert_after",), _seconds,
                            body.get("alert_after", default.alert_after)),
    )


def _bookings(r: _Reader, raw: Any) -> Bookings:
    path: Path_ = ("bookings",)
    body = r.mapping(path, raw, _BOOKINGS_KEYS,
                     "a mapping with max_length:, max_ahead: and max_gpus:")
    default = Bookings()
    return Bookings(
        max_length=r.check(path + ("max_length",), lambda v: _seconds(v, "no bookings"),
                           body.get("max_length", default.max_length)),
        max_ahead=r.check(path + ("max_ahead",), _positive_seconds,
                          body.get("max_ahead", default.max_ahead)),
        max_gpus=r.check(path + ("max_gpus",), _gpu_count, body.get("max_gpus", default.max_gpus)),
    )


def _budget(r: _Reader, path: Path_, raw: Any, group: str = "") -> Budget | None:
    """``budget:``: None for ``none`` (or absent), else a :class:`Budget`; *group*: the
    group it is set for, which ``shared: true`` makes its members share."""
    if raw is None or raw == "none":
        return None
    body = r.mapping(path, raw, _BUDGET_KEYS,
                     "none, or a mapping with gpu_hours:, per: (week or month), "
                     "enforce: (soft or hard) and, for a group, shared: (true or false)")
    if "gpu_hours" not in body:
        raise r.doc.error(path, "a budget needs gpu_hours: (GPU-hours per period)")
    shared = r.check(path + ("shared",), parse_bool, body.get("shared", False))
    if shared and not group:
        raise r.doc.error(path + ("shared",), "only a group's budget can be shared "
                                              "(its members' GPU-hours together)")
    return Budget(
        gpu_hours=r.check(path + ("gpu_hours",), _hours, body["gpu_hours"]),
        per=r.check(path + ("per",), _one_of(WEEK, MONTH), body.get("per", MONTH)),
        enforce=r.check(path + ("enforce",), _one_of(SOFT, HARD), body.get("enforce", SOFT)),
        shared_by=group if shared else "",
    )


def _hours(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"expected GPU-hours, a number of 0 or more, got {value!r}")
    return float(value)


def _one_of(*allowed: str):
    def check(value: Any) -> str:
        if value not in allowed:
            raise ValueError(f"expected {' or '.join(allowed)}, got {value!r}")
        return value
    return check


def _order(value: Any) -> str:
    if value not in (FIRST_COME, FAIR_SHARE):
        raise ValueError(f"expected {FIRST_COME} or {FAIR_SHARE}, got {value!r}")
    return value


def _priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -100 <= value <= 100:
        raise ValueError(f"expected a whole number from -100 to 100 (higher goes first in "
                         f"line; default 0), got {value!r}")
    return value


def _pool(r: _Reader, path: Path_, name: str, body: dict) -> Pool:
    mode = r.check(path + ("mode",), _mode, body.get("mode", EXCLUSIVE))
    description = str(body.get("description") or "")
    if "max_users" in body:
        max_users = r.check(path + ("max_users",), _max_users, body["max_users"])
        if mode == EXCLUSIVE and max_users != 1:
            raise r.doc.error(
                path + ("max_users",),
                f"max_users: {max_users} needs mode: shared (an exclusive GPU has one user)",
            )
    elif mode == SHARED:
        raise r.doc.error(
            path + ("mode",),
            "mode: shared needs max_users: N (how many users may share each GPU)",
        )
    else:
        max_users = 1
    machines: tuple[str, ...] = ()
    if "machines" in body:
        machines = tuple(r.check(path + ("machines", i), _machine, m)
                         for i, m in enumerate(r.check(path + ("machines",), _list,
                                                       body["machines"])))
    return Pool(name, mode, max_users, description, machines)


def _inventory(r: _Reader, raw: list, pools: Mapping[str, Pool]) -> tuple[GpuEntry, ...]:
    doc = r.doc
    out: list[GpuEntry] = []
    seen_index: dict[int, tuple[int | None, bool]] = {}  # index -> (first line, a MIG device)
    seen_uuid: dict[str, int | None] = {}
    for i, item in enumerate(raw):
        path: Path_ = ("inventory", i)
        body = r.mapping(path, item, _GPU_KEYS,
                         "a GPU: {index, uuid, model, pool, mode, max_users, reserved}")
        for required in ("index", "uuid"):
            if required not in body:
                raise doc.error(path, f"missing {required}: (as `nvidia-smi -L` prints it)")
        index = r.check(path + ("index",), _index, body["index"])
        uuid = r.check(path + ("uuid",), _uuid, body["uuid"])
        line = doc.line_of(path)
        # MIG devices share their GPU's index (nvidia-smi -L lists them under it); a GPU
        # in MIG mode is leased as its MIG devices, never whole beside them.
        mig = uuid.startswith("MIG-")
        if index in seen_index and not (mig and seen_index[index][1]):
            first, first_mig = seen_index[index]
            raise doc.error(path + ("index",), (
                f"index {index} is listed twice (first on line {first})" if mig == first_mig
                else f"index {index} is listed as a whole GPU and as a MIG device (first on "
                     f"line {first}): a GPU in MIG mode is given out as its MIG devices "
                     f"(MIG-... UUIDs under its index), not whole"))
        if uuid in seen_uuid:
            raise doc.error(path + ("uuid",),
                            f"uuid {uuid} is listed twice (first on line {seen_uuid[uuid]})")
        seen_index.setdefault(index, (line, mig))
        seen_uuid[uuid] = line
        model = body.get("model", "")
        if not isinstance(model, str):
            raise doc.error(path + ("model",), f"expected the model name as text, got {model!r}")
        pool = r.known_pool(path + ("pool",), body.get("pool", DEFAULT_POOL), pools)
        mode = r.check(path + ("mode",), _mode, body["mode"]) if "mode" in body else None
        max_users = (
            r.check(path + ("max_users",), _max_users, body["max_users"])
            if "max_users" in body else None
        )
        effective_mode = mode or pools[pool].mode
        if effective_mode == EXCLUSIVE and max_users not in (None, 1):
            raise doc.error(
                path + ("max_users",),
                f"max_users: {max_users} needs mode: shared (this GPU is exclusive"
                f"{'' if mode else f' through pool {pool}'})",
            )
        if mode == SHARED and max_users is None and pools[pool].mode != SHARED:
            raise doc.error(
                path + ("mode",),
                "mode: shared needs max_users: N (how many users may share this GPU)",
            )
        reserved = r.check(path + ("reserved",), parse_bool, body.get("reserved", False))
        out.append(GpuEntry(index, uuid, model.strip(), pool, mode, max_users, reserved, line))
    return tuple(out)


def _overrides(
    r: _Reader,
    section: str,
    raw: Any,
    pools: Mapping[str, Pool],
    gpus: Sequence[GpuEntry],
    auto: bool,
    lower: bool,
) -> tuple[Override, ...]:
    doc = r.doc
    entries = r.mapping((section,), raw, None, f"a mapping of {section[:-1]} name -> settings")
    out: list[Override] = []
    seen: dict[str, int | None] = {}
    for raw_name, body in entries.items():
        path: Path_ = (section, str(raw_name))
        if isinstance(raw_name, bool) or not isinstance(raw_name, str | int) or not str(raw_name):
            raise doc.error(path, f"expected a {section[:-1]} name, got {raw_name!r}")
        name = str(raw_name).lower() if lower else str(raw_name)
        if name in seen:
            raise doc.error(path, f"{section[:-1]} {name!r} is listed twice (first on line "
                                  f"{seen[name]}; usernames are not case-sensitive)")
        seen[name] = doc.line_of(path)
        group = section == "groups"
        if not group and isinstance(body, Mapping) and "projects" in body:
            raise doc.error(path + ("projects",), "projects are a group's (groups: NAME: "
                                                  "{projects: [...]}): a member has those "
                                                  "of her groups")
        body = r.mapping(path, body, (*_OVERRIDE_KEYS, "projects") if group else _OVERRIDE_KEYS,
                         "a mapping with gpus:, max_gpus:, max_servers:, pinned:, "
                         "pools:, no_gpu:, "
                         "gpu_idle_timeout:, max_server_age:, line_priority:, budget:, "
                         "cpus: or memory: (and their _per_gpu and max_)"
                         + (", or projects:" if group else ""))
        o = Override(
            name=name,
            gpus=r.check(path + ("gpus",), _gpu_count, body["gpus"]) if "gpus" in body else None,
            max_gpus=(r.check(path + ("max_gpus",), _gpu_count, body["max_gpus"])
                      if "max_gpus" in body else None),
            max_servers=(r.check(path + ("max_servers",), _server_count, body["max_servers"])
                         if "max_servers" in body else None),
            pinned=_pins(r, path + ("pinned",), body["pinned"], gpus, auto)
            if "pinned" in body else None,
            pools=r.pool_list(path + ("pools",), body["pools"], pools)
            if "pools" in body else None,
            no_gpu=(r.check(path + ("no_gpu",), parse_bool, body["no_gpu"])
                    if "no_gpu" in body else None),
            **{key: r.check(path + (key,), _seconds, body[key])
               for key in LIMIT_KEYS if key in body},
            line_priority=(r.check(path + ("line_priority",), _priority, body["line_priority"])
                           if "line_priority" in body else None),
            budget=_budget(r, path + ("budget",), body.get("budget"),
                           name if section == "groups" else ""),
            no_budget="budget" in body and body["budget"] in (None, "none"),
            resources=_resources(r, path, body),
            projects=_projects(r, path + ("projects",), body["projects"])
            if "projects" in body else (),
            line=doc.line_of(path),
        )
        if o.gpus is not None and o.max_gpus is not None and o.gpus > o.max_gpus:
            raise doc.error(path + ("gpus",),
                            f"gpus: {o.gpus} is more than max_gpus: {o.max_gpus} here")
        if o.pinned and o.max_gpus is not None and len(o.pinned) > o.max_gpus:
            raise doc.error(path + ("max_gpus",),
                            f"max_gpus: {o.max_gpus} is less than the {len(o.pinned)} pinned GPUs")
        if o.no_gpu and (o.pinned or o.gpus or o.max_gpus):
            raise doc.error(path + ("no_gpu",),
                            "no_gpu: true cannot be combined with gpus, max_gpus or pinned GPUs")
        out.append(o)
    every = [(p, o) for o in out for p in o.projects]
    if len({p for p, _ in every}) > MAX_PROJECTS:
        _, o = every[-1]
        raise doc.error((section, o.name, "projects"),
                        f"the groups name {len({p for p, _ in every})} projects; the lab "
                        f"has at most {MAX_PROJECTS} (each needs a folder of the image's "
                        f"to start from)")
    return tuple(out)


def _projects(r: _Reader, path: Path_, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise r.doc.error(path, f"expected a list of project names, such as [vision], got "
                                f"{value!r}")
    for name in value:
        if not isinstance(name, str) or not PROJECT_NAME.fullmatch(name):
            raise r.doc.error(path, f"expected project names of lower-case letters, digits "
                                    f"and '-' (at most 40), got {name!r}")
    return tuple(dict.fromkeys(value))


def _pins(
    r: _Reader, path: Path_, value: Any, gpus: Sequence[GpuEntry], auto: bool
) -> tuple[Pin, ...]:
    doc = r.doc
    if isinstance(value, str | int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list):
        raise doc.error(path, f"expected a list of GPU UUIDs or indexes (or MACHINE:INDEX), "
                              f"got {value!r}")
    pins: list[Pin] = []
    for i, ref in enumerate(value):
        p = path + (i,)
        on = _MACHINE_PIN.fullmatch(ref) if isinstance(ref, str) else None
        if on:  # MACHINE:INDEX, a GPU of one machine of a Swarm
            pin = Pin(int(on["index"]), doc.line_of(p), on["machine"])
        elif isinstance(ref, str) and ":" in ref:
            raise doc.error(p, f"expected MACHINE:INDEX (a machine's hostname as `docker "
                               f"node ls` shows it, a GPU index up to 999), got {ref!r}")
        else:
            ref = r.check(p, _uuid, ref) if isinstance(ref, str) else r.check(p, _index, ref)
            pin = Pin(ref, doc.line_of(p))
            listed_refs = {g.uuid if isinstance(ref, str) else g.index for g in gpus}
            if not auto and ref not in listed_refs:
                listed = ", ".join(f"{g.index} ({g.uuid})" for g in gpus) or "none"
                raise doc.error(p, f"pinned GPU {ref!r} is not listed under inventory; GPUs "
                                   f"listed there: {listed}")
        if any((q.ref, q.machine) == (pin.ref, pin.machine) for q in pins):
            raise doc.error(p, f"GPU {str(pin)!r} is pinned twice")
        pins.append(pin)
    return tuple(pins)


# ---------------------------------------------------------------- entry points


def parse_gpus_config(text: str, filename: str = "gpus.yaml") -> GpusConfig:
    return gpus_config_from_yaml(parse_yaml(text, filename))


def load_gpus_config(path: str | Path, missing_ok: bool = False) -> GpusConfig:
    """Read and validate ``gpus.yaml``. With *missing_ok*, an absent file means the
    defaults (auto inventory, exclusive GPUs, 0 by default, at most 1 per user)."""
    path = Path(path)
    if missing_ok and not path.exists():
        return GpusConfig(filename=str(path))
    return gpus_config_from_yaml(read_yaml(path))
