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

In every server (a job's or not), ``POST {base_url}gpulab/jobs`` is "Run as Job..." in
JupyterLab's file browser (the image's ``gpulab-job`` labextension): a ``.py`` file or a
notebook of hers, run as a job by ``gpulab-job submit`` with the server's own token, as
she would in a terminal; her GPUs, time limit and whether to wait in line come from the
dialog. Only she may (not a colleague her server might one day be shared with).

Enabled by jupyter_server_config.d/gpulab_job.json in the image; a server without
``GPULAB_JOB`` runs no job.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shlex
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from urllib.parse import quote

from tornado import ioloop, web
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


CLI = "/usr/local/bin/gpulab-job"
RUNNABLE = {".py": "python", ".ipynb": "notebook"}


def file_job(body: object, home: Path, at: float) -> tuple[str, list[str]]:
    """(job ID, ``gpulab-job submit`` arguments) that run the file *body* names
    (``{"path", "gpus", "time", "wait"}``, the path as JupyterLab's contents API gives it:
    relative to her home) as a job; ValueError saying what is wrong, for her. A ``.py``
    file runs with ``python`` in its folder; a notebook is executed by nbconvert into
    ``~/jobs/ID/`` (the notebook itself is left as it is)."""
    if not isinstance(body, dict):
        raise ValueError('The body is {"path": "train.py", "gpus": 1, "time": "8h"}.')
    raw = body.get("path")
    path = PurePosixPath(raw) if isinstance(raw, str) else None
    if path is None or path.is_absolute() or ".." in path.parts or not path.name:
        raise ValueError("\"path\" is a file in your home, as the file browser names it.")
    kind = RUNNABLE.get(path.suffix)
    if kind is None:
        raise ValueError(f"Only a Python file (.py) or a notebook (.ipynb) runs as a job, "
                         f"not {path.name}.")
    if not (home / path).is_file():
        raise ValueError(f"{path} is not a file in your home.")
    gpus = body.get("gpus", 1)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise ValueError("\"gpus\" is a whole number from 0.")
    limit = body.get("time") or ""
    if not isinstance(limit, str):
        raise ValueError("\"time\" is a duration such as 8h, or empty for the lab's most.")
    job_id = f"job-{datetime.fromtimestamp(at, UTC):%Y%m%d-%H%M%S}"
    folder = str(path.parent)
    where = f"cd {shlex.quote(folder)} && " if folder != "." else ""
    if kind == "python":
        command = f"{where}python {shlex.quote(path.name)}"
    else:
        command = (f"{where}jupyter nbconvert --to notebook --execute "
                   f"{shlex.quote(path.name)} --output-dir ~/jobs/{job_id} "
                   f"--output {shlex.quote(path.stem)}")
    args = ["submit", "--gpus", str(gpus), "--name", job_id,
            *(["--time", limit] if limit else []), *(["--wait"] if body.get("wait") else []),
            "--", command]
    return job_id, args


def run_as_job_handler() -> type:
    """``POST gpulab/jobs``: JupyterLab's "Run as Job..." (see the module). Built when the
    extension loads: jupyter_server is the image's, not the hub's (whose tests import
    this module for :func:`file_job`)."""
    from jupyter_server.base.handlers import APIHandler

    class RunAsJobHandler(APIHandler):
        @web.authenticated
        async def post(self):
            owner = os.environ.get("JUPYTERHUB_USER")
            if owner and getattr(self.current_user, "username", None) != owner:
                raise web.HTTPError(403, "Only the owner of this server runs jobs from it.")
            home = Path(os.environ.get("HOME") or "/home/jovyan")
            try:
                job_id, args = file_job(self.get_json_body(), home, time.time())
            except ValueError as e:
                raise web.HTTPError(400, str(e)) from None
            proc = await asyncio.create_subprocess_exec(
                CLI, *args, cwd=home, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            out, err = await proc.communicate()
            said = (out or err).decode(errors="replace").strip()
            self.log.info("gpulab_job: Run as Job %s: %s", job_id, said.splitlines()[:1])
            self.finish({"ok": proc.returncode == 0, "id": job_id, "message": said,
                         "log": f"jobs/{job_id}/log"})

    return RunAsJobHandler


def _jupyter_server_extension_points():
    return [{"module": "gpulab_job"}]


def _load_jupyter_server_extension(serverapp):
    from jupyter_server.utils import url_path_join

    web_app = serverapp.web_app
    web_app.add_handlers(".*$", [(url_path_join(web_app.settings["base_url"], "gpulab/jobs"),
                                  run_as_job_handler())])
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
