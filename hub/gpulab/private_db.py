"""The small sqlite files gpulab keeps next to the hub database (login tokens, SSH keys,
the login throttle, the line for GPUs): created readable and writable by their owner
only."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path


def connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, timeout=10)


def create(path: str | os.PathLike, schema: Iterable[str]) -> Path:
    """*path* (its folder made if need be), created mode 0600 if it is not there, with
    the ``CREATE ... IF NOT EXISTS`` statements of *schema* run; the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    with connect(path) as db:
        for statement in schema:
            db.execute(statement)
    return path


def add_columns(path: Path, table: str, columns: Iterable[tuple[str, str]]) -> None:
    """Add to *table* each of *columns* ``(name, declaration)`` it lacks: a file an older
    gpulab made gets what this one reads (``CREATE TABLE IF NOT EXISTS`` leaves it as
    it was)."""
    with connect(path) as db:
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for name, declaration in columns:
            if name in have:
                continue
            try:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
            except sqlite3.OperationalError as e:
                # another process (the hub and its services open the same files as they
                # start) added it between the look and the change
                if "duplicate column" not in str(e):
                    raise
