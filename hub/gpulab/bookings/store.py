"""Bookings, kept in a small SQLite file next to the hub's database: written by the hub's
REST API, read by its spawner (the GPUs a running booking keeps) and by the GPU culler
(the servers a booking stops). Ended bookings are dropped as new ones are made."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from gpulab import private_db
from gpulab.bookings.book import Booking, choose
from gpulab.gpus.allocator import Gpu, Lease
from gpulab.gpus.config import GpusConfig

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS bookings ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " user TEXT NOT NULL, gpus TEXT NOT NULL, start REAL NOT NULL, end REAL NOT NULL,"
    " made_by TEXT NOT NULL, made_at REAL NOT NULL)",
)
_COLUMNS = "id, user, gpus, start, end, made_by, made_at"
KEEP_ENDED = 7 * 86400  # ended bookings stay this long in the file (the API shows those not ended)


def _booking(row) -> Booking:
    id_, user, gpus, start, end, made_by, made_at = row
    return Booking(id_, user, tuple(json.loads(gpus)), start, end, made_by, made_at)


class BookingStore:
    def __init__(self, path: str | os.PathLike, now: Callable[[], float] = time.time):
        self.path = private_db.create(Path(path), _SCHEMA)
        self.now = now

    def _connect(self):
        return private_db.connect(self.path)

    def bookings(self, user: str | None = None) -> list[Booking]:
        """Every booking (or *user*'s), by start."""
        where, args = ("WHERE user = ?", (user,)) if user is not None else ("", ())
        with self._connect() as db:
            return [_booking(r) for r in db.execute(
                f"SELECT {_COLUMNS} FROM bookings {where} ORDER BY start, id", args)]

    def make(self, config: GpusConfig, inventory: Sequence[Gpu], user: str,
             groups: Sequence[str], count: object, start: float, end: float, made_by: str,
             used: float | None = None, leases: Sequence[Lease] = (),
             machine: str = "", sharing: Collection[str] = ()) -> Booking:
        """Check and record a booking in one transaction (two requests for the last free
        GPU cannot both get it); :class:`gpulab.bookings.book.BookingRefused` if not."""
        now = self.now()
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM bookings WHERE end < ?", (now - KEEP_ENDED,))
            current = [_booking(r) for r in db.execute(
                f"SELECT {_COLUMNS} FROM bookings WHERE end > ?", (now,))]
            gpus = choose(config, inventory, current, user, groups, count, start, end, now,
                          used, leases, machine, sharing)
            uuids = tuple(g.uuid for g in gpus)
            cursor = db.execute(
                "INSERT INTO bookings (user, gpus, start, end, made_by, made_at)"
                " VALUES (?, ?, ?, ?, ?, ?)", (user, json.dumps(uuids), start, end, made_by, now))
            db.commit()
            return Booking(cursor.lastrowid, user, uuids, start, end, made_by, now)
        finally:
            db.rollback()
            db.close()

    def cancel(self, user: str, booking_id: int) -> Booking | None:
        """Remove *user*'s booking *booking_id*; the booking, or None if she has none such."""
        with self._connect() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM bookings WHERE id = ? AND user = ?",
                             (booking_id, user)).fetchone()
            if row is None:
                return None
            db.execute("DELETE FROM bookings WHERE id = ?", (booking_id,))
        return _booking(row)

    def forget_user(self, user: str) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM bookings WHERE user = ?", (user,))


_stores: dict[str, BookingStore] = {}


def booking_store(path: str | os.PathLike) -> BookingStore:
    """The process's one store for *path* (opened on first use)."""
    key = str(path)
    if key not in _stores:
        _stores[key] = BookingStore(path)
    return _stores[key]
