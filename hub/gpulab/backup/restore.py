"""Putting a snapshot back: run by `make restore` (scripts/restore.sh) in a one-off
container, with the lab stopped, that sees the Docker volumes folder read-write at
``/volumes``, and this checkout's ``config/`` and ``secrets/``.

restic restores the snapshot into a scratch volume, :data:`SCRATCH_VOLUME` (ownership,
modes and times as they were); each part is then moved into its place
(:func:`gpulab.backup.plan.placements`), replacing what was there. The scratch volume
is reached through ``/volumes`` too, so that moving a home or Prometheus' data is a
rename, not a second copy: a restore costs the time restic takes to read the repository.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from gpulab.backup import plan
from gpulab.backup.run import BackupError, restic

log = logging.getLogger(__name__)

SCRATCH_VOLUME = "gpulab-restore-scratch"
SCRATCH = Path(plan.volume_data(SCRATCH_VOLUME))


def find_snapshot(wanted: str = "latest") -> dict[str, Any]:
    snapshots = json.loads(restic("restic", "snapshots", "--json", "--host", plan.HOST))
    if not snapshots:
        raise BackupError("the repository holds no backup of a gpulab lab")
    if wanted == "latest":
        return max(snapshots, key=lambda s: s["time"])
    found = [s for s in snapshots if s["id"].startswith(wanted)]
    if len(found) != 1:
        known = ", ".join(f"{s['short_id']} ({s['time'][:19]})" for s in snapshots[-5:])
        raise BackupError(f"no single backup {wanted!r} in the repository; the newest: {known}")
    return found[0]


def target_of(place: plan.Placement, host_dirs: dict[str, Path]) -> Path:
    if place.volume:
        target = Path(plan.volume_data(place.volume))
        if not target.is_dir():
            raise BackupError(f"Docker volume {place.volume} does not exist: "
                              f"docker volume create {place.volume} (make restore does)")
        return target
    return host_dirs[place.host_dir]


def occupied(snapshot: dict[str, Any], host_dirs: dict[str, Path],
             stack_only: bool = False) -> list[str]:
    """The volumes that already hold something a restore would replace."""
    out = []
    for place in plan.placements(snapshot["paths"]):
        if stack_only and not place.of_the_stack:
            continue
        if place.volume and any(target_of(place, host_dirs).iterdir()):
            out.append(place.volume)
    return sorted(set(out))


def _empty(folder: Path) -> None:
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def restore(snapshot: dict[str, Any], host_dirs: dict[str, Path],
            stack_only: bool = False) -> list[str]:
    """Restore *snapshot* into its places (emptied first); what was restored, in words.
    *stack_only*: only the stack's own state (:attr:`gpulab.backup.plan.Placement.of_the_stack`):
    members' homes, the datasets and Prometheus' history stay as they are now."""
    places = [p for p in plan.placements(snapshot["paths"]) if p.of_the_stack or not stack_only]
    targets = {p: target_of(p, host_dirs) for p in places}
    only = [arg for p in places for arg in ("--include", p.source)] if stack_only else []
    restic("restic", "restore", snapshot["id"], "--target", str(SCRATCH), *only)
    for target in {t: None for t in targets.values()}:
        _empty(target)
    done = []
    for place, target in targets.items():
        source = SCRATCH / place.source.lstrip("/")
        if not source.is_dir():
            raise BackupError(f"the backup lacks {place.source}")
        for entry in source.iterdir():
            shutil.move(str(entry), target / entry.name)
        if place.source != f"{plan.STAGING}/{plan.HUB_VOLUME}":
            # the folder itself as it was (a home's owner is the member's uid)
            st = source.stat()
            os.chown(target, st.st_uid, st.st_gid)
            os.chmod(target, st.st_mode & 0o7777)
        done.append(f"{place.source} -> {place.volume or place.host_dir + '/'}")
    _empty(SCRATCH)
    return done
