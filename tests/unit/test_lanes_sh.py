"""scripts/lanes.sh, the lanes of `make test`, run with a stand-in for pytest that records
when each lane ran: a lane started with lane_after begins once the lane it follows has
ended (not when the others do), and every lane's output and failure are reported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The stand-in is called as lanes.sh calls pytest (-p no:cacheprovider --durations=10
# first), then NAME SECONDS [fail]: it records its start and end, and fails if told to.
STAND_IN = """#!/bin/sh
shift 3
echo "start $1 $(date +%s.%N)" >> "$RECORD"
sleep "$2"
echo "end $1 $(date +%s.%N)" >> "$RECORD"
echo "output of $1"
[ "$3" != fail ]
"""

SCRIPT = """
. scripts/lanes.sh
lane slow slow 3
slow_pid=$!
lane short short 0.3
short_pid=$!
lane_after short after after 0.1
after_pid=$!
lane_after short failing failing 0.1 fail
failing_pid=$!
wait "$slow_pid"; show slow
wait "$short_pid"; show short
wait "$after_pid"; show after
wait "$failing_pid"; show failing
finish "lanes"
"""


def test_a_lane_after_another_begins_when_that_one_ends_and_failures_are_told(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pytest").write_text(STAND_IN)
    (bin_dir / "pytest").chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)  # lanes.sh runs bench.machine with it
    record = tmp_path / "record"
    out = subprocess.run(["bash", "-c", SCRIPT], cwd=REPO, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTEST": str(bin_dir / "pytest"),
                                          "RECORD": str(record), "PYTHONPATH": str(REPO)})
    assert out.returncode == 1, out  # a lane failed, and the run says which
    assert "[gpulab] failed: failing" in out.stderr, out.stderr
    for name, status in (("slow", 0), ("short", 0), ("after", 0), ("failing", 1)):
        assert f"================ lane '{name}' (exit {status}," in out.stdout, out.stdout
        assert f"output of {name}" in out.stdout
    at = {}
    for line in record.read_text().splitlines():
        event, name, when = line.split()
        at[event, name] = float(when)
    for name in ("after", "failing"):
        assert at["end", "short"] <= at["start", name] < at["end", "slow"], at
