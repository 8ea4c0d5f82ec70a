"""The backup in Prometheus (job ``gpulab-backup``): pure families from the service's
status, so operators see when the last good backup was and how big it is.

``gpulab_backup_last_success_timestamp_seconds``
    when the last good backup started (absent until there is one);
``gpulab_backup_watched_since_timestamp_seconds``
    when the service started watching: the age of "never backed up";
``gpulab_backup_last_attempt_success``
    1 when the last attempt backed up everything, 0 when it failed (whole or in part);
``gpulab_backup_last_duration_seconds``, ``gpulab_backup_last_processed_bytes``,
``gpulab_backup_last_added_bytes``
    the last backup's time, the size of what it read, what it added to the repository;
``gpulab_backup_repository_bytes``, ``gpulab_backup_snapshots``
    the repository's size (deduplicated, compressed as restic stores it) and backups;
``gpulab_backup_alert_after_seconds``
    gpulab.yaml's ``backup.alert_after`` (absent when 0: never);
``gpulab_filesystem_size_bytes{disk}``, ``gpulab_filesystem_avail_bytes{disk}``
    the filesystems the lab fills, as the service sees them: ``volumes`` (Docker's
    volumes: homes, the hub's database, Prometheus' data) and ``backup`` (the
    repository's).

``GpulabBackupTooOld``, ``GpulabBackupFailed`` and ``GpulabDiskNearlyFull``
(monitoring/prometheus/alerts.yml) read them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

__all__ = ["BackupCollector", "families"]

# status key -> (metric name, help)
_FIGURES = {
    "last_success": ("gpulab_backup_last_success_timestamp_seconds",
                     "When the last good backup of the lab started (Unix time)."),
    "last_duration": ("gpulab_backup_last_duration_seconds",
                      "How long the last backup attempt took."),
    "processed_bytes": ("gpulab_backup_last_processed_bytes",
                        "Bytes the last backup read (homes, databases, config, history)."),
    "added_bytes": ("gpulab_backup_last_added_bytes",
                    "Bytes the last backup added to the repository (new data only)."),
    "repository_bytes": ("gpulab_backup_repository_bytes",
                         "Size of the backup repository as restic stores it."),
    "snapshots": ("gpulab_backup_snapshots", "Backups the repository keeps."),
}


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text)
    family.add_metric([], float(value))
    return family


def families(status: Mapping[str, Any], alert_after: float, watched_since: float,
             disks: Mapping[str, tuple[int, int]] | None = None) -> list[Metric]:
    """*disks*: a filesystem's name -> (size, bytes available to its users)."""
    out = [_gauge("gpulab_backup_watched_since_timestamp_seconds",
                  "When the backup service started (Unix time).", watched_since)]
    for key, (name, help_text) in _FIGURES.items():
        if status.get(key) is not None:
            out.append(_gauge(name, help_text, status[key]))
    if status.get("last_attempt_ok") is not None:
        out.append(_gauge("gpulab_backup_last_attempt_success",
                          "1 when the last backup attempt backed up everything, else 0.",
                          1 if status["last_attempt_ok"] else 0))
    if alert_after > 0:
        out.append(_gauge("gpulab_backup_alert_after_seconds",
                          "gpulab.yaml's backup.alert_after: the oldest a last good "
                          "backup may be before operators are alerted.", alert_after))
    if disks:
        size = GaugeMetricFamily("gpulab_filesystem_size_bytes",
                                 "Size of a filesystem the lab fills.", labels=["disk"])
        avail = GaugeMetricFamily("gpulab_filesystem_avail_bytes",
                                  "Bytes of a filesystem the lab fills that are still free "
                                  "for it (not counting root's reserve).", labels=["disk"])
        for name, (total, free) in sorted(disks.items()):
            size.add_metric([name], float(total))
            avail.add_metric([name], float(free))
        out += [size, avail]
    return out


def disk_usage(paths: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    """statvfs of each named path that can be read: name -> (size, available)."""
    out = {}
    for name, path in paths.items():
        try:
            st = os.statvfs(path)
        except OSError:
            continue
        out[name] = (st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)
    return out


class BackupCollector:
    """Reads the status and the settings at each scrape (prometheus_client collector)."""

    def __init__(self, status: Callable[[], Mapping[str, Any]],
                 alert_after: Callable[[], float], watched_since: float,
                 disks: Mapping[str, str] | None = None):
        self._status, self._alert_after = status, alert_after
        self.watched_since = watched_since
        self._disks = dict(disks or {})

    def collect(self) -> Iterator[Metric]:
        yield from families(self._status(), self._alert_after(), self.watched_since,
                            disk_usage(self._disks))
