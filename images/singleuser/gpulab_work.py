"""Work that runs in a member's server is activity, for the hub's idle culler.

jupyterhub-idle-culler stops a server by the hub's ``last_activity``, which this server
reports (jupyterhub-singleuser, every ``JUPYTERHUB_ACTIVITY_INTERVAL`` seconds) from
``ServerWebApplication.last_activity()``: requests, kernel messages and terminal output.
A cell that computes for hours without printing, or ``nohup python train.py &`` started
in a terminal or over SSH, sends none of those, and the server was stopped with its work
(seen: a silent cell and a GPU at 95 % culled with an idle server, at one moment).

Here every :data:`CHECK_EVERY` seconds this server looks at what runs in it, and if
something works it sets ``gpulab_work_last_activity`` in the server's settings: jupyter
server counts every setting whose name ends in ``_last_activity`` (its documented hook
for extensions), so the next report carries it. What counts:

* **a kernel executing** (its execution state is ``busy``): a cell running, printing or
  not, sleeping or not. A kernel sitting idle does not count.
* **a process working**: any process of the container other than this server itself
  that used at least :data:`WORKING_CPU` of one core since the last look (a training
  script, a compile, a data preparation; started from a notebook, a terminal, SSH or
  nohup: the container's processes are all hers). A process that waits (``sleep``, a
  shell at its prompt, an idle kernel, a download blocked on the network) does not:
  it would keep a forgotten server, and its GPUs, for ever.

GPU work is counted by the hub's GPU culler (gpulab.culler), which sees the GPUs in
Prometheus; a server whose GPUs are busy is active there. Work that never ends does not
keep GPUs for ever: a server holding GPUs is stopped at its ``max_server_age``
(gpus.yaml), a clock that no activity resets.

Enabled by jupyter_server_config.d/gpulab_work.json in the image.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from tornado import ioloop

# seconds between looks: 10, or the server's activity reports' interval where the hub set
# that shorter (gpulab.hubconfig.activity_every, for a short hub.idle_timeout)
CHECK_EVERY = float(min(10, int(os.environ.get("JUPYTERHUB_ACTIVITY_INTERVAL") or 10)))
WORKING_CPU = 0.02  # share of one core a process must use between two looks to count
SETTING = "gpulab_work_last_activity"  # ends in _last_activity: jupyter_server's hook
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(proc: Path = Path("/proc")) -> dict[int, float]:
    """CPU time (user + system) of every process this server can see, by PID: in its
    container, the container's processes."""
    out = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        out[int(entry.name)] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def working_processes(before: Mapping[int, float], now: Mapping[int, float], seconds: float,
                      ignore: Iterable[int] = ()) -> list[int]:
    """The PIDs that used at least :data:`WORKING_CPU` of a core over *seconds*, between
    two :func:`cpu_seconds` readings (a process new since *before* counts from 0)."""
    skip = set(ignore)
    return sorted(pid for pid, used in now.items()
                  if pid not in skip and used - before.get(pid, 0.0) >= WORKING_CPU * seconds)


def busy_kernels(kernels: Iterable[Mapping]) -> list[str]:
    """The IDs of the kernels executing now, from ``MappingKernelManager.list_kernels()``."""
    return [k["id"] for k in kernels if k.get("execution_state") == "busy"]


def what_works(kernels: Iterable[Mapping], before: Mapping[int, float],
               now: Mapping[int, float], seconds: float, server_pid: int) -> str:
    """What makes this server active now, in words for the log ("" if nothing does)."""
    busy = busy_kernels(kernels)
    pids = working_processes(before, now, seconds, ignore=(server_pid,))
    parts = []
    if busy:
        parts.append(f"{len(busy)} kernel(s) executing")
    if pids:
        parts.append(f"{len(pids)} process(es) working")
    return ", ".join(parts)


def _jupyter_server_extension_points():
    return [{"module": "gpulab_work"}]


def _load_jupyter_server_extension(serverapp):
    settings = serverapp.web_app.settings
    kernels = serverapp.kernel_manager
    last = {"cpu": cpu_seconds(), "at": ioloop.IOLoop.current().time(), "said": ""}

    def look():
        now, at = cpu_seconds(), ioloop.IOLoop.current().time()
        works = what_works(kernels.list_kernels(), last["cpu"], now, at - last["at"],
                           os.getpid())
        last.update(cpu=now, at=at)
        if works:
            settings[SETTING] = datetime.now(UTC)
        if works != last["said"]:
            serverapp.log.info("gpulab_work: %s", works or "nothing working now")
            last["said"] = works

    ioloop.PeriodicCallback(look, CHECK_EVERY * 1000).start()
    serverapp.log.info("gpulab_work: a busy kernel or a working process counts as activity "
                       "(checked every %.0f s)", CHECK_EVERY)
