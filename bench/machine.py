"""How busy this machine's CPUs are, and how fast one of them is today.

The integration lanes are CPU-bound on a 2-core machine, so a run's time follows the CPU
it uses and how fast the CPUs were that day (the same checkout's integration tests took
658 s on one day's machine and 1509 s on another's). scripts/lanes.sh reads the counters
and times the probe before its lanes start, and prints the line below when they end:

    python -m bench.machine start              -> "BUSY STEAL PROBE"
    python -m bench.machine since WHAT WALL BUSY STEAL PROBE   -> the closing line

bench/suite_cpu counts each test's CPU with the same counters.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

# /proc/stat's first line after "cpu": user nice system idle iowait irq softirq steal ...
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # all but idle and iowait; steal counts as busy
STEAL_FIELD = 7


def _fields(stat: str | None) -> list[int]:
    if stat is None:
        stat = Path("/proc/stat").read_text()
    return [int(f) for f in stat.splitlines()[0].split()[1:]]


def machine_busy_seconds(stat: str | None = None) -> float:
    """Busy CPU seconds of all cores since boot, from /proc/stat's first line."""
    fields = _fields(stat)
    return sum(fields[i] for i in BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


def machine_steal_seconds(stat: str | None = None) -> float:
    """CPU seconds the hypervisor took from all cores since boot (part of the busy ones)."""
    return _fields(stat)[STEAL_FIELD] / os.sysconf("SC_CLK_TCK")


def probe_seconds(rounds: int = 500_000) -> float:
    """Seconds one core takes for a fixed loop of SHA-256 (0.17-0.18 s on 2026-12-05's
    machine): how fast this machine is right now, to compare runs by."""
    started, digest = time.perf_counter(), b""
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return time.perf_counter() - started


def closing_line(what: str, wall: float, busy: float, steal: float, cpus: int,
                 probe: float) -> str:
    """What a run says when it ends: its time, the CPU seconds used in it (*busy* and
    *steal* since its start), how busy that kept the cores, and the probe from before."""
    share = busy / (wall * cpus) if wall else 0.0
    return (f"{what} took {wall:.0f} s; CPU: {busy:.0f} s used of {wall * cpus:.0f} "
            f"({cpus} CPUs, {share:.0%} busy, {steal:.0f} s stolen); probe before: "
            f"{probe:.2f} s (a fixed loop on one core)")


def main(argv: list[str]) -> None:
    if argv[:1] == ["start"]:
        print(f"{machine_busy_seconds():.2f} {machine_steal_seconds():.2f} "
              f"{probe_seconds():.2f}")
    elif argv[:1] == ["since"] and len(argv) == 6:
        what, wall, busy, steal, probe = argv[1], *map(float, argv[2:])
        print(closing_line(what, wall, machine_busy_seconds() - busy,
                           machine_steal_seconds() - steal, len(os.sched_getaffinity(0)), probe))
    else:
        raise SystemExit("usage: python -m bench.machine start | "
                         "since WHAT WALL BUSY STEAL PROBE")


if __name__ == "__main__":
    main(sys.argv[1:])
