"""The SSH gateway's limits (gpulab.ssh.limits) from literal counts."""

from __future__ import annotations

import pytest

from gpulab.ssh import limits
from gpulab.ssh.limits import CONNECTIONS, FORWARDS, SESSIONS, Limits

OPENSSH_DEFAULT = Limits(start=10, rate=30, full=100)


@pytest.mark.parametrize("signing_in, chance", [
    (0, 0.0),
    (9, 0.0),
    (10, 0.30),  # from start on: rate percent
    (55, 0.65),  # halfway between start and full: halfway between rate and 100
    (99, 0.30 + 0.70 * 89 / 90),
    (100, 1.0),
    (500, 1.0),
])
def test_refusal_chance_is_openssh_maxstartups(signing_in, chance):
    assert limits.refusal_chance(OPENSSH_DEFAULT, signing_in) == pytest.approx(chance)


def test_a_hard_cap_refuses_from_full_on_only():
    cap = Limits(**dict(zip(("start", "rate", "full"), limits.parse_startups("4"), strict=True)))
    assert [limits.refusal_chance(cap, n) for n in range(6)] == [0, 0, 0, 0, 1, 1]


@pytest.mark.parametrize("spec, parsed", [
    ("10:30:100", (10, 30, 100)),
    ("4", (4, 100, 4)),
    (" 3:50:6 ", None),  # parse_startups takes it stripped (from_env strips)
    ("10:30", None),
    ("a:b:c", None),
    ("-1", None),
    ("", None),
])
def test_startups_are_written_as_openssh_writes_them(spec, parsed):
    if parsed is None:
        with pytest.raises(ValueError, match="start:rate:full"):
            limits.parse_startups(spec)
    else:
        assert limits.parse_startups(spec) == parsed


def test_a_new_connection_is_refused_by_address_before_chance():
    few = Limits(start=10, rate=30, full=100, per_address=2)
    draws = []

    def draw():
        draws.append(1)
        return 0.0  # would refuse whenever the chance is above 0

    assert limits.refuse_startup(few, 0, 0, draw) is None
    assert limits.refuse_startup(few, 5, 1, draw) is None
    why = limits.refuse_startup(few, 5, 2, draw)
    assert why and "2 connections from your address are already signing in" in why
    assert "1 connection from your address is already" in limits.refuse_startup(
        Limits(per_address=1), 0, 1, draw)
    assert limits.refuse_startup(few, 10, 0, draw).startswith("gpulab-ssh: too many")
    assert limits.refuse_startup(few, 10, 0, lambda: 0.3) is None  # 30 %: 0.3 is taken
    assert limits.refuse_startup(few, 100, 0, lambda: 0.999) is not None
    assert len(draws) == 3  # no draw for a refusal by address (two above)


def test_counts_take_give_back_and_forget():
    counts = limits.Counts(Limits(per_address=2, connections=1, sessions=2, forwards=1))
    assert counts.startup("10.0.0.1", lambda: 1.0) is None
    assert counts.startup("10.0.0.1", lambda: 1.0) is None
    assert counts.startup("10.0.0.1", lambda: 1.0) is not None  # third from one address
    assert counts.startup("10.0.0.2", lambda: 1.0) is None  # another address
    counts.signed_in("10.0.0.1")
    assert counts.startup("10.0.0.1", lambda: 1.0) is None
    for address in ("10.0.0.1", "10.0.0.1", "10.0.0.2"):
        counts.signed_in(address)
    assert not counts.signing_in

    assert counts.take("alice", SESSIONS) is None
    assert counts.take("alice", SESSIONS) is None
    why = counts.take("alice", SESSIONS)
    assert why == ("gpulab-ssh: you have 2 SSH sessions open, the lab's limit; end one "
                   "(exit a shell or command) and try again")
    assert counts.take("bob", SESSIONS) is None  # per member
    assert counts.take("alice", FORWARDS) is None  # per kind
    assert "forwarded connections" in counts.take("alice", FORWARDS)
    assert counts.take("alice", CONNECTIONS) is None
    assert "ControlMaster" in counts.take("alice", CONNECTIONS)
    counts.give_back("alice", SESSIONS)
    assert counts.take("alice", SESSIONS) is None
    for kind in (SESSIONS, SESSIONS, FORWARDS, CONNECTIONS):
        counts.give_back("alice", kind)
    counts.give_back("bob", SESSIONS)
    assert not counts.open


def test_limits_from_the_environment_name_the_bad_variable():
    assert Limits.from_env({}) == Limits()
    assert Limits.from_env({"GPULAB_SSH_MAX_STARTUPS": "",
                            "GPULAB_SSH_MAX_SESSIONS_PER_MEMBER": ""}) == Limits()
    got = Limits.from_env({"GPULAB_SSH_MAX_STARTUPS": "3:50:6",
                           "GPULAB_SSH_MAX_STARTUPS_PER_ADDRESS": "2",
                           "GPULAB_SSH_MAX_CONNECTIONS_PER_MEMBER": "4",
                           "GPULAB_SSH_MAX_SESSIONS_PER_MEMBER": "5",
                           "GPULAB_SSH_MAX_FORWARDS_PER_MEMBER": "7"})
    assert got == Limits(start=3, rate=50, full=6, per_address=2, connections=4,
                         sessions=5, forwards=7)
    assert got.describe() == ("signing in: 3:50:6 (MaxStartups), 2 per address; per "
                              "member: 4 connections, 5 sessions, 7 forwards")
    with pytest.raises(ValueError, match="GPULAB_SSH_MAX_SESSIONS_PER_MEMBER='many'"):
        Limits.from_env({"GPULAB_SSH_MAX_SESSIONS_PER_MEMBER": "many"})
    with pytest.raises(ValueError, match="GPULAB_SSH_MAX_STARTUPS='10:30'"):
        Limits.from_env({"GPULAB_SSH_MAX_STARTUPS": "10:30"})
    with pytest.raises(ValueError, match="full .5. is below start .10."):
        Limits.from_env({"GPULAB_SSH_MAX_STARTUPS": "10:30:5"})
    with pytest.raises(ValueError, match="forwards must be at least 1"):
        Limits.from_env({"GPULAB_SSH_MAX_FORWARDS_PER_MEMBER": "0"})
    with pytest.raises(ValueError, match="percentage"):
        Limits.from_env({"GPULAB_SSH_MAX_STARTUPS": "1:101:2"})
