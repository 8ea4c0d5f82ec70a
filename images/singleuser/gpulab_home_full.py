"""A member whose home is full is told so when JupyterLab saves (or uploads, or makes a
file), instead of jupyter_server's "Unexpected error while saving file: ... [Errno 28] No
space left on device": what is full, how full, that nothing was saved, and what to do.

A home is full when its filesystem is: a home of the lab's size (``spawn.home_size``,
an XFS project quota, whose limit the home's statfs reports as its size), or the disk all
homes share. Enabled by the image's jupyter_server_config.py (a ``.d`` JSON file sets
only extensions, not the contents manager: tried);
images/singleuser/gpulab-home.sh says the same in terminals and over SSH.
"""

from __future__ import annotations

import errno
import os
import sqlite3

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from tornado import web

FULL = (errno.ENOSPC, errno.EDQUOT)
INSUFFICIENT_STORAGE = 507


def is_full(error: BaseException | None) -> bool:
    """Did *error* come from a full disk: a write's ENOSPC (or EDQUOT), or SQLite's
    "database or disk is full" (a notebook's save signs it in ~/.local/share/jupyter's
    nbsignatures.db first: seen as the first thing to fail)?"""
    if isinstance(error, OSError):
        return error.errno in FULL
    return isinstance(error, sqlite3.Error) and \
        getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


def size_text(n: int) -> str:
    """1536 -> '1.5 KiB', as df -h would say it (binary units)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" or value >= 100 else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def home_full_message(what: str, home: str, size: int, free: int) -> str:
    """What a member reads in JupyterLab's "File Save Error" dialog."""
    return (f"Your home ({home}) is full: {size_text(size - free)} of {size_text(size)} "
            f"used, so {what} was not saved. Delete files you do not need (in a "
            f"terminal, `du -sh ~/* ~/.[!.]* | sort -h` lists the largest last) or ask the "
            f"lab's admins for more room; your running kernels go on meanwhile.")


class HomeFullContentsManager(AsyncLargeFileManager):
    """jupyter_server's own contents manager, with a clear 507 for a full home."""

    async def save(self, model, path=""):
        try:
            return await super().save(model, path)
        except web.HTTPError as e:
            cause = e.__cause__
            if not is_full(cause):
                raise
            home = os.path.expanduser("~")
            try:
                st = os.statvfs(home)
                size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
            except OSError:
                size = free = 0
            self.log.warning("Saving %s failed: the home is full (%s)", path, cause)
            raise web.HTTPError(INSUFFICIENT_STORAGE, home_full_message(
                path.strip("/") or "the file", home, size, free)) from cause
