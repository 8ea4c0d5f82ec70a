"""Which identity of the lab's provider each hub account belongs to, and whose access an
admin ended: a sqlite file next to the hub database (gpulab.private_db), not JupyterHub's
auth_state, which a sign-in with a login token overwrites and a lost crypt key empties.

* A name is bound to the provider's subject (OpenID Connect ``sub``) at its first
  sign-in there; another subject with the same name is refused for good.
* An admin who ends a member's access (``gpulab access end``) ends it for the lab's
  sign-in too, until an admin gives her access again (issues her a login token).
* When the provider last vouched for her (her sign-in, or a later check): while it cannot
  be asked, she keeps access for ``login.unreachable_grace`` from then, across hub
  restarts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from gpulab import private_db

SCHEMA = ("""CREATE TABLE IF NOT EXISTS identities (
    username TEXT PRIMARY KEY,
    subject TEXT,          -- the provider's sub; NULL: ended before she ever signed in
    bound_at REAL,
    ended_at REAL,         -- an admin ended her access; NULL: not ended
    vouched_at REAL        -- the provider last vouched for her; NULL: not since recorded
)""",)
ADDED = (("vouched_at", "REAL"),)  # columns a file an older gpulab made lacks


class IdentityStore:
    def __init__(self, path: str | os.PathLike, *, now: Callable[[], float] = time.time):
        self.path = private_db.create(path, SCHEMA)
        private_db.add_columns(self.path, "identities", ADDED)
        self.now = now

    def _row(self, username: str) -> tuple | None:
        with private_db.connect(self.path) as db:
            return db.execute("SELECT subject, ended_at FROM identities WHERE username = ?",
                              (username,)).fetchone()

    def subject(self, username: str) -> str | None:
        """The subject *username* is bound to, or None."""
        row = self._row(username)
        return row[0] if row else None

    def is_ended(self, username: str) -> bool:
        row = self._row(username)
        return bool(row and row[1] is not None)

    def bind(self, username: str, subject: str) -> None:
        """Bind *username* to *subject* if it is bound to none (never rebinds)."""
        with private_db.connect(self.path) as db:
            db.execute("INSERT INTO identities (username, subject, bound_at) VALUES (?, ?, ?) "
                       "ON CONFLICT (username) DO UPDATE SET subject = excluded.subject, "
                       "bound_at = excluded.bound_at WHERE subject IS NULL",
                       (username, subject, self.now()))

    def vouched(self, username: str) -> None:
        """The provider vouched for *username* just now."""
        with private_db.connect(self.path) as db:
            db.execute("UPDATE identities SET vouched_at = ? WHERE username = ?",
                       (self.now(), username))

    def grace_from(self, username: str) -> float:
        """Whence her access counts while the provider cannot be asked: when it last
        vouched for her, or now if that was never recorded (a file an older gpulab made:
        the grace starts afresh rather than ending her access at once)."""
        with private_db.connect(self.path) as db:
            row = db.execute("SELECT vouched_at FROM identities WHERE username = ?",
                             (username,)).fetchone()
        if row is None or row[0] is None:
            self.vouched(username)
            return self.now()
        return row[0]

    def end(self, username: str) -> None:
        with private_db.connect(self.path) as db:
            db.execute("INSERT INTO identities (username, ended_at) VALUES (?, ?) "
                       "ON CONFLICT (username) DO UPDATE SET ended_at = excluded.ended_at",
                       (username, self.now()))

    def restore(self, username: str) -> None:
        with private_db.connect(self.path) as db:
            db.execute("UPDATE identities SET ended_at = NULL WHERE username = ?", (username,))

    def forget(self, username: str) -> None:
        """A deleted account: a new one of the same name binds afresh."""
        with private_db.connect(self.path) as db:
            db.execute("DELETE FROM identities WHERE username = ?", (username,))
