"""Backups that restore: restic snapshots of everything a lab would miss, made while the
lab runs (:mod:`.plan` decides, :mod:`.run` backs up, :mod:`.restore` puts back,
:mod:`.service` schedules and serves the metrics of :mod:`.metrics`)."""
