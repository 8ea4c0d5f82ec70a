"""What members are told about their servers stopping: warnings and stop notices.

The GPU culler (a hub service) writes its warnings and the servers it stopped to one
JSON file in the hub's data folder (:data:`gpulab.contract.CULLER_NOTICES_FILE`),
replaced atomically at each check; on a Swarm the hub's spawner writes the servers it
found stopped (their machine went down) to another, in the same format
(:data:`gpulab.contract.SERVER_NOTICES_FILE`). The hub's home page reads both for the
member who opens it (``template_vars``, see :func:`home_page_notices`), and the GPU
dashboard shows the standing warnings. A warning lasts while it stands; a stop notice
until the member starts that server again, or for :data:`STOPPED_KEPT` seconds.

Shared by the culler, the spawners, the dashboard and the hub's config, so it sits
beside them and imports none of them.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STOPPED_KEPT = 3 * 86400
MACHINE = "machine"  # Stopped.reason of a server whose Swarm machine went down or drained
LINE = "line"  # Stopped.reason of a member's place in line that ended (gpulab.line.service)
# CullWarning/Stopped.reason of a server in which nothing happened for hub.idle_timeout
# (the hub's idle culler stops it; the GPU culler warns and tells: gpulab.culler.decide)
INACTIVE = "inactive"
JOB = "job"  # Stopped.reason of a job that ended (its server stopped itself: gpulab.spawn.jobs)


@dataclass(frozen=True)
class CullWarning:
    """A warning standing for one server (what the member sees on their home page)."""

    user: str
    server: str
    started: float  # which run of the server it is about
    reason: str  # IDLE or AGE
    warned_at: float
    stop_at: float
    message: str


@dataclass(frozen=True)
class Stopped:
    """A server the culler (or, on a Swarm, the hub) stopped, for its member to read
    when they come back."""

    user: str
    server: str
    at: float
    reason: str
    message: str


@dataclass(frozen=True)
class Notices:
    warnings: Mapping[tuple[str, str], CullWarning]
    stopped: Sequence[Stopped] = ()
    # GPU UUID -> (when it is expected back, "age" or "idle"): the culler's clocks, which
    # the line's estimates start from (gpulab.culler.decide.releases)
    releases: Mapping[str, tuple[float, str]] = field(default_factory=dict)


EMPTY = Notices({})


def dumps(notices: Notices) -> str:
    return json.dumps({"warnings": [asdict(w) for w in notices.warnings.values()],
                       "stopped": [asdict(s) for s in notices.stopped],
                       "releases": {u: list(r) for u, r in notices.releases.items()}},
                      indent=1)


def loads(text: str) -> Notices:
    data = json.loads(text)
    warnings = [CullWarning(**w) for w in data.get("warnings", [])]
    return Notices({(w.user, w.server): w for w in warnings},
                   [Stopped(**s) for s in data.get("stopped", [])],
                   {u: (float(at), str(kind))
                    for u, (at, kind) in data.get("releases", {}).items()})


def read(path: str | Path) -> Notices:
    """The notices in *path*; none if it is missing or unreadable (said in the log)."""
    try:
        return loads(Path(path).read_text())
    except FileNotFoundError:
        return EMPTY
    except (OSError, ValueError, TypeError) as e:
        log.warning("gpulab: ignoring the GPU culler's notices in %s: %s", path, e)
        return EMPTY


def write(path: str | Path, notices: Notices) -> None:
    """Replace *path* atomically: the hub never reads half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(dumps(notices))
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def record_stopped(path: str | Path, stopped: Stopped) -> None:
    """Add a stop notice to the file at *path* (which only the caller writes), replacing
    one for the same server and dropping those older than STOPPED_KEPT."""
    kept = [s for s in read(path).stopped
            if stopped.at - s.at < STOPPED_KEPT and (s.user, s.server) != (
                stopped.user, stopped.server)]
    write(path, Notices({}, [*kept, stopped]))


def forget_stopped(path: str | Path, user: str, server: str) -> None:
    """Drop the stop notice of *user*'s *server* (it is starting again), if any."""
    current = read(path)
    kept = [s for s in current.stopped if (s.user, s.server) != (user, server)]
    if len(kept) != len(current.stopped):
        write(path, Notices(current.warnings, kept, current.releases))


def keep_stopped(stopped: Iterable[Stopped], running: Mapping[tuple[str, str], float],
                 now: float) -> list[Stopped]:
    """Stop notices still worth showing: not older than STOPPED_KEPT, and not for a
    server that has been started again since (*running*: key -> its start time)."""
    return [s for s in stopped
            if now - s.at < STOPPED_KEPT and running.get((s.user, s.server), 0) <= s.at]


def server_label(server: str) -> str:
    return f"server '{server}'" if server else "server"


def notices_for(notices: Notices, user: str, now: float) -> list[dict[str, Any]]:
    """What *user*'s home page shows: one entry per notice, newest concern first, with
    ``kind`` (``warning`` or ``stopped``), ``at`` (epoch seconds of the stop, coming or
    done) and ``text``."""
    out = []
    for w in notices.warnings.values():
        if w.user != user:
            continue
        left = w.stop_at - now
        when = ("in less than a minute" if left < 90 else
                f"in about {round(left / 60)} min")
        out.append({"kind": "warning", "server": w.server, "at": w.stop_at,
                    "text": f"Your {server_label(w.server)} will be stopped {when}: "
                            f"{w.message}. "
                            + ("Use its GPU, or stop the server yourself to give the GPU "
                               "back now." if w.reason == "idle" else
                               "Open it, or keep a cell or a program working in it, and "
                               "it stays." if w.reason == INACTIVE else
                               "Save your work; you can start it again afterwards.")})
    for s in notices.stopped:
        if s.user != user:
            continue
        if s.reason == LINE:
            out.append({"kind": "stopped", "server": s.server, "at": s.at,
                        "text": f"Your place in line for GPUs ({server_label(s.server)}) "
                                f"has ended: {s.message}. Ask again, with \"Wait in "
                                f"line\" ticked, when you need them."})
            continue
        if s.reason == JOB:
            out.append({"kind": "stopped", "server": s.server, "at": s.at,
                        "text": f"Your job {s.server}: {s.message}. Its output is in "
                                f"~/jobs/{s.server}/."})
            continue
        if s.reason == MACHINE:  # the hub found it stopped on a Swarm (gpulab.spawn.swarm_spawner)
            after = ("Your files are kept. Start it again when you need it; if they are on "
                     "that machine, it can start once the machine is back.")
        elif s.reason == INACTIVE:
            after = "The files in your home are kept. Start it again when you need it."
        else:
            after = ("Its GPU went back to the lab; the files in your home are kept. Start "
                     "it again when you need it.")
        out.append({"kind": "stopped", "server": s.server, "at": s.at,
                    "text": f"Your {server_label(s.server)} was stopped: {s.message}. {after}"})
    for n in out:
        n.update(shown_time(n["at"]))
    return sorted(out, key=lambda n: n["at"])


def shown_time(t: float) -> dict[str, str]:
    """A time as the hub's pages show it: {"iso"} for the browser to put in the reader's
    own time zone, {"utc"} for the page without JavaScript."""
    at = datetime.fromtimestamp(t, UTC)
    return {"iso": at.isoformat(), "utc": at.strftime("%Y-%m-%d %H:%M")}


def home_page_notices(*paths: str | Path):
    """``c.JupyterHub.template_vars["gpu_notices"]``: JupyterHub calls it with the user
    who opens a page (None when nobody is signed in) and the template shows the list,
    from every notices file in *paths* (the culler's; on a Swarm, the hub's own)."""

    def gpu_notices(user) -> list[dict[str, Any]]:
        if user is None:
            return []
        now = time.time()
        return sorted((n for path in paths for n in notices_for(read(path), user.name, now)),
                      key=lambda n: n["at"])

    return gpu_notices
