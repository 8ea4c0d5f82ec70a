"""gpulab-backup: back up the lab, serve the backup's metrics, restore a backup.

  gpulab-backup serve    the service: scheduled backups (gpulab.yaml backup.*), metrics
  gpulab-backup now      one backup now (`make backup`; `make upgrade` with
                         --prometheus-stopped), its summary printed
  gpulab-backup list     the repository's backups
  gpulab-backup volumes  the Docker volumes a backup restores into (for scripts/restore.sh)
  gpulab-backup restore  put a backup back, the lab stopped (`make restore`)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from gpulab.backup import plan
from gpulab.backup.restore import find_snapshot, occupied, restore
from gpulab.backup.run import BackupError, restic
from gpulab.backup.service import current_settings, run_once, serve

CONFIG = Path(plan.CONFIG) / "gpulab.yaml"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _now(args: argparse.Namespace) -> int:
    from gpulab.backup.run import read_status

    ok = run_once(current_settings(CONFIG), args.prometheus_url, args.prometheus_stopped)
    status = read_status()
    if not ok:
        print(f"gpulab-backup: backup failed: {status.get('last_error')}", file=sys.stderr)
        return 1
    print(f"backup {status['last_snapshot']}: {status['files']} files, "
          f"{_size(status['processed_bytes'])} read, {_size(status['added_bytes'])} new, "
          f"in {status['last_duration']:.1f} s; the repository keeps "
          f"{status['snapshots']} backups in {_size(status['repository_bytes'])}")
    print(f"volumes: {' '.join(status.get('volumes', []))}")
    if not status.get("last_attempt_ok"):
        print(f"gpulab-backup: but not whole: {status['last_error']}", file=sys.stderr)
        return 1
    return 0


def _list(args: argparse.Namespace) -> int:
    snapshots = json.loads(restic("restic", "snapshots", "--json", "--host", plan.HOST))
    for s in sorted(snapshots, key=lambda s: s["time"]):
        volumes = plan.volumes_of(s["paths"])
        print(f"{s['short_id']}  {s['time'][:19].replace('T', ' ')} UTC  "
              f"{len(volumes)} volumes")
    if not snapshots:
        print("no backups yet")
    return 0


def _volumes(args: argparse.Namespace) -> int:
    print("\n".join(plan.volumes_of(find_snapshot(args.snapshot)["paths"])))
    return 0


def _restore(args: argparse.Namespace) -> int:
    snapshot = find_snapshot(args.snapshot)
    host_dirs = {"config": Path(plan.CONFIG), "secrets": Path(plan.SECRETS)}
    taken = occupied(snapshot, host_dirs, args.stack_only)
    if taken and not args.replace:
        print("gpulab-backup: these volumes hold data that the restore would replace: "
              + " ".join(taken) + "\n  make restore CONFIRM=yes replaces them; or remove "
              "them first (docker volume rm ...)", file=sys.stderr)
        return 3
    print(f"restoring backup {snapshot['short_id']} of {snapshot['time'][:19]} UTC ...")
    for line in restore(snapshot, host_dirs, args.stack_only):
        print(f"  {line}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpulab-backup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    prometheus = os.environ.get("GPULAB_PROMETHEUS_URL")
    p = sub.add_parser("serve", help="scheduled backups and their metrics")
    p.add_argument("--port", type=int, default=9446)
    p.add_argument("--prometheus-url", default=prometheus)
    p.set_defaults(run=lambda a: serve(CONFIG, a.port, a.prometheus_url))
    p = sub.add_parser("now", help="one backup now")
    p.add_argument("--prometheus-url", default=prometheus)
    p.add_argument("--prometheus-stopped", action="store_true",
                   help="Prometheus is stopped (make upgrade): back up its volume as it "
                        "lies instead of asking it for a snapshot")
    p.set_defaults(run=_now)
    p = sub.add_parser("list", help="the repository's backups")
    p.set_defaults(run=_list)
    for name, run in (("volumes", _volumes), ("restore", _restore)):
        p = sub.add_parser(name)
        p.add_argument("--snapshot", default="latest")
        p.set_defaults(run=run)
    p.add_argument("--replace", action="store_true",
                   help="replace volumes that hold data")
    p.add_argument("--stack-only", action="store_true",
                   help="only the stack's own state: the hub's data, config/ and secrets/, "
                        "the last good settings, the SSH gateway's and Alertmanager's data; "
                        "members' homes, the datasets and Prometheus' history stay as they "
                        "are (make upgrade-back)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        return args.run(args) or 0
    except BackupError as e:
        print(f"gpulab-backup: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
