"""The line, kept in a small SQLite file next to the hub's database (written by the hub
process alone: its REST API and its spawner), so that a hub restart loses nobody's
place. One row per member's server waiting; a row goes when she gets her GPUs, leaves
the line, or the line gives up on her."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from gpulab import private_db
from gpulab.contract import LINE_USAGE_FILE
from gpulab.line import usage as line_usage
from gpulab.line.order import Entry

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS line ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " user TEXT NOT NULL, server TEXT NOT NULL, gpus INTEGER NOT NULL,"
    " groups TEXT NOT NULL DEFAULT '[]', joined_at REAL NOT NULL, offered_at REAL,"
    " environment TEXT NOT NULL DEFAULT '', email TEXT NOT NULL DEFAULT '',"
    " machine TEXT NOT NULL DEFAULT '', ready_at REAL, job TEXT NOT NULL DEFAULT '',"
    " UNIQUE (user, server))",
)
# Columns added since the first version, for stores an older gpulab made (its rows:
# the default).
_ADDED = (("environment", "TEXT NOT NULL DEFAULT ''"), ("email", "TEXT NOT NULL DEFAULT ''"),
          ("machine", "TEXT NOT NULL DEFAULT ''"), ("ready_at", "REAL"),
          ("job", "TEXT NOT NULL DEFAULT ''"))
_COLUMNS = ("id, user, server, gpus, groups, joined_at, offered_at, environment, email,"
            " machine, ready_at, job")


def _entry(row) -> Entry:
    (id_, user, server, gpus, groups, joined_at, offered_at, environment, email, machine,
     ready_at, job) = row
    return Entry(id_, user, server, gpus, joined_at, tuple(json.loads(groups)), offered_at,
                 environment, email, machine, ready_at, job)


class LineStore:
    def __init__(self, path: str | os.PathLike, now: Callable[[], float] = time.time):
        self.path = private_db.create(Path(path), _SCHEMA)
        private_db.add_columns(self.path, "line", _ADDED)
        self.now = now

    def _connect(self):
        return private_db.connect(self.path)

    @property
    def usage_path(self) -> Path:
        """Where the line service leaves members' recent GPU-hours (beside the store)."""
        return self.path.parent / LINE_USAGE_FILE

    def usage(self) -> line_usage.Usage:
        """Members' GPU-hours, for fair share and the budgets (what is recent enough)."""
        return line_usage.read(self.usage_path, time.time())

    def entries(self) -> list[Entry]:
        with self._connect() as db:
            return [_entry(r) for r in db.execute(f"SELECT {_COLUMNS} FROM line")]

    def entry(self, user: str, server: str) -> Entry | None:
        with self._connect() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM line WHERE user = ? AND server = ?",
                             (user, server)).fetchone()
        return _entry(row) if row else None

    def join(self, user: str, server: str, gpus: int, groups: Iterable[str] = (),
             environment: str = "", email: str = "", machine: str = "",
             job: str = "") -> Entry:
        """Her entry for *server*, asking for *gpus* in *environment* ("": the lab's one)
        on *machine* ("": any), to be told at *email* ("": not by e-mail) when her turn
        comes, to run *job* (its options as JSON; "": a server): a new one at the back
        of the line, or the one she has, keeping its place (with what she asks now)."""
        with self._connect() as db:
            db.execute(
                "INSERT INTO line (user, server, gpus, groups, joined_at, environment, email,"
                " machine, job) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (user, server) DO UPDATE SET gpus = excluded.gpus,"
                " groups = excluded.groups, environment = excluded.environment,"
                " email = excluded.email, machine = excluded.machine, job = excluded.job",
                (user, server, gpus, json.dumps(sorted(groups)), self.now(), environment,
                 email, machine, job))
        entry = self.entry(user, server)
        assert entry is not None
        return entry

    def offer(self, user: str, server: str, offered: bool = True) -> Entry | None:
        """The line is starting her server now: her claim window opens (or, *offered*
        false, it could not: she waits again, in the place she had)."""
        with self._connect() as db:
            if offered:
                db.execute("UPDATE line SET offered_at = ? WHERE user = ? AND server = ?"
                           " AND offered_at IS NULL", (self.now(), user, server))
            else:
                db.execute("UPDATE line SET offered_at = NULL, ready_at = NULL"
                           " WHERE user = ? AND server = ?", (user, server))
        return self.entry(user, server)

    def server_up(self, user: str, server: str) -> Entry | None:
        """The server the line started for her is up: her claim window runs from now (the
        first time it is said; None if she is not in line, or it was not started)."""
        with self._connect() as db:
            db.execute("UPDATE line SET ready_at = ? WHERE user = ? AND server = ?"
                       " AND offered_at IS NOT NULL AND ready_at IS NULL",
                       (self.now(), user, server))
        entry = self.entry(user, server)
        return entry if entry is not None and entry.ready_at is not None else None

    def remove(self, user: str, server: str) -> bool:
        with self._connect() as db:
            return db.execute("DELETE FROM line WHERE user = ? AND server = ?",
                              (user, server)).rowcount > 0

    def forget_user(self, user: str) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM line WHERE user = ?", (user,))


_stores: dict[str, LineStore] = {}


def line_store(path: str | os.PathLike) -> LineStore:
    """The hub process's one store for *path* (opened on first use)."""
    key = str(path)
    if key not in _stores:
        _stores[key] = LineStore(path)
    return _stores[key]
