"""A job's server runs the member's command and stops when it ends (gpulab.spawn.jobs).

The hub starts a named server with ``GPULAB_JOB`` in its environment (``{"id", "command",
"time_limit"}``, as JSON). This extension then, in the member's home:

* moves an earlier run's folder of the same ID aside (``~/jobs/ID.<time>``: nothing is
  overwritten), and runs ``bash -c COMMAND`` in ``~`` with stdout and stderr in
  ``~/jobs/ID/log`` (``tail -f`` it, in JupyterLab or over SSH);
* keeps ``~/jobs/ID/status.json`` true: ``running`` with its start, then ``exited``
  (its exit code), ``timed out`` (stopped at its time limit: SIGTERM to its process group,
  SIGKILL :data:`GRACE` seconds later) or ``stopped`` (the server was stopped under it),
  with its end, its seconds and its GPU-hours (its GPUs x its hours), written at the
  SIGTERM of a stop;
* counts as activity while the command runs (``gpulab_job_last_activity``, jupyter
  server's hook), so the idle culler leaves a quiet job alone;
* once the command ended, tells the hub (``POST /hub/api/gpulab/jobs/USER/SERVER``: her
  home page says how it ended) and stops its own server (``DELETE`` on the hub's REST
  API with the server's own token, which may: hubconfig's server token scopes), so that
  its GPUs go back at once. A hub that does not answer (restarting after a crash) is
  asked again for up to :data:`HUB_PATIENCE` seconds; after that, the server exits and
  the hub sees it end when it is back.

Enabled by jupyter_server_config.d/gpulab_job.json in the image; a server without
``GPULAB_JOB`` is untouched.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from tornado import ioloop
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

ENV = "GPULAB_JOB"
SETTING = "gpulab_job_last_activity"  # ends in _last_activity: jupyter_server's hook
CHECK_EVERY = 1.0  # seconds between looks at the command
GRACE = 30.0  # seconds between SIGTERM and SIGKILL at the time limit
HUB_PATIENCE = 600.0  # seconds to keep asking a hub that does not answer (restarting)
HUB_RETRY = 3.0  # seconds between those asks


def now_text(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def gpu_hours(gpus: str, seconds: float) -> float:
    """*gpus*: the leased GPUs' UUIDs, comma-separated (GPULAB_GPUS)."""
    return round(len([g for g in gpus.split(",") if g.strip()]) * seconds / 3600, 4)


def ended_status(start: dict, state: str, exit_code: int | None, ended: float) -> dict:
    seconds = max(0.0, ended - start["started_at"])
    return {**start, "state": state, "exit_code": exit_code, "ended": now_text(ended),
            "seconds": round(seconds, 1), "gpu_hours": gpu_hours(start["gpus"], seconds)}


def write_json(path: Path, value: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n")
    tmp.replace(path)


def job_folder(home: Path, job_id: str, at: float) -> Path:
    """``~/jobs/ID``, an earlier run's moved aside to ``~/jobs/ID.<time>`` first."""
    folder = home / "jobs" / job_id
    if folder.exists():
        folder.rename(folder.with_name(f"{job_id}.{datetime.fromtimestamp(at, UTC):%Y%m%dT%H%M%S}"))
    folder.mkdir(parents=True)
    return folder


def _jupyter_server_extension_points():
    return [{"module": "gpulab_job"}]


def _load_jupyter_server_extension(serverapp):
    raw = os.environ.get(ENV)
    if not raw:
        return
    job = json.loads(raw)
    log = serverapp.log
    home = Path(os.environ.get("HOME") or "/home/jovyan")
    started = time.time()
    folder = job_folder(home, job["id"], started)
    status_path = folder / "status.json"
    out = (folder / "log").open("ab", buffering=0)
    # bash -c, not -lc: a login shell's /etc/profile sets Debian's PATH, without the
    # image's Python (seen: "python: command not found")
    proc = subprocess.Popen(["bash", "-c", job["command"]], cwd=home, stdin=subprocess.DEVNULL,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                            env={k: v for k, v in os.environ.items() if k != ENV})
    start = {"id": job["id"], "command": job["command"], "started": now_text(started),
             "started_at": started, "time_limit": job["time_limit"], "pid": proc.pid,
             "gpus": os.environ.get("GPULAB_GPUS", "")}
    write_json(status_path, {**start, "state": "running"})
    log.info("gpulab_job: job %s runs %r (pid %s), its output in %s", job["id"],
             job["command"][:200], proc.pid, folder / "log")
    settings = serverapp.web_app.settings
    state = {"timed_out_at": None, "done": False}

    def end(kind: str, code: int | None) -> dict:
        state["done"] = True
        status = ended_status(start, kind, code, time.time())
        write_json(status_path, status)
        log.info("gpulab_job: job %s %s (exit code %s) after %.0f s", job["id"], kind, code,
                 status["seconds"])
        return status

    def stopped_under_it() -> None:  # the server stopped under a running command
        if not state["done"] and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            end("stopped", None)

    # Said at the SIGTERM that stops the server (docker stop, when she cancels it), not
    # only at exit: jupyter_server's shutdown may take longer than Docker's 10 s on a
    # loaded machine, and a SIGKILL runs no atexit (seen in CI: "running" for ever).
    # jupyter_server has set its own handler by now (init_signal, before extensions).
    server_handler = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame) -> None:
        stopped_under_it()
        if callable(server_handler):
            server_handler(signum, frame)
        else:  # no handler before ours: die of it, as without us
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    atexit.register(stopped_under_it)

    api = os.environ.get("JUPYTERHUB_API_URL", "").rstrip("/")
    user = quote(os.environ.get("JUPYTERHUB_USER", ""))
    server = quote(os.environ.get("JUPYTERHUB_SERVER_NAME", ""))
    auth = {"Authorization": f"token {os.environ.get('JUPYTERHUB_API_TOKEN', '')}"}

    async def hub(method: str, path: str, body: dict | None = None):
        """The hub's answer, asked again while it does not answer (a hub restarting
        after a crash: its GPUs stay held until it is back either way), for at most
        HUB_PATIENCE seconds; its refusals (4xx) at once, as HTTPClientError."""
        deadline = time.monotonic() + HUB_PATIENCE
        while True:
            try:
                return await AsyncHTTPClient().fetch(HTTPRequest(
                    f"{api}{path}", method=method, request_timeout=30, headers=auth,
                    body=json.dumps(body) if body is not None else None))
            except HTTPClientError as e:
                if (e.code < 500 and e.code != 599) or time.monotonic() > deadline:
                    raise
                why = e
            except OSError as e:  # refused, reset: the hub is not there (yet)
                if time.monotonic() > deadline:
                    raise
                why = e
            log.warning("gpulab_job: the hub did not answer %s %s (%s): asking again",
                        method, path, why)
            await asyncio.sleep(HUB_RETRY)

    async def stop_server(status: dict) -> None:
        try:  # her home page says how it ended
            await hub("POST", f"/gpulab/jobs/{user}/{server}", {k: status[k] for k in (
                "command", "state", "exit_code", "seconds", "gpu_hours")})
        except Exception as e:
            log.warning("gpulab_job: the hub was not told how the job ended (%s)", e)
        # A command that ends before the hub has seen this server up: a stop now would
        # cancel the spawn, and whoever started the job would get a 500 (seen in CI:
        # gpulab-job submit of print(6*7) on a loaded machine). Wait for the hub first.
        for _ in range(240):
            try:
                r = await hub("GET", f"/users/{user}")
                model = (json.loads(r.body).get("servers") or {}).get(
                    os.environ.get("JUPYTERHUB_SERVER_NAME", "")) or {}
                if model.get("ready") or not model.get("pending"):
                    break
            except Exception as e:
                log.warning("gpulab_job: could not ask the hub about this server (%s)", e)
                break
            await asyncio.sleep(0.5)
        try:
            await hub("DELETE", f"/users/{user}/servers/{server}")
            log.info("gpulab_job: asked the hub to stop this server")
        except Exception as e:  # the hub will see the server end
            log.warning("gpulab_job: the hub did not stop this server (%s): exiting", e)
            ioloop.IOLoop.current().call_later(1, serverapp.stop)

    def look() -> None:
        if state["done"]:
            return
        code = proc.poll()
        now = time.time()
        if code is not None:
            status = end("timed out" if state["timed_out_at"] else "exited", code)
            checker.stop()
            ioloop.IOLoop.current().add_callback(stop_server, status)
            return
        settings[SETTING] = datetime.now(UTC)
        limit = job["time_limit"]
        if limit and state["timed_out_at"] is None and now - started > limit:
            log.warning("gpulab_job: job %s reached its time limit (%s s): stopping it",
                        job["id"], limit)
            state["timed_out_at"] = now
            os.killpg(proc.pid, signal.SIGTERM)
        elif state["timed_out_at"] and now - state["timed_out_at"] > GRACE:
            os.killpg(proc.pid, signal.SIGKILL)

    checker = ioloop.PeriodicCallback(look, CHECK_EVERY * 1000)
    checker.start()
