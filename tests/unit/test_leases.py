"""LeaseBook: the hub's lease table over docker's container list.

The containers are plain dicts shaped like docker-py's ``APIClient.containers(all=True)``
output, served by a lister that yields to the event loop on every call (as the real
one does, through a thread), so concurrent acquires really interleave.
"""

import asyncio
from datetime import UTC, datetime

import pytest

from gpulab.contract import LABEL_GPUS, LABEL_MANAGED, LABEL_SERVER, LABEL_USER
from gpulab.gpus.allocator import NotEnoughGpus, Request, allocate
from gpulab.gpus.config import parse_gpus_config
from gpulab.gpus.leases import LeaseBook, lease_containers

T0 = datetime(2026, 1, 1, tzinfo=UTC)
G0 = "GPU-00000000-0000-0000-0000-000000000000"
G1 = "GPU-00000001-0000-0000-0000-000000000000"
G9 = "GPU-00000009-0000-0000-0000-000000000000"  # not in the inventory

TWO_GPUS = parse_gpus_config(f"""\
inventory:
  - {{index: 0, uuid: {G0}, model: A100}}
  - {{index: 1, uuid: {G1}, model: A100}}
defaults: {{gpus: 1, max_gpus: 2}}
""", "gpus.yaml")


def container(user, gpus, server="", state="running", created=1_767_225_600, cid=None):
    return {
        "Id": cid or f"id-{user}-{server}-{state}",
        "Names": [f"/jupyter-{user}"],
        "Labels": {LABEL_MANAGED: "true", LABEL_USER: user, LABEL_SERVER: server,
                   LABEL_GPUS: ",".join(gpus)},
        "State": state,
        "Created": created,
    }


class FakeDocker:
    """The containers a daemon would list; every call yields to the loop first."""

    def __init__(self, containers=()):
        self.containers = list(containers)
        self.calls = 0

    async def list(self):
        self.calls += 1
        await asyncio.sleep(0)
        return [dict(c) for c in self.containers]


def no_nvml():
    raise AssertionError("an explicit inventory must not ask NVML")


def book(docker):
    return LeaseBook(docker.list, discover=no_nvml, now=lambda: T0)


async def acquire(b: LeaseBook, config, request: Request) -> list:
    """A lease taken as the spawner takes one (GpulabSpawner._lease): the table read, the
    GPUs chosen and the lease recorded under the lock, nothing awaited in between."""
    inventory = await b.current_inventory(config)
    async with b.locked(inventory) as table:
        gpus = allocate(config, inventory, table.leases, request)
        table.record(request, gpus, table.leases)
    return gpus


async def test_twenty_concurrent_acquires_for_two_gpus_never_double_book():
    docker = FakeDocker()
    b = book(docker)
    results = await asyncio.gather(
        *(acquire(b, TWO_GPUS, Request(f"user{i}")) for i in range(20)),
        return_exceptions=True)
    won = [(i, r) for i, r in enumerate(results) if isinstance(r, list)]
    lost = [r for r in results if isinstance(r, NotEnoughGpus)]
    assert len(won) == 2 and len(lost) == 18
    assert sorted(g.uuid for _, r in won for g in r) == [G0, G1]  # one each, distinct
    assert all(r.status == 409 and r.free == 0 for r in lost)
    assert docker.calls == 20  # every acquire read the table, under the lock


async def test_pending_lease_counts_until_settled_then_the_labels_take_over():
    docker = FakeDocker()
    b = book(docker)
    [g] = await acquire(b, TWO_GPUS, Request("alice"))
    assert g.uuid == G0
    rows = await b.view(TWO_GPUS)
    assert [(r.lease.user, r.state, r.container_state) for r in rows] == \
        [("alice", "pending", None)]
    # a second spawn sees alice's pending lease and gets the other GPU
    [g2] = await acquire(b, TWO_GPUS, Request("bob"))
    assert g2.uuid == G1
    # alice's container now exists; settling drops the pending copy for the label one
    docker.containers.append(container("alice", [G0], created=1_767_225_700))
    b.settle("alice")
    rows = {r.lease.user: r for r in await b.view(TWO_GPUS)}
    assert rows["alice"].state == "active" and rows["alice"].container_state == "running"
    assert rows["alice"].lease.since == datetime.fromtimestamp(1_767_225_700, UTC)
    assert rows["bob"].state == "pending"


async def test_failed_spawn_settles_and_frees_the_gpu():
    b = book(FakeDocker())
    await acquire(b, TWO_GPUS, Request("alice"))
    await acquire(b, TWO_GPUS, Request("bob"))
    with pytest.raises(NotEnoughGpus):
        await acquire(b, TWO_GPUS, Request("carol"))
    b.settle("alice")  # alice's spawn failed: no container holds it
    [g] = await acquire(b, TWO_GPUS, Request("carol"))
    assert g.uuid == G0


async def test_restart_of_a_server_gets_its_own_gpu_back():
    docker = FakeDocker([container("alice", [G1])])
    b = book(docker)
    [g] = await acquire(b, TWO_GPUS, Request("alice"))
    assert g.uuid == G1  # from the labels, not the lowest free index


async def test_exited_containers_hold_nothing_and_states_are_reported():
    docker = FakeDocker([
        container("alice", [G0], state="created"),
        container("bob", [G1], state="exited"),
    ])
    b = book(docker)
    rows = await b.view(TWO_GPUS)
    assert [(r.lease.user, r.container_state, r.container_id) for r in rows] == \
        [("alice", "created", "id-alice--created")]
    [g] = await acquire(b, TWO_GPUS, Request("carol"))
    assert g.uuid == G1  # bob's exited container does not hold GPU 1


async def test_lease_on_a_gpu_gone_from_the_inventory_is_orphaned_and_kept():
    docker = FakeDocker([container("alice", [G9]), container("bob", [G0], server="gpu")])
    rows = await book(docker).view(TWO_GPUS)
    by_user = {r.lease.user: r for r in rows}
    assert by_user["alice"].state == "orphaned" and by_user["alice"].gpu is None
    assert by_user["bob"].state == "active" and by_user["bob"].gpu.index == 0
    assert [r.lease.user for r in rows] == ["bob", "alice"]  # known GPUs first, by index
    j = by_user["alice"].to_json()
    assert j["gpu_index"] is None and j["model"] is None and j["gpu_uuid"] == G9
    assert j["container_state"] == "running"


async def test_the_locked_table_lists_every_lease_of_every_container():
    docker = FakeDocker([container("alice", [G0, G1]), container("bob", [G1], "x")])
    async with book(docker).locked(()) as table:
        held = sorted((le.gpu_uuid, le.user, le.server) for le in table.leases)
    assert held == [(G0, "alice", ""), (G1, "alice", ""), (G1, "bob", "x")]


def test_lease_containers_maps_each_lease_to_the_first_holding_container():
    first = container("alice", [G0, G1], cid="first")
    second = container("alice", [G0], cid="second", state="paused")
    dead = container("bob", [G1], state="dead")
    held = lease_containers([first, second, dead])
    assert {k: v["Id"] for k, v in held.items()} == {
        (G0, "alice", ""): "first", (G1, "alice", ""): "first"}


async def test_a_removed_services_gpu_stays_busy_while_its_container_stops(monkeypatch):
    """On a Swarm the lease leaves with the service at once, its container later: the GPU
    cools for a while, busy for everyone (her own restart too), in nobody's quota."""
    import gpulab.gpus.leases as leases

    clock = [1000.0]
    monkeypatch.setattr(leases.time, "monotonic", lambda: clock[0])
    docker = FakeDocker([container("bob", [G1])])
    b = book(docker)
    b.cool([G0], 12)  # alice's service was just removed
    with pytest.raises(NotEnoughGpus):  # G0 cools, G1 is bob's
        await acquire(b, TWO_GPUS, Request("alice"))
    assert [(le.gpu_uuid, le.user) for le in await b._table()][-1] == (G0, leases.STOPPING)
    clock[0] += 13
    [g] = await acquire(b, TWO_GPUS, Request("alice"))
    assert g.uuid == G0
