"""The image's full-disk notice (images/singleuser/gpulab_home_full.py): which errors are
a full disk, which folder is named, and what the member reads. jupyter_server is not in
the unit tests' environment: its contents manager's module is a stand-in class here
(the image's integration tests, tests/integration/test_full_home.py and test_projects.py,
run the real one)."""

from __future__ import annotations

import errno
import importlib.util
import sqlite3
import sys
import types
from pathlib import Path

import pytest

from gpulab.contract import PROJECTS_PATH

IMAGE = Path(__file__).resolve().parents[2] / "images" / "singleuser"


def _load():
    name = "jupyter_server.services.contents.largefilemanager"
    stand_in = types.ModuleType(name)
    stand_in.AsyncLargeFileManager = type("AsyncLargeFileManagerStandIn", (), {})
    saved = sys.modules.get(name)
    sys.modules[name] = stand_in
    try:
        spec = importlib.util.spec_from_file_location("gpulab_home_full",
                                                      IMAGE / "gpulab_home_full.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        if saved is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = saved


home_full = _load()


def raised_while_handling(first: BaseException, then: BaseException) -> BaseException:
    try:
        try:
            raise first
        except BaseException:
            raise then  # noqa: B904  (as atomic_writing does: its __context__ is *first*)
    except BaseException as e:
        return e


def test_a_full_disk_is_seen_behind_the_error_that_hid_it():
    enospc = OSError(errno.ENOSPC, "No space left on device")
    assert home_full.is_full(enospc)
    assert home_full.is_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    # a new file's failed write: atomic_writing puts back a backup it never made
    hidden = raised_while_handling(enospc, FileNotFoundError(errno.ENOENT, "no .~file"))
    assert home_full.is_full(hidden)
    full_db = sqlite3.OperationalError("database or disk is full")
    full_db.sqlite_errorcode = sqlite3.SQLITE_FULL
    assert home_full.is_full(full_db)
    assert not home_full.is_full(FileNotFoundError(errno.ENOENT, "gone"))
    assert not home_full.is_full(raised_while_handling(ValueError(), PermissionError()))
    assert not home_full.is_full(None)


@pytest.mark.parametrize("folder, named", [
    ("/projects/cars", "/projects/cars"), ("/projects/cars/runs/1", "/projects/cars"),
    ("/home/jovyan", "/home/jovyan"), ("/home/jovyan/notes", "/home/jovyan"),
    ("/projects", "/home/jovyan"), ("/projectsx/cars", "/home/jovyan"),
])
def test_the_folder_named_is_the_project_written_into_or_her_home(folder, named):
    assert home_full.PROJECTS == PROJECTS_PATH  # the image's copy of the hub's
    assert home_full.full_folder(folder, "/home/jovyan") == named


def test_a_link_in_her_home_to_a_project_names_the_project(tmp_path, monkeypatch):
    project = tmp_path / "projects" / "cars"
    project.mkdir(parents=True)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "cars").symlink_to(project)
    monkeypatch.setattr(home_full, "PROJECTS", str(tmp_path / "projects"))
    assert home_full.full_folder(str(tmp_path / "home" / "cars"), "/h") == str(project)


def test_what_she_reads_names_the_full_folder_and_what_to_do():
    home = home_full.home_full_message("a.ipynb", "/home/jovyan", 32 << 20, 0)
    assert home.startswith("Your home (/home/jovyan) is full: 32.0 MiB of 32.0 MiB used, "
                           "so a.ipynb was not saved.")
    assert "du -sh ~/*" in home
    project = home_full.home_full_message("cars/a.ipynb", "/projects/cars", 32 << 20, 1024)
    assert project.startswith("The project folder /projects/cars is full: ")
    assert "du -sh /projects/cars/*" in project and "your home" not in project.lower()
