"""A member whose home is full is told so when JupyterLab saves (or uploads, or makes a
file), instead of jupyter_server's "Unexpected error while saving file: ... [Errno 28] No
space left on device": what is full, how full, that nothing was saved, and what to do.

A home is full when its filesystem is: a home of the lab's size (``spawn.home_size``,
an XFS project quota, whose limit the home's statfs reports as its size), or the disk all
homes share. Enabled by the image's jupyter_server_config.py (a ``.d`` JSON file sets
only extensions, not the contents manager: tried), which also keeps a server's start
off a full home (:func:`mark_configuration_migrated`; its runtime files are in /tmp,
JUPYTER_RUNTIME_DIR in the Dockerfile);
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


def mark_configuration_migrated(config_dir: str) -> None:
    """jupyter_core migrates IPython 3's configuration at the start of a server whose
    home has ``~/.ipython`` (a kernel made it) and no ``~/.jupyter/migrated`` marker yet,
    and writes that marker unguarded: on a full home, the server then stops at start
    ("No space left on device"; seen), so its member could not even reach a terminal to
    make room. Written here at each start that has room (this file's configuration is
    read right after that migration step), the marker is there before a home fills.
    There is nothing of IPython 3 to migrate in this image."""
    marker = os.path.join(config_dir, "migrated")
    try:
        if not os.path.exists(marker):
            os.makedirs(config_dir, exist_ok=True)
            with open(marker, "w", encoding="utf-8") as f:
                f.write("gpulab: nothing to migrate\n")
    except OSError:
        pass  # a full home now: the start goes on without it


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
