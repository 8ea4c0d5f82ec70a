"""bench/scarcity.py's simulation, on small labs whose outcome can be worked out by hand:
the figures it reports are only worth printing if these hold."""

from __future__ import annotations

import itertools

import pytest

from bench.scarcity import (
    FAIR_SHARE,
    FIRST_COME,
    HOUR,
    POLICIES,
    REGULAR,
    RETRY,
    START,
    Ask,
    Lab,
    jain,
    lab_config,
    percentile,
    report,
    simulate,
    steps,
)

MINUTE = 60.0
NEVER = Ask(think=1e9, gpus=1, session=HOUR, patience=HOUR, opens_after=0)


def lab(policy: str, gpus: int, **streams: list[Ask]) -> Lab:
    order = "fair_share" if policy == FAIR_SHARE else "first_come"
    config, inventory = lab_config(gpus, order, "10m")
    return Lab(policy, config, inventory, [(name, REGULAR) for name in streams], seed=0,
               until=START + 86400, retry_every=15 * MINUTE, usage_every=600,
               streams={name: itertools.chain(asked, itertools.repeat(NEVER))
                        for name, asked in streams.items()})


def at(hours: float, minutes: float = 0) -> float:
    """Think time from Monday 00:00 to Monday hh:mm (working hours start at 08:00)."""
    return hours * HOUR + minutes * MINUTE


def test_the_line_gives_the_gpu_the_moment_it_frees():
    # alice holds the one GPU 09:00-10:00; bob asks at 09:10 and waits
    asked = {"alice": [Ask(at(9), 1, HOUR, 10 * HOUR, 0)],
             "bob": [Ask(at(9, 10), 1, HOUR, 10 * HOUR, 60)]}
    result = lab(FIRST_COME, 1, **asked).run()
    assert result.waits == [0, 50 * MINUTE]  # bob's server starts at 10:00
    assert result.idle_while_waiting == 0
    assert result.unopened == 60  # the minute before bob opened it
    assert result.in_sessions == 2 * HOUR
    assert (result.served, result.gave_up, result.not_opened) == (2, 0, 0)


def test_retry_on_409_leaves_the_gpu_idle_until_the_next_try():
    asked = {"alice": [Ask(at(9), 1, HOUR, 10 * HOUR, 0)],
             "bob": [Ask(at(9, 10), 1, HOUR, 10 * HOUR, 60)]}
    result = lab(RETRY, 1, **asked).run()
    bob = result.waits[1]
    assert bob > 50 * MINUTE
    # the GPU was free and bob waiting from 10:00 until his next try
    assert result.idle_while_waiting == pytest.approx(bob - 50 * MINUTE)
    assert result.unopened == 0


def test_a_server_not_opened_in_the_claim_window_goes_to_the_next():
    asked = {"alice": [Ask(at(9), 1, HOUR, 10 * HOUR, 0)],
             "bob": [Ask(at(9, 10), 1, HOUR, 10 * HOUR, None)],  # never opens it
             "carol": [Ask(at(9, 20), 1, HOUR, 10 * HOUR, 30)]}
    result = lab(FIRST_COME, 1, **asked).run()
    assert result.waits == [0, 50 * MINUTE, 50 * MINUTE]  # bob at 10:00, carol at 10:10
    assert result.not_opened == 1
    assert result.unopened == 10 * MINUTE + 30
    assert result.got_gpu_seconds["bob"] == 0


def test_a_member_who_runs_out_of_patience_leaves_the_line():
    asked = {"alice": [Ask(at(9), 1, HOUR, 10 * HOUR, 0)],
             "bob": [Ask(at(9, 10), 1, HOUR, 20 * MINUTE, 60)]}
    result = lab(FIRST_COME, 1, **asked).run()
    assert (result.served, result.gave_up) == (1, 1)
    assert result.ended == [0, 20 * MINUTE]


@pytest.mark.parametrize("policy, first", [(FIRST_COME, "heavy"), (FAIR_SHARE, "light")])
def test_fair_share_serves_the_member_with_fewer_recent_gpu_hours_first(policy, first):
    # heavy used the GPU 08:00-08:30 and asks again at 09:05; light asks at 09:10; the
    # GPU is busy until 12:00
    asked = {"heavy": [Ask(at(8), 1, 30 * MINUTE, 10 * HOUR, 0),
                       Ask(35 * MINUTE, 1, HOUR, 10 * HOUR, 60)],
             "holder": [Ask(at(8, 40), 1, at(3, 20), 10 * HOUR, 0)],
             "light": [Ask(at(9, 10), 1, HOUR, 10 * HOUR, 60)]}
    simulation = lab(policy, 1, **asked)
    simulation.until = START + at(12, 2)
    simulation.run()
    states = {name: m.state for name, m in simulation.members.items()}
    second = "light" if first == "heavy" else "heavy"
    assert states[first] == "working" and states[second] == "waiting", states


def test_the_same_seed_gives_the_same_month_and_every_policy_the_same_first_asks():
    one = [simulate(policy, members=6, gpus=2, days=3, seed=3)[0] for policy in POLICIES]
    two = [simulate(policy, members=6, gpus=2, days=3, seed=3)[0] for policy in POLICIES]
    for a, b in zip(one, two, strict=True):
        assert (a.waits, a.idle_while_waiting, a.gave_up) == (b.waits, b.idle_while_waiting,
                                                               b.gave_up)
    assert one[0].asked > 0 and one[1].plans > 0 and one[0].plans == 0
    text = report(one, [f"m{i}" for i in range(6)], 2, 3)
    for row in ("mean wait, minutes", "p95 wait", "idle while someone waited",
                "Jain's index", "GPU utilization"):
        assert row in text
    assert all(policy in text for policy in POLICIES)


def test_figures():
    assert jain([2, 2, 2]) == 1
    assert jain([1, 0, 0]) == pytest.approx(1 / 3)
    assert percentile([5, 1, 4, 2, 3], 95) == 5 and percentile([5, 1, 4, 2, 3], 50) == 3
    assert percentile([], 95) == 0
    # 2 GPUs from t=100 to t=250, in 60 s steps: 20 s of step 1, steps 2 and 3, 10 s of 4
    assert list(steps(100, 2, 60, until=250)) == [(1, pytest.approx(2 / 3)), (2, 2.0),
                                                  (3, 2.0), (4, pytest.approx(1 / 3))]
