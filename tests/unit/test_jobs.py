"""Jobs (gpulab.spawn.jobs): what a member's "job" option may be, as a table, and the
image's runner's pure parts (images/singleuser/gpulab_job.py). A job run end to end on
the real stack is tests/integration/test_jobs.py's."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import re
from pathlib import Path

import pytest

from gpulab import notices
from gpulab.gpus.allocator import InvalidRequest
from gpulab.spawn.jobs import MAX_COMMAND, Job, ended_text, job_env, parse_ended, parse_job

IMAGE = Path(__file__).resolve().parents[2] / "images" / "singleuser"
spec = importlib.util.spec_from_file_location("gpulab_job", IMAGE / "gpulab_job.py")
runner = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runner)
cli_loader = importlib.machinery.SourceFileLoader("gpulab_job_cli", str(IMAGE / "gpulab-job"))
cli = importlib.util.module_from_spec(
    importlib.util.spec_from_loader("gpulab_job_cli", cli_loader))
cli_loader.exec_module(cli)
DAY = 86400


@pytest.mark.parametrize("options, server, age, expected", [
    ({"gpus": 1}, "train", 0, None),  # a server, not a job
    (None, "train", 0, None),
    ({"job": "python train.py"}, "j1", 0, Job("python train.py", 0)),
    ({"job": {"command": "python train.py"}}, "j1", DAY, Job("python train.py", DAY)),
    ({"job": {"command": "x", "time": "8h"}}, "j1", DAY, Job("x", 8 * 3600)),
    ({"job": {"command": "x", "time": 60}}, "j1", 0, Job("x", 60)),  # no cap: any time
    ({"job": "x"}, "", 0, "A job runs as a named server of its own"),
    ({"job": ""}, "j1", 0, "A job needs its command"),
    ({"job": {"command": "   "}}, "j1", 0, "A job needs its command"),
    ({"job": {"command": ["python", "x.py"]}}, "j1", 0, "A job needs its command"),
    ({"job": 3}, "j1", 0, "\"job\" must be an object"),
    ({"job": {"command": "x", "gpus": 2}}, "j1", 0, "Unknown job option(s): gpus"),
    ({"job": {"command": "x", "time": "2d"}}, "j1", DAY,
     "A job's \"time\" may be at most 1 day (max_server_age in the lab's gpus.yaml), got 2 days."),
    ({"job": {"command": "x", "time": "soon"}}, "j1", 0, "A job's \"time\": expected a duration"),
    ({"job": {"command": "x", "time": 0}}, "j1", 0, "must be above 0"),
    ({"job": "x" * (MAX_COMMAND + 1)}, "j1", 0, "at most 64 KiB"),
    ({"job": "a\0b"}, "j1", 0, "at most 64 KiB"),
])
def test_a_job_option(options, server, age, expected):
    if isinstance(expected, str):
        with pytest.raises(InvalidRequest) as refused:
            parse_job(options, server, age)
        assert expected in str(refused.value)
    else:
        assert parse_job(options, server, age) == expected


def test_the_job_reaches_its_server_as_json():
    env = job_env(Job("echo 'hi'", 60), "j1")
    assert json.loads(env["GPULAB_JOB"]) == {"id": "j1", "command": "echo 'hi'",
                                             "time_limit": 60}


def test_a_runs_gpu_hours_and_its_ended_status():
    assert runner.gpu_hours("GPU-a,GPU-b", 1800) == 1.0
    assert runner.gpu_hours("", 1800) == 0.0
    start = {"id": "j1", "started_at": 1000.0, "gpus": "GPU-a"}
    status = runner.ended_status(start, "exited", 3, 1000.0 + 7200)
    assert (status["state"], status["exit_code"], status["seconds"], status["gpu_hours"]) == (
        "exited", 3, 7200.0, 2.0)


def test_a_second_run_of_an_id_moves_the_first_aside(tmp_path):
    first = runner.job_folder(tmp_path, "j1", 0)
    (first / "log").write_text("first run\n")
    second = runner.job_folder(tmp_path, "j1", 86400)
    assert second == first and not (second / "log").exists()
    assert (tmp_path / "jobs" / "j1.19700102T000000" / "log").read_text() == "first run\n"


def test_what_she_reads_when_a_job_ended():
    assert ended_text("python train.py", "exited", 0, 7980, 2.2) == (
        "python train.py exited 0 after 2 h 13 min, 2.2 GPU-hours")
    assert ended_text("x" * 80, "timed out", -15, 3600, 1) == (
        "x" * 57 + "... was stopped at its time limit after 1 h, 1.0 GPU-hours")
    body = {"command": "x", "state": "exited", "exit_code": 3, "seconds": 4.5, "gpu_hours": 0}
    assert parse_ended(body) == ("x", "exited", 3, 4.5, 0.0)
    for bad in ({**body, "state": "running"}, {**body, "exit_code": "3"},
                {**body, "seconds": -1}, {**body, "gpu_hours": True}, [], None,
                {**body, "command": None}):
        with pytest.raises(InvalidRequest):
            parse_ended(bad)


def test_her_home_page_says_how_her_job_ended():
    said = notices.Notices({}, [notices.Stopped("ann", "train1", 100.0, notices.JOB,
                                                "python train.py exited 0 after 5 s, "
                                                "0.0 GPU-hours")])
    (shown,) = notices.notices_for(said, "ann", 200.0)
    assert shown["text"] == ("Your job train1: python train.py exited 0 after 5 s, 0.0 "
                             "GPU-hours. Its output is in ~/jobs/train1/.")
    assert notices.notices_for(said, "bob", 200.0) == []


@pytest.mark.parametrize("status, server, shown", [
    ({"state": "running"}, {"ready": True}, "running"),
    ({"state": "running"}, {"ready": False, "pending": "spawn"}, "running"),
    # cancelled, and killed before it wrote its end: not running (seen in CI)
    ({"state": "running"}, {"ready": False, "pending": None}, "stopped"),
    ({"state": "running"}, {"ready": True, "pending": "stop"}, "running"),
    ({"state": "running"}, {}, "stopped"),  # its server deleted
    ({"state": "exited", "exit_code": 0}, {}, "exited"),
    ({"state": "timed out"}, {"ready": True}, "timed out"),
    ({}, {"ready": False, "pending": "spawn"}, "starting"),
    ({}, {}, "waiting"),  # in line: no server yet
])
def test_gpulab_job_list_says_a_job_whose_server_is_gone_is_not_running(status, server, shown):
    assert cli.shown_state(status, server) == shown


def test_gpulab_job_list_shows_each_state_its_code_and_gpu_hours(tmp_path, monkeypatch, capsys):
    jobs = {"ok": {"state": "exited", "exit_code": 0, "gpu_hours": 1.5, "command": "x"},
            # a cancelled job has no exit code and no GPU-hours yet (seen: a TypeError)
            "gone": {"state": "stopped", "exit_code": None, "gpu_hours": None, "command": "y"},
            "cut": {"state": "running", "command": "z"}}
    for name, status in jobs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "status.json").write_text(json.dumps(status))
    monkeypatch.setattr(cli, "JOBS", tmp_path)
    monkeypatch.setattr(cli, "servers", lambda: {
        "queued": {"ready": False, "pending": None, "user_options": {"job": "w"}}})
    assert cli.list_jobs(None) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows == [["cut", "stopped", "z"], ["gone", "stopped", "y"],
                    ["ok", "exited", "0", "1.5", "x"], ["queued", "waiting"]]


@pytest.mark.parametrize("body, expected", [
    ({"path": "train.py"}, ["--gpus", "1", "--name", "job-20270115-080000", "--",
                            "python train.py"]),
    ({"path": "exp 1/run it.py", "gpus": 2, "time": "8h", "wait": True},
     ["--gpus", "2", "--name", "job-20270115-080000", "--time", "8h", "--wait", "--",
      "cd 'exp 1' && python 'run it.py'"]),
    ({"path": "nb/Fit.ipynb", "gpus": 0},
     ["--gpus", "0", "--name", "job-20270115-080000", "--",
      "cd nb && jupyter nbconvert --to notebook --execute Fit.ipynb "
      "--output-dir ~/jobs/job-20270115-080000 --output Fit"]),
    ({"path": "x; rm -rf ~.py"}, ["--gpus", "1", "--name", "job-20270115-080000", "--",
                                  "python 'x; rm -rf ~.py'"]),  # quoted: a name, not code
    ({"path": "/etc/passwd.py"}, "is a file in your home"),
    ({"path": "../other/train.py"}, "is a file in your home"),
    ({"path": "notes.txt"}, "Only a Python file (.py) or a notebook (.ipynb)"),
    ({"path": "gone.py"}, "gone.py is not a file in your home"),
    ({"path": "train.py", "gpus": -1}, "a whole number from 0"),
    ({"path": "train.py", "gpus": True}, "a whole number from 0"),
    ({"path": "train.py", "time": 8}, "a duration such as 8h"),
    ([], "The body is"),
])
def test_run_as_job_in_jupyterlab_runs_her_file_through_gpulab_job(tmp_path, body, expected):
    for name in ("train.py", "exp 1/run it.py", "nb/Fit.ipynb", "x; rm -rf ~.py",
                 "notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=re.escape(expected)):
            runner.file_job(body, tmp_path, 1_800_000_000)
        return
    assert runner.file_job(body, tmp_path, 1_800_000_000) == (
        "job-20270115-080000", ["submit", *expected])
