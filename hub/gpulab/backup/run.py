"""One backup, as the backup service's container runs it: the I/O around :mod:`.plan`.

restic finds its repository and password in the environment the container is given
(``RESTIC_REPOSITORY``, ``RESTIC_PASSWORD_FILE``); its cache lives in a tmpfs. One
backup at a time: a lock in :data:`STATE_DIR`, which the scheduled backups and
`make backup` (``docker exec gpulab-backup gpulab-backup now``) share, as they share the
status file the service's metrics read.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import sqlite3
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from gpulab.backup import plan

log = logging.getLogger(__name__)

STATE_DIR = Path(os.environ.get("GPULAB_BACKUP_STATE", "/run/gpulab-backup"))
# How long one restic of ours waits, trying again every LOCK_RETRY seconds, for another
# restic that holds the repository: `make backups` lists it from a container of its own.
LOCK_WAIT = 120.0
LOCK_RETRY = 2.0
# How many times a backup is made again when a home it was about to read was removed.
VANISHED_TRIES = 3


class BackupError(Exception):
    """A backup or restore that could not be done, with what to do about it."""


def run_restic(*args: str) -> subprocess.CompletedProcess:
    """``restic ARGS`` run to its end; again while another restic holds the repository
    (up to LOCK_WAIT seconds: restic 0.14 has no --retry-lock)."""
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            done = subprocess.run(list(args), capture_output=True, text=True, check=False)
        except FileNotFoundError:
            raise BackupError("restic is not installed in this image (images/hub)") from None
        if done.returncode == 0 or not plan.locked_by_another(done.stderr) \
                or time.monotonic() >= deadline:
            return done
        log.info("another restic holds the backup repository (%s); %s waits for it",
                 last_words(done), " ".join(args[:2]))
        time.sleep(LOCK_RETRY)


def last_words(done: subprocess.CompletedProcess) -> str:
    """restic's last three lines; first the one that names who holds the repository, when
    another restic did (it comes before three more)."""
    lines = (done.stderr.strip() or done.stdout.strip()).splitlines()
    holder = [line for line in lines[:-3] if plan.locked_by_another(line)][:1]
    return " / ".join(holder + lines[-3:])


def restic(*args: str) -> str:
    """Run ``restic ARGS``; its standard output, or BackupError with its last words."""
    done = run_restic(*args)
    if done.returncode != 0 and "wrong password" in done.stderr:
        raise BackupError("the backup repository does not open with this password: give "
                          "the one of the lab that made it (its secrets/backup-password; "
                          "make restore reads GPULAB_BACKUP_PASSWORD_FILE)")
    if done.returncode != 0:
        raise BackupError(f"{' '.join(args[:2])} failed (exit {done.returncode}): "
                          f"{last_words(done)}")
    return done.stdout


def ensure_repository() -> bool:
    """Make the repository if there is none yet; True when it was made."""
    probe = subprocess.run(["restic", "cat", "config"], capture_output=True, text=True,
                           check=False)
    if probe.returncode == 0:
        return False
    if "wrong password" in probe.stderr:
        raise BackupError("the backup repository does not open with secrets/backup-password "
                          "(another lab's repository, or the password was changed): give "
                          "this lab a repository of its own (GPULAB_BACKUP_DIR)")
    restic("restic", "init")
    log.info("made the backup repository %s", os.environ.get("RESTIC_REPOSITORY", "?"))
    return True


def copy_sqlite(source: Path, target: Path) -> None:
    """An online backup of the database *source* into *target*: consistent while the
    hub writes (sqlite waits for its write to end), from a read-only mount."""
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
    try:
        fd = os.open(target, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        os.close(fd)
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            dst.close()
    finally:
        src.close()


def stage_databases() -> list[str]:
    """Online copies of the hub volume's sqlite databases in STAGING; their names."""
    source = Path(plan.volume_data(plan.HUB_VOLUME))
    target = Path(plan.STAGING) / plan.HUB_VOLUME
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True, mode=0o700)
    names = plan.sqlite_files(os.listdir(source)) if source.is_dir() else []
    for name in names:
        copy_sqlite(source / name, target / name)
    return names


def prometheus_snapshot(url: str, timeout: float = 120) -> None:
    """Ask Prometheus for a snapshot of its data and move it to PROMETHEUS_SNAPSHOT."""
    request = urllib.request.Request(f"{url.rstrip('/')}/api/v1/admin/tsdb/snapshot",
                                     method="POST", data=b"")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            name = json.load(response)["data"]["name"]
    except (OSError, ValueError, KeyError) as e:
        raise BackupError(f"Prometheus at {url} made no snapshot: {e}") from None
    made = Path(plan.PROMETHEUS_DATA) / "snapshots" / name
    drop_prometheus_snapshot()
    made.rename(plan.PROMETHEUS_SNAPSHOT)


def drop_prometheus_snapshot() -> None:
    shutil.rmtree(plan.PROMETHEUS_SNAPSHOT, ignore_errors=True)


def present_volumes() -> list[str]:
    try:
        return sorted(os.listdir(plan.VOLUMES))
    except OSError as e:
        raise BackupError(f"the Docker volumes folder is not readable at {plan.VOLUMES}: "
                          f"{e}") from None


_RESTIC_TIME = re.compile(r"(?P<base>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(?P<fraction>\d+))?"
                          r"(?P<zone>Z|[+-]\d\d:\d\d)?")


def restic_time(text: str) -> float:
    """restic's snapshot time (nanoseconds, 'Z' or an offset) as a Unix time."""
    m = _RESTIC_TIME.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not a restic time: {text!r}")
    fraction = f".{m['fraction'][:6]}" if m["fraction"] else ""
    zone = (m["zone"] or "Z").replace("Z", "+00:00")
    return datetime.fromisoformat(m["base"] + fraction + zone).timestamp()


def latest_snapshot() -> dict[str, Any] | None:
    """The newest snapshot of this lab, or None when there is none (or no repository)."""
    probe = subprocess.run(["restic", "snapshots", "--json", "--latest", "1", "--host",
                            plan.HOST], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return None
    snapshots = json.loads(probe.stdout or "[]")
    return max(snapshots, key=lambda s: s["time"]) if snapshots else None


def repository_facts() -> dict[str, int]:
    stats = json.loads(restic("restic", "stats", "--json", "--mode", "raw-data"))
    snapshots = json.loads(restic("restic", "snapshots", "--json", "--host", plan.HOST))
    return {"repository_bytes": int(stats.get("total_size", 0)),
            "snapshots": len(snapshots)}


# The status that the service's metrics read and `make backup` prints.

def read_status() -> dict[str, Any]:
    try:
        return json.loads((STATE_DIR / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def write_status(status: Mapping[str, Any]) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = STATE_DIR / "status.json.tmp"
    tmp.write_text(json.dumps(dict(status), sort_keys=True))
    tmp.replace(STATE_DIR / "status.json")


@contextmanager
def one_at_a_time(wait: float = 0) -> Iterator[None]:
    """This container's one backup (or lock clearing) at a time; waits up to *wait*
    seconds for the one that runs (the service's start clears locks for a second)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait
    with open(STATE_DIR / "lock", "w") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise BackupError("a backup is running already; try again when it "
                                      "is done") from None
                time.sleep(0.2)
        yield


def back_up_volumes(settings: Mapping[str, Any], with_prometheus: bool,
                    prometheus_stopped: bool
                    ) -> tuple[subprocess.CompletedProcess, list[str], list[str]]:
    """restic's backup of the volumes there now (and the rest of :func:`plan.backup_paths`):
    its run, the volumes and the homes among them. Made again without a home that was
    removed as restic began (its member removed): restic fails the whole backup when a
    folder above a path it was given goes (seen: ``Lstat: stat /volumes/gpulab-home-...:
    no such file or directory``, exit 1)."""
    for _ in range(VANISHED_TRIES):
        volumes = plan.volumes_to_back_up(
            present_volumes(), settings["spawn.home_volume"],
            settings["spawn.datasets_volume"], settings["backup.datasets"],
            prometheus=prometheus_stopped)
        homes = [v for v in volumes
                 if v.startswith(plan.home_prefix(settings["spawn.home_volume"]))]
        done = run_restic(*plan.backup_command(plan.backup_paths(volumes, with_prometheus)))
        removed = [v for v in homes if not os.path.lexists(plan.volume_data(v))]
        if done.returncode in (0, 3) or not removed:
            break
        log.info("%s removed as the backup began (restic: %s); backing up again without "
                 "it", ", ".join(removed), last_words(done))
    return done, volumes, homes


def back_up(settings: Mapping[str, Any], prometheus_url: str | None,
            prometheus_stopped: bool = False) -> dict[str, Any]:
    """One whole backup, then the old ones forgotten as the settings keep; the status
    (written for the metrics too). A part that fails (Prometheus not answering) leaves
    the rest backed up and the attempt marked failed, with why. *prometheus_stopped*:
    Prometheus is stopped (``make upgrade``; an older gpulab's has no snapshot API), so
    its volume is backed up as it lies, like any other."""
    started = time.time()
    status = read_status()
    status.update(last_attempt=started)
    problems: list[str] = []
    try:
        with one_at_a_time(wait=30):
            ensure_repository()
            # a lock that a killed restic left (an OOM kill, a crash) would fail every
            # prune after it for 30 minutes: no other restic of ours runs now
            restic("restic", "unlock")
            stage_databases()
            with_prometheus = False
            if prometheus_url and not prometheus_stopped:
                try:
                    prometheus_snapshot(prometheus_url)
                    with_prometheus = True
                except BackupError as e:
                    problems.append(str(e))
            try:
                done, volumes, homes = back_up_volumes(settings, with_prometheus,
                                                       prometheus_stopped)
            finally:
                drop_prometheus_snapshot()
            if done.returncode == 3 and plan.only_vanished_from_homes(done.stderr, homes,
                                                                     os.path.lexists):
                log.info("files gone from members' homes while the backup read them (deleted "
                         "or moved, or the home removed) are not in it; the rest is whole")
            elif done.returncode == 3:  # the snapshot is made, without some files
                problems.append(f"some files could not be read: {last_words(done)}")
            elif done.returncode != 0:
                raise BackupError(f"restic backup failed (exit {done.returncode}): "
                                  f"{last_words(done)}")
            summary = plan.parse_summary(done.stdout)
            forget = plan.forget_command(plan.Keep.from_settings(settings))
            if forget:
                restic(*forget)
            status.update(repository_facts())
    except (BackupError, OSError, sqlite3.Error, ValueError) as e:
        status.update(last_attempt_ok=False, last_error=str(e),
                      last_duration=time.time() - started)
        write_status(status)
        raise BackupError(str(e)) from None
    if not problems:
        status.update(last_success=started)
    status.update(last_attempt_ok=not problems, last_error="; ".join(problems),
                  last_snapshot=summary.snapshot,
                  files=summary.files, processed_bytes=summary.processed_bytes,
                  added_bytes=summary.added_bytes, volumes=volumes,
                  last_duration=time.time() - started)
    write_status(status)
    return status
