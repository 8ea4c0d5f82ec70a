"""What a backup holds, how restic is called, and when the next one is due: pure.

The backup service (``gpulab-backup`` in docker-compose.yml) sees the Docker engine's
volumes folder read-only at :data:`VOLUMES`, this checkout's ``config/`` and
``secrets/`` at :data:`CONFIG` and :data:`SECRETS`, and Prometheus' data volume at
:data:`PROMETHEUS_DATA`. What it backs up, each consistent while the lab runs:

- the volumes a lab would miss (:func:`volumes_to_back_up`): the hub's data, members'
  homes, the last good settings, the SSH gateway's throttle, Alertmanager's silences;
- the sqlite databases of the hub's volume through sqlite's online backup, copied to
  :data:`STAGING` (the live files are excluded: a copy of a file in mid-write is not a
  database);
- Prometheus' data through its snapshot API, as :data:`PROMETHEUS_SNAPSHOT`;
- ``config/`` and ``secrets/``.

A restore (:mod:`gpulab.backup.restore`) puts each back where it came from.
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from gpulab.contract import PROJECT_VOLUME_PREFIX

VOLUMES = "/volumes"
STAGING = "/staging"
CONFIG = "/srv/gpulab/config"
SECRETS = "/srv/gpulab/secrets"
PROMETHEUS_DATA = "/prometheus-data"
PROMETHEUS_VOLUME = "gpulab-prometheus-data"
# Prometheus writes snapshots/<time>-<random>; the backup renames its own to this fixed
# name so that every backup stores it under one path (restic deduplicates by path).
PROMETHEUS_SNAPSHOT = f"{PROMETHEUS_DATA}/snapshots/gpulab-backup"
HUB_VOLUME = "gpulab-hub-data"
# The volumes the stack itself keeps (docker-compose.yml); members' homes come on top.
STACK_VOLUMES = (HUB_VOLUME, "gpulab-last-good", "gpulab-ssh-data", "gpulab-alertmanager-data")
SQLITE_SUFFIXES = (".sqlite", ".sqlite-journal", ".sqlite-wal", ".sqlite-shm")
# restic groups snapshots by host when it forgets old ones; the container's host name
# would change with every new container.
HOST = "gpulab"
TAG = "gpulab"


def volume_data(name: str) -> str:
    return f"{VOLUMES}/{name}/_data"


def home_prefix(home_volume: str) -> str:
    """The fixed start of members' home volumes' names, from ``spawn.home_volume``
    ("gpulab-home-{username}" -> "gpulab-home-")."""
    return home_volume.split("{", 1)[0]


def volumes_to_back_up(present: Iterable[str], home_volume: str,
                       datasets_volume: str = "", datasets: bool = False,
                       prometheus: bool = False) -> list[str]:
    """The volumes of *present* (the engine's volume names) that a backup holds, sorted:
    the stack's own, every home (named by *home_volume*'s template), every group's project
    (gpulab.contract.PROJECT_VOLUME_PREFIX), and the datasets volume when *datasets*.
    Prometheus' only when *prometheus* (it is stopped): while it runs, its snapshot is
    backed up instead."""
    prefix = home_prefix(home_volume)
    wanted = []
    for name in present:
        if name in STACK_VOLUMES or (prefix and name.startswith(prefix)) \
                or name.startswith(PROJECT_VOLUME_PREFIX) \
                or (prometheus and name == PROMETHEUS_VOLUME) \
                or (datasets and datasets_volume and name == datasets_volume):
            wanted.append(name)
    return sorted(set(wanted))


def only_vanished_from_homes(stderr: str, homes: Iterable[str],
                             exists: Callable[[str], bool]) -> bool:
    """Did restic (exit 3: some files could not be read) miss only files that were gone
    from members' *homes* (volume names) by the time it read them: deleted or moved by
    their owner, or the whole home removed with its member, while the backup ran? Homes
    are read live, and a file that no longer exists is not lost. Each error restic
    reported (``--json``: a ``message_type`` "error" line; else an ``error:`` line) must
    be under one of them and say "no such file or directory", or, where restic gives no
    cause (``"error": {}``, seen for files of a home being removed), name a path that
    does not *exist* now. Anything else unreadable, or gone from the lab's own volumes,
    is a backup that is not whole."""
    prefixes = tuple(f"{VOLUMES}/{name}/" for name in homes)
    errors = []  # (path, gone)
    for line in stderr.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            if line.startswith("error: "):
                errors.append((line, line.endswith("no such file or directory")))
            continue
        if isinstance(message, dict) and message.get("message_type") == "error":
            error = message.get("error") or {}
            path = str(message.get("item") or error.get("Path") or "")
            gone = error.get("Err") == errno.ENOENT or (
                not error and bool(path) and not exists(path))
            errors.append((path + "/", gone))
    return bool(prefixes) and bool(errors) and all(
        gone and any(p in where for p in prefixes) for where, gone in errors)


def locked_by_another(stderr: str) -> bool:
    """Did restic fail because another restic holds the repository (its lock is live)?
    restic 0.14 says "unable to create lock in backend: repository is already locked by
    PID 28 on ... lock was created at ... (1.63s ago)" (seen)."""
    return "repository is already locked" in stderr


def sqlite_files(names: Iterable[str]) -> list[str]:
    """The databases among a folder's file names (their journals are not databases)."""
    return sorted(n for n in names if n.endswith(".sqlite"))


def backup_paths(volumes: Sequence[str], with_prometheus: bool) -> list[str]:
    paths = [volume_data(v) for v in volumes] + [STAGING, CONFIG, SECRETS]
    if with_prometheus:
        paths.append(PROMETHEUS_SNAPSHOT)
    return paths


def excludes() -> list[str]:
    """The live sqlite files of the hub's volume (their online copies are in STAGING)."""
    return [f"{volume_data(HUB_VOLUME)}/*{suffix}" for suffix in SQLITE_SUFFIXES]


def backup_command(paths: Sequence[str]) -> list[str]:
    command = ["restic", "backup", "--json", "--host", HOST, "--tag", TAG]
    for pattern in excludes():
        command += ["--exclude", pattern]
    return command + list(paths)


@dataclass(frozen=True)
class Keep:
    last: int = 3
    daily: int = 7
    weekly: int = 4
    monthly: int = 12

    @classmethod
    def from_settings(cls, settings: Mapping) -> Keep:
        return cls(settings["backup.keep_last"], settings["backup.keep_daily"],
                   settings["backup.keep_weekly"], settings["backup.keep_monthly"])


def forget_command(keep: Keep) -> list[str] | None:
    """restic's forget-and-prune for *keep*; None when it keeps everything (all 0)."""
    if not (keep.last or keep.daily or keep.weekly or keep.monthly):
        return None
    return ["restic", "forget", "--prune", "--quiet", "--host", HOST, "--tag", TAG,
            "--group-by", "host", "--keep-last", str(keep.last),
            "--keep-daily", str(keep.daily), "--keep-weekly", str(keep.weekly),
            "--keep-monthly", str(keep.monthly)]


@dataclass(frozen=True)
class Summary:
    """restic's summary of one backup."""
    snapshot: str
    files: int
    processed_bytes: int
    added_bytes: int
    seconds: float


def parse_summary(output: str) -> Summary:
    """The summary line of ``restic backup --json``'s output; ValueError without one."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("message_type") == "summary" and message.get("snapshot_id"):
            return Summary(message["snapshot_id"], int(message.get("total_files_processed", 0)),
                           int(message.get("total_bytes_processed", 0)),
                           int(message.get("data_added", 0)),
                           float(message.get("total_duration", 0.0)))
    raise ValueError("restic printed no summary of the backup")


RETRY_SECONDS = 900


def due(now: float, status: Mapping, watched_since: float, every: float,
        retry: float = RETRY_SECONDS) -> bool:
    """Whether a scheduled backup is due, from the service's *status*: *every* seconds
    after the last good backup, or after *watched_since* (the service's start) when there
    is none; after a failed attempt, *retry* seconds later at the soonest (a full disk
    is not tried every few seconds). Never when *every* is 0."""
    if every <= 0:
        return False
    last_success = status.get("last_success")
    if now < (last_success if last_success is not None else watched_since) + every:
        return False
    if status.get("last_attempt_ok") is False and status.get("last_attempt") is not None:
        return now >= status["last_attempt"] + min(retry, every)
    return True


@dataclass(frozen=True)
class Placement:
    """Where one part of a snapshot goes back to: *source* inside the restored tree,
    *volume* (a Docker volume's name) or *host_dir* ("config" or "secrets")."""
    source: str
    volume: str | None = None
    host_dir: str | None = None

    @property
    def of_the_stack(self) -> bool:
        """Whether it is the stack's own state (the hub's database and data, config/,
        secrets/, the last good settings, the SSH gateway's and Alertmanager's data), as
        opposed to members' homes, the datasets and Prometheus' history: what
        ``make upgrade-back`` puts back (:func:`gpulab.backup.restore.restore`)."""
        return bool(self.host_dir) or self.volume in STACK_VOLUMES


# Docker's rule for volume names: a restore creates and writes nothing else.
_VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]+")


def placements(paths: Iterable[str]) -> list[Placement]:
    """Where each of a snapshot's *paths* (restic's list) goes back to on restore."""
    out = []
    for path in paths:
        p = PurePosixPath(path)
        if p.parent.parent == PurePosixPath(VOLUMES) and p.name == "_data" \
                and _VOLUME_NAME.fullmatch(p.parent.name) and p.parent.name != "..":
            out.append(Placement(path, volume=p.parent.name))
        elif path == STAGING:
            out.append(Placement(f"{STAGING}/{HUB_VOLUME}", volume=HUB_VOLUME))
        elif path == PROMETHEUS_SNAPSHOT:
            out.append(Placement(path, volume=PROMETHEUS_VOLUME))
        elif path == CONFIG:
            out.append(Placement(path, host_dir="config"))
        elif path == SECRETS:
            out.append(Placement(path, host_dir="secrets"))
        else:
            raise ValueError(f"a path gpulab does not back up: {path}")
    return out


def volumes_of(paths: Iterable[str]) -> list[str]:
    """The Docker volumes a snapshot with *paths* restores into, sorted."""
    return sorted({p.volume for p in placements(paths) if p.volume})
