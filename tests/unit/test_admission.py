"""A spawn's admission (gpulab.spawn.admission) as a table: one ask, what was read once
(config, leases, bookings, the line, GPU-hours), and the answer: her GPUs, or the status
and message she is told, or her place in line. Configs are written as an admin would."""

from datetime import UTC, datetime

import pytest

from gpulab.bookings.book import BOOKED, Booking
from gpulab.environments import Environment
from gpulab.gpus.allocator import Gpu, Lease
from gpulab.gpus.config import parse_gpus_config
from gpulab.gpus.policy import policy_for
from gpulab.line.order import Entry
from gpulab.line.plan import HELD
from gpulab.line.spawning import HINT
from gpulab.line.usage import NONE, Usage
from gpulab.spawn import admission
from gpulab.spawn.admission import Admitted, Ask, JoinLine, Refused, Seen

NOW = 1_800_000_000.0
T0 = datetime.fromtimestamp(NOW - 600, UTC)
HOUR = 3600.0


def uuid(i: int) -> str:
    return f"GPU-{i:08d}-0000-0000-0000-000000000000"


def gpu(i: int, node: str = "", machine: str = "") -> Gpu:
    return Gpu(i, uuid(i), "A100", "default", "exclusive", 1, False, node=node,
               machine=machine)


TWO = (gpu(0), gpu(1))
LAB = parse_gpus_config("defaults: {gpus: 1, max_gpus: 2}\nusers:\n  root: {max_gpus: 0}\n")
BUDGETED = parse_gpus_config(
    "defaults: {gpus: 1, max_gpus: 2}\n"
    "groups: {lab: {budget: {gpu_hours: 2, per: week, enforce: hard, shared: true}}}\n")
CPU_ONLY = Environment("notes", "gpulab/singleuser:cpu", gpus=False)
WEEK = {"lab": ["ann", "bob"]}


def held(i: int, user: str, server: str = "") -> Lease:
    return Lease(uuid(i), user, server, T0)


def seen(config=LAB, leases=(), bookings=(), line=None, usage=NONE, mail=False,
         inventory=TWO) -> Seen:
    return Seen(config, tuple(inventory), tuple(leases), NOW, bookings=tuple(bookings),
                line=None if line is None else tuple(line), usage=usage, mail_on=mail)


def booking(user: str, *gpus: int, start=NOW - 60, end=NOW + HOUR) -> Booking:
    return Booking(1, user, tuple(uuid(i) for i in gpus), start, end)


def waiting(user: str, gpus: int = 1, offered: float | None = None) -> Entry:
    return Entry(1, user, "", gpus, NOW - 100, offered_at=offered)


def uuids(decision) -> list[str]:
    assert isinstance(decision, Admitted), decision
    return [g.uuid for g in decision.gpus]


NONE_FREE = "You asked for 1 GPU, but only 0 of the 2 GPUs available to you are free."


# (what happens, the ask, what was seen, the answer: GPU indexes, or (status, message
# start), or JoinLine)
TABLE = [
    ("her default: one GPU", Ask("ann"), seen(), [0]),
    ("two asked", Ask("ann", options={"gpus": 2}), seen(), [0, 1]),
    ("none asked", Ask("ann", options={"gpus": 0}), seen(), []),
    ("the form's digits", Ask("ann", options={"gpus": "2"}), seen(), [0, 1]),
    ("words for a count", Ask("ann", options={"gpus": "two"}), seen(),
     (400, "\"gpus\" must be a whole number from 0 to 2")),
    ("an unknown option", Ask("ann", options={"gpu": 1}), seen(),
     (400, "Unknown server option(s): gpu.")),
    ("over her quota", Ask("ann", options={"gpus": 3}), seen(),
     (403, "You asked for 3 GPUs; you may use at most 2.")),
    ("no GPU access", Ask("root", options={"gpus": 1}), seen(), (403, "")),
    ("busy GPU skipped", Ask("ann"), seen(leases=[held(0, "bob")]), [1]),
    ("both busy", Ask("ann"), seen(leases=[held(0, "bob"), held(1, "cat")]),
     (409, NONE_FREE)),
    ("both busy, the lab has a line: how to wait", Ask("ann"),
     seen(leases=[held(0, "bob"), held(1, "cat")], line=[]), (409, NONE_FREE)),
    ("both busy, she waits", Ask("ann", options={"gpus": 1, "wait": True}),
     seen(leases=[held(0, "bob"), held(1, "cat")], line=[]), JoinLine(1, "", "", "")),
    ("both busy, her job waits", Ask("ann", "j1", options={"gpus": 1, "wait": True,
                                                           "job": {"command": "x"}}),
     seen(leases=[held(0, "bob"), held(1, "cat")], line=[]),
     JoinLine(1, "", "", "", '{"command": "x"}')),
    ("wait without a line is just a 409", Ask("ann", options={"gpus": 1, "wait": True}),
     seen(leases=[held(0, "bob"), held(1, "cat")]), (409, NONE_FREE)),
    ("an e-mail where the lab sends none", Ask("ann", options={"wait": True, "email": "a@b.org"}),
     seen(line=[]), (400, "This lab sends no e-mail")),
    ("an e-mail without waiting, from the REST API",
     Ask("ann", options={"email": "a@b.org"}, from_form=False), seen(mail=True),
     (400, "An e-mail address is for waiting in line")),
    ("her e-mail goes with her place", Ask("ann", options={"wait": True, "email": "a@b.org"}),
     seen(leases=[held(0, "bob"), held(1, "cat")], line=[], mail=True),
     JoinLine(1, "", "a@b.org", "")),
    ("an environment without GPUs: 0 from the form",
     Ask("ann", options={"gpus": 1}, environment=CPU_ONLY), seen(), []),
    ("an environment without GPUs: a 400 from the REST API",
     Ask("ann", options={"gpus": 1}, environment=CPU_ONLY, from_form=False), seen(),
     (400, "The environment 'notes' runs without GPUs")),
    ("a booking running now keeps its GPU from others", Ask("ann"),
     seen(bookings=[booking("bob", 0)]), [1]),
    ("her own booking's GPU comes first", Ask("bob"),
     seen(bookings=[booking("bob", 1)]), [1]),
    ("booked and busy: none", Ask("ann"),
     seen(bookings=[booking("bob", 0)], leases=[held(1, "cat")]), (409, NONE_FREE)),
    ("the line keeps the free GPU for the one waiting first", Ask("ann"),
     seen(leases=[held(0, "cat")], line=[waiting("bob")]), (409, NONE_FREE)),
    ("her own place does not keep a GPU from her", Ask("bob"),
     seen(leases=[held(0, "cat")], line=[waiting("bob")]), [1]),
    ("hard budget spent", Ask("bob", groups=("lab",)),
     seen(config=BUDGETED, usage=Usage(periods={"week": {"ann": 1.5, "bob": 0.6}},
                                       groups=WEEK)),
     (403, "Your group lab has used 2.1 of its 2 GPU-hours")),
    ("spent, but asks for no GPU", Ask("bob", groups=("lab",), options={"gpus": 0}),
     seen(config=BUDGETED, usage=Usage(periods={"week": {"bob": 5.0}}, groups=WEEK)), []),
    ("use unknown: no budget enforced", Ask("bob", groups=("lab",)),
     seen(config=BUDGETED), [0]),
    ("a named server beside her default one", Ask("ann", "train", running=("",)),
     seen(leases=[held(0, "ann")]), [1]),
    ("her quota counts all her servers", Ask("ann", "train", options={"gpus": 2},
                                             running=("",)),
     seen(leases=[held(0, "ann")]), (403, "You asked for 2 GPUs, but you already hold 1 on server(s) default and "
                               "may use at most 2 in total.")),
    ("max_servers running already", Ask("ann", "third", options={"gpus": 0},
                                        running=("", "train")),
     seen(), (403, "You already have 2 servers running (your default one, \"train\"), the "
                   "most the lab gives you at once (max_servers: 2): stop one first.")),
    ("max_servers: 1 from gpus.yaml", Ask("ann", "train", running=("",)),
     seen(config=parse_gpus_config("defaults: {max_servers: 1}\n")),
     (403, "You already have 1 server running (your default one)")),
    ("a group's max_servers", Ask("ann", "c", groups=("big",), running=("", "b")),
     seen(config=parse_gpus_config("groups: {big: {max_servers: 3}}\n")), []),
    ("budget enforced without a line too", Ask("bob", groups=("lab",)),
     seen(config=BUDGETED, line=None,
          usage=Usage(periods={"week": {"bob": 2.0}}, groups=WEEK)), (403, "")),
]


@pytest.mark.parametrize("ask,seen_,expected", [row[1:] for row in TABLE],
                         ids=[row[0] for row in TABLE])
def test_admission(ask, seen_, expected):
    decision = admission.decide(ask, seen_)
    if isinstance(expected, list):
        assert uuids(decision) == [uuid(i) for i in expected]
    elif isinstance(expected, JoinLine):
        assert isinstance(decision, Refused) and decision.join == expected, decision
    else:
        status, start = expected
        assert isinstance(decision, Refused) and decision.join is None, decision
        assert (decision.status, decision.message[:len(start)]) == (status, start), decision


def test_the_hint_to_wait_is_given_only_where_the_lab_has_a_line():
    full = [held(0, "bob"), held(1, "cat")]
    assert admission.decide(Ask("ann"), seen(leases=full, line=[])).message.endswith(HINT)
    assert HINT not in admission.decide(Ask("ann"), seen(leases=full)).message


def test_admins_are_told_who_holds_the_busy_gpus_members_are_not():
    full = seen(leases=[held(0, "bob"), held(1, "cat")])
    member = admission.decide(Ask("ann"), full)
    assert "bob" not in member.message and "bob" in member.log
    admin = admission.decide(Ask("ann", admin=True), full)
    assert "bob" in admin.message


def test_what_is_recorded_is_her_lease_against_everything_taken():
    decision = admission.decide(Ask("ann", "train"), seen(bookings=[booking("bob", 0)]))
    assert isinstance(decision, Admitted) and uuids(decision) == [uuid(1)]
    assert {le.user for le in decision.taken} == {BOOKED}
    assert (decision.request.user, decision.request.server) == ("ann", "train")


def test_getting_gpus_takes_her_out_of_the_line_unless_the_line_started_her_server():
    assert admission.decide(Ask("bob"), seen(line=[waiting("bob")])).leaves_line
    offered = admission.decide(Ask("bob"), seen(line=[waiting("bob", offered=NOW - 5)]))
    assert not offered.leaves_line
    assert not admission.decide(Ask("bob"), seen(line=[waiting("cat")])).leaves_line


def test_she_is_told_at_once_when_a_gpu_she_got_is_booked_later():
    later = booking("bob", 0, 1, start=NOW + HOUR, end=NOW + 2 * HOUR)
    decision = admission.decide(Ask("ann"), seen(bookings=[later]))
    assert decision.booked_note.startswith("Another member has booked this GPU from ")
    mine = booking("ann", 0, 1, start=NOW + HOUR, end=NOW + 2 * HOUR)
    assert admission.decide(Ask("ann"), seen(bookings=[mine])).booked_note == ""
    aged = parse_gpus_config("defaults: {gpus: 1, max_gpus: 2, max_server_age: 30m}\n")
    assert admission.decide(Ask("ann"), seen(config=aged, bookings=[later])).booked_note == ""


def test_a_swarm_home_keeps_her_server_on_its_machine_and_says_so():
    nodes = (gpu(0, node="n1", machine="gpu1"), gpu(1, node="n2", machine="gpu2"))
    ask = Ask("ann", machine="n2", line_machine="gpu2", machine_name="gpu2")
    assert uuids(admission.decide(ask, seen(inventory=nodes))) == [uuid(1)]
    busy = admission.decide(ask, seen(inventory=nodes, leases=[held(1, "bob")]))
    assert busy.status == 409
    assert busy.message.startswith("Your files are on the lab's machine gpu2, so your "
                                   "server runs there: ")
    waits = admission.decide(Ask("ann", options={"wait": True}, machine="n2",
                                 line_machine="gpu2", machine_name="gpu2"),
                             seen(inventory=nodes, leases=[held(1, "bob")], line=[]))
    assert waits.join == JoinLine(1, "", "", "gpu2")


def test_the_form_sees_the_holders_the_spawn_would_count():
    s = seen(leases=[held(0, "cat")], line=[waiting("bob")])
    holders = admission.holders(Ask("ann"), s, [uuid(0), uuid(1)])
    assert [le.user for le in holders[uuid(0)]] == ["cat"]
    assert [le.user for le in holders[uuid(1)]] == ["bob"]  # his turn: the line keeps it
    assert admission.holders(Ask("bob"), s, [uuid(1)]) == {uuid(1): []}
    s = seen(leases=[held(0, "cat")], line=[waiting("bob", gpus=2)])
    holders = admission.holders(Ask("ann"), s, [uuid(1)])
    assert [le.user for le in holders[uuid(1)]] == [HELD]  # kept for bob, who waits for 2


def test_a_preview_says_what_each_count_would_get_leasing_nothing():
    got = admission.preview(Ask("ann"), seen(leases=[held(0, "cat")]), [1, 2])
    assert [g.uuid for g in got[0]] == [uuid(1)]
    assert got[1].status == 409


def test_her_policy_is_worked_out_once_per_decision(monkeypatch):
    calls = []
    real = admission.policy_for

    def counted(config, user, groups=()):
        calls.append(user)
        return real(config, user, groups)

    monkeypatch.setattr(admission, "policy_for", counted)
    import gpulab.gpus.allocator as allocator
    monkeypatch.setattr(allocator, "policy_for", counted)
    admission.decide(Ask("ann"), seen(bookings=[booking("bob", 0)]))
    assert calls == ["ann"]


def test_a_shared_budget_counts_the_groups_use():
    usage = Usage(periods={"week": {"ann": 1.5, "bob": 0.6}}, groups=WEEK)
    ask = Ask("bob", groups=("lab",))
    state = admission.budget_of(ask, seen(config=BUDGETED, usage=usage),
                                policy_for(BUDGETED, "bob", ["lab"]))
    assert (state.used, state.refuses) == (pytest.approx(2.1), True)
    assert admission.budget_of(ask, seen(config=BUDGETED),
                               policy_for(BUDGETED, "bob", ["lab"])) is None  # unknown


def test_an_admitted_server_gets_the_cpus_and_memory_of_its_gpus():
    sized = parse_gpus_config("defaults: {gpus: 1, max_gpus: 2, cpus: 2, cpus_per_gpu: 4, "
                              "memory_per_gpu: 16g}\n")
    s = Seen(sized, TWO, (), NOW, base_cpus=8.0, base_memory=4 << 30)
    one = admission.decide(Ask("ann"), s).resources
    assert (one.cpus, one.memory, one.threads) == (6.0, 20 << 30, 6)
    none = admission.decide(Ask("ann", options={"gpus": 0}), s).resources
    assert (none.cpus, none.memory) == (2.0, 4 << 30)  # memory: the lab's spawn.mem_limit
    # an environment that sizes its own servers: its values, within her caps
    big = Environment("train", "gpulab/singleuser:latest",
                      resources=(("cpus_per_gpu", 8.0), ("memory", 1 << 30)))
    one = admission.decide(Ask("ann", environment=big), s).resources
    assert (one.cpus, one.memory) == (10.0, 17 << 30)
    small = Environment("notes", "gpulab/singleuser:cpu", gpus=False,
                        resources=(("cpus", 0.5), ("memory", 512 << 20)))
    none = admission.decide(Ask("ann", environment=small), s).resources
    assert (none.cpus, none.memory) == (0.5, 512 << 20)
    # and what she may ask for is the environment's: no more than its 0.5 CPUs
    refused = admission.decide(Ask("ann", options={"cpus": 1}, environment=small,
                                   from_form=False), s)
    assert isinstance(refused, Refused) and "at most 0.5" in refused.message, refused


SIZED = parse_gpus_config("defaults: {gpus: 0, max_gpus: 2, cpus: 2, memory: 4g, "
                          "cpus_per_gpu: 4, memory_per_gpu: 16g}\n")


@pytest.mark.parametrize("options,expected", [
    ({}, (2.0, 4 << 30)),  # all that no GPU brings
    ({"cpus": "", "memory": ""}, (2.0, 4 << 30)),  # the form's fields left empty
    ({"cpus": 1.5, "memory": "1g"}, (1.5, 1 << 30)),
    ({"cpus": "0.5", "memory": 536870912}, (0.5, 512 << 20)),  # the form's text; bytes
    ({"gpus": 1, "cpus": 6, "memory": "20g"}, (6.0, 20 << 30)),  # what one GPU brings
    ({"cpus": 3}, (400, '"cpus" must be a number above 0 and at most 2 (with 0 GPUs)')),
    ({"cpus": 0}, (400, '"cpus" must be a number above 0')),
    ({"cpus": -1}, (400, '"cpus" must be a number above 0')),
    ({"cpus": "two"}, (400, '"cpus" must be a number above 0')),
    ({"cpus": True}, (400, '"cpus" must be a number above 0')),
    ({"gpus": 1, "cpus": 7}, (400, "at most 6 (with 1 GPU)")),
    ({"memory": "8g"}, (400, '"memory" must be from 256m to 4g (with 0 GPUs), got 8g')),
    ({"memory": "1.5"}, (400, '"memory" must be from 256m')),  # 1.5 bytes: too little
    ({"memory": 1.5e9}, (400, '"memory" must be a size such as "4g"')),
    ({"memory": "lots"}, (400, '"memory" must be a size such as "4g"')),
    ({"memory": "100m"}, (400, '"memory" must be from 256m')),
])
def test_she_may_ask_for_fewer_cpus_or_less_memory_than_her_gpus_bring(options, expected):
    s = Seen(SIZED, TWO, (), NOW, base_cpus=8.0, base_memory=8 << 30)
    decision = admission.decide(Ask("ann", options=options, from_form=False), s)
    if isinstance(expected[0], float):
        assert isinstance(decision, Admitted), decision
        assert (decision.resources.cpus, decision.resources.memory) == expected
    else:
        assert isinstance(decision, Refused), decision
        assert decision.status == expected[0] and expected[1] in decision.message, decision
