"""The GPU culler's decisions (gpulab.culler.decide), by tables: since when a GPU is idle,
and keep / warn / stop for one server on its two clocks."""

from __future__ import annotations

import pytest

from gpulab.culler.decide import (
    AGE,
    IDLE,
    KEEP,
    STOP,
    WARN,
    Server,
    cull_decision,
    decide_all,
    gpu_working,
    idle_since,
    inactivity_warning,
    longest_idle_window,
    query_step,
)
from gpulab.gpus.config import Culling
from gpulab.gpus.policy import Policy, policy_note
from gpulab.notices import CullWarning
from gpulab.settings import duration_text

NOW = 100_000.0
STEP = 15.0


def series(*values, end=NOW, step=STEP):
    """Samples ending at *end*, one per *step*; None = no sample there (a gap)."""
    n = len(values)
    return [(end - (n - 1 - i) * step, v) for i, v in enumerate(values) if v is not None]


@pytest.mark.parametrize("samples, expected", [
    ([], None),                                           # no data: unknown, not idle
    (series(0.9, 0.9, 0.0), NOW - STEP),                  # idle since the last busy point
    (series(0.0, 0.0, 0.0, 0.0), NOW - 4 * STEP),         # idle all along the window
    (series(0.0, 0.0, 0.5), None),                        # working now
    (series(0.0, 0.049, 0.0), NOW - 3 * STEP),            # 4.9 % is under 5 %
    (series(0.0, 0.05, 0.0), NOW - STEP),                 # 5 % is not
    (series(0.0, 0.0, None, None, None, 0.0, 0.0), NOW - 2 * STEP),  # a gap ends the run
    (series(0.0, None, 0.0), NOW - 3 * STEP),             # one missing point is not a gap
    (series(0.0, 0.0, end=NOW - 4 * STEP), None),         # stale: the exporter stopped
    (series(0.0, 0.0, end=NOW - 3 * STEP), NOW - 5 * STEP),  # 3 steps old is still fresh
])
def test_idle_since(samples, expected):
    assert idle_since(samples, below=0.05, step=STEP, now=NOW) == expected


CULL = Culling(idle_below=0.05, warn_before=600, check_every=60)
HOUR = 3600
ALICE = Server("alice", "", started=NOW - 10 * HOUR, gpus=("GPU-a",))
TWO = Server("bob", "big", started=NOW - 10 * HOUR, gpus=("GPU-a", "GPU-b"))


def policy(idle=2 * HOUR, age=0):
    return Policy(gpus=0, max_gpus=2, pools=("default",), gpu_idle_timeout=idle,
                  max_server_age=age)


def warning(server, warned_at, stop_at, reason=IDLE):
    return CullWarning(server.user, server.name, server.started, reason, warned_at, stop_at,
                       "m")


@pytest.mark.parametrize("server, pol, idle, standing, action, stop_at", [
    # idle for less than timeout - warning: nothing happens
    (ALICE, policy(), {"GPU-a": NOW - HOUR}, None, KEEP, None),
    # into the warning window: warned, and stopped once the warning has stood its time
    (ALICE, policy(), {"GPU-a": NOW - 2 * HOUR + 600}, None, WARN, NOW + 600),
    (ALICE, policy(), {"GPU-a": NOW - 2 * HOUR + 300}, None, WARN, NOW + 600),
    # already past the timeout but never warned (timeout lowered, culler was down):
    # warned now, with the full warning time
    (ALICE, policy(), {"GPU-a": NOW - 5 * HOUR}, None, WARN, NOW + 600),
    # warned long enough and past due: stopped
    (ALICE, policy(), {"GPU-a": NOW - 5 * HOUR}, warning(ALICE, NOW - 600, NOW), STOP, NOW),
    # warned, but not for the full warning time yet
    (ALICE, policy(), {"GPU-a": NOW - 5 * HOUR}, warning(ALICE, NOW - 300, NOW + 300), WARN,
     NOW + 300),
    # the GPU works again: kept (the warning is withdrawn)
    (ALICE, policy(), {"GPU-a": None}, warning(ALICE, NOW - 600, NOW), KEEP, None),
    # no data for the GPU: never idle
    (ALICE, policy(), {}, None, KEEP, None),
    # idle counted from the server's start, not before (a GPU idle before it was leased)
    (Server("alice", "", NOW - 30 * 60, ("GPU-a",)), policy(), {"GPU-a": NOW - 9 * HOUR},
     None, KEEP, None),
    # culling off for this user
    (ALICE, policy(idle=0), {"GPU-a": NOW - 9 * HOUR}, None, KEEP, None),
    # two GPUs: idle only when both are; then from the later of the two
    (TWO, policy(), {"GPU-a": NOW - 9 * HOUR, "GPU-b": None}, None, KEEP, None),
    (TWO, policy(), {"GPU-a": NOW - 9 * HOUR, "GPU-b": NOW - 2 * HOUR + 600}, None, WARN,
     NOW + 600),
    (TWO, policy(), {"GPU-a": NOW - 9 * HOUR, "GPU-b": NOW - 2 * HOUR + 601}, None, KEEP,
     None),
    # age: a busy server past its max age is warned, then stopped
    (ALICE, policy(age=10 * HOUR), {"GPU-a": None}, None, WARN, NOW + 600),
    (ALICE, policy(age=10 * HOUR), {"GPU-a": None},
     warning(ALICE, NOW - 600, NOW, AGE), STOP, NOW),
    (ALICE, policy(age=11 * HOUR), {"GPU-a": None}, None, KEEP, None),
    # a warning about an earlier run of the server does not count
    (ALICE, policy(), {"GPU-a": NOW - 5 * HOUR},
     CullWarning("alice", "", ALICE.started - 1, IDLE, NOW - 900, NOW, "m"), WARN, NOW + 600),
])
def test_decide(server, pol, idle, standing, action, stop_at):
    d = cull_decision(server, pol, CULL, idle, standing, NOW)
    assert d.action == action
    if action == KEEP:
        assert d.warning is None
    else:
        assert d.warning.stop_at == stop_at
        assert (d.warning.user, d.warning.server, d.warning.started) == (
            server.user, server.name, server.started)


def test_the_earlier_clock_says_why():
    idle_first = cull_decision(ALICE, policy(idle=2 * HOUR, age=12 * HOUR), CULL,
                               {"GPU-a": NOW - 2 * HOUR}, None, NOW)
    assert idle_first.warning.reason == IDLE
    assert idle_first.warning.message == "its GPU stayed under 5% utilization for 2 h"
    age_first = cull_decision(ALICE, policy(idle=2 * HOUR, age=10 * HOUR), CULL,
                              {"GPU-a": NOW - HOUR}, None, NOW)
    assert age_first.warning.reason == AGE
    assert age_first.warning.message == "servers holding GPUs may run for 10 h"
    assert "its 2 GPUs" in cull_decision(TWO, policy(), CULL, {"GPU-a": NOW - 3 * HOUR,
                                                              "GPU-b": NOW - 3 * HOUR}, None,
                                         NOW).warning.message


def test_warning_kept_across_checks_keeps_its_first_time():
    first = cull_decision(ALICE, policy(), CULL, {"GPU-a": NOW - 5 * HOUR}, None, NOW)
    later = cull_decision(ALICE, policy(), CULL, {"GPU-a": NOW - 5 * HOUR}, first.warning, NOW + 60)
    assert later.action == WARN and later.warning.warned_at == NOW
    done = cull_decision(ALICE, policy(), CULL, {"GPU-a": NOW - 5 * HOUR}, later.warning, NOW + 600)
    assert done.action == STOP


def test_no_warning_time():
    d = cull_decision(ALICE, policy(), Culling(warn_before=0), {"GPU-a": NOW - 2 * HOUR}, None, NOW)
    assert d.action == STOP


def test_plan_uses_each_servers_policy_and_warning():
    decisions = decide_all([ALICE, TWO], {ALICE.key: policy(idle=HOUR), TWO.key: policy(idle=0)},
                     CULL, {"GPU-a": NOW - 3 * HOUR, "GPU-b": NOW - 3 * HOUR},
                     {ALICE.key: warning(ALICE, NOW - 700, NOW)}, NOW)
    assert [d.action for d in decisions] == [STOP, KEEP]


@pytest.mark.parametrize("idle_timeouts, expected", [
    ([], 0), ([0, 0], 0), ([3600, 0, 7200], 7200),
])
def test_longest_idle_window(idle_timeouts, expected):
    assert longest_idle_window([policy(idle=t) for t in idle_timeouts]) == expected


@pytest.mark.parametrize("window, expected", [
    (60, 15), (2 * HOUR, 15), (8 * HOUR, 29), (7 * 86400, 605),
])
def test_query_step(window, expected):
    step = query_step(window)
    assert step == expected
    assert window / step <= 1000


@pytest.mark.parametrize("seconds, text", [
    (0, "0 s"), (45, "45 s"), (90, "1 min 30 s"), (3600, "1 h"), (5400, "1 h 30 min"),
    (86400, "1 day"), (2 * 86400 + 3600, "2 days 1 h"),
])
def test_duration_text(seconds, text):
    assert duration_text(seconds) == text


@pytest.mark.parametrize("idle, age, warn, note", [
    (2 * HOUR, 0, 900, "A server holding GPUs is stopped when its GPUs stay under 5% "
                       "utilization for 2 h, after a warning 15 min ahead on your hub home "
                       "page. Your files stay in your home."),
    (HOUR, 86400, 0, "A server holding GPUs is stopped when its GPUs stay under 5% "
                     "utilization for 1 h or 1 day after it starts. Your files stay in your "
                     "home."),
    (0, 0, 900, ""),
])
def test_policy_note_for_the_spawn_form(idle, age, warn, note):
    assert policy_note(policy(idle=idle, age=age), Culling(warn_before=warn)) == note


@pytest.mark.parametrize("pol, idle, standing, expected", [
    # busy, no age limit: nobody knows when its GPU comes back
    (policy(), {"GPU-a": None}, None, {}),
    # idle for an hour of two: back in an hour, if it stays idle
    (policy(), {"GPU-a": NOW - HOUR}, None, {"GPU-a": (NOW + HOUR, IDLE)}),
    # an age limit: back at start + max_server_age at the latest
    (policy(idle=0, age=12 * HOUR), {}, None, {"GPU-a": (NOW + 2 * HOUR, AGE)}),
    # due already but not yet warned: a warning stands warn_before first
    (policy(idle=0, age=10 * HOUR), {}, None, {"GPU-a": (NOW + 600, AGE)}),
    # a standing warning says when
    (policy(idle=0, age=10 * HOUR), {}, warning(ALICE, NOW - 60, NOW + 540, AGE),
     {"GPU-a": (NOW + 540, AGE)}),
])
def test_when_each_gpu_is_expected_back(pol, idle, standing, expected):
    from gpulab.culler.decide import releases

    standing = {ALICE.key: standing} if standing else {}
    assert releases([ALICE], {ALICE.key: pol}, CULL, idle, standing, NOW) == expected


# ------------------------------------------------------------ work and the idle culler

def test_servers_whose_gpus_work_are_told_apart_from_sharers_who_only_hold_them():
    alone = Server("ann", "", 0.0, ("GPU-a",))
    idle = Server("bob", "", 0.0, ("GPU-b",))
    two = Server("cat", "big", 0.0, ("GPU-b", "GPU-c"))  # works if one of hers does
    sharer_working = Server("dan", "", 0.0, ("GPU-s",))
    sharer_holding = Server("eve", "", 0.0, ("GPU-s",))
    servers = [alone, idle, two, sharer_working, sharer_holding]
    assert gpu_working(servers, {"GPU-a", "GPU-c", "GPU-s"}, {"GPU-s": {"dan"}}) == [
        alone, two, sharer_working]
    # nobody's memory known on the shared GPU: unknown is not idle
    assert gpu_working(servers, {"GPU-s"}, {}) == [sharer_working, sharer_holding]
    assert gpu_working(servers, set(), {}) == []


HOUR = 3600


@pytest.mark.parametrize("last, timeout, warn_before, stop_at", [
    (NOW - 40 * 60, HOUR, 15 * 60, None),          # 20 min before the stop: not yet
    (NOW - 50 * 60, HOUR, 15 * 60, NOW + 10 * 60),  # within 15 min of it: warned
    (NOW - 70 * 60, HOUR, 15 * 60, NOW - 10 * 60),  # late: the culler is due now
    (NOW - 50 * 60, 0, 15 * 60, None),             # no idle culler
    # a short timeout: warned only in its last third, so that work reported every
    # quarter of it never brings a warning
    (NOW - 10, 24, 15 * 60, None),
    (NOW - 17, 24, 15 * 60, NOW + 7),
])
def test_the_warning_ahead_of_the_idle_culler(last, timeout, warn_before, stop_at):
    server = Server("ann", "", NOW - 2 * HOUR, ())
    w = inactivity_warning(server, last, timeout, warn_before, None, NOW)
    assert (w and w.stop_at) == stop_at
    if w:
        assert w.reason == "inactive" and w.warned_at == NOW
        assert "no browser on it, no cell executing, no process working and no GPU busy" \
            in w.message


def test_a_standing_warning_keeps_its_time_until_the_stop_moves():
    server = Server("ann", "", NOW - 2 * HOUR, ())
    first = inactivity_warning(server, NOW - 50 * 60, HOUR, 15 * 60, None, NOW)
    again = inactivity_warning(server, NOW - 50 * 60, HOUR, 15 * 60, first, NOW + 60)
    assert again.warned_at == NOW
    # she opened it meanwhile, and left again: a new stop time, a new warning
    moved = inactivity_warning(server, NOW + 10, HOUR, 15 * 60, first, NOW + 50 * 60)
    assert moved.warned_at == NOW + 50 * 60 and moved.stop_at == NOW + 10 + HOUR
    # a server started after its last activity counts from its start
    fresh = Server("ann", "", NOW - 50 * 60, ())
    assert inactivity_warning(fresh, 0.0, HOUR, 15 * 60, None, NOW).stop_at == NOW + 10 * 60
