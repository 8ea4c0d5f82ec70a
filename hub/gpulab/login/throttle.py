"""Failed-login throttling that survives a hub restart.

A failed sign-in from a browser that has no *device cookie* for the username tried
(see :mod:`gpulab.login.auth`) counts twice: against the (normalised) username and against
the client address. A failed sign-in that carries a valid device cookie for that
username counts against that one device only, and only its own lockout stops it: so
whoever locks alice's name or a shared address cannot lock out the browser alice
signed in with before (OWASP's "device cookies").

Each counter follows a :class:`LockoutPolicy`: after ``max_failures`` failures within
``window`` seconds the key is locked for ``lockout`` seconds, and every further
lockout of the same key doubles that, up to ``max_lockout``. A key with no failure for
``forget_after`` seconds starts from nothing again. A successful sign-in clears the
counter it was checked against (the username's, or the device's).

The decisions are pure functions of an :class:`Entry` and the time
(:func:`is_locked`, :func:`after_failure`); :class:`Throttle` only stores entries in a
small sqlite file next to the hub database, so a restart does not reset a lockout.
Time is injectable (``Throttle(path, now=...)``) and is wall-clock seconds, because
a monotonic clock does not survive a restart either.
"""

from __future__ import annotations

import ipaddress
import math
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from gpulab import private_db

USER = "user"
ADDRESS = "address"
DEVICE = "device"  # a device cookie's random id; follows the username policy


@dataclass(frozen=True)
class LockoutPolicy:
    """How many failures lock a key, and for how long (all durations in seconds)."""

    max_failures: int = 5
    window: float = 15 * 60
    lockout: float = 15 * 60
    max_lockout: float = 24 * 3600
    forget_after: float = 24 * 3600

    def __post_init__(self):
        if self.max_failures < 1:
            raise ValueError(f"max_failures must be at least 1, got {self.max_failures}")
        for name in ("window", "lockout", "max_lockout", "forget_after"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def lockout_for(self, lockouts: int) -> float:
        """Length of the *lockouts*-th lockout (1-based): lockout, 2x, 4x, ... capped."""
        # cap the exponent so a long history cannot overflow the float
        return min(self.lockout * 2 ** min(lockouts - 1, 64), self.max_lockout)


@dataclass(frozen=True)
class Entry:
    """Failure history of one key (a username or a client address)."""

    failures: int = 0  # failures in the current window (reset by a lockout)
    window_start: float = 0.0
    locked_until: float = 0.0
    lockouts: int = 0  # lockouts so far; each one doubles the next
    last_failure: float = 0.0


def is_locked(entry: Entry, now: float) -> bool:
    return entry.locked_until > now


def after_failure(entry: Entry, now: float, policy: LockoutPolicy) -> Entry:
    """The entry after one more failed sign-in at *now*."""
    if is_locked(entry, now):
        # Callers do not try a locked key; if one does, the lock is not extended,
        # so a lockout cannot be stretched for ever by a client that keeps trying.
        return entry
    if entry.last_failure and now - entry.last_failure > policy.forget_after:
        entry = Entry()
    if entry.failures == 0 or now - entry.window_start > policy.window:
        entry = replace(entry, failures=1, window_start=now)
    else:
        entry = replace(entry, failures=entry.failures + 1)
    entry = replace(entry, last_failure=now)
    if entry.failures >= policy.max_failures:
        lockouts = entry.lockouts + 1
        entry = replace(
            entry,
            failures=0,
            lockouts=lockouts,
            locked_until=now + policy.lockout_for(lockouts),
        )
    return entry


def address_key(address: str) -> str:
    """The throttling key for a client address.

    IPv6 clients usually hold a whole /64, so they are counted per /64 (otherwise a
    client could rotate addresses within it); IPv4-mapped IPv6 counts as IPv4.
    Anything that does not parse is used as it is.
    """
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return address.strip()
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass(frozen=True)
class LockoutDecision:
    """Whether a sign-in may be attempted now, and if not, until when."""

    locked: bool
    retry_at: float = 0.0  # wall-clock seconds; 0 when not locked
    now: float = 0.0

    @property
    def status(self) -> int | None:
        """The HTTP status the login page answers with: 429 when locked, else None."""
        return 429 if self.locked else None

    @property
    def retry_after(self) -> int:
        """Whole seconds until the next attempt is allowed (the Retry-After header)."""
        return max(0, math.ceil(self.retry_at - self.now)) if self.locked else 0

    def message(self) -> str:
        """What the login page tells the user; says when to try again."""
        if not self.locked:
            return ""
        at = datetime.fromtimestamp(self.retry_at, UTC).strftime("%H:%M UTC")
        minutes = max(1, math.ceil(self.retry_after / 60))
        unit = "minute" if minutes == 1 else "minutes"
        return (
            "Too many failed sign-ins for this username or from your address. "
            f"Try again after {at} (in {minutes} {unit}), or ask the lab admin "
            "for a new token if you have lost yours."
        )


_SCHEMA = """
CREATE TABLE IF NOT EXISTS login_failures (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    failures INTEGER NOT NULL,
    window_start REAL NOT NULL,
    locked_until REAL NOT NULL,
    lockouts INTEGER NOT NULL,
    last_failure REAL NOT NULL,
    PRIMARY KEY (kind, key)
)
"""


class Throttle:
    """Username, client-address and device counters kept in a sqlite file.

    ``Throttle(path)`` opens (and creates, mode 0600) the file; a second instance on
    the same file, e.g. after a hub restart, sees the same lockouts. Each call opens
    its own short transaction, so several hub processes may share the file.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        user_policy: LockoutPolicy | None = None,
        address_policy: LockoutPolicy | None = None,
        now: Callable[[], float] = time.time,
    ):
        self.path = Path(path)
        user_policy = user_policy or LockoutPolicy()
        self.policies = {
            USER: user_policy,
            ADDRESS: address_policy or LockoutPolicy(max_failures=20),
            DEVICE: user_policy,
        }
        self.now = now
        # the file says who failed to sign in from where: readable by the hub only
        private_db.create(self.path, [_SCHEMA])

    def _connect(self) -> sqlite3.Connection:
        return private_db.connect(self.path)

    @staticmethod
    def _keys(
        username: str | None, address: str | None, device: str | None = None
    ) -> list[tuple[str, str]]:
        if device:
            # a browser that signed in as this username before: its own counter only
            return [(DEVICE, device)]
        keys = []
        if username:
            keys.append((USER, username))
        if address:
            keys.append((ADDRESS, address_key(address)))
        return keys

    @staticmethod
    def _load(db: sqlite3.Connection, kind: str, key: str) -> Entry:
        row = db.execute(
            "SELECT failures, window_start, locked_until, lockouts, last_failure"
            " FROM login_failures WHERE kind = ? AND key = ?",
            (kind, key),
        ).fetchone()
        return Entry(*row) if row else Entry()

    def _decide(self, entries: list[Entry], now: float) -> LockoutDecision:
        locked_until = max((e.locked_until for e in entries if is_locked(e, now)), default=0.0)
        return LockoutDecision(locked=bool(locked_until), retry_at=locked_until, now=now)

    def check(
        self, username: str | None, address: str | None, device: str | None = None
    ) -> LockoutDecision:
        """May *username* try to sign in from *address* now? Changes nothing.

        With *device* (the id in a valid device cookie for *username*) only that
        device's own lockout counts; the username's and the address's do not.
        """
        now = self.now()
        with self._connect() as db:
            entries = [self._load(db, kind, key)
                       for kind, key in self._keys(username, address, device)]
        return self._decide(entries, now)

    def record_failure(
        self, username: str | None, address: str | None, device: str | None = None
    ) -> LockoutDecision:
        """Count one failed sign-in; the decision says whether that caused a lockout.

        Pass ``username=None`` for a name that is not even valid: only the address is
        counted then, so junk names do not fill the file. With *device*, only that
        device is counted (see :meth:`check`).
        """
        now = self.now()
        entries = []
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            for kind, key in self._keys(username, address, device):
                entry = after_failure(self._load(db, kind, key), now, self.policies[kind])
                db.execute(
                    "INSERT OR REPLACE INTO login_failures VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (kind, key, entry.failures, entry.window_start, entry.locked_until,
                     entry.lockouts, entry.last_failure),
                )
                entries.append(entry)
            self._prune(db, now)
        return self._decide(entries, now)

    def record_success(self, username: str, device: str | None = None) -> None:
        """A successful sign-in forgets the failures of what it was checked against:
        the device's with a device cookie (the username's lockout, perhaps someone
        else's doing, stays), else the username's."""
        kind, key = (DEVICE, device) if device else (USER, username)
        with self._connect() as db:
            db.execute("DELETE FROM login_failures WHERE kind = ? AND key = ?", (kind, key))

    def entry(self, kind: str, key: str) -> Entry:
        """The stored entry of one key (for tests and `gpulab` diagnostics)."""
        if kind == ADDRESS:
            key = address_key(key)
        with self._connect() as db:
            return self._load(db, kind, key)

    def _prune(self, db: sqlite3.Connection, now: float) -> None:
        for kind, policy in self.policies.items():
            db.execute(
                "DELETE FROM login_failures WHERE kind = ? AND locked_until <= ?"
                " AND last_failure < ?",
                (kind, now, now - policy.forget_after),
            )
