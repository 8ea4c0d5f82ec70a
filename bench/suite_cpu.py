"""Where the test suite's time and CPU go, test by test: a pytest plugin and its report.

The suite is CPU-bound on a 2-core machine (bench/RESULTS.md, "The test suite's time"), so
a test's cost is the CPU the whole machine spends while it runs (its pytest, the hub,
dockerd, Chromium, the members' servers), not its wall time. Run ONE lane alone, so that
no other lane's work is counted in its tests:

    GPULAB_SUITE_CPU=/tmp/members.jsonl PYTHONPATH=. .venv/bin/pytest -p bench.suite_cpu \\
        -m "integration and not gpus_lane and not disruptive" tests/integration ...
    # the disruptive lane, on its own engine (scripts/test-integration.sh's arguments):
    GPULAB_SUITE_CPU=/tmp/disruptive.jsonl PYTHONPATH=$PWD scripts/own-engine-pytest \\
        -p bench.suite_cpu -m "integration and disruptive" tests/integration --ignore ...
    .venv/bin/python -m bench.suite_cpu /tmp/members.jsonl [--top 25]

Each test adds one JSON line: its node id, wall seconds, and the machine's busy CPU
seconds over all cores (bench/machine.py: /proc/stat less idle and iowait) from its
setup to its teardown. The report sums them per module and lists the costliest tests.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

from bench.machine import machine_busy_seconds


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    out = os.environ.get("GPULAB_SUITE_CPU")
    cpu, wall = machine_busy_seconds(), time.monotonic()
    yield
    if out:
        record = {"test": item.nodeid, "wall": round(time.monotonic() - wall, 2),
                  "cpu": round(machine_busy_seconds() - cpu, 2)}
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")


def report(records: list[dict], top: int) -> str:
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in records:
        module = r["test"].split("::")[0].rsplit("/", 1)[-1]
        modules[module][0] += r["wall"]
        modules[module][1] += r["cpu"]
    wall, cpu = sum(r["wall"] for r in records), sum(r["cpu"] for r in records)
    lines = [f"{len(records)} tests: {wall:.0f} s wall, {cpu:.0f} CPU-s "
             f"({cpu / wall if wall else 0:.2f} cores busy on average)", "",
             f"{'CPU-s':>7} {'wall s':>7}  module"]
    for module, (w, c) in sorted(modules.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{c:7.1f} {w:7.1f}  {module}")
    lines += ["", f"{'CPU-s':>7} {'wall s':>7}  test (costliest {top})"]
    for r in sorted(records, key=lambda r: -r["cpu"])[:top]:
        lines.append(f"{r['cpu']:7.1f} {r['wall']:7.1f}  {r['test'].rsplit('/', 1)[-1]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path, help="the JSON lines GPULAB_SUITE_CPU named")
    parser.add_argument("--top", type=int, default=25, help="how many tests to list")
    args = parser.parse_args(argv)
    records = [json.loads(line) for line in args.records.read_text().splitlines() if line]
    print(report(records, args.top))


if __name__ == "__main__":
    main()
