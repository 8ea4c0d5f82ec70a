"""The login throttles, read and put back by the sign-in tests.

Failed sign-ins count in the hub's throttle (a sqlite file in the hub's volume), and
failed SSH sign-ins in the SSH gateway's own (same schema, in its volume). Tests
that fail on purpose refuse to start while an address is locked, and afterwards put back
what they changed: address counters that saw no new lockout go back to what they were,
and the usernames they failed as are forgotten, so that running the suite again (or a
later test) is not locked out.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from functools import partial

import pytest

from .stack import docker, wait_for

HUB_CONTAINER = "gpulab-hub"
SSH_CONTAINER, SSH_THROTTLE = "gpulab-ssh", "/var/lib/gpulab-ssh/throttle.sqlite"

SCRIPT = r"""
import json, os, sqlite3, sys
cmd = json.loads(sys.argv[1])
path = cmd.get("path") or os.path.join(os.environ.get("GPULAB_DATA_DIR", "/srv/jupyterhub"),
                                       "gpulab-login-throttle.sqlite")
if not os.path.exists(path):
    print("{}"); sys.exit(0)
db = sqlite3.connect(path, timeout=10)
cols = "failures, window_start, locked_until, lockouts, last_failure"
if cmd["op"] == "read":
    rows = db.execute(f"SELECT kind, key, {cols} FROM login_failures")
    print(json.dumps({f"{kind}|{key}": list(v) for kind, key, *v in rows}))
elif cmd["op"] == "restore":
    # address rows this module changed without a new lockout: back to what they were
    with db:
        for key, (now, before) in cmd["rows"].items():
            kind, key = key.split("|", 1)
            cond = " AND ".join(f"{c} = ?" for c in cols.split(", "))
            if before is None:
                db.execute(f"DELETE FROM login_failures WHERE kind = ? AND key = ? AND {cond}",
                           [kind, key, *now])
            else:
                db.execute(f"UPDATE login_failures SET failures = ?, window_start = ?,"
                           f" last_failure = ? WHERE kind = ? AND key = ? AND {cond}",
                           [before[0], before[1], before[4], kind, key, *now])
    print("{}")
elif cmd["op"] == "forget":
    # rows this module created on purpose (a lockout it caused itself)
    with db:
        for kind, keys in (("address", cmd["addresses"]), ("user", cmd["users"])):
            db.executemany("DELETE FROM login_failures WHERE kind = ? AND key = ?",
                           [(kind, k) for k in keys])
    print("{}")
"""


def throttle(op: str, container: str = HUB_CONTAINER, path: str | None = None, **kw) -> dict:
    """Run one operation (read, restore, forget) on a throttle file: the hub's, or with
    *container* and *path* another one (the SSH gateway's)."""
    out = docker("exec", container, "python3", "-c", SCRIPT,
                 json.dumps({"op": op, "path": path, **kw}))
    return json.loads(out or "{}")


@contextmanager
def failures_undone(hub, failed_usernames: list[str], container: str = HUB_CONTAINER,
                    path: str | None = None):
    """Around a module that fails sign-ins on purpose (see the module docstring)."""
    run = partial(throttle, container=container, path=path)
    before = run("read")
    now = time.time()
    locked = {k: v[2] for k, v in before.items() if k.startswith("address|") and v[2] > now}
    if locked:
        pytest.fail(f"the login throttle of {container} has locked {locked} (locked_until, epoch "
                    "seconds): sign-in tests cannot run until then")
    yield
    try:
        wait_for(hub.is_up, 120, interval=1, what="the hub to answer")
        after = run("read")
        rows = {key: (row, before.get(key)) for key, row in after.items()
                if key.startswith("address|") and row != before.get(key)
                and row[3] == (before.get(key) or [0, 0, 0, 0, 0])[3]}
        run("restore", rows=rows)
        run("forget", addresses=[], users=failed_usernames)
    except Exception as e:  # cleanup only: report, do not turn a pass into an error
        print(f"\ncould not restore the login throttle's counters: {e}")
