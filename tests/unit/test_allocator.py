"""GPU leases: allocation rules, quotas, pins, reloads, user input, restart from labels.

Inventories are built by hand (the allocator never sees NVML); configs are parsed
from text, so every scenario reads like the gpus.yaml an admin would write.
"""

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from gpulab.contract import LABEL_GPUS, LABEL_SERVER, LABEL_USER
from gpulab.gpus.allocator import (
    AllocationError,
    Gpu,
    InvalidRequest,
    Lease,
    NoGpuAccess,
    NotEnoughGpus,
    QuotaExceeded,
    Request,
    add_leases,
    allocate,
    leases_from_labels,
    reconcile,
    release,
    resolve_inventory,
    validate_user_options,
)
from gpulab.gpus.config import parse_gpus_config
from gpulab.gpus.policy import policy_for

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def uuid(i: int) -> str:
    return f"GPU-{i:08d}-0000-0000-0000-000000000000"


def gpu(i, pool="default", mode="exclusive", max_users=1, reserved=False, model="A100"):
    return Gpu(i, uuid(i), model, pool, mode, max_users, reserved)


def shared(i, max_users=2, pool="default"):
    return gpu(i, pool=pool, mode="shared", max_users=max_users, model="T4")


def lease(i, user, server=""):
    return Lease(uuid(i), user, server, T0)


BASE = """\
pools:
  big: {mode: exclusive}
  small: {mode: shared, max_users: 2}
defaults: {gpus: 1, max_gpus: 2}
groups:
  students: {pools: [small], max_gpus: 1}
  staff: {max_gpus: 4}
  visitors: {no_gpu: true}
users:
  alice: {pinned: [1]}
  rex: {pinned: [4]}
  carl: {pinned: [5], max_gpus: 1}
  nina: {no_gpu: true}
"""
CONFIG = parse_gpus_config(BASE, "gpus.yaml")

EXCL2 = [gpu(0), gpu(2)]
EXCL3 = [gpu(0), gpu(2), gpu(3)]
SHARED2 = [shared(0), shared(2)]  # GPU 1 is alice's pin
POOLS = [gpu(0, pool="big"), gpu(2, pool="big"), shared(3, pool="small")]
RESERVED = [gpu(0), gpu(2), gpu(4, reserved=True)]


@pytest.mark.parametrize(
    "inventory, leases, request_, expected",
    [
        # exclusive: lowest free index first
        (EXCL3, [], Request("bob", count=1), [0]),
        (EXCL3, [], Request("bob", count=2), [0, 2]),
        (EXCL3, [lease(0, "dan")], Request("bob", count=1), [2]),
        (EXCL3, [lease(0, "dan"), lease(2, "eve")], Request("bob", count=1), [3]),
        # default count (defaults.gpus: 1) when the user does not choose
        (EXCL3, [], Request("bob"), [0]),
        (EXCL3, [], Request("bob", count=0), []),
        # shared: least loaded, then lowest index
        (SHARED2, [], Request("bob", count=1), [0]),
        (SHARED2, [lease(0, "dan")], Request("bob", count=1), [2]),
        (SHARED2, [lease(0, "dan"), lease(2, "eve")], Request("bob", count=1), [0]),
        (SHARED2, [lease(0, "dan"), lease(0, "eve"), lease(2, "fay")], Request("bob"), [2]),
        # shared: prefer a GPU the user is not already on with another server
        (SHARED2, [lease(0, "bob", "a")], Request("bob", "b", count=1), [2]),
        # pools: students only draw from small, even when big GPUs are free
        (POOLS, [], Request("stu", groups=("students",), count=1), [3]),
        (POOLS, [], Request("bob", count=2), [0, 2]),
        (POOLS, [lease(0, "x"), lease(2, "y")], Request("bob", count=1), [3]),
        # pins first, and pinned GPUs are kept for who pins them
        (EXCL3 + [gpu(1)], [], Request("alice", count=1), [1]),
        (EXCL3 + [gpu(1)], [], Request("alice", count=2), [1, 0]),
        (sorted(EXCL3 + [gpu(1)], key=lambda g: g.index), [lease(0, "x")], Request("bob", count=2),
         [2, 3]),
        # a busy pin falls back to another GPU
        (EXCL3 + [gpu(1)], [lease(1, "alice", "other")], Request("alice", "nb", count=1), [0]),
        # a pin that matches no GPU on this host is ignored
        (EXCL3, [], Request("rex", count=1), [0]),
        # reserved: only for the users who pin it
        (RESERVED, [], Request("rex", count=1), [4]),
        (RESERVED, [lease(0, "x"), lease(2, "y")], Request("rex", "2", count=1), [4]),
        # staff quota is 4, more than the default 2
        (EXCL3, [], Request("sam", groups=("staff",), count=3), [0, 2, 3]),
        # no_gpu users still start CPU-only servers
        (EXCL3, [], Request("nina"), []),
        (EXCL3, [], Request("vic", groups=("visitors",), count=0), []),
        # idempotent restart: the server's own leases come back, even when lower GPUs are free
        (EXCL3, [lease(3, "bob", "train")], Request("bob", "train", count=1), [3]),
        (EXCL3, [lease(3, "bob", "train"), lease(2, "bob", "train")],
         Request("bob", "train", count=2), [3, 2]),
        # ... and another user's lease on a GPU of the same number does not count as own
        (EXCL3, [lease(3, "bob", "train")], Request("bob", "", count=1), [0]),
        # a lease on a GPU no longer in the inventory is never given back
        (EXCL3, [lease(9, "bob", "train")], Request("bob", "train", count=1), [0]),
    ],
)
def test_allocate_picks(inventory, leases, request_, expected):
    got = allocate(CONFIG, inventory, leases, request_)
    assert [g.index for g in got] == expected
    # and never past a GPU's capacity
    load = Counter(le.gpu_uuid for le in add_leases(leases, request_, got, T0))
    by_uuid = {g.uuid: g for g in inventory}
    assert all(load[u] <= by_uuid[u].capacity for u in load if u in by_uuid)


@pytest.mark.parametrize(
    "inventory, leases, request_, error, words",
    [
        # quotas (defaults.max_gpus 2, students 1, carl 1)
        (EXCL3, [], Request("bob", count=3), QuotaExceeded, "at most 2"),
        (EXCL3, [], Request("stu", groups=("students",), count=2), QuotaExceeded, "at most 1"),
        (EXCL3, [lease(0, "bob", "a"), lease(2, "bob", "a")], Request("bob", "b", count=1),
         QuotaExceeded, "already hold 2 on server(s) a"),
        (EXCL3, [lease(0, "bob")], Request("bob", "b", count=2), QuotaExceeded,
         "already hold 1 on server(s) default"),
        # the user's own entry wins over the group's quota
        (EXCL3, [], Request("carl", groups=("staff",), count=2), QuotaExceeded, "at most 1"),
        # no GPU access
        (EXCL3, [], Request("nina", count=1), NoGpuAccess, "no GPU access"),
        (EXCL3, [], Request("vic", groups=("visitors", "staff"), count=1), NoGpuAccess,
         "gpus.yaml"),
        # exhaustion
        (EXCL3, [lease(0, "x"), lease(2, "y"), lease(3, "z")], Request("bob", count=1),
         NotEnoughGpus, "only 0 of the 3 GPUs available to you are free"),
        (EXCL3, [lease(0, "x"), lease(2, "y")], Request("bob", count=2), NotEnoughGpus,
         "only 1 of the 3 GPUs available to you is free. Busy: GPU 0 (A100) 1/1 in use, "
         "GPU 2 (A100) 1/1 in use."),
        (SHARED2, [lease(0, "a"), lease(0, "b"), lease(2, "c"), lease(2, "d")],
         Request("bob", count=1), NotEnoughGpus, "GPU 2 (T4) 2/2 in use"),
        (EXCL2, [], Request("sam", groups=("staff",), count=3), NotEnoughGpus,
         "only 2 GPUs are available to you"),
        ([], [], Request("bob"), NotEnoughGpus, "no GPU is available to you on this host"),
        # pools: small is full for students even though big is free
        (POOLS, [lease(3, "a"), lease(3, "b")], Request("stu", groups=("students",), count=1),
         NotEnoughGpus, "GPU 3 (T4) 2/2 in use"),
        # a GPU pinned by alice is not given to bob even when it is free
        ([gpu(0), gpu(1)], [lease(0, "x")], Request("bob", count=1), NotEnoughGpus,
         "only 0 of the 1 GPUs"),
        # reserved GPUs are not for everyone
        (RESERVED, [lease(0, "x"), lease(2, "y")], Request("bob", count=1), NotEnoughGpus,
         "only 0 of the 2 GPUs"),
        # bad counts from code that bypassed validate_user_options
        (EXCL3, [], Request("bob", count=-1), InvalidRequest, "cannot be negative"),
        (EXCL3, [], Request("bob", count=True), InvalidRequest, "whole number"),
        (EXCL3, [], Request("bob", count=1.0), InvalidRequest, "whole number"),
        (EXCL3, [], Request("bob", count="1"), InvalidRequest, "whole number"),
    ],
)
def test_allocate_refuses(inventory, leases, request_, error, words):
    with pytest.raises(error) as e:
        allocate(CONFIG, inventory, leases, request_)
    assert words in str(e.value)
    assert isinstance(e.value, AllocationError)
    assert 400 <= e.value.status < 500


@pytest.mark.parametrize(
    "cls, status, reason",
    [
        (InvalidRequest, 400, "invalid_request"),
        (QuotaExceeded, 403, "quota_exceeded"),
        (NoGpuAccess, 403, "no_gpu_access"),
        (NotEnoughGpus, 409, "not_enough_gpus"),
    ],
)
def test_error_status_and_reason(cls, status, reason):
    assert (cls.status, cls.reason) == (status, reason)
    assert issubclass(cls, AllocationError)


def test_not_enough_gpus_keeps_holders_out_of_the_message():
    leases = [lease(0, "dan", "train"), lease(2, "eve"), lease(3, "bob", "other")]
    with pytest.raises(NotEnoughGpus) as e:
        allocate(CONFIG, EXCL3, leases, Request("bob", count=1))
    err = e.value
    assert (err.requested, err.free) == (1, 0)
    assert err.holders == {uuid(0): ("dan/train",), uuid(2): ("eve",), uuid(3): ("bob/other",)}
    for name in ("dan", "eve"):
        assert name not in err.message and name not in str(err)
        assert name in err.detailed_message
    assert "GPU 0 (A100): dan/train" in err.detailed_message
    assert [b.gpu.index for b in err.busy] == [0, 2, 3]


def test_release_and_add_leases():
    leases = [lease(0, "bob"), lease(2, "bob", "train"), lease(3, "amy")]
    assert release(leases, "bob", "train") == [lease(0, "bob"), lease(3, "amy")]
    assert release(leases, "bob") == [lease(2, "bob", "train"), lease(3, "amy")]
    assert release(leases, "nobody", "x") == leases  # releasing nothing is fine
    later = T0 + timedelta(hours=1)
    leases = release(leases, "bob")
    req = Request("bob", "train", count=2)
    got = allocate(CONFIG, EXCL3, leases, req)
    assert [g.index for g in got] == [2, 0]
    new = add_leases(leases, req, got, later)
    mine = [le for le in new if le.server == "train"]
    # the lease it already had keeps its start time; the new one starts now
    assert [(le.gpu_uuid, le.since) for le in mine] == [(uuid(2), T0), (uuid(0), later)]
    assert new[0] == lease(3, "amy") and len(new) == 3
    # asking for fewer GPUs on restart keeps the first of its own
    fewer = allocate(CONFIG, EXCL3, new, Request("bob", "train", count=1))
    assert [g.index for g in fewer] == [2]


def test_restart_is_idempotent_over_many_rounds():
    inv = EXCL3 + [gpu(4)]
    leases = [lease(0, "x")]
    req = Request("bob", "nb", count=2)
    first = allocate(CONFIG, inv, leases, req)
    leases = add_leases(leases, req, first, T0)
    for _ in range(5):
        again = allocate(CONFIG, inv, leases, req)
        assert again == first
        leases = add_leases(leases, req, again, T0)
    assert len(leases) == 3


PLAIN = parse_gpus_config("defaults: {gpus: 1, max_gpus: 2}\n")


@pytest.mark.parametrize("seed", range(5))
def test_fifty_users_never_double_book(seed):
    """50 users (some with two servers) spawn, stop and restart in random order, each
    allocation applied to the growing lease table: no GPU ever goes past its capacity,
    no user past their quota, and every refusal is a real shortage or quota."""
    rng = random.Random(seed)
    inventory = [gpu(i) for i in range(4)] + [shared(i, 3) for i in range(4, 8)]
    capacity = {g.uuid: g.capacity for g in inventory}
    leases: list[Lease] = []
    users = [f"user{n:02d}" for n in range(50)]
    granted = refused = quota = 0
    for step in range(400):
        user = rng.choice(users)
        server = rng.choice(["", "", "b"])
        if rng.random() < 0.3:
            leases = release(leases, user, server)
            continue
        req = Request(user, server, count=rng.choice([None, 0, 1, 1, 2]))
        wanted = 1 if req.count is None else req.count
        others = release(leases, user, server)
        try:
            got = allocate(PLAIN, inventory, leases, req)
        except NotEnoughGpus as e:
            refused += 1
            load = Counter(le.gpu_uuid for le in others)
            free_gpus = sum(load[u] < c for u, c in capacity.items())
            assert free_gpus < wanted and e.free == free_gpus
            continue
        except QuotaExceeded:
            quota += 1
            assert sum(le.user == user for le in others) + wanted > 2
            continue
        granted += 1
        assert len(got) == wanted and len({g.uuid for g in got}) == len(got)
        leases = add_leases(leases, req, got, T0 + timedelta(seconds=step))
        load = Counter(le.gpu_uuid for le in leases)
        assert all(load[u] <= capacity[u] for u in load), (step, load)
        assert max(Counter(le.user for le in leases).values()) <= 2
    assert granted > 50 and refused > 0 and quota > 0
    assert len(leases) <= sum(capacity.values())


def test_fifty_users_fill_every_slot_exactly_once():
    inventory = [gpu(i) for i in range(4)] + [shared(i, 3) for i in range(4, 8)]
    leases: list[Lease] = []
    outcomes = []
    for n in range(50):
        req = Request(f"user{n:02d}", count=1)
        try:
            got = allocate(PLAIN, inventory, leases, req)
        except NotEnoughGpus:
            outcomes.append(None)
            continue
        leases = add_leases(leases, req, got, T0)
        outcomes.append(got[0].index)
    # exclusive GPUs 0-3 first (load 0, lowest index), then the shared ones round-robin
    assert outcomes[:16] == [0, 1, 2, 3] + [4, 5, 6, 7] * 3
    assert outcomes[16:] == [None] * 34
    assert Counter(le.gpu_uuid for le in leases) == Counter(
        {uuid(i): 1 for i in range(4)} | {uuid(i): 3 for i in range(4, 8)}
    )


# ---------------------------------------------------------------- reloads


def test_reload_with_leases_outstanding_shared_to_exclusive():
    leases = [lease(0, "a"), lease(0, "b"), lease(1, "c")]
    after = [gpu(0), gpu(1), gpu(2)]  # GPU 0 was shared by 2, now exclusive
    kept, orphaned = reconcile(CONFIG, after, leases)
    assert kept == leases and orphaned == []
    # over capacity after the reload: no one else gets GPU 0 until both have left
    assert [g.index for g in allocate(CONFIG, after, leases, Request("d", count=1))] == [2]
    leases = release(leases, "a", "")
    with pytest.raises(NotEnoughGpus):
        allocate(CONFIG, after, leases + [lease(2, "e")], Request("d", count=1))
    leases = release(leases, "b", "")
    assert [g.index for g in allocate(CONFIG, after, leases, Request("d", count=1))] == [0]


@pytest.mark.parametrize(
    "inventory, leases, orphaned",
    [
        # GPU 2 removed from the config while bob holds it
        ([gpu(0), gpu(3)], [lease(0, "a"), lease(2, "bob", "nb")], [lease(2, "bob", "nb")]),
        # nothing removed
        ([gpu(0), gpu(2)], [lease(0, "a"), lease(2, "bob")], []),
        # GPU 4 became reserved: rex pins it (kept), bob does not (orphaned)
        ([gpu(4, reserved=True)], [lease(4, "rex"), lease(4, "bob")], [lease(4, "bob")]),
        # every GPU gone (e.g. the host lost its GPUs)
        ([], [lease(0, "a")], [lease(0, "a")]),
    ],
)
def test_reconcile(inventory, leases, orphaned):
    kept, orph = reconcile(CONFIG, inventory, leases)
    assert orph == orphaned
    assert kept == [le for le in leases if le not in orphaned]


def test_reserved_gpu_pinned_by_a_group_is_kept():
    c = parse_gpus_config("groups:\n  lab: {pinned: [4]}\n")
    kept, orphaned = reconcile(c, [gpu(4, reserved=True)], [lease(4, "anyone")])
    assert (kept, orphaned) == ([lease(4, "anyone")], [])
    assert allocate(c, [gpu(4, reserved=True)], [], Request("m", groups=["lab"], count=1))
    with pytest.raises(NotEnoughGpus):
        allocate(c, [gpu(4, reserved=True)], [], Request("m", count=1))


def test_removed_gpu_stays_taken_until_release_and_is_never_given_again():
    leases = [lease(2, "bob", "nb")]
    after = [gpu(0), gpu(3)]
    kept, orphaned = reconcile(CONFIG, after, leases)
    table = kept + orphaned
    # bob's quota still counts the orphaned lease
    with pytest.raises(QuotaExceeded, match="already hold 1"):
        allocate(CONFIG, after, table, Request("bob", "other", count=2))
    # bob's restart gets a GPU that is still in the config
    got = allocate(CONFIG, after, table, Request("bob", "nb", count=1))
    assert [g.index for g in got] == [0]
    table = add_leases(table, Request("bob", "nb"), got, T0)
    assert uuid(2) not in {le.gpu_uuid for le in table}


# ---------------------------------------------------------------- inventory


def test_resolve_inventory_auto():
    c = parse_gpus_config("pools:\n  default: {mode: shared, max_users: 3}\n"
                          "users:\n  bob: {pinned: [7]}\n", "gpus.yaml")
    gpus, warnings = resolve_inventory(c, [(1, uuid(1), "T4"), (0, uuid(0), "A100")])
    assert gpus == [Gpu(0, uuid(0), "A100", "default", "shared", 3),
                    Gpu(1, uuid(1), "T4", "default", "shared", 3)]
    assert warnings == ["gpus.yaml:4: pinned GPU index 7 is not available on this host; "
                        "users pinned to it get other GPUs"]
    assert resolve_inventory(c, None) == ([], warnings)  # no GPUs: no error
    # what nvml_discovery.discover_gpus() returns works the same
    from gpulab.gpus.discovery import DiscoveredGpu

    assert resolve_inventory(c, [DiscoveredGpu(1, uuid(1), "T4"),
                                 DiscoveredGpu(0, uuid(0), "A100")]) == (gpus, warnings)


def test_resolve_inventory_explicit():
    c = parse_gpus_config(
        f"""\
pools:
  small: {{mode: shared, max_users: 4}}
inventory:
  - {{index: 0, uuid: {uuid(0)}, pool: small, max_users: 2}}
  - {{index: 1, uuid: {uuid(1)}, model: A100, reserved: true}}
  - {{index: 2, uuid: {uuid(2)}, model: A100, pool: small, mode: exclusive}}
""",
        "gpus.yaml",
    )
    # trusted as written when nothing is discovered
    gpus, warnings = resolve_inventory(c)
    assert gpus == [
        Gpu(0, uuid(0), "", "small", "shared", 2),
        Gpu(1, uuid(1), "A100", "default", "exclusive", 1, reserved=True),
        Gpu(2, uuid(2), "A100", "small", "exclusive", 1),
    ]
    assert warnings == []
    # against what NVML sees: missing ones left out, unlisted ones ignored, models filled in
    gpus, warnings = resolve_inventory(c, [(0, uuid(0), "T4"), (2, uuid(2), "A100"),
                                           (5, uuid(5), "H100")])
    assert [(g.index, g.model) for g in gpus] == [(0, "T4"), (2, "A100")]
    assert warnings == [
        f"gpus.yaml:5: GPU 1 ({uuid(1)}) is listed but not present on this host; "
        f"it will not be given out",
        f"gpus.yaml: GPU 5 (H100, {uuid(5)}) is present but not listed under inventory; "
        f"it will not be given out",
    ]
    _, warnings = resolve_inventory(c, [(3, uuid(0), "T4"), (1, uuid(1), ""), (2, uuid(2), "")])
    assert warnings == [f"gpus.yaml:4: GPU {uuid(0)} is listed with index 0 but NVML reports "
                        f"index 3; check inventory"]


# ---------------------------------------------------------------- user_options


@pytest.mark.parametrize(
    "raw, max_gpus, expected",
    [
        (None, 2, None),
        ({}, 2, None),
        ({"gpus": None}, 2, None),
        ({"gpus": 0}, 2, 0),
        ({"gpus": 2}, 2, 2),
        ({"gpus": "1"}, 2, 1),  # from an HTML form
        ({"gpus": " 2 "}, 2, 2),
        ({"gpus": "0"}, 0, 0),
    ],
)
def test_user_options_accepted(raw, max_gpus, expected):
    assert validate_user_options(raw, max_gpus) == expected


@pytest.mark.parametrize(
    "raw, error, words",
    [
        ({"gpus": "all"}, InvalidRequest, "whole number from 0 to 2, got 'all'"),
        ({"gpus": -1}, InvalidRequest, "got -1"),
        ({"gpus": "-1"}, InvalidRequest, "got '-1'"),
        ({"gpus": 10**20}, InvalidRequest, "whole number from 0 to 2"),
        ({"gpus": "99999999999999"}, InvalidRequest, "whole number"),
        ({"gpus": 65}, InvalidRequest, "whole number from 0 to 2"),
        ({"gpus": True}, InvalidRequest, "got True"),
        ({"gpus": False}, InvalidRequest, "got False"),
        ({"gpus": 1.0}, InvalidRequest, "got 1.0"),
        ({"gpus": 1.5}, InvalidRequest, "got 1.5"),
        ({"gpus": "1.0"}, InvalidRequest, "got '1.0'"),
        ({"gpus": "1e1"}, InvalidRequest, "got '1e1'"),
        ({"gpus": "0x1"}, InvalidRequest, "got '0x1'"),
        ({"gpus": "+1"}, InvalidRequest, "got '+1'"),
        ({"gpus": "١"}, InvalidRequest, "whole number"),  # Arabic-Indic one: int() takes it
        ({"gpus": ""}, InvalidRequest, "got ''"),
        ({"gpus": [1]}, InvalidRequest, "got [1]"),
        ({"gpus": ["1"]}, InvalidRequest, "got ['1']"),
        ({"gpus": {"n": 1}}, InvalidRequest, "whole number"),
        ({"device_ids": ["0"]}, InvalidRequest, "Unknown server option(s): device_ids"),
        ({"gpus": 1, "device_ids": "all"}, InvalidRequest, "device_ids"),
        ({"gpus": 1, "image": "evil", "runtime": "x"}, InvalidRequest, "image, runtime"),
        ({"GPUS": 1}, InvalidRequest, "Unknown server option(s): GPUS"),
        ([1], InvalidRequest, "must be an object"),
        ("gpus=1", InvalidRequest, "must be an object"),
        ({"gpus": 3}, QuotaExceeded, "at most 2"),
        ({"gpus": "3"}, QuotaExceeded, "at most 2"),
    ],
)
def test_user_options_refused(raw, error, words):
    with pytest.raises(error) as e:
        validate_user_options(raw, 2)
    assert words in str(e.value), str(e.value)
    assert e.value.status in (400, 403)


def test_user_options_over_quota_for_no_gpu_user():
    with pytest.raises(QuotaExceeded, match="at most 0"):
        validate_user_options({"gpus": 1}, 0)


# ---------------------------------------------------------------- restart from labels


def container(user, gpus, server="", created=1_700_000_000, state="running", **extra):
    labels = {LABEL_USER: user, LABEL_SERVER: server, LABEL_GPUS: gpus, **extra}
    return {"Labels": labels, "Created": created, "State": state}


SINCE = datetime.fromtimestamp(1_700_000_000, tz=UTC)


@pytest.mark.parametrize(
    "containers, expected",
    [
        ([], []),
        ([container("bob", uuid(0))], [Lease(uuid(0), "bob", "", SINCE)]),
        ([container("bob", f"{uuid(2)},{uuid(0)}", "train")],
         [Lease(uuid(2), "bob", "train", SINCE), Lease(uuid(0), "bob", "train", SINCE)]),
        # no GPUs, exited, or not ours: no lease
        ([container("bob", "")], []),
        ([container("bob", uuid(0), state="exited")], []),
        ([container("bob", uuid(0), state="dead")], []),
        ([{"Labels": {"other": "x"}, "Created": 1, "State": "running"}], []),
        ([{"Labels": None, "Created": 1}], []),
        # starting containers already hold their GPUs; State missing means running
        ([container("bob", uuid(0), state="created")], [Lease(uuid(0), "bob", "", SINCE)]),
        ([{"Labels": {LABEL_USER: "amy", LABEL_GPUS: uuid(1)}, "Created": 1_700_000_000}],
         [Lease(uuid(1), "amy", "", SINCE)]),
        # sorted by start time; duplicates collapse
        ([container("b", uuid(1), created=1_700_000_100), container("a", uuid(0)),
          container("a", uuid(0))],
         [Lease(uuid(0), "a", "", SINCE),
          Lease(uuid(1), "b", "", SINCE + timedelta(seconds=100))]),
        # spaces and empty items in the label are tolerated
        ([container("bob", f" {uuid(0)} ,,")], [Lease(uuid(0), "bob", "", SINCE)]),
    ],
)
def test_leases_from_labels(containers, expected):
    assert leases_from_labels(containers) == expected


def test_leases_from_labels_round_trip_with_container_options():
    from gpulab.settings import defaults
    from gpulab.spawn.containers import container_options

    opts = container_options(defaults(), "bob", "train", [uuid(3), uuid(1)])
    rebuilt = leases_from_labels([{"Labels": opts.labels, "Created": 1_700_000_000,
                                   "State": "running"}])
    assert rebuilt == [Lease(uuid(3), "bob", "train", SINCE), Lease(uuid(1), "bob", "train", SINCE)]
    # and the rebuilt table makes the restart idempotent
    inv = [gpu(0), gpu(1), gpu(2), gpu(3)]
    got = allocate(PLAIN, inv, rebuilt, Request("bob", "train", count=2))
    assert [g.index for g in got] == [3, 1]
    # with CONFIG, GPU 1 is alice's pin: bob's restart keeps GPU 3 and moves off GPU 1
    got = allocate(CONFIG, inv, rebuilt, Request("bob", "train", count=2))
    assert [g.index for g in got] == [3, 0]


# ---------------------------------------------------------------- several machines

AUTO = "inventory: auto\ndefaults: {gpus: 1, max_gpus: 4}\n"


def on(node: str, i: int, n: int = 0) -> Gpu:
    """GPU *i* of machine *node* (its UUID unique across machines: *n*)."""
    return Gpu(i, uuid(n), "A100", node=node)


def cluster(**sizes: int) -> list[Gpu]:
    out, n = [], 0
    for node, size in sizes.items():
        for i in range(size):
            out.append(on(node, i, n))
            n += 1
    return out


def test_a_servers_gpus_are_all_on_one_machine():
    cfg = parse_gpus_config(AUTO)
    inv = cluster(node1=1, node2=2)  # node1 first, but only node2 has two
    got = allocate(cfg, inv, [], Request("alice", count=2))
    assert {g.node for g in got} == {"node2"} and len(got) == 2


def test_members_spread_over_machines_and_never_share_a_gpu():
    cfg = parse_gpus_config(AUTO)
    inv = cluster(node1=2, node2=2, node3=1)
    leases, placed = [], []
    for who in ["a", "b", "c", "d", "e"]:
        [g] = allocate(cfg, inv, leases, Request(who))
        leases = add_leases(leases, Request(who), [g], T0)
        placed.append((g.node, g.index))
    assert placed == [("node1", 0), ("node2", 0), ("node3", 0), ("node1", 1), ("node2", 1)]
    assert len({le.gpu_uuid for le in leases}) == 5
    with pytest.raises(NotEnoughGpus) as e:  # one more than the cluster holds
        allocate(cfg, inv, leases, Request("f"))
    assert e.value.status == 409 and "only 0 of the 5 GPUs" in str(e.value)


def test_a_restart_stays_on_its_machine():
    cfg = parse_gpus_config(AUTO)
    inv = cluster(node1=2, node2=2)
    leases = [Lease(inv[2].uuid, "alice", "", T0)]  # alice holds GPU 0 of node2
    got = allocate(cfg, inv, leases, Request("alice", count=2))
    assert [(g.node, g.index) for g in got] == [("node2", 0), ("node2", 1)]


def test_a_server_whose_home_is_on_a_machine_gets_gpus_there_or_none():
    cfg = parse_gpus_config(AUTO)
    inv = cluster(node1=2, node2=2)
    [g] = allocate(cfg, inv, [], Request("alice", machine="node2"))
    assert (g.node, g.index) == ("node2", 0)  # node1 comes first otherwise
    busy = [Lease(inv[2].uuid, "x", "", T0), Lease(inv[3].uuid, "y", "", T0)]
    with pytest.raises(NotEnoughGpus) as e:  # node1 is free, but her home is on node2
        allocate(cfg, inv, busy, Request("alice", machine="node2"))
    assert "only 0 of the 2 GPUs" in str(e.value)


def test_a_pin_by_index_means_nothing_across_machines():
    # Every machine has a GPU 0: withholding all of them from everyone else would leave
    # GPUs idle while members get 409s. Only a UUID pins a GPU there.
    cfg = parse_gpus_config(AUTO + "users:\n  alice: {pinned: [0]}\n")
    inv = cluster(node1=2, node2=2)
    leases = [Lease(inv[1].uuid, "x", "", T0), Lease(inv[3].uuid, "y", "", T0)]
    [g] = allocate(cfg, inv, leases, Request("dave"))  # GPU 0s are not withheld
    assert g.index == 0
    gpus, warnings = resolve_inventory(cfg, inv)
    assert any("on several machines a pin names a GPU by UUID" in w for w in warnings)
    by_uuid = parse_gpus_config(AUTO + f"users:\n  alice: {{pinned: [{inv[3].uuid}]}}\n")
    [g] = allocate(by_uuid, inv, [], Request("alice"))
    assert g.uuid == inv[3].uuid


def test_enough_free_gpus_split_over_machines_are_refused_and_say_so():
    cfg = parse_gpus_config(AUTO)
    inv = cluster(node1=2, node2=2)
    leases = [Lease(inv[0].uuid, "x", "", T0), Lease(inv[2].uuid, "y", "", T0)]
    with pytest.raises(NotEnoughGpus) as e:
        allocate(cfg, inv, leases, Request("alice", count=2))
    assert e.value.free == 1
    assert "2 of the GPUs available to you are free, but at most 1 on any one machine" \
        in str(e.value)
    assert allocate(cfg, inv, leases, Request("alice", count=1))  # one still fits


def test_a_busy_gpu_names_its_machine():
    cfg = parse_gpus_config(AUTO)
    inv = cluster(node1=1, node2=1)
    leases = [Lease(inv[0].uuid, "x", "", T0), Lease(inv[1].uuid, "y", "", T0)]
    with pytest.raises(NotEnoughGpus) as e:
        allocate(cfg, inv, leases, Request("alice"))
    assert "GPU 0 of node1 (A100) 1/1 in use" in str(e.value)
    assert "GPU 0 of node2 (A100) 1/1 in use" in str(e.value)


def test_random_spawns_and_stops_on_several_machines_never_double_book():
    cfg = parse_gpus_config(AUTO)
    inv = cluster(node1=3, node2=2, node3=4)
    rng = random.Random(13)
    leases: list[Lease] = []
    for step in range(400):
        who = f"u{rng.randrange(12)}"
        if rng.random() < 0.4:
            leases = release(leases, who)
            continue
        try:
            got = allocate(cfg, inv, leases, Request(who, count=rng.randrange(0, 4)))
        except AllocationError:
            continue
        assert len({g.node for g in got}) <= 1, step
        leases = add_leases(leases, Request(who), got, T0)
        assert max(Counter(le.gpu_uuid for le in leases).values(), default=0) <= 1, step


def named(**sizes: int) -> list[Gpu]:
    """Like :func:`cluster`, the machines named as the Swarm names them (hostnames)."""
    return [Gpu(g.index, g.uuid, g.model, node=f"id-{g.node}", machine=g.node)
            for g in cluster(**sizes)]


MACHINE_POOLS = """\
inventory: auto
pools:
  a100: {machines: [gpu-2], description: "the big ones"}
  small: {mode: shared, max_users: 2, machines: [gpu-3]}
defaults: {gpus: 1, max_gpus: 4, pools: [default]}
users:
  alice: {pools: [a100]}
  bob: {pinned: ["gpu-3:1"]}
  carol: {pools: [small]}
"""


def test_a_pool_names_machines_and_a_pin_names_one_machines_gpu():
    cfg = parse_gpus_config(MACHINE_POOLS)
    gpus, warnings = resolve_inventory(cfg, named(**{"gpu-1": 1, "gpu-2": 2, "gpu-3": 2}))
    assert warnings == []
    assert [(g.machine, g.index, g.pool, g.mode, g.max_users) for g in gpus] == [
        ("gpu-1", 0, "default", "exclusive", 1),
        ("gpu-2", 0, "a100", "exclusive", 1), ("gpu-2", 1, "a100", "exclusive", 1),
        ("gpu-3", 0, "small", "shared", 2), ("gpu-3", 1, "small", "shared", 2)]
    [g] = allocate(cfg, gpus, [], Request("alice"))  # her pool is gpu-2's
    assert (g.machine, g.index) == ("gpu-2", 0)
    [g] = allocate(cfg, gpus, [], Request("dave"))  # the defaults' pool: gpu-1's
    assert (g.machine, g.index) == ("gpu-1", 0)
    [g] = allocate(cfg, gpus, [], Request("bob"))  # his pin, on its machine
    assert (g.machine, g.index) == ("gpu-3", 1)
    [g] = allocate(cfg, gpus, [], Request("carol"))  # her pool: gpu-3's, but not bob's pin
    assert (g.machine, g.index) == ("gpu-3", 0)
    leases = [Lease(gpus[3].uuid, "x", "", T0), Lease(gpus[3].uuid, "y", "", T0)]
    with pytest.raises(NotEnoughGpus):  # gpu-3:0 is full; gpu-3:1 is kept for bob
        allocate(cfg, gpus, leases, Request("carol"))


def test_pins_of_one_index_on_several_machines_from_several_groups_all_count():
    cfg = parse_gpus_config('groups:\n  lab: {pinned: ["gpu-1:0", "gpu-2:0"]}\n'
                            '  other: {pinned: ["gpu-3:0"]}\n')
    policy = policy_for(cfg, "alice", ["lab", "other"])
    assert [str(p) for p in policy.pinned] == ["gpu-1:0", "gpu-2:0", "gpu-3:0"]
    assert policy.max_gpus == 3  # the default 1, raised to the pins


def test_a_pool_or_pin_naming_a_machine_that_lists_no_gpus_is_said():
    cfg = parse_gpus_config(MACHINE_POOLS.replace("machines: [gpu-2]", "machines: [gpu-9]"))
    _, warnings = resolve_inventory(cfg, named(**{"gpu-1": 1, "gpu-3": 2}))
    assert warnings == ["gpus.yaml: pools.a100.machines: no machine gpu-9 lists GPUs "
                        "(machines with GPUs: gpu-1, gpu-3)"]
    _, warnings = resolve_inventory(cfg, [Gpu(0, uuid(0), "A100")])  # one host
    assert any("pools.small.machines: no machine gpu-3 lists GPUs (this hub is not on a "
               "Swarm" in w for w in warnings), warnings
    assert any("pinned GPU gpu-3:1 is not available" in w for w in warnings), warnings
