"""A member whose home is full is told so when JupyterLab saves (or uploads, or makes a
file), instead of jupyter_server's "Unexpected error while saving file: ... [Errno 28] No
space left on device": what is full, how full, that nothing was saved, and what to do.

A project folder of her group's (``/projects/NAME``, reached from her home through a
link) is told apart the same way: the message names it.

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
    nbsignatures.db first: seen as the first thing to fail)? Or did it happen while
    handling one: jupyter_server's atomic_writing, when writing a *new* file fails, then
    puts back a backup that was never made, and its FileNotFoundError hides the ENOSPC
    (seen with a 64 KiB file into a full folder, jupyter_server 2.x)."""
    while error is not None:  # Python keeps the chain free of cycles
        if isinstance(error, OSError) and error.errno in FULL:
            return True
        if isinstance(error, sqlite3.Error) and \
                getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            return True
        error = error.__context__
    return False


def size_text(n: int) -> str:
    """1536 -> '1.5 KiB', as df -h would say it (binary units)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" or value >= 100 else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


PROJECTS = "/projects"  # gpulab.contract.PROJECTS_PATH: a group's folders, /projects/NAME


def full_folder(folder: str, home: str) -> str:
    """The filesystem a write into *folder* (a real path) went to: a group's project folder
    (``spawn.project_size``, or the disk) when it is in one, else her home."""
    inside = os.path.relpath(os.path.realpath(folder), PROJECTS)
    if inside == "." or inside.startswith(".."):
        return home
    return os.path.join(PROJECTS, inside.split(os.sep)[0])


def home_full_message(what: str, folder: str, size: int, free: int) -> str:
    """What a member reads in JupyterLab's "File Save Error" dialog, when *folder* (her
    home, or a project folder of her group's) is full."""
    used = f"{size_text(size - free)} of {size_text(size)} used, so {what} was not saved"
    if folder.startswith(PROJECTS + "/"):
        return (f"The project folder {folder} is full: {used}. Delete files the group does "
                f"not need (in a terminal, `du -sh {folder}/* | sort -h` lists the largest "
                f"last) or ask the lab's admins for more room; your running kernels go on "
                f"meanwhile.")
    return (f"Your home ({folder}) is full: {used}. Delete files you do not need (in a "
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
            folder = full_folder(os.path.dirname(os.path.join(
                self.root_dir, path.strip("/"))), home)
            try:
                st = os.statvfs(folder)
                size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
            except OSError:
                size = free = 0
            self.log.warning("Saving %s failed: %s is full (%s)", path, folder, cause)
            raise web.HTTPError(INSUFFICIENT_STORAGE, home_full_message(
                path.strip("/") or "the file", folder, size, free)) from cause
