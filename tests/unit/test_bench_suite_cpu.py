"""bench.suite_cpu: the per-test CPU plugin in a real pytest run, and its report; the
machine's counters it reads and the lanes' closing line (bench.machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.machine import closing_line, machine_busy_seconds, machine_steal_seconds
from bench.suite_cpu import report

REPO = Path(__file__).resolve().parents[2]


def test_busy_seconds_leave_out_idle_and_iowait():
    stat = "cpu  100 10 50 9000 700 5 5 30 0 0\ncpu0 1 2 3 4\n"
    # user + nice + system + irq + softirq + steal, in clock ticks
    assert machine_busy_seconds(stat) * os.sysconf("SC_CLK_TCK") == 200
    assert machine_steal_seconds(stat) * os.sysconf("SC_CLK_TCK") == 30


def test_the_closing_line_says_time_cpu_share_steal_and_probe():
    assert closing_line("integration tests", 637, 1027.4, 0.3, 2, 0.183) == (
        "integration tests took 637 s; CPU: 1027 s used of 1274 (2 CPUs, 81% busy, "
        "0 s stolen); probe before: 0.18 s (a fixed loop on one core)")
    assert "0% busy" in closing_line("nothing", 0, 0, 0, 2, 0.2)


def test_a_pytest_run_records_each_tests_wall_and_cpu(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import time\n"
        "def test_spins():\n"
        "    end = time.monotonic() + 0.5\n"
        "    while time.monotonic() < end:\n"
        "        pass\n"
        "def test_sleeps():\n"
        "    time.sleep(0.5)\n")
    out = tmp_path / "cpu.jsonl"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "bench.suite_cpu",
                          "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                          str(tmp_path / "test_sample.py")],
                         cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={"GPULAB_SUITE_CPU": str(out), "PATH": "/usr/bin:/bin",
                              "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stdout + run.stderr
    records = {r["test"].rsplit("::", 1)[1]: r
               for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {"test_spins", "test_sleeps"}
    assert records["test_spins"]["wall"] >= 0.5 and records["test_sleeps"]["wall"] >= 0.5
    # a busy loop keeps a core busy; the machine may be busy with other work meanwhile
    assert records["test_spins"]["cpu"] >= 0.3, records


def test_the_report_sums_modules_and_lists_the_costliest_first():
    records = [{"test": "tests/integration/test_a.py::test_x", "wall": 10.0, "cpu": 4.0},
               {"test": "tests/integration/test_a.py::test_y", "wall": 5.0, "cpu": 6.0},
               {"test": "tests/integration/test_b.py::test_z", "wall": 20.0, "cpu": 1.0}]
    text = report(records, top=2)
    assert text.splitlines()[0] == "3 tests: 35 s wall, 11 CPU-s (0.31 cores busy on average)"
    modules = text.split("\n\n")[1].splitlines()[1:]
    assert modules[0].split() == ["10.0", "15.0", "test_a.py"]
    assert modules[1].split() == ["1.0", "20.0", "test_b.py"]
    tests = text.split("\n\n")[2].splitlines()[1:]
    assert [t.split()[-1] for t in tests] == ["test_a.py::test_y", "test_a.py::test_x"]
