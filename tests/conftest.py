"""Shared pytest setup. Unit tests need nothing; integration fixtures live in
tests/integration/conftest.py and start or find the real stack.

Under CI=true (``.ci/run``) a skipped test FAILS the run, unless it needs a real GPU: it
is marked ``gpu_host``, or it skips with a reason that starts with :data:`REAL_GPU`. A
host without a browser, promtool or the stand-in GPU plumbing is a broken CI host, not a
reason to pass (``make test`` installs and arranges all of them: scripts/test-host.sh).
"""

from __future__ import annotations

import os

import pytest

REAL_GPU = "[real GPU] "  # the one prefix of a skip reason that CI accepts


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.skipped and _ci() and item.get_closest_marker("gpu_host") is None:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        if not reason.removeprefix("Skipped: ").startswith(REAL_GPU):
            rep.outcome = "failed"
            rep.longrepr = (f"skipped under CI=true, where only tests that need a real GPU "
                            f"may skip: {reason}")
    return rep
