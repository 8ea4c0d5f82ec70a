"""The line for GPUs: who gets which GPUs in turn (gpulab.line.plan), its store, what a
member's home page says (gpulab.line.view), the line service's decisions
(gpulab.line.service.decide) and the options that put a server in line.

Inventories are built by hand and configs parsed from text, as in test_allocator.py;
the real hub, spawner and service are exercised by tests/integration/test_line.py.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from gpulab.gpus.allocator import (
    Gpu,
    InvalidRequest,
    Lease,
    Request,
    allocate,
    validate_user_options,
    wants_to_wait,
)
from gpulab.gpus.allocator import NotEnoughGpus as Busy
from gpulab.gpus.config import parse_gpus_config
from gpulab.line.order import Entry, position_of
from gpulab.line.plan import (
    HELD,
    OFFERED,
    READY,
    REFUSED,
    WAITING,
    holds,
    plan,
)
from gpulab.line.service import (
    CLAIM_MARGIN,
    CLAIMED,
    EXPIRED,
    GONE,
    REFUSE,
    START,
    WAIT,
    decide,
)
from gpulab.line.store import LineStore
from gpulab.line.usage import Usage
from gpulab.line.view import line_rows
from tests.unit.test_allocator import lease, uuid


def gpu(i, pool="default", mode="exclusive", max_users=1):
    return Gpu(i, uuid(i), "A100", pool, mode, max_users)


def entry(id_, user, gpus=1, at=None, server="", offered_at=None, groups=(), ready_at=None):
    return Entry(id_, user, server, gpus, float(id_ if at is None else at), tuple(groups),
                 offered_at, ready_at=ready_at)


CONFIG = parse_gpus_config("""\
pools:
  big: {mode: exclusive}
defaults: {gpus: 1, max_gpus: 2, pools: [default]}
groups:
  vision: {pools: [big]}
""")
FOUR = [gpu(0), gpu(1), gpu(2, "big"), gpu(3, "big")]


def states(places):
    return [(p.entry.user, p.state, p.position, [g.index for g in p.gpus]) for p in places]


# ---------------------------------------------------------------- plan


@pytest.mark.parametrize("leases, entries, expected", [
    pytest.param(  # nobody holds anything: the first in line gets the first free GPU
        [], [entry(1, "bob")], [("bob", READY, 1, [0])], id="one-free"),
    pytest.param(  # both default GPUs busy: bob waits, keeping nothing (none free)
        [lease(0, "alice"), lease(1, "carol")], [entry(1, "bob")],
        [("bob", WAITING, 1, [])], id="all-busy"),
    pytest.param(  # one GPU free: the first in line gets it, the second waits
        [lease(0, "alice")], [entry(1, "bob"), entry(2, "dave")],
        [("bob", READY, 1, [1]), ("dave", WAITING, 2, [])], id="first-come"),
    pytest.param(  # joined order decides, not the entry's number
        [lease(0, "alice")], [entry(1, "bob", at=20), entry(2, "dave", at=10)],
        [("dave", READY, 1, [1]), ("bob", WAITING, 2, [])], id="by-join-time"),
    pytest.param(  # bob wants 2, only 1 free: it is kept for him; dave (1) does not pass
        [lease(0, "alice")], [entry(1, "bob", gpus=2), entry(2, "dave")],
        [("bob", WAITING, 1, [1]), ("dave", WAITING, 2, [])], id="no-overtaking"),
    pytest.param(  # ...but a member of another pool passes him: he cannot use her GPUs
        [lease(0, "alice")],
        [entry(1, "bob", gpus=2), entry(2, "vera", groups=["vision"])],
        [("bob", WAITING, 1, [1]), ("vera", READY, 2, [2])], id="other-pool-passes"),
    pytest.param(  # the line already started dave's server: its GPU stays his
        [lease(0, "alice")], [entry(1, "bob", at=5), entry(2, "dave", at=9, offered_at=10)],
        [("dave", OFFERED, 0, [1]), ("bob", WAITING, 1, [])], id="offered-first"),
    pytest.param(  # asks more than she may ever hold: refused, and not counted
        [], [entry(1, "bob", gpus=3), entry(2, "dave")],
        [("bob", REFUSED, 0, []), ("dave", READY, 1, [0])], id="over-quota"),
    pytest.param(  # her running server counts toward her quota: 2 more is too many
        [lease(0, "bob", "other")], [entry(1, "bob", gpus=2)],
        [("bob", REFUSED, 0, [])], id="quota-with-running-server"),
])
def test_plan(leases, entries, expected):
    assert states(plan(CONFIG, FOUR, leases, entries)) == expected


def test_on_a_swarm_a_member_whose_home_is_on_one_machine_waits_for_its_gpus():
    """spawn.swarm_homes: machine (the default): her server can only run where her home
    is. A GPU freed on another machine is not hers: the line neither starts her server
    with it (its start would be refused, again every round) nor keeps it from others."""
    swarm = [replace(gpu(0), node="node-a", machine="a"),
             replace(gpu(1), node="node-b", machine="b")]
    ann = replace(entry(1, "ann"), machine="node-a")  # her home is on a
    bob = entry(2, "bob")  # no home yet: anywhere
    # a's GPU held, b's free: ann waits (keeping nothing), bob behind her gets b's
    places = plan(CONFIG, swarm, [lease(0, "carol")], [ann, bob])
    assert states(places) == [("ann", WAITING, 1, []), ("bob", READY, 2, [1])]
    assert [(le.gpu_uuid, le.user) for le in holds(places, [])] == [(uuid(1), "bob")]
    # a's comes free: hers
    places = plan(CONFIG, swarm, [lease(1, "carol")], [ann, bob])
    assert states(places) == [("ann", READY, 1, [0]), ("bob", WAITING, 2, [])]
    # a is down or drained (its GPUs out of the inventory): she waits, keeping nothing,
    # not refused as if she asked for more than the lab has
    places = plan(CONFIG, swarm[1:], [], [ann, bob])
    assert states(places) == [("ann", WAITING, 1, []), ("bob", READY, 2, [1])]
    # a joined the Swarm again under a new ID: the line knows it by its hostname too
    rejoined = [replace(swarm[0], node="node-a2"), swarm[1]]
    by_name = replace(ann, machine="a")
    assert states(plan(CONFIG, rejoined, [lease(1, "carol")], [by_name])) == [
        ("ann", READY, 1, [0])]


def test_a_line_store_keeps_the_machine_she_waits_on(tmp_path):
    store = LineStore(tmp_path / "line.sqlite")
    ann = store.join("ann", "", 1, (), machine="node-a")
    assert ann.machine == "node-a" and ann.request().machine == "node-a"
    assert store.join("ann", "", 1, ()).machine == ""  # asked again without: anywhere


def test_a_ready_entry_gets_what_allocate_gives_it_once_the_holds_of_others_count():
    leases = [lease(0, "alice")]
    places = plan(CONFIG, FOUR, leases, [entry(1, "bob")])
    # carol, not in line, finds GPU 1 kept for bob
    with pytest.raises(Busy):
        allocate(CONFIG, FOUR, leases + holds(places, leases), Request("carol", count=1))
    # bob's own spawn does not count his own hold, and gets exactly that GPU
    mine = holds(places, leases, spawning=("bob", ""))
    assert [g.index for g in allocate(CONFIG, FOUR, leases + mine,
                                      Request("bob", count=1))] == [1]


def test_free_gpus_kept_for_a_waiting_member_are_held_by_nobody_and_counted_in_no_quota():
    leases = [lease(0, "alice")]
    places = plan(CONFIG, FOUR, leases, [entry(1, "bob", gpus=2)])
    assert holds(places, leases) == [Lease(uuid(1), HELD, "", holds(places, leases)[0].since)]
    # the GPUs of another pool stay free for those who may use them
    got = allocate(CONFIG, FOUR, leases + holds(places, leases),
                   Request("vera", groups=["vision"], count=1))
    assert [g.index for g in got] == [2]


def test_an_offered_entrys_gpus_are_not_held_twice_once_its_container_holds_them():
    leases = [lease(0, "alice"), lease(1, "dave")]  # dave's server, started by the line
    places = plan(CONFIG, FOUR, leases, [entry(1, "dave", offered_at=1.0)])
    assert states(places) == [("dave", OFFERED, 0, [1])]
    assert holds(places, leases) == []


def test_an_offered_entry_whose_server_went_away_keeps_nothing():
    leases = [lease(0, "alice"), lease(1, "carol")]
    places = plan(CONFIG, FOUR, leases, [entry(1, "dave", offered_at=1.0)])
    assert states(places) == [("dave", OFFERED, 0, [])]


def test_a_shared_gpu_keeps_one_place_for_a_waiting_member():
    config = parse_gpus_config("pools:\n  default: {mode: shared, max_users: 3}\n"
                               "defaults: {max_gpus: 2}\n")
    inventory = [gpu(0, mode="shared", max_users=3), gpu(1, mode="shared", max_users=3)]
    leases = [lease(0, "alice"), lease(1, "carol"), lease(1, "erin"), lease(1, "fay")]
    places = plan(config, inventory, leases, [entry(1, "bob", gpus=2), entry(2, "dave")])
    # bob waits for a second GPU; one place on GPU 0 is kept for him, one is left for dave
    assert states(places) == [("bob", WAITING, 1, [0]), ("dave", READY, 2, [0])]


@pytest.mark.parametrize("inventory, asked, reason", [
    ([gpu(0), gpu(1)], 2, ""),
    ([gpu(0)], 2, "at most 1 is available to you, however long you wait"),
    ([gpu(2, "big")], 1, "no GPU is available to you"),
    ([Gpu(0, uuid(0), "A100", node="n1"), Gpu(1, uuid(1), "A100", node="n2")], 2,
     "at most 1 is available to you on any one machine"),
])
def test_a_request_no_wait_could_serve_is_refused_not_kept_waiting(inventory, asked, reason):
    from gpulab.line.plan import never_fits

    config = parse_gpus_config("defaults: {max_gpus: 2, pools: [default]}\npools: {big: {}}\n")
    got = never_fits(config, inventory, Request("bob", count=asked))
    assert (reason in got) if reason else got == ""
    if reason:
        (place,) = plan(config, inventory, [], [entry(1, "bob", gpus=asked)])
        assert place.state == REFUSED and reason in place.reason


def test_position_counts_the_entries_still_waiting_in_order():
    entries = [entry(3, "c", at=30), entry(1, "a", at=10, offered_at=11), entry(2, "b", at=20)]
    assert position_of(entries[0], entries) == (2, 2)
    assert position_of(entries[2], entries) == (1, 2)
    assert position_of(entries[1], entries) == (0, 2)


# ---------------------------------------------------------------- options


@pytest.mark.parametrize("raw, wait", [
    ({"gpus": 1}, False), ({"gpus": 1, "wait": True}, True), ({"wait": False}, False),
    ({"gpus": "1", "wait": "on"}, True), ({"wait": None}, False), (None, False),
])
def test_wait_in_line_is_a_boolean_or_the_forms_ticked_box(raw, wait):
    validate_user_options(raw, 2)
    assert wants_to_wait(raw) is wait


@pytest.mark.parametrize("value", ["yes", "true", 1, 0, [], {"a": 1}, "off"])
def test_anything_else_for_wait_is_a_clear_400(value):
    with pytest.raises(InvalidRequest, match='"wait" must be true or false') as e:
        validate_user_options({"gpus": 1, "wait": value}, 2)
    assert e.value.status == 400


# ---------------------------------------------------------------- store


def test_the_store_keeps_places_across_reopening_and_a_second_join_keeps_the_place(tmp_path):
    clock = iter([100.0, 200.0, 300.0, 400.0])
    store = LineStore(tmp_path / "line.sqlite", now=lambda: next(clock))
    bob = store.join("bob", "", 1, ["vision"])
    store.join("dave", "train", 2)
    again = store.join("bob", "", 2)  # asks again, for 2: same place
    assert (again.id, again.joined_at, again.gpus, again.groups) == (bob.id, 100.0, 2, ())
    reopened = LineStore(tmp_path / "line.sqlite")
    assert [(e.user, e.server, e.joined_at) for e in reopened.entries()] == [
        ("bob", "", 100.0), ("dave", "train", 200.0)]
    assert reopened.server_up("bob", "") is None  # not started by the line yet
    assert reopened.offer("bob", "").offered_at is not None
    up = reopened.server_up("bob", "")
    assert up.ready_at is not None and reopened.server_up("bob", "").ready_at == up.ready_at
    # the line could not start it after all: she waits again, and it is not up
    assert reopened.offer("bob", "", offered=False).ready_at is None
    assert reopened.offer("bob", "").offered_at is not None
    assert reopened.offer("nobody", "") is None
    assert reopened.remove("bob", "") and not reopened.remove("bob", "")
    reopened.forget_user("dave")
    assert reopened.entries() == []
    assert oct((tmp_path / "line.sqlite").stat().st_mode & 0o777) == "0o600"


# ---------------------------------------------------------------- home page


def test_the_home_page_shows_her_place_or_until_when_to_open_her_server():
    entries = [entry(1, "alice", at=10, offered_at=100.0), entry(2, "bob", at=20),
               entry(3, "bob", at=30, server="train", gpus=2)]
    config = parse_gpus_config("line: {claim_window: 10m}\n")
    rows = line_rows(entries, "bob", config)
    assert [(r["server"], r["state"], r["position"], r["waiting"]) for r in rows] == [
        ("", "waiting", 1, 2), ("train", "waiting", 2, 2)]
    (alice,) = line_rows(entries, "alice", config)  # started for her, not up yet
    assert (alice["state"], alice["window"]) == ("starting", "10 min")
    entries[0] = entry(1, "alice", at=10, offered_at=100.0, ready_at=160.0)
    (alice,) = line_rows(entries, "alice", config)  # up: ten minutes from then
    assert alice["state"] == "offered" and alice["deadline"]["utc"] == "1970-01-01 00:12"
    assert line_rows(entries, "carol", config) == []


# ---------------------------------------------------------------- the service


def model(state, offered_at=None, reason=""):
    return {"id": 1, "user": "bob", "server": "", "gpus": 1, "state": state,
            "offered_at": offered_at, "reason": reason}


def iso(t):
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


@pytest.mark.parametrize("entry_, server, now, ready_at, action", [
    (model(WAITING), None, 100, None, WAIT),
    (model(READY), None, 100, None, START),
    (model(REFUSED, reason="too many"), None, 100, None, REFUSE),
    # started for her: pending, then ready (this service noted when)
    (model(OFFERED, 100), {"pending": "spawn", "ready": False}, 110, None, WAIT),
    (model(OFFERED, 100), {"ready": True, "last_activity": iso(130)}, 131, 130, WAIT),
    # activity after it became ready is hers: claimed
    (model(OFFERED, 100), {"ready": True, "last_activity": iso(140)}, 141, 130, CLAIMED),
    # activity within the margin is the proxy adding the route: not a claim
    (model(OFFERED, 100),
     {"ready": True, "last_activity": iso(130 + CLAIM_MARGIN)}, 200, 130, WAIT),
    # the claim window (600 s from when it was up, not from the offer) ends: stopped
    (model(OFFERED, 100), {"ready": True, "last_activity": iso(130)}, 729, 130, WAIT),
    (model(OFFERED, 100), {"ready": True, "last_activity": iso(130)}, 730, 130, EXPIRED),
    # a start slower than the window leaves her the whole window once it is up
    (model(OFFERED, 100), {"ready": True, "last_activity": iso(900)}, 901, 900, WAIT),
    # her server is gone: it failed to start, or she stopped it
    (model(OFFERED, 100), None, 150, None, GONE),
    (model(OFFERED, 100), {"ready": False, "pending": None}, 150, 130, GONE),
])
def test_the_line_service_decides(entry_, server, now, ready_at, action):
    assert decide(entry_, server, now, 600, ready_at).action == action


def test_a_job_in_line_is_started_with_its_options_and_is_hers_once_up(tmp_path):
    store = LineStore(tmp_path / "line.sqlite")
    job = '{"command": "python train.py", "time": "8h"}'
    assert store.join("ann", "j1", 1, (), job=job).job == job
    assert store.entry("ann", "j1").job == job and store.join("bob", "", 1).job == ""
    ready = {**model(READY), "job": {"command": "python train.py", "time": "8h"}}
    assert decide(ready, None, 100, 600, None).job == {"command": "python train.py",
                                                        "time": "8h"}
    # nobody opens a job: once it is up it is hers, with no claim window
    up = {**model(OFFERED, 100), "job": {"command": "x"}}
    assert decide(up, {"ready": True, "last_activity": iso(130)}, 131, 600, 130).action \
        == CLAIMED
    assert decide(up, {"pending": "spawn", "ready": False}, 110, 600, None).action == WAIT
    # a short job that ran and ended between two looks: gone, without "could not start"
    ended = decide(up, None, 140, 600, None)
    assert (ended.action, ended.message) == (GONE, "")


def test_what_she_is_told_says_why():
    expired = decide(model(OFFERED, 100), {"ready": True, "last_activity": iso(130)}, 730,
                     600, 130)
    assert "did not open it within 10 min" in expired.message
    failed = decide(model(OFFERED, 100), None, 150, 600, None)
    assert "could not be started" in failed.message
    stopped = decide(model(OFFERED, 100), None, 150, 600, 130)
    assert stopped.message == ""  # she stopped it herself: nothing to tell her


class RecordingHub:
    """Stands in for gpulab.hubapi.HubApi's line calls: records them, answers the spawn
    with *spawn_status*."""

    def __init__(self, line, spawn_status=202, users=None, up_at=None):
        self.entries, self.spawn_status, self.users = line, spawn_status, users or {}
        self.up_at = up_at  # what server_up answers: when the hub noted it up
        self.calls = []

    async def line(self):
        return self.entries

    async def user(self, name):
        return self.users.get(name)

    async def offer(self, user, server="", offered=True):
        self.calls.append(("offer", user, offered))

    async def server_up(self, user, server=""):
        self.calls.append(("up", user))
        for e in self.entries:  # the hub keeps it: the next round's line carries it
            e["ready_at"] = e.get("ready_at") or self.up_at
        return self.up_at

    async def start_server(self, user, server="", options=None):
        self.calls.append(("start", user, dict(options or {})))
        return self.spawn_status, {"message": "no"}

    async def stop_server(self, user, server=""):
        self.calls.append(("stop", user))
        return True

    async def leave_line(self, user, server=""):
        self.calls.append(("leave", user))
        return True

    async def groups(self):
        return [{"name": "students", "users": ["ann", "sue"]}, {"name": "staff"}]


def service(hub, tmp_path, window="10m"):
    from gpulab.line.service import LineService

    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(f"line: {{claim_window: {window}}}\n")
    return LineService(hub, str(gpus), str(tmp_path / "notices.json"), interval=0)


@pytest.mark.parametrize("status, calls", [
    (202, [("offer", "bob", True), ("start", "bob", {"gpus": 1})]),
    # the GPUs went in between: she keeps her place, and is tried again next round
    (409, [("offer", "bob", True), ("start", "bob", {"gpus": 1}), ("offer", "bob", False)]),
    # anything else: out of the line, and told why
    (503, [("offer", "bob", True), ("start", "bob", {"gpus": 1}), ("leave", "bob")]),
])
async def test_her_turn_starts_her_server(tmp_path, status, calls):
    from gpulab import notices as notes

    hub = RecordingHub([model(READY)], spawn_status=status)
    line = service(hub, tmp_path)
    await line.check(now=100)
    assert hub.calls == calls
    told = notes.read(line.notices_file).stopped
    assert [s.message for s in told] == (
        ["it could not be started when it was your turn in line (no)"] if status == 503 else [])


async def test_her_turn_starts_her_server_in_the_environment_she_waits_in(tmp_path):
    hub = RecordingHub([{**model(READY), "environment": "course"}])
    await service(hub, tmp_path).check(now=100)
    assert hub.calls == [("offer", "bob", True),
                         ("start", "bob", {"gpus": 1, "environment": "course"})]


async def test_her_job_starts_with_its_command_and_the_address_that_hears_how_it_ended(
        tmp_path):
    job = {"command": "python train.py"}
    hub = RecordingHub([{**model(READY), "job": job, "email": "bob@lab.example"},
                        {**model(READY), "user": "cy", "id": 8, "email": "cy@lab.example"}])
    await service(hub, tmp_path).check(now=100)
    # a server's address was for her turn only: it is no option of the server
    assert [c for c in hub.calls if c[0] == "start"] == [
        ("start", "bob", {"gpus": 1, "job": job, "email": "bob@lab.example"}),
        ("start", "cy", {"gpus": 1})]


def test_the_store_keeps_her_environment_and_takes_an_older_gpulabs_file(tmp_path):
    import sqlite3

    old = tmp_path / "line.sqlite"  # the schema before environments
    with sqlite3.connect(old) as db:
        db.execute("CREATE TABLE line (id INTEGER PRIMARY KEY AUTOINCREMENT,"
                   " user TEXT NOT NULL, server TEXT NOT NULL, gpus INTEGER NOT NULL,"
                   " groups TEXT NOT NULL DEFAULT '[]', joined_at REAL NOT NULL,"
                   " offered_at REAL, UNIQUE (user, server))")
        db.execute("INSERT INTO line (user, server, gpus, joined_at) VALUES ('ann', '', 1, 5)")
    store = LineStore(old)
    [ann] = store.entries()
    assert (ann.user, ann.joined_at, ann.environment, ann.email) == ("ann", 5, "", "")
    bob = store.join("bob", "", 1, ("phd",), "course", "bob@lab.example")
    assert (bob.environment, bob.email) == ("course", "bob@lab.example")
    # asking again keeps her place, with the environment of the new request
    again = store.join("bob", "", 2, ("phd",), "pytorch")
    assert (again.environment, again.email) == ("pytorch", "")
    assert store.entry("bob", "").joined_at == bob.joined_at
    LineStore(old)  # opened again: nothing to add, nothing lost
    assert [e.user for e in LineStore(old).entries()] == ["ann", "bob"]


def test_two_processes_adding_the_same_column_do_not_fail(tmp_path, monkeypatch):
    """The hub and its services open the line's file as they start: the second to add a
    column finds it added between its look and its change."""
    import sqlite3

    from gpulab import private_db

    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (a TEXT)")
    real = private_db.connect

    class Racing:  # the other process adds it right after this one looked
        def __init__(self, p):
            self.db = real(p)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.db.__exit__(*exc)

        def execute(self, sql):
            rows = list(self.db.execute(sql))
            if sql.startswith("PRAGMA"):
                with real(path) as other:
                    other.execute("ALTER TABLE t ADD COLUMN b TEXT NOT NULL DEFAULT ''")
            return rows

    monkeypatch.setattr(private_db, "connect", Racing)
    private_db.add_columns(path, "t", [("b", "TEXT NOT NULL DEFAULT ''")])
    with real(path) as db:
        assert [r[1] for r in db.execute("PRAGMA table_info(t)")] == ["a", "b"]


async def test_an_unopened_server_is_stopped_after_the_claim_window_and_she_is_told(tmp_path):
    from gpulab import notices as notes

    ready = {"servers": {"": {"ready": True, "last_activity": iso(100)}}}
    # started at 0, up only at 100: past a whole window after the start
    hub = RecordingHub([model(OFFERED, offered_at=0)], users={"bob": ready}, up_at=100)
    line = service(hub, tmp_path, window="1m")
    assert await line.check(now=100) == []  # seen up now, said to the hub; the window runs
    assert await line.check(now=159) == []
    assert [d.action for d in await line.check(now=160)] == [EXPIRED]
    assert hub.calls == [("up", "bob"), ("stop", "bob"), ("leave", "bob")]
    (told,) = notes.read(line.notices_file).stopped
    assert (told.user, told.reason) == ("bob", notes.LINE)
    assert "did not open it within 1 min" in told.message


# ---------------------------------------------------------------- estimates


@pytest.mark.parametrize("leases, entries, releases, expected", [
    pytest.param(  # GPU 0 back at 500 at the latest (age), GPU 1 at 300 if it stays idle
        [lease(0, "alice"), lease(1, "carol")], [entry(1, "bob"), entry(2, "dave")],
        {uuid(0): (500.0, "age"), uuid(1): (300.0, "idle")},
        {1: (300.0, "idle"), 2: (500.0, "age")}, id="earliest-first"),
    pytest.param(  # 2 GPUs: when the later of the two comes back
        [lease(0, "alice"), lease(1, "carol")], [entry(1, "bob", gpus=2)],
        {uuid(0): (500.0, "age"), uuid(1): (300.0, "age")},
        {1: (500.0, "age")}, id="two-gpus"),
    pytest.param(  # a holder without a clock: no estimate for whoever needs that GPU
        [lease(0, "alice"), lease(1, "carol")], [entry(1, "bob"), entry(2, "dave")],
        {uuid(0): (500.0, "age")}, {1: (500.0, "age"), 2: (None, "")}, id="unknown"),
    pytest.param(  # the one before him is served with GPU 1 now: he waits for GPU 0
        [lease(0, "alice")], [entry(1, "erin"), entry(2, "bob")],
        {uuid(0): (500.0, "age")}, {2: (500.0, "age")}, id="behind-a-ready-one"),
    pytest.param(  # one GPU free and kept for him, the other back at 400
        [lease(0, "alice")], [entry(1, "bob", gpus=2)],
        {uuid(0): (400.0, "age")}, {1: (400.0, "age")}, id="kept-and-coming"),
])
def test_estimates(leases, entries, releases, expected):
    from gpulab.line.eta import estimates

    places = plan(CONFIG, FOUR, leases, entries)
    got = estimates(CONFIG, FOUR, leases, places, releases, now=100.0)
    assert {i: (e.at, e.kind) for i, e in got.items()} == expected


def test_the_members_ahead_keep_their_gpus_until_their_own_age_limit():
    from gpulab.line.eta import estimates

    config = parse_gpus_config("defaults: {max_gpus: 2, max_server_age: 1h}\n")
    inventory = [gpu(0)]
    leases = [lease(0, "alice")]
    places = plan(config, inventory, leases, [entry(1, "bob"), entry(2, "dave")])
    got = estimates(config, inventory, leases, places, {uuid(0): (500.0, "age")}, 100.0)
    # bob gets it at 500, and may keep it an hour: dave's turn is at 4100 at the latest
    assert {i: (e.at, e.kind) for i, e in got.items()} == {1: (500.0, "age"),
                                                             2: (4100.0, "age")}


def test_estimates_count_other_members_bookings():
    from gpulab.bookings.book import Booking, holds
    from gpulab.line.eta import estimates

    inventory = [gpu(0), gpu(1)]
    config = parse_gpus_config("defaults: {max_gpus: 2}\n")
    servers = [lease(1, "alice")]  # back at 450 at the latest (her age)
    releases = {uuid(1): (450.0, "age")}

    def etas(bookings, entries):
        # as the line's API: the plan counts a running booking's GPUs as taken (its
        # booker's, for her), the estimates the bookings with their times
        places = plan(config, inventory, [*servers, *holds(
            bookings, 100.0, waiting={e.user: e.server for e in entries})], entries)
        got = estimates(config, inventory, servers, places, releases, 100.0, bookings)
        return {i: (e.at, e.kind) for i, e in got.items()}

    carol_now = Booking(1, "carol", (uuid(0),), 50.0, 300.0)  # running: GPU 0 until 300
    erin = [Booking(2, "erin", (uuid(1),), 400.0, 700.0),  # GPU 1 from 400...
            Booking(3, "erin", (uuid(1),), 650.0, 900.0)]  # ...on to 900
    # GPU 0 is free but booked until 300; alice is stopped at 400 for erin, whose
    # bookings keep GPU 1 until 900: bob gets GPU 0 at 300, dave GPU 1 at 900
    assert etas([carol_now, *erin], [entry(1, "bob"), entry(2, "dave")]) == {
        1: (300.0, "booking"), 2: (900.0, "booking")}
    # bob, in line for two, booked GPU 1 from 150: alice is stopped then, and it is his
    assert etas([Booking(4, "bob", (uuid(1),), 150.0, 250.0)],
                [entry(1, "bob", gpus=2)]) == {1: (150.0, "booking")}
    # carol, in line for two with her running booking of GPU 0: hers now, GPU 1 at 450
    assert etas([carol_now], [entry(1, "carol", gpus=2)]) == {1: (450.0, "age")}


def test_estimates_keep_a_servers_gpus_on_one_machine():
    from gpulab.line.eta import estimates

    config = parse_gpus_config("defaults: {max_gpus: 2}\n")
    inventory = [Gpu(0, uuid(0), "A100", node="n1"), Gpu(1, uuid(1), "A100", node="n1"),
                 Gpu(2, uuid(2), "A100", node="n2"), Gpu(3, uuid(3), "A100", node="n2")]
    leases = [lease(i, f"u{i}") for i in range(4)]
    releases = {uuid(0): (200.0, "age"), uuid(2): (300.0, "age"), uuid(3): (350.0, "age"),
                uuid(1): (900.0, "age")}
    places = plan(config, inventory, leases, [entry(1, "bob", gpus=2)])
    # n1's two are back at 900, n2's at 350: n2, though GPU 0 comes back first
    assert estimates(config, inventory, leases, places, releases, 100.0)[1].at == 350.0


# ---------------------------------------------------------------- order


ORDERED = parse_gpus_config("""\
line: {order: fair_share, half_life: 7d}
groups:
  phd: {line_priority: 1}
users:
  zed: {line_priority: -1}
""")


@pytest.mark.parametrize("config, usage, expected", [
    # first come, first served
    (parse_gpus_config(""), None, ["ann", "bob", "cat", "dan"]),
    # priorities come first, in either order: phd (cat) before everyone, zed last
    (parse_gpus_config("groups: {phd: {line_priority: 1}}\nusers: {ann: {line_priority: -1}}\n"),
     None, ["cat", "bob", "dan", "ann"]),
    # fair share: fewer recent GPU-hours first (never used: 0); ties by joining
    (ORDERED, Usage({"ann": 5.0, "bob": 0.5, "dan": 0.5}), ["cat", "bob", "dan", "ann"]),
    # fair share without recent usage data: first come, first served (priorities stay)
    (ORDERED, None, ["cat", "ann", "bob", "dan"]),
    (ORDERED, Usage(None), ["cat", "ann", "bob", "dan"]),
    # line.max_wait (default 1 day): ann, in line since 10, has waited it out at 86410:
    # her GPU-hours count as none, and she joined first; bob and dan have not yet
    (ORDERED, Usage({"ann": 5.0, "bob": 0.5, "dan": 0.5}, now=86410.0),
     ["cat", "ann", "bob", "dan"]),
    (ORDERED, Usage({"ann": 5.0, "bob": 0.5, "dan": 0.5}, now=86409.0),
     ["cat", "bob", "dan", "ann"]),
    # ... not when max_wait is 0, and never against priorities
    (parse_gpus_config("line: {order: fair_share, max_wait: 0}\n"),
     Usage({"ann": 5.0, "bob": 0.5, "dan": 0.5}, now=1e9), ["cat", "bob", "dan", "ann"]),
    (parse_gpus_config("line: {order: fair_share, max_wait: 1m}\n"
                       "users: {bob: {line_priority: 1}}\n"),
     Usage({"ann": 5.0, "bob": 0.5, "dan": 0.5}, now=1e9), ["bob", "ann", "cat", "dan"]),
])
def test_the_lines_order(config, usage, expected):
    from gpulab.line.order import ranked

    entries = [entry(1, "ann", at=10), entry(2, "bob", at=20),
               entry(3, "cat", at=30, groups=["phd"]), entry(4, "dan", at=40)]
    assert [e.user for e in ranked(entries, config, usage)] == expected


def test_admins_see_whose_gpu_hours_no_longer_count_after_max_wait(tmp_path):
    import json

    from gpulab.line import usage as line_usage
    from gpulab.line.order import Standing, standing

    config = parse_gpus_config("line: {order: fair_share, max_wait: 2h}\n")
    # the hub's Usage keeps the clock it was read by, which max_wait counts on
    path = tmp_path / "usage.json"
    path.write_text(json.dumps({"at": 7000.0, "decayed": {"ann": 5.0}}))
    usage = line_usage.read(path, 10.0 + 7200)
    assert usage.now == 7210.0
    assert standing(entry(1, "ann", at=10), config, usage) == Standing(0, 0.0, False, True)
    assert standing(entry(1, "ann", at=11), config, usage) == Standing(0, 5.0, False, False)


def test_an_entry_whose_turn_came_stays_first_whatever_its_standing():
    from gpulab.line.order import ranked, standing

    entries = [entry(1, "cat", at=10, groups=["phd"]), entry(2, "zed", at=5, offered_at=50)]
    assert [e.user for e in ranked(entries, ORDERED, Usage({"zed": 100.0}))] == ["zed", "cat"]
    assert standing(entries[1], ORDERED, Usage({"zed": 100.0})).priority == -1
    assert standing(entries[0], ORDERED, Usage({})).gpu_hours == 0.0
    assert standing(entries[0], ORDERED, None).gpu_hours is None


# ---------------------------------------------------------------- usage


def test_decayed_gpu_hours_weigh_each_step_by_its_age():
    from gpulab.line.usage import decayed_gpu_hours

    h = 3600.0
    series = {"ann": [(0.0, 1.0), (h, 2.0)], "bob": [(h, 0.0)]}  # GPUs held, per hour
    got = decayed_gpu_hours(series, now=h, half_life=h, step=h)
    assert got == {"ann": pytest.approx(1.0 * 0.5 + 2.0 * 1.0), "bob": 0.0}


@pytest.mark.parametrize("half_life, scrape, expected", [
    (7 * 86400, 15, (28 * 86400, 2420)),  # 1000 points over four weeks
    (600, 2, (2400, 3)),
    (60, 15, (240, 15)),  # never finer than a scrape
])
def test_the_history_asked_for(half_life, scrape, expected):
    from gpulab.line.usage import window_and_step

    assert window_and_step(half_life, scrape) == expected


def test_usage_older_than_five_minutes_of_another_period_or_unreadable_is_not_used(tmp_path):
    from gpulab.line import usage

    path = tmp_path / "usage.json"
    assert usage.read(path, 100.0) == usage.NONE  # missing
    sunday = datetime(2026, 11, 29, 23, 58, tzinfo=UTC).timestamp()
    usage.write(path, sunday, {"ann": 1.5}, {"week": {"ann": 3.0}, "month": {"ann": 9.0}})
    got = usage.read(path, sunday + 60)
    assert (got.decayed, got.used("ann", "week"), got.used("bob", "month")) == (
        {"ann": 1.5}, 3.0, 0.0)
    # Monday: a new week (last week's numbers are not this week's); the month goes on
    monday = usage.read(path, sunday + 180)
    assert (monday.used("ann", "week"), monday.used("ann", "month")) == (None, 9.0)
    assert usage.read(path, sunday + 1 + usage.MAX_AGE) == usage.NONE  # too old
    path.write_text("{not json")
    assert usage.read(path, 100.0) == usage.NONE


class RecordingPrometheus:
    """Stands in for gpulab.prometheus_api.Prometheus's range query: records the query,
    answers with *matrix*, or raises PrometheusUnavailable when it is None."""

    def __init__(self, matrix):
        self.matrix, self.asked = matrix, []

    async def query_range(self, expr, start, end, step):
        from gpulab.prometheus_api import PrometheusUnavailable

        self.asked.append((expr, end - start, step))
        if self.matrix is None:
            raise PrometheusUnavailable("Prometheus at http://x did not answer")
        return self.matrix


async def test_the_line_service_writes_members_gpu_hours_under_fair_share(tmp_path):
    from gpulab.line import usage
    from gpulab.line.service import LineService

    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("line: {order: fair_share, half_life: 10m}\n")
    prometheus = RecordingPrometheus([{"metric": {"user": "ann"},
                                       "values": [[1000, "1"], [997, "1"]]}])
    line = LineService(RecordingHub([]), str(gpus), str(tmp_path / "n.json"), 2,
                       prometheus, str(tmp_path / "usage.json"))
    await line.check(now=1000.0)
    (expr, window, step), = prometheus.asked
    assert expr == f"sum by (user) (avg_over_time(gpulab:user_gpus_held[{step}s]))"
    assert window == 2400
    got = usage.read(tmp_path / "usage.json", 1000.0)
    assert set(got.decayed) == {"ann"} and got.decayed["ann"] > 0 and got.periods == {}
    await line.check(now=1001.0)  # asked again only after a while (here: 6 s)
    assert len(prometheus.asked) == 1
    prometheus.matrix = None  # Prometheus down: the file is left to grow old
    await line.check(now=1010.0)
    assert len(prometheus.asked) == 2 and usage.read(tmp_path / "usage.json", 1010.0) == replace(got, now=1010.0)


# ---------------------------------------------------------------- budgets


def test_budgets_combine_generously_and_a_users_own_entry_wins():
    from gpulab.gpus.policy import policy_for

    config = parse_gpus_config("""\
defaults: {budget: {gpu_hours: 100}}
groups:
  students: {budget: {gpu_hours: 20, per: week, enforce: hard}}
  staff: {budget: none}
users:
  zed: {budget: {gpu_hours: 1, enforce: hard}}
  amy: {budget: none}
""")
    def budget(user, groups=()):
        b = policy_for(config, user, groups).budget
        return b and (b.gpu_hours, b.per, b.enforce)

    assert budget("ann") == (100.0, "month", "soft")
    assert budget("sue", ["students"]) == (20.0, "week", "hard")
    assert budget("tim", ["students", "staff"]) is None  # none is the most generous
    assert budget("zed", ["staff"]) == (1.0, "month", "hard")
    assert budget("amy", ["students"]) is None


def test_a_groups_shared_budget_counts_its_members_use_together():
    from gpulab.gpus.budget import budget_state
    from gpulab.gpus.policy import policy_for

    config = parse_gpus_config("""\
groups:
  lab: {budget: {gpu_hours: 10, per: week, enforce: hard, shared: true}}
  solo: {budget: {gpu_hours: 4, per: week}}
  big: {budget: {gpu_hours: 20, per: week}}
users:
  pi: {budget: none}
""")
    shared = policy_for(config, "ann", ["lab"]).budget
    assert shared.shared_by == "lab" and policy_for(config, "cy", ["solo"]).budget.shared_by == ""
    usage = Usage(periods={"week": {"ann": 3.0, "bob": 6.0, "cy": 2.0, "pi": 50.0,
                                    "eve": 40.0}},
                  groups={"lab": ("ann", "bob", "pi", "eve"), "solo": ("cy",), "big": ("eve",)})
    # the PI (budget: none of her own) and eve (a more generous group's) are in lab but
    # neither bound by its shared budget nor spending it
    assert usage.sharing(shared, "ann", config) == ("ann", "bob")
    assert usage.used_against(shared, "ann", config) == 9.0  # hers and bob's
    assert policy_for(config, "pi", ["lab"]).budget is None
    assert policy_for(config, "eve", ["lab", "big"]).budget.gpu_hours == 20
    # a member the line service has not seen in the group yet still counts hers
    assert usage.used_against(shared, "dan", config) == 9.0
    assert usage.sharing(shared, "dan", config) == ("ann", "bob", "dan")
    own = policy_for(config, "cy", ["solo"]).budget
    assert (usage.used_against(own, "cy", config), usage.sharing(own, "cy", config)) == (
        2.0, ("cy",))
    # the group's members not known (the hub did not say): not known, nothing enforced
    assert Usage(periods={"week": {"ann": 3.0}}).used_against(shared, "ann", config) is None
    assert Usage(groups={"lab": ("ann",)}).used_against(shared, "ann", config) is None
    now = datetime(2026, 12, 2, 15, tzinfo=UTC).timestamp()
    state = budget_state(shared, 10.5, now)
    assert state.refusal() == (
        "Your group lab has used 10.5 of its 10 GPU-hours this week, so no GPU until its "
        "budget renews on 2026-12-07 00:00 UTC. Start the server with 0 GPUs, or ask an "
        "admin.")
    assert state.note().startswith("Your group lab has used 10.5 of its 10 GPU-hours this "
                                   "week (once they are spent, you get no GPU")


def test_a_spent_shared_soft_budget_puts_each_of_its_members_behind():
    from gpulab.line.order import ranked

    config = parse_gpus_config(
        "groups: {lab: {budget: {gpu_hours: 5, shared: true}}}\n"
        "defaults: {budget: {gpu_hours: 5}}\n")
    entries = [entry(1, "ann", at=10, groups=["lab"]), entry(2, "bob", at=20)]
    usage = Usage(periods={"month": {"ann": 1.0, "pat": 4.5, "bob": 4.0}},
                  groups={"lab": ("ann", "pat")})
    # ann used 1 of her group's 5, pat 4.5: spent together; bob, 4 of his own 5, goes first
    assert [e.user for e in ranked(entries, config, usage)] == ["bob", "ann"]


@pytest.mark.parametrize("text, error", [
    ("defaults: {budget: {gpu_hours: 1, shared: true}}",
     "defaults.budget.shared: only a group's budget can be shared"),
    ("users: {ann: {budget: {gpu_hours: 1, shared: true}}}",
     "users.ann.budget.shared: only a group's budget can be shared"),
    ("groups: {lab: {budget: {gpu_hours: 1, shared: maybe}}}", "lab.budget.shared"),
    ("defaults: {budget: 5}", "expected none, or a mapping with gpu_hours:"),
    ("defaults: {budget: {gpu_hours: -1}}", "expected GPU-hours, a number of 0 or more"),
    ("defaults: {budget: {gpu_hours: 1, per: day}}", "per: expected week or month"),
    ("defaults: {budget: {gpu_hours: 1, enforce: strict}}", "expected soft or hard"),
    ("groups: {x: {budget: {per: week}}}", "groups.x.budget: a budget needs gpu_hours:"),
])
def test_a_bad_budget_is_a_clear_error_with_its_line(text, error):
    from gpulab.yamlfile import ConfigError

    with pytest.raises(ConfigError, match="gpus.yaml:1") as e:
        parse_gpus_config(text)
    assert error in str(e.value)


@pytest.mark.parametrize("now, per, start, reset", [
    ((2026, 12, 2, 15), "week", (2026, 11, 30), (2026, 12, 7)),  # Wednesday
    ((2026, 11, 30, 0), "week", (2026, 11, 30), (2026, 12, 7)),  # Monday 00:00
    ((2026, 12, 2, 15), "month", (2026, 12, 1), (2027, 1, 1)),  # December: a new year
    ((2027, 2, 28, 23), "month", (2027, 2, 1), (2027, 3, 1)),
])
def test_budget_periods_are_calendar_weeks_and_months_in_utc(now, per, start, reset):
    from gpulab.gpus.budget import next_reset, period_start

    t = datetime(*now, tzinfo=UTC).timestamp()
    assert period_start(t, per) == datetime(*start, tzinfo=UTC).timestamp()
    assert next_reset(t, per) == datetime(*reset, tzinfo=UTC).timestamp()


def test_a_spent_hard_budget_refuses_and_says_with_what_numbers_until_when():
    from gpulab.gpus.budget import budget_state
    from gpulab.gpus.config import Budget

    now = datetime(2026, 12, 2, 15, tzinfo=UTC).timestamp()
    state = budget_state(Budget(100, "month", "hard"), 101.24, now)
    assert state.refuses
    assert state.refusal() == (
        "You have used 101.2 of your 100 GPU-hours this month, so no GPU until your budget "
        "renews on 2027-01-01 00:00 UTC. Start the server with 0 GPUs, or ask an admin.")
    soft = budget_state(Budget(10, "week", "soft"), 12.0, now)
    assert soft.spent and not soft.refuses
    assert "you wait behind members within theirs in line" in soft.note()
    assert not budget_state(Budget(10, "week", "hard"), 9.9, now).spent


def test_a_spent_soft_budget_puts_her_behind_those_within_theirs():
    from gpulab.line.order import ranked, standing

    config = parse_gpus_config("defaults: {budget: {gpu_hours: 1}}\n"
                               "groups: {phd: {line_priority: 5}}\n")
    entries = [entry(1, "ann", at=10, groups=["phd"]), entry(2, "bob", at=20),
               entry(3, "cat", at=30)]
    usage = Usage(None, {"month": {"ann": 2.0, "bob": 0.5}})
    # ann's priority does not lift her over members within their budget
    assert [e.user for e in ranked(entries, config, usage)] == ["bob", "cat", "ann"]
    assert standing(entries[0], config, usage).over_budget
    # with no known use, nobody is behind: first come (and priority)
    assert [e.user for e in ranked(entries, config, Usage())] == ["ann", "bob", "cat"]


async def test_the_line_service_brings_this_periods_gpu_hours_where_budgets_count_them(
        tmp_path):
    from gpulab.line import usage
    from gpulab.line.service import LineService

    class InstantPrometheus(RecordingPrometheus):
        async def query(self, expr, at=None):
            self.asked.append((expr, at))
            return [{"metric": {"user": "ann"}, "value": [at, "2.5"]}]

    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("groups: {students: {budget: {gpu_hours: 5, per: week}}}\n")
    prometheus = InstantPrometheus(None)
    line = LineService(RecordingHub([]), str(gpus), str(tmp_path / "n.json"), 2,
                       prometheus, str(tmp_path / "usage.json"))
    now = datetime(2026, 12, 2, 15, tzinfo=UTC).timestamp()
    await line.check(now=now)
    ((expr, at),) = prometheus.asked  # this week only: no fair share, no month budget
    assert expr.startswith(f"sum_over_time(gpulab:user_gpus_held[{2 * 86400 + 15 * 3600}s])")
    got = usage.read(tmp_path / "usage.json", now)
    assert (got.decayed, got.used("ann", "week"), got.used("ann", "month")) == (None, 2.5, None)
    # and the groups' members, for budget use per group in Prometheus
    assert got.groups == {"students": ("ann", "sue"), "staff": ()}

    class NoGroups(RecordingHub):
        async def groups(self):
            from gpulab.hubapi import HubApiError

            raise HubApiError("GET", "/groups", 403, "not allowed")

    # the hub refusing the groups later: the last ones read still count (a shared budget
    # stays enforced); never read, there are none (and it is not)
    line.hub = NoGroups([])
    await line.check(now=now + 3600)
    got = usage.read(tmp_path / "usage.json", now + 3600)
    assert (got.used("ann", "week"), got.groups["students"]) == (2.5, ("ann", "sue"))
    line = LineService(NoGroups([]), str(gpus), str(tmp_path / "n.json"), 2,
                       prometheus, str(tmp_path / "usage.json"))
    await line.check(now=now + 7200)
    got = usage.read(tmp_path / "usage.json", now + 7200)
    assert (got.used("ann", "week"), got.groups) == (2.5, {})


def test_a_spawn_that_waits_takes_a_place_unless_waiting_could_never_serve_it(tmp_path):
    """(Her budget and leaving the line once served: tests/unit/test_admission.py.)"""
    from gpulab.line.spawning import LineAtSpawn

    store = LineStore(tmp_path / "line.sqlite")
    config = parse_gpus_config("defaults: {max_gpus: 2, budget: {gpu_hours: 1}}\n")
    bob = LineAtSpawn(store, "bob", "", ["phd"])
    assert bob.join(config, [gpu(0)], 2).status == 409  # one GPU in all
    joined = bob.join(config, [gpu(0)], 1)
    assert (joined.status, joined.message.startswith(
        "No 1 GPU free now: you are number 1 in line (1 waiting).")) == (202, True)
    assert store.entry("bob", "").groups == ("phd",)
    again = bob.join(config, [gpu(0)], 1)  # she keeps her place
    assert again.status == 202 and len(store.entries()) == 1
