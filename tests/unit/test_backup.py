"""gpulab.backup's decisions (what a backup holds, restic's commands, the schedule, where
a restore puts each part), its metrics, and the sqlite online copy against a writer."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpulab.backup import plan
from gpulab.backup.metrics import BackupCollector, families
from gpulab.backup.run import copy_sqlite, restic_time
from gpulab.settings import defaults

PRESENT = ["gpulab-hub-data", "gpulab-home-ann", "gpulab-home-bob", "gpulab-prometheus-data",
           "gpulab-datasets", "gpulab-last-good", "gpulab-ssh-data", "gpulab-alertmanager-data",
           "gpulab-restore-scratch", "someone-elses", "4f2a9c0b1e", "gpulab-project-vision"]


def test_a_backup_holds_the_stack_volumes_every_home_and_project_not_prometheus_or_strangers():
    assert plan.volumes_to_back_up(PRESENT, "gpulab-home-{username}", "gpulab-datasets") == [
        "gpulab-alertmanager-data", "gpulab-home-ann", "gpulab-home-bob", "gpulab-hub-data",
        "gpulab-last-good", "gpulab-project-vision", "gpulab-ssh-data"]


def test_datasets_only_when_asked_and_homes_follow_the_template():
    got = plan.volumes_to_back_up(PRESENT, "lab-{username}-home", "gpulab-datasets",
                                  datasets=True)
    assert "gpulab-datasets" in got
    assert not any(v.startswith("gpulab-home-") for v in got)
    assert plan.home_prefix("lab-{username}-home") == "lab-"


def test_a_stopped_prometheus_is_backed_up_as_its_volume_and_restored_into_it():
    got = plan.volumes_to_back_up(PRESENT, "gpulab-home-{username}", prometheus=True)
    assert "gpulab-prometheus-data" in got
    paths = plan.backup_paths(got, with_prometheus=False)
    assert plan.PROMETHEUS_SNAPSHOT not in paths
    assert "gpulab-prometheus-data" in plan.volumes_of(paths)


def test_paths_and_the_live_databases_excluded():
    paths = plan.backup_paths(["gpulab-hub-data", "gpulab-home-ann"], with_prometheus=True)
    assert paths == ["/volumes/gpulab-hub-data/_data", "/volumes/gpulab-home-ann/_data",
                     "/staging", "/srv/gpulab/config", "/srv/gpulab/secrets",
                     "/prometheus-data/snapshots/gpulab-backup"]
    command = plan.backup_command(paths)
    assert command[:2] == ["restic", "backup"] and command[-len(paths):] == paths
    assert "/volumes/gpulab-hub-data/_data/*.sqlite" in command
    assert "/volumes/gpulab-hub-data/_data/*.sqlite-journal" in command
    assert plan.PROMETHEUS_SNAPSHOT not in plan.backup_paths(["gpulab-hub-data"], False)
    assert plan.sqlite_files(["a.sqlite", "a.sqlite-journal", "cookie", "b.sqlite"]) == [
        "a.sqlite", "b.sqlite"]


def test_forget_keeps_what_the_settings_say_grouped_by_host_only():
    command = plan.forget_command(plan.Keep.from_settings(defaults()))
    assert command[:3] == ["restic", "forget", "--prune"]
    # paths change as members come and go: grouping by paths would keep every backup
    assert command[command.index("--group-by") + 1] == "host"
    assert command[command.index("--keep-daily") + 1] == "7"
    assert command[command.index("--keep-monthly") + 1] == "12"
    # a backup by hand before an upgrade is not forgotten for the nightly one that day
    assert command[command.index("--keep-last") + 1] == "3"
    assert plan.forget_command(plan.Keep(0, 0, 0, 0)) is None


def test_restic_summary_is_read_from_its_json_output():
    output = "\n".join([
        json.dumps({"message_type": "status", "percent_done": 0.5}),
        "not json",
        json.dumps({"message_type": "summary", "snapshot_id": "bcde3620",
                    "total_files_processed": 12, "total_bytes_processed": 3000,
                    "data_added": 1751, "total_duration": 0.2}),
    ])
    s = plan.parse_summary(output)
    assert (s.snapshot, s.files, s.processed_bytes, s.added_bytes) == ("bcde3620", 12, 3000, 1751)
    with pytest.raises(ValueError, match="no summary"):
        plan.parse_summary(json.dumps({"message_type": "status"}))


DAY = 86400


def test_schedule_counts_from_the_last_good_backup_or_the_service_start():
    assert not plan.due(DAY - 1, {}, watched_since=0, every=DAY)
    assert plan.due(DAY, {}, watched_since=0, every=DAY)
    ok = {"last_success": 5 * DAY, "last_attempt": 5 * DAY, "last_attempt_ok": True}
    assert not plan.due(6 * DAY - 1, ok, watched_since=0, every=DAY)
    assert plan.due(6 * DAY, ok, watched_since=0, every=DAY)
    assert not plan.due(10 * DAY, ok, watched_since=0, every=0)


def test_a_failed_attempt_is_tried_again_after_the_retry_not_at_once():
    failed = {"last_success": 0, "last_attempt": DAY, "last_attempt_ok": False}
    assert not plan.due(DAY + 899, failed, watched_since=0, every=DAY)
    assert plan.due(DAY + 900, failed, watched_since=0, every=DAY)
    # a schedule shorter than the retry is not slowed down by it
    assert plan.due(DAY + 60, failed, watched_since=0, every=60)


def test_each_part_of_a_snapshot_goes_back_where_it_came_from():
    paths = plan.backup_paths(["gpulab-hub-data", "gpulab-home-ann"], with_prometheus=True)
    got = {p.source: (p.volume, p.host_dir) for p in plan.placements(paths)}
    assert got == {
        "/volumes/gpulab-hub-data/_data": ("gpulab-hub-data", None),
        "/volumes/gpulab-home-ann/_data": ("gpulab-home-ann", None),
        "/staging/gpulab-hub-data": ("gpulab-hub-data", None),
        "/srv/gpulab/config": (None, "config"),
        "/srv/gpulab/secrets": (None, "secrets"),
        "/prometheus-data/snapshots/gpulab-backup": ("gpulab-prometheus-data", None),
    }
    assert plan.volumes_of(paths) == ["gpulab-home-ann", "gpulab-hub-data",
                                      "gpulab-prometheus-data"]
    with pytest.raises(ValueError, match="does not back up: /etc"):
        plan.placements(["/etc"])
    # nothing outside the volumes folder, whatever a snapshot's paths say
    for odd in ("/volumes/../_data", "/volumes/.hidden/_data", "/volumes/a/b/_data"):
        with pytest.raises(ValueError, match="does not back up"):
            plan.placements([odd])


def test_the_way_back_from_an_upgrade_puts_back_the_stacks_state_only():
    """make upgrade-back restores the stack's own state; homes (the files members wrote
    since), the datasets and Prometheus' history stay as they are."""
    paths = plan.backup_paths(["gpulab-hub-data", "gpulab-last-good", "gpulab-ssh-data",
                               "gpulab-alertmanager-data", "gpulab-home-ann",
                               "gpulab-datasets"], with_prometheus=True)
    assert sorted((p.volume or p.host_dir) for p in plan.placements(paths)
                  if p.of_the_stack) == [
        "config", "gpulab-alertmanager-data", "gpulab-hub-data", "gpulab-hub-data",
        "gpulab-last-good", "gpulab-ssh-data", "secrets"]


def test_restic_times_keep_their_nanoseconds_apart():
    assert restic_time("2026-12-02T22:41:24.193604658Z") == pytest.approx(1796251284.193604)
    assert restic_time("2026-12-02T22:41:24Z") == 1796251284.0
    assert restic_time("2026-12-02T23:41:24.5+01:00") == 1796251284.5
    assert restic_time("2026-12-02T17:41:24-05:00") == 1796251284.0


def _metrics(status, alert_after=7200.0):
    registry = CollectorRegistry()
    registry.register(BackupCollector(lambda: status, lambda: alert_after, watched_since=100.0))
    return generate_latest(registry).decode()


def test_metrics_before_any_backup_say_since_when_only():
    text = _metrics({})
    assert "gpulab_backup_watched_since_timestamp_seconds 100.0" in text
    assert "gpulab_backup_alert_after_seconds 7200.0" in text
    assert "gpulab_backup_last_success_timestamp_seconds" not in text
    assert "gpulab_backup_last_attempt_success" not in text


def test_metrics_of_a_good_and_of_a_failed_backup():
    good = {"last_success": 500.0, "last_attempt": 500.0, "last_attempt_ok": True,
            "last_duration": 12.5, "processed_bytes": 4096, "added_bytes": 1024,
            "repository_bytes": 9000, "snapshots": 3}
    text = _metrics(good)
    for line in ("gpulab_backup_last_success_timestamp_seconds 500.0",
                 "gpulab_backup_last_attempt_success 1.0",
                 "gpulab_backup_last_duration_seconds 12.5",
                 "gpulab_backup_last_processed_bytes 4096.0",
                 "gpulab_backup_last_added_bytes 1024.0",
                 "gpulab_backup_repository_bytes 9000.0", "gpulab_backup_snapshots 3.0"):
        assert line in text
    failed = dict(good, last_attempt=900.0, last_attempt_ok=False)
    assert "gpulab_backup_last_attempt_success 0.0" in _metrics(failed)
    # alert_after 0: the alert is off, its series absent
    assert "gpulab_backup_alert_after_seconds" not in _metrics(good, alert_after=0)
    assert {f.name for f in families({}, 0, 1.0)} == {"gpulab_backup_watched_since_timestamp_seconds"}


def test_online_copy_of_a_database_being_written_is_a_whole_database(tmp_path):
    source, copy = tmp_path / "hub.sqlite", tmp_path / "copy.sqlite"
    with sqlite3.connect(source) as db:
        db.execute("CREATE TABLE t (n INTEGER)")
    stop, wrote = threading.Event(), threading.Event()

    def writer():
        db = sqlite3.connect(source, timeout=30)
        n = 0
        while not stop.is_set():
            with db:  # one transaction: ten rows at once, never five
                db.executemany("INSERT INTO t VALUES (?)", [(n,)] * 10)
            wrote.set()
            n += 1
            stop.wait(0.001)
        db.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert wrote.wait(30)
        for _ in range(5):
            copy_sqlite(source, copy)
            with sqlite3.connect(copy) as db:
                assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
                rows = db.execute("SELECT count(*) FROM t").fetchone()[0]
            assert rows % 10 == 0
        assert rows > 0
    finally:
        stop.set()
        thread.join()
    assert copy.stat().st_mode & 0o777 == 0o600


def test_the_disks_the_lab_fills_are_measured_by_name(tmp_path):
    from gpulab.backup.metrics import disk_usage

    got = disk_usage({"backup": str(tmp_path), "gone": str(tmp_path / "missing")})
    assert set(got) == {"backup"}  # one it cannot read is left out, not an error
    size, avail = got["backup"]
    assert 0 < avail <= size
    text = generate_latest(_registry_with_disks({"backup": str(tmp_path)})).decode()
    sizes = [line for line in text.splitlines()
             if line.startswith('gpulab_filesystem_size_bytes{disk="backup"}')]
    assert [float(line.split()[-1]) for line in sizes] == [float(size)]
    assert 'gpulab_filesystem_avail_bytes{disk="backup"}' in text


def _registry_with_disks(disks):
    registry = CollectorRegistry()
    registry.register(BackupCollector(lambda: {}, lambda: 0, watched_since=1.0, disks=disks))
    return registry


def test_one_backup_at_a_time_waits_a_little_then_says_why(tmp_path, monkeypatch):
    import time as clock

    from gpulab.backup import run

    monkeypatch.setattr(run, "STATE_DIR", tmp_path)
    with run.one_at_a_time():
        started = clock.monotonic()
        with pytest.raises(run.BackupError, match="a backup is running already"):
            with run.one_at_a_time(wait=0.5):
                pass
        assert clock.monotonic() - started >= 0.5
    with run.one_at_a_time(wait=0.5):  # free again
        pass


VANISHED = ("error: lstat /volumes/gpulab-home-bea/_data: no such file or directory\n"
            "error: open /volumes/gpulab-home-bea/_data/notes.txt: no such file or directory\n"
            "Warning: at least one source file could not be read\n")
# what gpulab-backup's restic (--json) printed when a home was removed under it (seen)
VANISHED_JSON = "\n".join(
    '{"message_type":"error","error":{"Op":"lstat","Path":"/volumes/gpulab-home-bea/_data/'
    f'{n}","Err":2}},"during":"archival","item":"/volumes/gpulab-home-bea/_data/{n}"}}'
    for n in (67, 72)) + "\nWarning: at least one source file could not be read\n"
HOMES = {"gpulab-home-bea"}


def gone(stderr: str, homes=HOMES, exists=lambda path: False) -> bool:
    return plan.only_vanished_from_homes(stderr, homes, exists)


def test_files_gone_from_homes_while_they_were_read_leave_the_backup_whole():
    assert gone(VANISHED)  # restic's text (seen here, restic 0.14)
    assert gone(VANISHED_JSON)
    assert not gone(VANISHED_JSON, {"gpulab-home-be"})  # another home
    assert not gone(VANISHED, set())  # no home in the backup
    denied = VANISHED_JSON.replace('_data/72","Err":2', '_data/72","Err":13')
    assert denied != VANISHED_JSON and not gone(denied)
    unreadable = VANISHED + "error: open /volumes/gpulab-home-cy/_data/x: permission denied\n"
    assert not gone(unreadable, {"gpulab-home-bea", "gpulab-home-cy"})
    assert not gone("Warning: at least one source file could not be read\n")
    # gone from the lab's own volumes: not whole
    assert not gone(VANISHED_JSON.replace("gpulab-home-bea", "gpulab-hub-data"))


def test_an_error_without_a_cause_counts_as_gone_only_where_nothing_is_there_now():
    # restic gives some errors no cause (seen for files of a home being removed)
    line = ('{"message_type":"error","error":{},"during":"archival",'
            '"item":"/volumes/gpulab-home-bea/_data/30/98"}\n')
    assert gone(line)
    assert not gone(line, exists=lambda path: True)


# restic 0.14's words when another restic holds the repository (seen: a `forget` beside a
# running `backup --stdin`)
LOCKED = ("unable to create lock in backend: repository is already locked by PID 28 on "
          "419c856a1704 by root (UID 0, GID 0)\nlock was created at 2026-12-03 21:07:48 "
          "(1.630555111s ago)\nstorage ID ccfbe7c0\nthe `unlock` command can be used to "
          "remove stale locks\n")


def test_a_restic_that_meets_another_ones_lock_waits_for_it(tmp_path, monkeypatch):
    from gpulab.backup import run

    monkeypatch.setattr(run, "LOCK_RETRY", 0.01)
    tries = tmp_path / "tries"
    # fails twice as restic does beside another restic, then succeeds
    script = (f"echo x >> {tries}; [ $(wc -l < {tries}) -gt 2 ] && echo done && exit 0; "
              f"printf '%s' \"$LOCKED\" >&2; exit 1")
    monkeypatch.setenv("LOCKED", LOCKED)
    done = run.run_restic("sh", "-c", script)
    assert done.returncode == 0 and done.stdout == "done\n"
    assert len(tries.read_text().splitlines()) == 3

    tries.unlink()  # another failure is no lock: said at once
    done = run.run_restic("sh", "-c", f"echo x >> {tries}; echo 'Fatal: wrong password' >&2; "
                                      "exit 1")
    assert done.returncode == 1 and len(tries.read_text().splitlines()) == 1

    tries.unlink()  # a lock that stays: given up after LOCK_WAIT, with restic's words
    monkeypatch.setattr(run, "LOCK_WAIT", 0.1)
    with pytest.raises(run.BackupError, match="repository is already locked by PID 28"):
        run.restic("sh", "-c", f"echo x >> {tries}; printf '%s' \"$LOCKED\" >&2; exit 1")
    assert len(tries.read_text().splitlines()) > 1
    assert plan.locked_by_another(LOCKED) and not plan.locked_by_another(VANISHED)


def test_a_home_removed_as_the_backup_began_is_backed_up_again_without_it(
        tmp_path, monkeypatch):
    """restic fails a whole backup when a folder above a path it was given goes as it
    starts (a member removed then; seen in CI): the backup is made again of what is there."""
    from gpulab.backup import run

    volumes = tmp_path / "volumes"
    for name in ("gpulab-hub-data", "gpulab-home-ann", "gpulab-home-bob"):
        (volumes / name / "_data").mkdir(parents=True)
    monkeypatch.setattr(plan, "VOLUMES", str(volumes))
    given = []

    def restic_removing_bob(*args):
        given.append([a for a in args if a.startswith(str(volumes))])
        if (volumes / "gpulab-home-bob").exists():
            shutil.rmtree(volumes / "gpulab-home-bob")  # gone as restic began
            return subprocess.CompletedProcess(args, 1, "", (
                f"Fatal: unable to save snapshot: Lstat: stat {volumes}/gpulab-home-bob: no "
                "such file or directory\n"))
        return subprocess.CompletedProcess(args, 0, "{}", "")

    monkeypatch.setattr(run, "run_restic", restic_removing_bob)
    done, backed_up, homes = run.back_up_volumes(defaults(), False, False)
    assert done.returncode == 0 and homes == ["gpulab-home-ann"]
    assert backed_up == ["gpulab-home-ann", "gpulab-hub-data"]
    assert len(given) == 2 and not any("bob" in path for path in given[1])

    # a failure with every home still there is no removal: not made again
    given.clear()
    monkeypatch.setattr(run, "run_restic", lambda *args: given.append(args) or
                        subprocess.CompletedProcess(args, 1, "", "Fatal: disk full\n"))
    done, _, _ = run.back_up_volumes(defaults(), False, False)
    assert done.returncode == 1 and len(given) == 1
