"""The GPU culler's shell (gpulab.culler.service and gpulab.notices): the hub's and Prometheus'
answers turned into servers and idle times, and one check round end to end against
recording stand-ins for the hub's API and Prometheus (the real ones are exercised by
tests/integration/test_gpu_culler.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gpulab import notices as notes
from gpulab.culler.decide import IDLE, KEEP, STOP, WARN, Server
from gpulab.culler.service import (
    GpuCuller,
    HubServer,
    hub_servers,
    samples_by_uuid,
    servers_holding_gpus,
)
from gpulab.hubapi import HubApi, HubApiError
from gpulab.notices import CullWarning
from gpulab.prometheus_api import Prometheus, PrometheusUnavailable

T0 = 1_764_500_000.0  # 2025-11-30T10:53:20Z
ISO0 = "2025-11-30T10:53:20.000000Z"


def test_hub_servers_keeps_ready_servers_with_their_groups():
    users = [
        {"name": "alice", "groups": ["students"], "servers": {
            "": {"ready": True, "pending": None, "started": ISO0},
            "big": {"ready": False, "pending": "spawn", "started": ISO0}}},
        {"name": "bob", "servers": {"x": {"ready": True, "pending": "stop", "started": ISO0}}},
        {"name": "carol", "groups": [], "servers": {}},
    ]
    assert hub_servers(users) == [HubServer("alice", "", T0, ("students",))]


def test_servers_holding_gpus_joins_leases_by_user_and_server():
    ready = [HubServer("alice", "", T0, ()), HubServer("alice", "cpu", T0, ()),
             HubServer("bob", "x", T0, ("g",))]
    leases = [{"metric": {"user": "alice", "server": "", "uuid": "GPU-b"}},
              {"metric": {"user": "alice", "server": "", "uuid": "GPU-a"}},
              {"metric": {"user": "bob", "server": "x", "uuid": "GPU-c"}},
              {"metric": {"user": "ghost", "server": "", "uuid": "GPU-d"}}]
    assert servers_holding_gpus(ready, leases) == [
        Server("alice", "", T0, ("GPU-a", "GPU-b")), Server("bob", "x", T0, ("GPU-c",), ("g",))]


def test_samples_by_uuid():
    matrix = [{"metric": {"uuid": "GPU-a"}, "values": [[T0, "0.5"], [T0 + 15, "0"]]}]
    assert samples_by_uuid(matrix) == {"GPU-a": [(T0, 0.5), (T0 + 15, 0.0)]}


class RecordingHub(HubApi):
    """The hub's API as a list of users, recording the servers it is asked to stop."""

    def __init__(self, users, fail=False):
        super().__init__("http://hub.invalid/hub/api", "token")
        self.listed, self.fail, self.stopped, self.active = users, fail, [], []

    async def users(self, state="", *, token=None):
        assert state == "ready"  # servers that start or stop are left alone
        if self.fail:
            raise HubApiError("GET", "/users", 503)
        return self.listed

    async def stop_server(self, user, server="", *, token=None):
        self.stopped.append((user, server))
        return True

    async def report_activity(self, user, server, when, *, token=None):
        self.active.append((user, server, when))


class HubThatReadsTheNotices(RecordingHub):
    """A hub that, asked to stop a server, reads what the member's home page would show
    at that moment; then stops it (True), finds it stopped already (False) or fails."""

    def __init__(self, users, notices_file, answer):
        super().__init__(users)
        self.notices_file, self.answer, self.seen = notices_file, answer, []

    async def stop_server(self, user, server="", *, token=None):
        shown = notes.read(self.notices_file)
        self.seen.append(([(s.user, s.reason) for s in shown.stopped], list(shown.warnings)))
        if self.answer == "fails":
            raise HubApiError("DELETE", f"/users/{user}/server", 503)
        return self.answer


class CannedPrometheus(Prometheus):
    """Prometheus answering the lease query, the utilization range query, the recent
    utilization and the users' memory per GPU from data (each GPU's utilization now: its
    last sample before the check's time, *now*)."""

    def __init__(self, leases, utilization, down=False, memory=()):
        super().__init__("http://prometheus.invalid")
        self.leases, self.utilization, self.down = leases, utilization, down
        self.memory = list(memory)  # (uuid, user) with memory there
        self.ranges, self.now = [], T0

    async def query(self, expr, at=None):
        if self.down:
            raise PrometheusUnavailable("Prometheus at http://prometheus.invalid did not answer")
        if expr == "gpulab_gpu_lease_info":
            return self.leases
        if expr.startswith("max by (uuid) (max_over_time(gpulab_gpu_utilization_ratio["):
            return [{"metric": {"uuid": u}, "value": [self.now, str(max(
                [v for t, v in samples if self.now - 30 <= t <= self.now] or [0.0]))]}
                for u, samples in self.utilization.items()]
        assert expr == "max by (uuid, user) (gpulab_gpu_user_memory_used_bytes) > 0", expr
        return [{"metric": {"uuid": u, "user": user}, "value": [self.now, "1e9"]}
                for u, user in self.memory]

    async def query_range(self, expr, start, end, step):
        self.ranges.append((expr, end - start, step))
        return [{"metric": {"uuid": u},
                 "values": [[t, str(v)] for t, v in samples if start <= t <= end]}
                for u, samples in self.utilization.items()]


GPUS_YAML = """
defaults: {gpu_idle_timeout: 1h}
culling: {idle_below: 5%, warn_before: 10m, check_every: 30s}
groups:
  patient: {gpu_idle_timeout: 0}
"""


def flat(value, start, end, step=15):
    return [(t, value) for t in range(int(start), int(end) + 1, step)]


@pytest.fixture
def culler_for(tmp_path):
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(GPUS_YAML)
    notices = tmp_path / "notices.json"

    def make(hub, prometheus, idle_timeout=0):
        return GpuCuller(hub, prometheus, gpus, notices, idle_timeout=idle_timeout)

    return make, notices


def users(*rows):
    return [{"name": n, "groups": list(g), "servers": {"": {"ready": True, "started": ISO0}}}
            for n, g in rows]


LEASES = [{"metric": {"user": "alice", "server": "", "uuid": "GPU-a"}},
          {"metric": {"user": "pat", "server": "", "uuid": "GPU-p"}},
          {"metric": {"user": "busy", "server": "", "uuid": "GPU-b"}}]


def test_a_check_warns_then_stops_and_leaves_notices(culler_for):
    make, notices_file = culler_for
    now = T0 + 2 * 3600
    later = now + 3600
    util = {"GPU-a": flat(0.0, T0, later), "GPU-p": flat(0.0, T0, later),
            "GPU-b": flat(0.0, T0, now - 60) + flat(0.9, now - 45, later)}
    hub = RecordingHub(users(("alice", ()), ("pat", ("patient",)), ("busy", ())))
    prometheus = CannedPrometheus(LEASES, util)
    culler = make(hub, prometheus)

    first = asyncio.run(culler.check(now))
    assert {d.server.user: d.action for d in first} == {"alice": WARN, "pat": KEEP,
                                                        "busy": KEEP}
    assert prometheus.ranges[0][0] == ("max by (uuid) (max_over_time("
                                       "gpulab_gpu_utilization_ratio[30s]))")
    assert prometheus.ranges[0][1] >= 3600  # the longest timeout in force, 1 h
    assert hub.stopped == []
    saved = notes.read(notices_file)
    assert list(saved.warnings) == [("alice", "")]
    assert saved.warnings["alice", ""].stop_at == now + 600

    asyncio.run(culler.check(now + 300))  # warned, but not long enough
    assert hub.stopped == []
    last = asyncio.run(culler.check(now + 600))
    assert [d.action for d in last if d.server.user == "alice"] == [STOP]
    assert hub.stopped == [("alice", "")]
    saved = notes.read(notices_file)
    assert saved.warnings == {}
    assert [(s.user, s.reason) for s in saved.stopped] == [("alice", IDLE)]


@pytest.mark.parametrize("answer", [True, False, "fails"])
def test_the_stop_notice_is_there_before_the_hub_lists_the_server_stopped(culler_for, answer):
    """The hub lists a server stopped before the culler hears back; a member who finds it
    gone finds why on her home page too (CI once saw the page without it). A server that
    had stopped already, or could not be stopped, gets no notice."""
    make, notices_file = culler_for
    now = T0 + 2 * 3600
    hub = HubThatReadsTheNotices(users(("alice", ())), notices_file, answer)
    culler = make(hub, CannedPrometheus(LEASES[:1], {"GPU-a": flat(0.0, T0, now + 600)}))
    asyncio.run(culler.check(now))  # warned
    asyncio.run(culler.check(now + 600))  # due
    assert hub.seen == [([("alice", IDLE)], [])]  # told she was stopped, not that she will be
    after = notes.read(notices_file)
    assert [s.user for s in after.stopped] == (["alice"] if answer is True else [])


@pytest.mark.parametrize("answer", [True, "fails"])
def test_two_servers_stopped_in_one_round_each_shows_its_own_state(culler_for, answer):
    """alice's and pat's servers are due in the same round: when the hub is asked to stop
    pat's, alice's page says she was stopped (if she was) and no longer that she will be;
    pat's says he was stopped. While the round goes on, a server that could not be
    stopped shows its warning again."""
    make, notices_file = culler_for
    now = T0 + 2 * 3600
    hub = HubThatReadsTheNotices(users(("alice", ()), ("pat", ())), notices_file, answer)
    idle = flat(0.0, T0, now + 600)
    culler = make(hub, CannedPrometheus(LEASES[:2], {"GPU-a": idle, "GPU-p": idle}))
    asyncio.run(culler.check(now))  # both warned
    assert set(notes.read(notices_file).warnings) == {("alice", ""), ("pat", "")}
    asyncio.run(culler.check(now + 600))  # both due
    if answer is True:
        assert hub.seen == [([("alice", IDLE)], [("pat", "")]),
                            ([("alice", IDLE), ("pat", IDLE)], [])]
    else:
        assert hub.seen == [([("alice", IDLE)], [("pat", "")]),
                            ([("pat", IDLE)], [("alice", "")])]


def check(culler, prometheus, now):
    prometheus.now = now
    return asyncio.run(culler.check(now))


def test_servers_whose_gpus_work_are_reported_active_to_the_hub(culler_for):
    """The idle culler stops by the hub's last activity: the GPU culler, which sees the
    GPUs, reports a server whose GPU works as active. On a shared GPU (two servers hold
    GPU-s), only the sharer whose processes hold memory there works."""
    make, _ = culler_for
    now = T0 + 600
    leases = [*LEASES, {"metric": {"user": "ann", "server": "", "uuid": "GPU-s"}},
              {"metric": {"user": "ben", "server": "", "uuid": "GPU-s"}}]
    util = {"GPU-a": flat(0.0, T0, now), "GPU-p": flat(0.0, T0, now),
            "GPU-b": flat(0.9, T0, now), "GPU-s": flat(0.5, T0, now)}
    hub = RecordingHub(users(("alice", ()), ("pat", ()), ("busy", ()), ("ann", ()),
                             ("ben", ())))
    prometheus = CannedPrometheus(leases, util, memory=[("GPU-s", "ben")])
    check(make(hub, prometheus), prometheus, now)
    assert sorted(hub.active) == [("ben", "", now), ("busy", "", now)]

    hub.active.clear()  # the memory cannot be attributed (MIG): unknown is not idle
    prometheus.memory = []
    check(make(hub, prometheus), prometheus, now)
    assert sorted(hub.active) == [("ann", "", now), ("ben", "", now), ("busy", "", now)]


def test_members_are_warned_ahead_of_the_idle_cullers_stop_and_told_after(culler_for):
    """hub.idle_timeout 1 h, warn_before 10 min: a server the hub last saw active 55 min
    ago is warned (the idle culler stops it at 60); one whose GPU works is not, whatever
    its Jupyter activity; once the idle culler stopped it, her page says why."""
    make, notices_file = culler_for
    now = T0 + 3 * 3600
    listed = [{"name": n, "groups": ["patient"], "servers": {"": {  # no GPU idle clock
        "ready": True, "started": ISO0, "last_activity": iso(now - 55 * 60)}}}
        for n in ("alice", "busy", "nogpu")]
    hub = RecordingHub(listed)
    util = {"GPU-a": flat(0.0, T0, now + 900), "GPU-b": flat(0.9, T0, now + 900)}
    prometheus = CannedPrometheus([LEASES[0], LEASES[2]], util)
    culler = make(hub, prometheus, idle_timeout=3600)
    check(culler, prometheus, now)
    warned = notes.read(notices_file).warnings
    assert sorted(warned) == [("alice", ""), ("nogpu", "")]
    assert warned["nogpu", ""].stop_at == now + 300
    assert warned["nogpu", ""].reason == notes.INACTIVE
    text = notes.notices_for(notes.read(notices_file), "nogpu", now)[0]["text"]
    assert text == ("Your server will be stopped in about 5 min: nothing has happened in it "
                    "for 55 min (no browser on it, no cell executing, no process working and "
                    "no GPU busy), and servers stop after 1 h of that. Open it, or keep a "
                    "cell or a program working in it, and it stays.")

    # the idle culler stops nogpu's server at 60 min; alice opened hers meanwhile
    hub.listed = [{**listed[0], "servers": {"": {**listed[0]["servers"][""],
                                                 "last_activity": iso(now + 200)}}},
                  listed[1]]
    check(culler, prometheus, now + 320)
    after = notes.read(notices_file)
    assert after.warnings == {}
    [gone] = after.stopped
    assert (gone.user, gone.reason) == ("nogpu", notes.INACTIVE)
    assert notes.notices_for(after, "nogpu", now + 400)[0]["text"] == (
        "Your server was stopped: nothing had happened in it for 1 h (no browser on it, no "
        "cell executing, no process working and no GPU busy). The files in your home are "
        "kept. Start it again when you need it.")


def iso(t: float) -> str:
    from datetime import UTC, datetime
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def test_no_prometheus_means_nothing_culled(culler_for, caplog):
    make, notices_file = culler_for
    hub = RecordingHub(users(("alice", ())))
    assert asyncio.run(make(hub, CannedPrometheus([], {}, down=True)).check(T0 + 9 * 3600)) == []
    assert hub.stopped == [] and not notices_file.exists()
    assert "nothing culled this round" in caplog.text and "did not answer" in caplog.text


def test_no_hub_means_nothing_culled(culler_for, caplog):
    make, _ = culler_for
    hub = RecordingHub([], fail=True)
    assert asyncio.run(make(hub, CannedPrometheus(LEASES, {})).check(T0)) == []
    assert "the hub did not list its servers (GET /users answered 503)" in caplog.text


def test_notices_round_trip_and_what_a_member_reads(tmp_path):
    path = tmp_path / "n.json"
    w = CullWarning("alice", "big", T0, IDLE, T0, T0 + 600,
                    "its GPU stayed under 5% utilization for 2 h")
    gone = notes.Stopped("alice", "", T0 - 60, IDLE, "its GPU stayed under 5% utilization "
                                                     "for 2 h")
    notes.write(path, notes.Notices({("alice", "big"): w}, [gone]))
    assert notes.read(path) == notes.Notices({("alice", "big"): w}, [gone])
    assert [p.name for p in tmp_path.iterdir()] == ["n.json"]  # no temporary file left
    shown = notes.notices_for(notes.read(path), "alice", T0 + 60)
    assert [n["kind"] for n in shown] == ["stopped", "warning"]
    assert shown[1]["text"].startswith("Your server 'big' will be stopped in about 9 min: "
                                       "its GPU stayed under 5% utilization for 2 h.")
    assert shown[0]["text"].startswith("Your server was stopped: its GPU")
    assert shown[1]["iso"] == "2025-11-30T11:03:20+00:00"
    assert notes.notices_for(notes.read(path), "bob", T0) == []
    soon = notes.notices_for(notes.read(path), "alice", T0 + 540)[1]["text"]
    assert soon.startswith("Your server 'big' will be stopped in less than a minute: ")


def test_a_broken_notices_file_is_no_notices(tmp_path, caplog):
    path = tmp_path / "n.json"
    path.write_text("{not json")
    assert notes.read(path) == notes.EMPTY
    assert "ignoring the GPU culler's notices" in caplog.text
    path.write_text(json.dumps({"warnings": [{"user": "x"}]}))
    assert notes.read(path) == notes.EMPTY


@pytest.mark.parametrize("running, age, kept", [
    ({}, 60, True),                                # the server is still stopped
    ({("alice", ""): T0 - 120}, 60, True),         # the run it was about
    ({("alice", ""): T0 + 10}, 60, False),         # started again since: done
    ({}, notes.STOPPED_KEPT + 1, False),           # too old
])
def test_stop_notices_last_until_the_server_starts_again(running, age, kept):
    s = notes.Stopped("alice", "", T0, IDLE, "m")
    assert notes.keep_stopped([s], running, T0 + age) == ([s] if kept else [])


def test_home_page_notices_for_nobody_signed_in(tmp_path):
    assert notes.home_page_notices(tmp_path / "missing.json")(None) == []


def test_the_hubs_own_stop_notices_join_the_cullers_on_the_home_page(tmp_path):
    """On a Swarm the hub notes servers whose machine went down (gpulab.spawn.swarm_spawner)
    in a file of its own; the home page shows both files' notices, oldest first."""
    culler, hub = tmp_path / "culler.json", tmp_path / "hub.json"
    notes.write(culler, notes.Notices({}, [notes.Stopped("alice", "", T0, IDLE, "idle GPU")]))
    down = "the machine it ran on (gpu-2) is down"
    notes.record_stopped(hub, notes.Stopped("alice", "big", T0 - 30, "machine", down))
    notes.record_stopped(hub, notes.Stopped("bob", "", T0 - 20, "machine", down))
    notes.record_stopped(hub, notes.Stopped("alice", "big", T0 - 10, "machine", down))
    assert [(s.user, s.at) for s in notes.read(hub).stopped] == [
        ("bob", T0 - 20), ("alice", T0 - 10)]  # one per server, the latest

    class Member:
        name = "alice"
    texts = [n["text"] for n in notes.home_page_notices(culler, hub)(Member())]
    assert texts[0].startswith(f"Your server 'big' was stopped: {down}.")
    assert texts[1].startswith("Your server was stopped: idle GPU.")
    notes.forget_stopped(hub, "alice", "big")  # she starts it again
    assert [s.user for s in notes.read(hub).stopped] == ["bob"]
    notes.forget_stopped(tmp_path / "missing.json", "alice", "")  # nothing to forget


def test_the_service_stops_without_a_traceback_when_jupyterhub_interrupts_it(tmp_path):
    """JupyterHub stops the services it started with SIGINT; the culler said so with a
    KeyboardInterrupt traceback in the hub's log at every hub restart."""
    env = dict(os.environ, JUPYTERHUB_API_URL="http://127.0.0.1:9/hub/api",
               JUPYTERHUB_API_TOKEN="x", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulab.culler", "--gpus-file", str(tmp_path / "gpus.yaml"),
         "--notices", str(tmp_path / "notices.json"), "--prometheus-url", "http://127.0.0.1:9"],
        env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        line = ""
        while "checking" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=30)[1]
    finally:
        proc.kill()  # never left behind, whatever failed
        proc.wait()
    assert "checking" in line
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest and "GPU culler: stopping" in rest
