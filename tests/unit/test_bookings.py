"""Bookings of GPUs for a time window: which GPUs a booking takes and what is refused, with the
reason (gpulab.bookings.book.choose); what a running booking keeps from spawns
(holds); which servers the GPU culler warns and stops for one (gpulab.culler.decide);
the store; the limits in gpus.yaml; the REST API's times.

Inventories are built by hand and configs parsed from text, as in test_allocator.py; the
real hub, spawner and culler are exercised by tests/integration/test_bookings.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpulab.bookings.api import booking_model, parse_time
from gpulab.bookings.book import (
    BOOKED,
    Booking,
    BookingRefused,
    choose,
    first_booked,
    holds,
    upcoming,
)
from gpulab.bookings.store import KEEP_ENDED, BookingStore
from gpulab.culler.decide import BOOKING, KEEP, STOP, WARN, Server, cull_decision
from gpulab.gpus.allocator import Gpu, NotEnoughGpus, Request, allocate
from gpulab.gpus.config import ConfigError, Culling, parse_gpus_config
from gpulab.gpus.policy import policy_for
from gpulab.notices import CullWarning
from tests.unit.test_allocator import gpu, lease, uuid

NOW = datetime(2027, 1, 11, 9, 0, tzinfo=UTC).timestamp()  # a Monday, 09:00 UTC
HOUR = 3600.0
CONFIG = parse_gpus_config("""\
defaults: {gpus: 1, max_gpus: 2}
groups:
  visitors: {no_gpu: true}
users:
  prof: {pinned: [3], max_gpus: 4}
  capped: {budget: {gpu_hours: 10, per: week, enforce: hard}}
bookings: {max_length: 4h, max_ahead: 7d}
""", "gpus.yaml")
GPUS = [gpu(0), gpu(1), gpu(2), gpu(3)]  # GPU 3 is prof's pin


def booking(id_, user, gpus, start, end) -> Booking:
    return Booking(id_, user, tuple(uuid(i) for i in gpus), start, end)


def book(user="alice", count=1, start=NOW + HOUR, end=NOW + 2 * HOUR, bookings=(),
         config=CONFIG, inventory=GPUS, groups=(), used=None, leases=(), sharing=()):
    return [g.index for g in choose(config, inventory, list(bookings), user, groups, count,
                                    start, end, NOW, used, leases, sharing=sharing)]


# ---------------------------------------------------------------- what is booked


def test_a_booking_takes_gpus_free_then_and_prefers_those_nobody_holds_now():
    assert book(count=2) == [0, 1]
    # GPU 0 is held by a running server: a booking soon takes the free ones first
    assert book(count=2, leases=[lease(0, "bob")]) == [1, 2]
    # GPUs booked by others at an overlapping time are not free then
    others = [booking(1, "bob", [0, 1], NOW + 90 * 60, NOW + 3 * HOUR)]
    assert book(count=1, bookings=others) == [2]
    # ...but before or after it they are (a booking ending when another starts)
    assert book(count=2, start=NOW + 3 * HOUR, end=NOW + 4 * HOUR, bookings=others) == [0, 1]
    assert book(count=2, start=NOW, end=NOW + 90 * 60, bookings=others) == [0, 1]


def test_a_members_pinned_gpu_is_hers_to_book_and_nobody_elses():
    assert 3 not in book(count=2, bookings=[booking(1, "bob", [0], NOW, NOW + 5 * HOUR)])
    assert book("prof", count=4) == [0, 1, 2, 3]


def test_a_servers_gpus_are_booked_on_one_machine_and_on_her_homes():
    two = [Gpu(0, uuid(0), "A100", node="n1"), Gpu(1, uuid(1), "A100", node="n2"),
           Gpu(2, uuid(2), "A100", node="n2")]
    assert book(count=2, inventory=two) == [1, 2]
    # a Swarm with homes on one machine: her servers run on n1, so her booking is there
    assert [g.index for g in choose(CONFIG, two, [], "alice", (), 1, NOW + HOUR,
                                    NOW + 2 * HOUR, NOW, machine="n1")] == [0]
    with pytest.raises(BookingRefused, match="must be on one machine") as e:
        book(count=2, inventory=two, bookings=[booking(1, "bob", [1], NOW, NOW + 3 * HOUR)])
    assert e.value.status == 409


@pytest.mark.parametrize("kwargs, status, words", [
    (dict(count=0), 400, '"gpus" must be a whole number of GPUs, 1 or more, got 0'),
    (dict(count=-1), 400, "got -1"),
    (dict(count="1"), 400, "got '1'"),
    (dict(count=True), 400, "got True"),
    (dict(end=NOW + HOUR), 400, "must end after it starts"),
    (dict(end=float("nan")), 400, "must end after it starts"),
    (dict(start=NOW - HOUR), 400, "cannot start in the past (2027-01-11 08:00 UTC)"),
    (dict(end=NOW + 6 * HOUR), 400, "A booking may last at most 4 h; this one lasts 5 h."),
    (dict(start=NOW + 8 * 86400, end=NOW + 8 * 86400 + HOUR), 400, "at most 7 days ahead"),
    (dict(count=3), 403, "You may book at most 2 GPUs at a time; you asked for 3"),
    (dict(user="vic", groups=("visitors",)), 403, "no GPU access, so it cannot book"),
    (dict(bookings=[booking(1, "alice", [2], NOW + 90 * 60, NOW + 3 * HOUR)]), 409,
     "You have a booking from 2027-01-11 10:30 UTC to 2027-01-11 12:00 UTC already"),
    (dict(count=2, bookings=[booking(1, "bob", [0, 1], NOW, NOW + 4 * HOUR),
                             booking(2, "carol", [2], NOW + HOUR, NOW + 4 * HOUR)]),
     409, "Not enough GPUs for that time: you asked for 2; of the 3 GPUs you may use, 3 "
          "are booked then"),
])
def test_a_booking_the_lab_cannot_honour_is_refused_with_the_reason(kwargs, status, words):
    with pytest.raises(BookingRefused) as e:
        book(**kwargs)
    assert e.value.status == status
    assert words in str(e.value)


def test_a_start_a_minute_ago_counts_as_now():
    assert book(start=NOW - 30, end=NOW + HOUR) == [0]


def test_the_lab_may_take_no_bookings():
    config = parse_gpus_config("bookings: {max_length: 0}\n")
    with pytest.raises(BookingRefused, match="takes no bookings") as e:
        book(config=config)
    assert e.value.status == 403


def test_bookings_max_gpus_caps_below_a_members_max():
    config = parse_gpus_config("defaults: {max_gpus: 4}\nbookings: {max_gpus: 1}\n")
    with pytest.raises(BookingRefused, match="at most 1 GPU at a time; you asked for 2"):
        book(count=2, config=config)


def test_a_hard_budget_counts_use_and_bookings_in_the_period_it_starts_in():
    # 10 GPU-hours a week: 6 used, a 2-GPU 2-hour booking (4) fits, with one more hour not
    assert book("capped", count=2, end=NOW + 3 * HOUR, used=6.0) == [0, 1]
    ahead = [booking(1, "capped", [0], NOW + 5 * HOUR, NOW + 6 * HOUR)]
    with pytest.raises(BookingRefused) as e:
        book("capped", count=2, end=NOW + 3 * HOUR, used=6.0, bookings=ahead)
    assert e.value.status == 403
    assert ("This booking is 4.0 GPU-hours; with 6.0 used and 1.0 booked in this week "
            "(from 2027-01-11 00:00 UTC), it is over your budget of 10 GPU-hours per week"
            ) in str(e.value)
    # next week's starts a fresh week: this week's use and bookings do not count...
    monday = NOW + 7 * 86400  # next Monday 09:00
    assert book("capped", count=2, start=monday, end=monday + 3 * HOUR, used=9.0,
                bookings=ahead)
    # ...but next week's own bookings do: no day-by-day way around the budget
    two_weeks = parse_gpus_config("users:\n  capped: {budget: {gpu_hours: 10, per: week, "
                                  "enforce: hard}}\nbookings: {max_length: 8h, "
                                  "max_ahead: 14d}\n")
    next_week = [booking(2, "capped", [0], monday, monday + 8 * HOUR)]
    with pytest.raises(BookingRefused, match=r"with 0.0 used and 8.0 booked in that week "
                                             r"\(from 2027-01-18 00:00 UTC\)"):
        book("capped", count=1, start=monday + 86400, end=monday + 86400 + 4 * HOUR,
             bookings=next_week, config=two_weeks)
    # a group's shared budget: the other members' bookings count too, and it says whose
    lab = parse_gpus_config("groups:\n  lab: {budget: {gpu_hours: 10, per: week, "
                            "enforce: hard, shared: true}}\nbookings: {max_length: 8h}\n")
    hers = [booking(5, "bob", [2, 3], NOW + 5 * HOUR, NOW + 8 * HOUR)]  # 6 GPU-hours
    assert book("ann", count=1, end=NOW + 5 * HOUR, groups=["lab"], config=lab,
                used=1.0, bookings=hers)  # bob shares nothing with her: 1 + 4 fits
    with pytest.raises(BookingRefused, match=r"with 1.0 used and 6.0 booked in this week "
                                             r".*over your group lab's budget of 10 "
                                             r"GPU-hours per week"):
        book("ann", count=1, end=NOW + 5 * HOUR, groups=["lab"], config=lab, used=1.0,
             bookings=hers, sharing=("ann", "bob"))
    # use not known yet (the line service brings it): counted as none, bookings still count
    assert book("capped", count=2, end=NOW + 3 * HOUR, used=None)
    with pytest.raises(BookingRefused):
        book("capped", count=2, end=NOW + 3 * HOUR, used=None, bookings=[
            booking(3, "capped", [1], NOW + 5 * HOUR, NOW + 9 * HOUR),
            booking(4, "capped", [2], NOW + 5 * HOUR, NOW + 8 * HOUR)])


# ---------------------------------------------------------------- what a booking keeps


def test_a_running_booking_keeps_its_gpus_from_others_and_gives_them_to_her_first():
    bookings = [booking(1, "bob", [1], NOW - HOUR, NOW + HOUR),
                booking(2, "carol", [2], NOW + HOUR, NOW + 2 * HOUR)]  # not yet
    [kept] = holds(bookings, NOW)
    assert (kept.gpu_uuid, kept.user) == (uuid(1), BOOKED)
    [mine] = holds(bookings, NOW, "bob", "train")
    assert (mine.gpu_uuid, mine.user, mine.server) == (uuid(1), "bob", "train")
    # at its end bob's booking keeps nothing; carol's, starting then, keeps GPU 2
    assert [(le.gpu_uuid, le.user) for le in holds(bookings, NOW + HOUR, "bob")] == [
        (uuid(2), BOOKED)]
    # as the spawner counts them: alice cannot get GPU 1 (dan holds GPU 0); bob gets it
    free = [gpu(0), gpu(1)]
    with pytest.raises(NotEnoughGpus) as e:
        allocate(CONFIG, free, [lease(0, "dan"), *holds(bookings, NOW, "alice")],
                 Request("alice", "", (), 1))
    assert ("only 0 of the 2 GPUs available to you are free. Busy: GPU 0 (A100) 1/1 in "
            "use, GPU 1 (A100) 1/1 in use (booked by a member).") in str(e.value)
    # a GPU both held by a server and booked counts once
    with pytest.raises(NotEnoughGpus, match=r"GPU 1 \(A100\) 1/1 in use \(booked by a member\)"):
        allocate(CONFIG, [gpu(1)], [lease(1, "dan"), *holds(bookings, NOW, "alice")],
                 Request("alice", "", (), 1))
    assert allocate(CONFIG, free, holds(bookings, NOW, "bob"),
                    Request("bob", "", (), 1)) == [gpu(1)]


def test_the_first_booking_of_someone_else_on_a_servers_gpus():
    bookings = [booking(1, "bob", [1], NOW + 2 * HOUR, NOW + 3 * HOUR),
                booking(2, "carol", [0, 1], NOW + HOUR, NOW + 2 * HOUR),
                booking(3, "alice", [0], NOW, NOW + HOUR),  # her own
                booking(4, "dan", [0], NOW - 2 * HOUR, NOW - HOUR)]  # ended
    found = first_booked(bookings, "alice", [uuid(0), uuid(1)], NOW)
    assert (found.booking.id, found.start, found.gpus) == (2, NOW + HOUR, 2)
    assert first_booked(bookings, "alice", [uuid(2)], NOW) is None
    # carol's own booking and dan's ended one do not count; alice's does
    assert first_booked(bookings, "carol", [uuid(0)], NOW).booking.id == 3
    assert first_booked(bookings, "carol", [uuid(0)], NOW + HOUR) is None


def test_a_spawn_gets_the_gpus_nobody_booked_first_then_those_booked_latest():
    bookings = [booking(1, "bob", [0], NOW + 2 * HOUR, NOW + 3 * HOUR),
                booking(2, "carol", [1], NOW + 5 * HOUR, NOW + 6 * HOUR),
                booking(3, "bob", [1], NOW + HOUR, NOW + 2 * HOUR),  # GPU 1's first
                booking(4, "alice", [2], NOW + HOUR, NOW + 2 * HOUR),  # her own
                booking(5, "dan", [2], NOW - HOUR, NOW + HOUR)]  # running: held, not ahead
    ahead = upcoming(bookings, "alice", NOW)  # seconds until each GPU's first
    assert ahead == ((uuid(0), 2 * HOUR), (uuid(1), HOUR))
    two = [gpu(0), gpu(1)]
    config = parse_gpus_config("defaults: {gpus: 1, max_gpus: 2}\n")

    def given(count, inventory, booked_from=ahead, config=config, leases=()):
        return [(g.node, g.index) if g.node else g.index
                for g in allocate(config, inventory, list(leases),
                                  Request("alice", "", (), count, booked_from=booked_from))]
    assert given(1, [*two, gpu(2)]) == [2]  # GPU 2: only her own booking
    assert given(1, two) == [0]  # GPU 0's booking is later than GPU 1's
    assert given(2, two) == [0, 1]  # none free without: both, the later one first
    assert given(1, two, booked_from=()) == [0]  # no bookings: by index, as before
    assert given(1, [gpu(1), gpu(3)], booked_from=((uuid(3), HOUR),)) == [1]
    # a booking after her server's max_server_age ends does not matter: by index again
    ninety = parse_gpus_config("defaults: {gpus: 1, max_gpus: 2, max_server_age: 90m}\n")
    in_two_hours = ((uuid(0), 2 * HOUR),)
    assert given(1, two, booked_from=in_two_hours) == [1]
    assert given(1, two, booked_from=in_two_hours, config=ninety) == [0]
    # on a Swarm, a server of two goes to the machine where neither is booked, though
    # the other machine is less loaded
    a = [Gpu(i, uuid(i), "A100", node="a") for i in range(3)]
    b = [Gpu(i, uuid(10 + i), "A100", node="b") for i in range(2)]
    assert given(2, [*a, *b], booked_from=((uuid(11), HOUR),),
                 leases=[lease(2, "zed")]) == [("a", 0), ("a", 1)]
    assert given(2, [*a, *b], booked_from=(), leases=[lease(2, "zed")]) == [("b", 0),
                                                                           ("b", 1)]


# ---------------------------------------------------------------- the GPU culler

CULLING = Culling(warn_before=600)
SERVER = Server("alice", "", NOW - HOUR, (uuid(0),))
NO_CLOCKS = policy_for(parse_gpus_config(
    "defaults: {gpus: 1, max_gpus: 1, gpu_idle_timeout: 0, max_server_age: 0}\n"), "alice", ())


def decide(bookings, now, standing=None):
    return cull_decision(SERVER, NO_CLOCKS, CULLING, {}, standing, now, bookings)


def test_a_server_holding_a_gpu_someone_booked_is_warned_then_stopped_at_the_start():
    bookings = [booking(1, "bob", [0], NOW + HOUR, NOW + 2 * HOUR)]
    assert decide(bookings, NOW).action == KEEP  # an hour ahead
    warned = decide(bookings, NOW + 50 * 60)  # ten minutes ahead
    assert warned.action == WARN and warned.warning.reason == BOOKING
    assert warned.warning.stop_at == NOW + HOUR
    assert warned.warning.message == ("its GPU is booked by another member from "
                                      "2027-01-11 10:00 UTC")
    stop = decide(bookings, NOW + HOUR, warned.warning)
    assert stop.action == STOP
    # her own booking, or one cancelled: kept (a standing warning is withdrawn)
    assert decide([booking(1, "alice", [0], NOW, NOW + HOUR)], NOW + 50 * 60).action == KEEP
    assert decide([], NOW + HOUR, warned.warning).action == KEEP


def test_a_booking_made_late_still_gives_the_holder_her_warning_time():
    bookings = [booking(1, "bob", [0], NOW + 60, NOW + HOUR)]
    warned = decide(bookings, NOW)
    assert warned.action == WARN and warned.warning.stop_at == NOW + 600
    assert decide(bookings, NOW + 300, warned.warning).action == WARN
    assert decide(bookings, NOW + 600, warned.warning).action == STOP


def test_the_booking_clock_runs_beside_the_others():
    aged = policy_for(parse_gpus_config("defaults: {gpus: 1, max_gpus: 1, max_server_age: "
                                        "90m}\n"), "alice", ())
    later = [booking(1, "bob", [0], NOW + HOUR, NOW + 2 * HOUR)]
    # her server's age runs out at NOW + 30 min, before the booking
    d = cull_decision(SERVER, aged, CULLING, {}, None, NOW + 25 * 60, later)
    assert d.action == WARN and d.warning.reason == "age"
    assert isinstance(d.warning, CullWarning)


# ---------------------------------------------------------------- the store


def test_the_store_records_cancels_and_forgets(tmp_path):
    clock = [NOW]
    store = BookingStore(tmp_path / "b.sqlite", now=lambda: clock[0])
    made = store.make(CONFIG, GPUS, "alice", (), 2, NOW + HOUR, NOW + 2 * HOUR, "alice")
    assert made.gpus == (uuid(0), uuid(1)) and made.made_by == "alice"
    assert store.bookings() == [made]
    # what is refused records nothing
    with pytest.raises(BookingRefused):
        store.make(CONFIG, GPUS, "alice", (), 1, NOW + HOUR, NOW + 2 * HOUR, "alice")
    other = store.make(CONFIG, GPUS, "bob", (), 1, NOW + HOUR, NOW + 2 * HOUR, "admin")
    assert other.gpus == (uuid(2),) and other.made_by == "admin"
    assert store.cancel("alice", other.id) is None  # not hers
    assert store.cancel("bob", other.id) == other
    assert store.bookings("bob") == []
    store.forget_user("alice")
    assert store.bookings() == []
    assert (tmp_path / "b.sqlite").stat().st_mode & 0o777 == 0o600


def test_the_store_drops_bookings_ended_over_a_week_ago(tmp_path):
    clock = [NOW]
    store = BookingStore(tmp_path / "b.sqlite", now=lambda: clock[0])
    store.make(CONFIG, GPUS, "alice", (), 1, NOW + HOUR, NOW + 2 * HOUR, "alice")
    clock[0] = NOW + 2 * HOUR + KEEP_ENDED + 1
    store.make(CONFIG, GPUS, "bob", (), 1, clock[0], clock[0] + HOUR, "bob")
    assert [b.user for b in store.bookings()] == ["bob"]


# ---------------------------------------------------------------- gpus.yaml, the API


def test_the_limits_in_gpus_yaml():
    limits = parse_gpus_config("bookings: {max_length: 2h, max_ahead: 1d, max_gpus: 1}\n"
                               ).bookings
    assert (limits.max_length, limits.max_ahead, limits.max_gpus) == (7200, 86400, 1)
    default = parse_gpus_config("").bookings
    assert (default.max_length, default.max_ahead, default.max_gpus) == (8 * 3600, 14 * 86400,
                                                                          0)


@pytest.mark.parametrize("text, where, words", [
    ("bookings: {max_lenght: 2h}\n", "gpus.yaml:1: bookings.max_lenght",
     "did you mean max_length?"),
    ("bookings:\n  max_ahead: 0\n", "gpus.yaml:2: bookings.max_ahead", ""),
    ("bookings:\n  max_gpus: -1\n", "gpus.yaml:2: bookings.max_gpus", ""),
    ("bookings: 3\n", "gpus.yaml:1", "max_length"),
])
def test_bad_limits_name_the_file_and_line(text, where, words):
    with pytest.raises(ConfigError) as e:
        parse_gpus_config(text, "gpus.yaml")
    assert where in str(e.value) and words in str(e.value)


@pytest.mark.parametrize("value, expected", [
    ("2027-01-11T09:00:00Z", NOW),
    ("2027-01-11T10:00:00+01:00", NOW),
    (" 2027-01-11T09:00Z ", NOW),
])
def test_times_are_iso_8601_with_their_zone(value, expected):
    assert parse_time(value, "start") == expected


@pytest.mark.parametrize("value, words", [
    ("2027-01-11T09:00:00", "needs its time zone"),
    ("tomorrow", "is not a time"),
    (1799999999, "must be a time such as"),
    # times Python cannot print back in UTC: refused, not a 500
    ("0001-01-01T00:30:00+01:00", "not a time a booking can have"),
    ("9999-12-31T23:00:00-05:00", "not a time a booking can have"),
    (None, "must be a time such as"),
])
def test_a_bad_time_is_refused_saying_why(value, words):
    with pytest.raises(ValueError, match=words):
        parse_time(value, "start")


def test_other_members_names_are_for_admins():
    b = booking(7, "bob", [0], NOW, NOW + HOUR)
    gpus = {uuid(0): gpu(0)}
    seen = booking_model(b, gpus, "alice", False, NOW)
    assert seen["user"] is None and seen["made_by"] is None and not seen["mine"]
    assert seen["gpu_labels"] == ["GPU 0 (A100)"] and seen["running"]
    assert booking_model(b, gpus, "alice", True, NOW)["user"] == "bob"
    assert booking_model(b, gpus, "bob", False, NOW)["mine"]
    assert seen["start"] == "2027-01-11T09:00:00Z"


def test_a_booked_shared_gpu_is_kept_whole_and_its_booker_in_line_gets_it():
    from gpulab.line.order import Entry
    from gpulab.line.plan import READY, WAITING, plan

    shared = [Gpu(0, uuid(0), "T4", mode="shared", max_users=3)]
    bookings = [booking(1, "bob", [0], NOW - 60, NOW + HOUR)]
    others = holds(bookings, NOW, capacity={uuid(0): 3})
    assert [le.user for le in others] == [BOOKED] * 3
    mine = holds(bookings, NOW, "bob", "", capacity={uuid(0): 3})
    assert [le.user for le in mine] == ["bob", BOOKED, BOOKED]
    # as the allocator counts them: no slot of it for carol; bob gets it
    with pytest.raises(NotEnoughGpus):
        allocate(CONFIG, shared, others, Request("carol", "", (), 1))
    assert allocate(CONFIG, shared, mine, Request("bob", "", (), 1)) == shared
    # in line: bob, waiting with his server "train", is served from his booking; carol,
    # ahead of him, waits
    entries = [Entry(1, "carol", "", 1, NOW - 100), Entry(2, "bob", "train", 1, NOW - 50)]
    leases = holds(bookings, NOW, capacity={uuid(0): 3},
                   waiting={e.user: e.server for e in entries})
    states = {p.entry.user: p.state for p in plan(CONFIG, shared, leases, entries)}
    assert states == {"carol": WAITING, "bob": READY}
