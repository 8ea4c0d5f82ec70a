"""bench/timeline.py reads a spawn's phases from the timestamps Docker keeps."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bench.timeline import PHASES, docker_time, spawn_timeline

T0 = datetime(2026, 11, 30, 17, 9, 32, 603000, tzinfo=UTC).timestamp()

# Abridged from a real spawn on the stack (docker logs --timestamps).
SERVER_LOG = """\
2026-11-30T17:09:35.996106427Z [I 2026-11-30 17:09:35.995 ServerApp] Extension package jupyterlab took 0.2398s to import
2026-11-30T17:09:36.109489782Z [I 2026-11-30 17:09:36.109 ServerApp] jupyter_lsp | extension was successfully linked.
2026-11-30T17:09:36.364785646Z [I 2026-11-30 17:09:36.364 ServerApp] Jupyter Server 2.21.1 is running at:
2026-11-30T17:09:36.364830464Z [I 2026-11-30 17:09:36.364 ServerApp] http://0.0.0.0:8888/user/bench1/lab?token=...
"""
HUB_LOG = """\
2026-11-30T17:09:30.000000000Z [I 2026-11-30 17:09:30.000 JupyterHub base:1192] User bench1 took 9.000 seconds to start
2026-11-30T17:09:36.404969833Z [I 2026-11-30 17:09:36.404 JupyterHub base:1192] User bench10 took 3.790 seconds to start
2026-11-30T17:09:36.405069833Z [I 2026-11-30 17:09:36.405 JupyterHub base:1192] User bench1 took 3.793 seconds to start
2026-11-30T17:09:36.405168802Z [I 2026-11-30 17:09:36.405 JupyterHub proxy:335] Adding user bench1 to proxy /user/bench1/ => http://172.30.0.5:8888
"""
PROXY_LOG = """\
2026-11-30T17:09:36.407102180Z 17:09:36.406 [ConfigProxy] \x1b[32minfo\x1b[39m: Route added /user/bench1 -> http://172.30.0.5:8888
"""


def test_docker_timestamps_keep_their_microseconds():
    assert docker_time("2026-11-30T17:09:32.603000999Z") == pytest.approx(T0, abs=1e-6)
    assert docker_time("2026-11-30T17:09:32Z") == pytest.approx(T0 - 0.603, abs=1e-6)
    assert docker_time("2026-11-30T17:09:32.6+00:00") == pytest.approx(T0 - 0.003, abs=1e-6)


def test_a_spawn_is_read_phase_by_phase():
    timeline = spawn_timeline("bench1", T0, "2026-11-30T17:09:32.675736439Z",
                              "2026-11-30T17:09:32.931017672Z", SERVER_LOG, HUB_LOG, PROXY_LOG,
                              ready=T0 + 3.82)
    assert list(timeline) == list(PHASES)
    expected = {
        "container created": 0.0727, "container started": 0.3280,
        "server imports done": 3.3931, "server listening": 3.7618,
        # not the line of an earlier spawn, nor of user bench10
        "hub sees it ready": 3.8021, "route added": 3.8041, "API says ready": 3.82,
    }
    assert timeline == pytest.approx(expected, abs=1e-3)


def test_a_phase_the_logs_do_not_show_is_none():
    timeline = spawn_timeline("bench2", T0, "2026-11-30T17:09:32.675736439Z",
                              "2026-11-30T17:09:32.931017672Z", "", HUB_LOG, PROXY_LOG,
                              ready=T0 + 5)
    assert timeline["server imports done"] is None
    assert timeline["server listening"] is None
    assert timeline["hub sees it ready"] is None
    assert timeline["route added"] is None
    assert timeline["API says ready"] == pytest.approx(5)
