"""A job: one of her named servers that runs her command and ends when it ends.

A member starts a named server with ``"job": {"command": "python train.py", "time": "8h"}``
among its options (``POST /hub/api/users/NAME/servers/ID``). It is a server like any
other (the line's admission, her GPUs and CPUs, her home, the hardening, the culler, the
dashboards), and its image's ``gpulab_job`` extension (images/singleuser/gpulab_job.py)
runs the command in her home as she would in a terminal, writes ``~/jobs/ID/log`` and
``~/jobs/ID/status.json``, and stops the server when the command ends, so that its GPUs
go back at once. docs/plans/jobs.md says why a job is a server.

This module only decides: whether the options ask for a job and whether it may run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpulab.gpus.allocator import InvalidRequest
from gpulab.settings import duration_text, parse_duration

OPTION = "job"
ENV = "GPULAB_JOB"  # what the image's gpulab_job extension reads: the job, as JSON
MAX_COMMAND = 64 * 1024  # bytes of a command line (Linux takes 128 KiB in one argument)
_KEYS = ("command", "time")
_SHAPE = '"job": {"command": "python train.py", "time": "8h"}'


@dataclass(frozen=True)
class Job:
    command: str
    time_limit: int  # seconds after which it is stopped; 0: none (max_server_age: never)


def parse_job(options: Any, server: str, max_server_age: int) -> Job | None:
    """The job *options* ask of *server* (None: a server, not a job), or InvalidRequest
    saying what is wrong. Its time is hers to choose up to gpus.yaml's max_server_age
    (which is also its default; 0 there: no limit)."""
    raw = options.get(OPTION) if isinstance(options, Mapping) else None
    if raw is None:
        return None
    if not server:
        raise InvalidRequest("A job runs as a named server of its own, not your default "
                             "one: POST /hub/api/users/NAME/servers/ID with its options.")
    if isinstance(raw, str):
        raw = {"command": raw}
    if not isinstance(raw, Mapping):
        raise InvalidRequest(f"\"job\" must be an object such as {{{_SHAPE}}}, got "
                             f"{type(raw).__name__}.")
    unknown = sorted(str(k) for k in raw if k not in _KEYS)
    if unknown:
        raise InvalidRequest(f"Unknown job option(s): {', '.join(unknown)}; a job is "
                             f"{{{_SHAPE}}} (time optional).")
    command = raw.get("command")
    if not isinstance(command, str) or not command.strip():
        raise InvalidRequest(f"A job needs its command, a line of text: {{{_SHAPE}}}.")
    if len(command.encode()) > MAX_COMMAND or "\0" in command:
        raise InvalidRequest(f"A job's command is at most {MAX_COMMAND // 1024} KiB of text "
                             f"(put a longer one in a script in your home and run that).")
    time_limit = max_server_age
    if raw.get("time") is not None:
        try:
            time_limit = parse_duration(raw["time"])
        except ValueError as e:
            raise InvalidRequest(f"A job's \"time\": {e}.") from None
        if time_limit <= 0:
            raise InvalidRequest("A job's \"time\" must be above 0, such as \"8h\".")
        if max_server_age and time_limit > max_server_age:
            raise InvalidRequest(f"A job's \"time\" may be at most "
                                 f"{duration_text(max_server_age)} (max_server_age in the "
                                 f"lab's gpus.yaml), got {duration_text(time_limit)}.")
    return Job(command, time_limit)


ENDED = ("exited", "timed out")  # what a job's server says of its end (gpulab_job.py)


def ended_text(command: str, state: str, exit_code: int | None, seconds: float,
               gpu_hours: float) -> str:
    """What she reads of a job that ended: "python train.py exited 0 after 2 h 13 min,
    2.2 GPU-hours"."""
    shown = command if len(command) <= 60 else command[:57] + "..."
    took = f"after {duration_text(max(1, seconds))}, {gpu_hours:.1f} GPU-hours"
    if state == "timed out":
        return f"{shown} was stopped at its time limit {took}"
    return f"{shown} exited {exit_code} {took}"


def parse_ended(body: Any) -> tuple[str, str, int | None, float, float]:
    """A job's server's report of its end (``{"command", "state", "exit_code", "seconds",
    "gpu_hours"}``), or InvalidRequest."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("Body must be an object: {\"command\", \"state\", "
                             "\"exit_code\", \"seconds\", \"gpu_hours\"}.")
    command, state, code = body.get("command"), body.get("state"), body.get("exit_code")
    seconds, hours = body.get("seconds"), body.get("gpu_hours")
    numbers = (seconds, hours)
    if (not isinstance(command, str) or len(command.encode()) > MAX_COMMAND
            or state not in ENDED
            or not (code is None or (isinstance(code, int) and not isinstance(code, bool)))
            or any(isinstance(n, bool) or not isinstance(n, int | float) or n < 0
                   for n in numbers)):
        raise InvalidRequest(f"A job's end is {{\"command\": text, \"state\": one of "
                             f"{', '.join(ENDED)}, \"exit_code\": a whole number or null, "
                             f"\"seconds\" and \"gpu_hours\": numbers from 0}}.")
    return command, state, code, float(seconds), float(hours)


def job_env(job: Job, server: str) -> dict[str, str]:
    """The container's environment that makes the server *server* run *job*."""
    return {ENV: json.dumps({"id": server, "command": job.command,
                             "time_limit": job.time_limit})}
