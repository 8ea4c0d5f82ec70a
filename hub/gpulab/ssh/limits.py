"""How much the SSH gateway takes on at once: pure decisions, and the counts they need.

* **Connections still signing in** (as OpenSSH's ``MaxStartups start:rate:full`` and
  ``PerSourceMaxStartups``): below *start* every new connection is taken; from *start*
  on, each is refused with a chance of *rate* percent, rising linearly to 100 at *full*;
  and no client address may have more than *per_address* connections signing in. Each
  one ends at sign-in or after the gateway's login timeout, so a client that opens
  connections and says nothing holds a bounded share.
* **Per member**, across all her connections: signed-in connections (each asks the hub
  every few seconds), sessions (shells, commands, sftp) and forwards (``ssh -L``/``-D``).

A refusal is a message for the member's SSH client, never a silent close: OpenSSH shows
it as ``Received disconnect ...: <message>`` or ``channel N: open failed: resource
shortage: <message>``.

Standard library only; tested with literal counts (tests/unit/test_ssh_limits.py).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

CONNECTIONS, SESSIONS, FORWARDS = "connections", "sessions", "forwards"


@dataclass(frozen=True)
class Limits:
    start: int = 10  # connections signing in before refusals begin (MaxStartups start)
    rate: int = 30  # percent refused at *start* (MaxStartups rate)
    full: int = 100  # connections signing in at which all are refused (MaxStartups full)
    per_address: int = 10  # connections signing in from one client address
    connections: int = 10  # signed-in connections per member
    sessions: int = 20  # open sessions per member
    forwards: int = 64  # open forwarded connections per member

    def __post_init__(self):
        for f in fields(self):
            if getattr(self, f.name) < (0 if f.name == "rate" else 1):
                raise ValueError(f"{f.name} must be at least {0 if f.name == 'rate' else 1}")
        if self.rate > 100:
            raise ValueError("rate is a percentage (0 to 100)")
        if self.full < self.start:
            raise ValueError(f"full ({self.full}) is below start ({self.start})")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Limits:
        """The limits the gateway runs with: its defaults, overridden by ``ENV`` (the
        names are in :data:`ENV`); ValueError naming the variable if one is invalid."""
        values: dict[str, int] = {}
        spec = env.get(STARTUPS_ENV, "").strip()
        if spec:
            try:
                values.update(zip(("start", "rate", "full"), parse_startups(spec), strict=True))
            except ValueError as e:
                raise ValueError(f"{STARTUPS_ENV}={spec!r}: {e}") from None
        for name, var in ENV.items():
            raw = env.get(var, "").strip()
            if raw:
                if not raw.isdecimal():
                    raise ValueError(f"{var}={raw!r}: a whole number is needed")
                values[name] = int(raw)
        try:
            return cls(**values)
        except ValueError as e:
            raise ValueError(f"SSH gateway limits: {e}") from None

    def describe(self) -> str:
        return (f"signing in: {self.start}:{self.rate}:{self.full} (MaxStartups), "
                f"{self.per_address} per address; per member: {self.connections} "
                f"connections, {self.sessions} sessions, {self.forwards} forwards")


STARTUPS_ENV = "GPULAB_SSH_MAX_STARTUPS"
ENV = {  # Limits field -> environment variable (docker-compose.yml passes them on)
    "per_address": "GPULAB_SSH_MAX_STARTUPS_PER_ADDRESS",
    "connections": "GPULAB_SSH_MAX_CONNECTIONS_PER_MEMBER",
    "sessions": "GPULAB_SSH_MAX_SESSIONS_PER_MEMBER",
    "forwards": "GPULAB_SSH_MAX_FORWARDS_PER_MEMBER",
}


def parse_startups(spec: str) -> tuple[int, int, int]:
    """OpenSSH's ``MaxStartups`` syntax: ``full`` alone, or ``start:rate:full``."""
    parts = spec.split(":")
    if len(parts) not in (1, 3) or not all(p.isdecimal() for p in parts):
        raise ValueError("write start:rate:full (as OpenSSH's MaxStartups, e.g. 10:30:100) "
                         "or a single number")
    if len(parts) == 1:
        return int(parts[0]), 100, int(parts[0])
    start, rate, full = (int(p) for p in parts)
    return start, rate, full


def refusal_chance(limits: Limits, signing_in: int) -> float:
    """The chance that a new connection is refused while *signing_in* others are signing
    in: OpenSSH's ``drop()`` (sshd.c), as a fraction."""
    if signing_in >= limits.full:
        return 1.0
    if signing_in < limits.start:
        return 0.0
    return (limits.rate + (100 - limits.rate) * (signing_in - limits.start)
            / (limits.full - limits.start)) / 100


def refuse_startup(limits: Limits, signing_in: int, from_address: int,
                   draw: Callable[[], float]) -> str | None:
    """Why a new connection is refused (what its client reads), or None to take it.
    *signing_in*: connections signing in now, all addresses; *from_address*: those from
    the new one's address; *draw*: a uniform random number in [0, 1)."""
    if from_address >= limits.per_address:
        these = "1 connection" if from_address == 1 else f"{from_address} connections"
        return (f"gpulab-ssh: {these} from your address {'is' if from_address == 1 else 'are'}"
                " already signing in; wait until they have, then connect again")
    if draw() < refusal_chance(limits, signing_in):
        return ("gpulab-ssh: too many connections are signing in right now; connect "
                "again in a few seconds")
    return None


WHAT = {
    CONNECTIONS: ("SSH connections", "close one (or reuse one with ssh's ControlMaster)"),
    SESSIONS: ("SSH sessions", "end one (exit a shell or command)"),
    FORWARDS: ("forwarded connections", "close some (the programs using ssh -L or -D)"),
}


def over_limit(limits: Limits, kind: str, open_now: int) -> str | None:
    """Why a member's new connection, session or forward (*kind*) is refused while she
    has *open_now* of them, or None to take it."""
    limit = getattr(limits, kind)
    if open_now < limit:
        return None
    what, remedy = WHAT[kind]
    return (f"gpulab-ssh: you have {open_now} {what} open, the lab's limit; {remedy} "
            "and try again")


class Counts:
    """What is open now: connections signing in (in all and per address) and each
    member's connections, sessions and forwards. The gateway's single event loop is
    the only writer."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.signing_in: Counter[str] = Counter()  # client address -> connections
        self.open: Counter[tuple[str, str]] = Counter()  # (member, kind) -> open

    def startup(self, address: str, draw: Callable[[], float]) -> str | None:
        """A new connection from *address*: counted as signing in, or why not."""
        why = refuse_startup(self.limits, sum(self.signing_in.values()),
                             self.signing_in[address], draw)
        if why is None:
            self.signing_in[address] += 1
        return why

    def signed_in(self, address: str) -> None:
        """A connection counted by :meth:`startup` signed in or went away."""
        self.signing_in[address] -= 1
        if self.signing_in[address] <= 0:
            del self.signing_in[address]

    def take(self, member: str, kind: str) -> str | None:
        """One more *kind* for *member*: counted, or why not."""
        why = over_limit(self.limits, kind, self.open[member, kind])
        if why is None:
            self.open[member, kind] += 1
        return why

    def give_back(self, member: str, kind: str) -> None:
        self.open[member, kind] -= 1
        if self.open[member, kind] <= 0:
            del self.open[member, kind]
