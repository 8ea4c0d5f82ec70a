"""The single-user image's work watcher (images/singleuser/gpulab_work.py): what counts as
work that keeps a server from the idle culler, from the kernels' states and the
processes' CPU time. Its effect on the real stack (a silent cell, a nohup script, a busy
GPU surviving the idle culler) is tests/integration/test_idle_culler.py's."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

IMAGE = Path(__file__).resolve().parents[2] / "images" / "singleuser"
spec = importlib.util.spec_from_file_location("gpulab_work", IMAGE / "gpulab_work.py")
work = importlib.util.module_from_spec(spec)
spec.loader.exec_module(work)


def test_a_busy_kernel_counts_an_idle_one_does_not():
    kernels = [{"id": "a", "execution_state": "busy"}, {"id": "b", "execution_state": "idle"},
               {"id": "c", "execution_state": "starting"}]
    assert work.busy_kernels(kernels) == ["a"]


def test_a_process_works_when_it_used_a_share_of_a_core_since_the_last_look():
    before = {1: 10.0, 7: 5.0, 8: 3.0}
    now = {1: 13.0, 7: 5.01, 8: 3.3, 9: 0.25}  # 1: the server; 9: new since
    # over 10 s, 2 % of a core is 0.2 s: 8 (0.3 s) and 9 (0.25 s from nothing) work;
    # 7 (0.01 s, a shell at its prompt or a kernel waiting) does not; the server is left out
    assert work.working_processes(before, now, 10.0, ignore=[1]) == [8, 9]
    assert work.what_works([], before, now, 10.0, server_pid=1) == "2 process(es) working"
    assert work.what_works([{"id": "k", "execution_state": "busy"}], before, before, 10.0,
                           server_pid=1) == "1 kernel(s) executing"
    assert work.what_works([], before, before, 10.0, server_pid=1) == ""


def test_cpu_seconds_reads_user_and_system_time_from_proc(tmp_path):
    ticks = os.sysconf("SC_CLK_TCK")
    # a process name with spaces and parentheses: the fields count from its closing ")"
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text(
        f"42 (python (train) x) R 1 42 42 0 -1 4194304 100 0 0 0 {3 * ticks} {ticks} "
        "0 0 20 0 1 0 100 0 0\n")
    (tmp_path / "self").mkdir()  # not a process number
    (tmp_path / "43").mkdir()  # gone while read: no stat file
    assert work.cpu_seconds(tmp_path) == {42: 4.0}


def test_the_live_proc_of_this_process_is_read():
    assert os.getpid() in work.cpu_seconds()
