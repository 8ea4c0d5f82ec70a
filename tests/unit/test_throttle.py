"""gpulab.login.throttle: lockout decisions, doubling, persistence across restarts, 429, and
device cookies that keep a member's own browser out of other people's lockouts."""

from __future__ import annotations

import stat

import pytest

from gpulab.login.throttle import (
    ADDRESS,
    DEVICE,
    USER,
    Entry,
    LockoutPolicy,
    Throttle,
    address_key,
    after_failure,
    is_locked,
)

POLICY = LockoutPolicy(max_failures=5, window=900, lockout=900, max_lockout=3600, forget_after=86400)


class Clock:
    """Wall-clock stand-in: starts at a fixed time, moves only when told."""

    def __init__(self, t: float = 1_700_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def fail_n(entry: Entry, n: int, now: float, step: float = 1.0) -> Entry:
    for i in range(n):
        entry = after_failure(entry, now + i * step, POLICY)
    return entry


def test_four_failures_do_not_lock_the_fifth_does():
    e = fail_n(Entry(), 4, 0.0)
    assert not is_locked(e, 4.0)
    assert e.failures == 4
    e = after_failure(e, 4.0, POLICY)
    assert is_locked(e, 4.0)
    assert e.locked_until == 4.0 + 900
    assert not is_locked(e, 4.0 + 900)


def test_failures_outside_the_window_start_a_new_count():
    e = fail_n(Entry(), 4, 0.0)
    e = after_failure(e, 1000.0, POLICY)  # window (900 s) has passed
    assert e.failures == 1 and not is_locked(e, 1000.0)


def test_lockouts_double_and_are_capped():
    e, t, lengths = Entry(), 0.0, []
    for _ in range(4):
        e = fail_n(e, 5, t)
        lengths.append(e.locked_until - (t + 4))
        t = e.locked_until
    assert lengths == [900, 1800, 3600, 3600]
    assert e.lockouts == 4


def test_a_locked_key_is_not_extended_by_more_attempts():
    e = fail_n(Entry(), 5, 0.0)
    assert after_failure(e, 10.0, POLICY) == e


def test_history_is_forgotten_after_a_quiet_day():
    e = fail_n(Entry(), 5, 0.0)
    e = after_failure(e, 90_000.0, POLICY)
    assert e.lockouts == 0 and e.failures == 1


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("not-an-ip", "not-an-ip"),
    ],
)
def test_address_keys(address, key):
    assert address_key(address) == key


def test_policy_rejects_nonsense():
    with pytest.raises(ValueError, match="max_failures"):
        LockoutPolicy(max_failures=0)
    with pytest.raises(ValueError, match="lockout"):
        LockoutPolicy(lockout=0)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def throttle(tmp_path, clock):
    return Throttle(tmp_path / "state" / "throttle.sqlite", user_policy=POLICY, now=clock)


def test_file_is_private_to_the_hub(throttle):
    assert stat.S_IMODE(throttle.path.stat().st_mode) == 0o600


def test_fifth_failure_answers_429_with_retry_after(throttle, clock):
    for _ in range(4):
        assert throttle.record_failure("alice", "192.0.2.1").status is None
    decision = throttle.record_failure("alice", "192.0.2.1")
    assert decision.locked and decision.status == 429
    assert decision.retry_after == 900
    assert "Try again after" in decision.message() and "15 minutes" in decision.message()
    # the right token does not help while locked: the handler checks first
    assert throttle.check("alice", "198.51.100.9").status == 429
    # other users from the same address are not locked by alice's lockout
    assert throttle.check("bob", "192.0.2.1").locked is False
    clock.advance(900)
    assert throttle.check("alice", "192.0.2.1").locked is False


def test_lockout_survives_a_restart(tmp_path, clock):
    path = tmp_path / "throttle.sqlite"
    first = Throttle(path, user_policy=POLICY, now=clock)
    for _ in range(5):
        first.record_failure("alice", "192.0.2.1")
    del first
    clock.advance(60)
    second = Throttle(path, user_policy=POLICY, now=clock)  # "after the restart"
    decision = second.check("alice", None)
    assert decision.locked and decision.retry_after == 840
    assert second.entry(USER, "alice").lockouts == 1


def test_success_resets_the_username_but_not_the_address(throttle, clock):
    for _ in range(4):
        throttle.record_failure("alice", "192.0.2.1")
    throttle.record_success("alice")
    assert throttle.entry(USER, "alice") == Entry()
    assert throttle.entry(ADDRESS, "192.0.2.1").failures == 4
    # counting for alice starts again from zero
    for _ in range(4):
        throttle.record_failure("alice", "192.0.2.2")
    assert not throttle.check("alice", None).locked


def test_address_locks_after_twenty_failures_across_usernames(throttle):
    for i in range(19):
        assert not throttle.record_failure(f"user{i}", "192.0.2.50").locked
    decision = throttle.record_failure("user19", "192.0.2.50")
    assert decision.locked and decision.status == 429
    assert throttle.check("someone-else", "192.0.2.50").locked
    assert not throttle.check("someone-else", "192.0.2.51").locked


def test_invalid_usernames_count_only_against_the_address(throttle):
    throttle.record_failure(None, "192.0.2.1")
    assert throttle.entry(ADDRESS, "192.0.2.1").failures == 1
    with throttle._connect() as db:
        assert db.execute("SELECT count(*) FROM login_failures WHERE kind = ?", (USER,)).fetchone() == (0,)


def test_stale_rows_are_pruned(throttle, clock):
    throttle.record_failure("old", "192.0.2.1")
    clock.advance(2 * 86400)
    throttle.record_failure("new", "192.0.2.2")
    assert throttle.entry(USER, "old") == Entry()
    with throttle._connect() as db:
        keys = {row[0] for row in db.execute("SELECT key FROM login_failures")}
    assert keys == {"new", "192.0.2.2"}


# ------------------------------------------------------------------ device cookies

DEVICE_ID = "dev-alice-laptop-0001"


def lock_alice_and_the_address(throttle):
    """What an attacker sharing alice's address can do: lock her name and the address."""
    for _ in range(5):
        throttle.record_failure("alice", "192.0.2.1")
    for i in range(15):
        throttle.record_failure(f"guess{i}", "192.0.2.1")
    assert throttle.check("alice", "192.0.2.1").locked
    assert throttle.check("bob", "192.0.2.1").locked


def test_a_device_is_not_locked_by_the_name_or_address_lockouts(throttle):
    lock_alice_and_the_address(throttle)
    assert not throttle.check("alice", "192.0.2.1", DEVICE_ID).locked


def test_failures_with_a_device_count_against_it_only(throttle):
    for _ in range(4):
        assert not throttle.record_failure("alice", "192.0.2.1", DEVICE_ID).locked
    assert throttle.entry(USER, "alice") == Entry()
    assert throttle.entry(ADDRESS, "192.0.2.1") == Entry()
    decision = throttle.record_failure("alice", "192.0.2.1", DEVICE_ID)
    assert decision.locked and decision.status == 429 and decision.retry_after == 900
    assert throttle.check("alice", "192.0.2.1", DEVICE_ID).locked
    # the name and the address are free: another browser may still try
    assert not throttle.check("alice", "192.0.2.1").locked
    assert not throttle.check("alice", "192.0.2.1", "another-device-0002").locked


def test_success_with_a_device_clears_the_device_not_the_name(throttle):
    lock_alice_and_the_address(throttle)
    for _ in range(3):
        throttle.record_failure("alice", "192.0.2.1", DEVICE_ID)
    throttle.record_success("alice", DEVICE_ID)
    assert throttle.entry(DEVICE, DEVICE_ID) == Entry()
    # the attacker does not get fresh guesses at alice's name from her sign-in
    assert throttle.check("alice", "192.0.2.9").locked


def test_device_lockout_survives_a_restart_and_expires(tmp_path, clock):
    path = tmp_path / "throttle.sqlite"
    first = Throttle(path, user_policy=POLICY, now=clock)
    for _ in range(5):
        first.record_failure("alice", "192.0.2.1", DEVICE_ID)
    second = Throttle(path, user_policy=POLICY, now=clock)
    assert second.check("alice", None, DEVICE_ID).locked
    clock.advance(900)
    assert not second.check("alice", None, DEVICE_ID).locked
    assert second.entry(DEVICE, DEVICE_ID).lockouts == 1
