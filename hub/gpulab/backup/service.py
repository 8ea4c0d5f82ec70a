"""The backup service's loop: a backup whenever gpulab.yaml's schedule says one is due,
and the metrics of the last one on ``--port`` for Prometheus."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from gpulab import live_config
from gpulab.backup import plan
from gpulab.backup.metrics import BackupCollector
from gpulab.backup.run import (
    BackupError,
    back_up,
    last_words,
    latest_snapshot,
    one_at_a_time,
    read_status,
    repository_facts,
    restic_time,
    run_restic,
    write_status,
)
from gpulab.settings import ConfigError, Settings, defaults

log = logging.getLogger(__name__)

# Where docker-compose.yml mounts GPULAB_BACKUP_DIR (RESTIC_REPOSITORY).
REPOSITORY = os.environ.get("RESTIC_REPOSITORY", "/backup")


def current_settings(config: Path) -> Settings:
    """gpulab.yaml's last good version; the defaults (and the error logged) when it never
    had one: backups go on while an admin fixes the file."""
    try:
        return live_config.settings_file.load(config)
    except ConfigError as e:
        log.error("%s; backing up with the default settings meanwhile", e)
        return defaults()


def clear_locks() -> None:
    """At the service's start, nothing of this container can hold the repository: the
    locks of a restic killed with the last one (docker kill, a reboot mid-backup) go.
    (The repository is this lab's backup service's alone; `make restore` runs only while
    the lab, this service with it, is down.)"""
    try:
        with one_at_a_time():  # not under a `make backup` that already runs
            done = run_restic("restic", "unlock", "--remove-all")
    except BackupError:
        return  # that backup clears stale locks itself
    if done.returncode != 0 and "unable to open config file" not in done.stderr:
        log.warning("cannot clear the repository's locks: %s", last_words(done))


def recover_status() -> None:
    """After a restart (the status lives in a tmpfs): the last good backup from the
    repository itself, so that the schedule and the metrics go on from it. Not under
    the backups' lock: on a large repository these reads take minutes, and a `make
    backup` typed meanwhile would be told one runs already. restic's read locks are
    live while they read; a backup's prune beside them waits for them
    (:func:`gpulab.backup.run.run_restic`; before, it failed: seen in CI)."""
    status = read_status()
    if status.get("last_success") is None and last_backup_into(status):
        write_status(status)


def last_backup_into(status: dict[str, Any]) -> bool:
    """The repository's last backup put into *status*; whether there was one to read."""
    try:
        latest = latest_snapshot()
        if latest is None:
            return False
        status.update(last_success=restic_time(latest["time"]),
                      last_snapshot=latest["short_id"], **repository_facts())
        return True
    except (BackupError, ValueError, KeyError) as e:
        log.warning("cannot read the last backup from the repository: %s", e)
        return False


def run_once(settings: Mapping[str, Any], prometheus_url: str | None,
             prometheus_stopped: bool = False) -> bool:
    try:
        status = back_up(settings, prometheus_url, prometheus_stopped)
    except BackupError as e:
        log.error("backup failed: %s", e)
        return False
    if status.get("last_attempt_ok"):
        log.info("backup %s: %d files, %d bytes read, %d added, in %.1f s",
                 status["last_snapshot"], status["files"], status["processed_bytes"],
                 status["added_bytes"], status["last_duration"])
    else:
        log.error("backup %s made, but not whole: %s", status["last_snapshot"],
                  status["last_error"])
    return True


def serve(config: Path, port: int, prometheus_url: str | None, poll: float = 10) -> None:
    watched_since = time.time()
    clear_locks()
    recover_status()
    registry = CollectorRegistry()
    registry.register(BackupCollector(
        read_status, lambda: current_settings(config)["backup.alert_after"], watched_since,
        disks={"volumes": plan.VOLUMES, "backup": REPOSITORY}))
    start_http_server(port, registry=registry)
    log.info("gpulab-backup: metrics on :%d; backing up as %s says (backup.every)",
             port, config)
    while True:
        settings = current_settings(config)
        if plan.due(time.time(), read_status(), watched_since, settings["backup.every"]):
            run_once(settings, prometheus_url)
        time.sleep(poll)
