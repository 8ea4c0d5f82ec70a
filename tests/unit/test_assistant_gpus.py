"""The lab assistant's GPUs (gpulab.yaml's assistant.gpus): held in the hub's lease table
for "(lab assistant)", never given to a member, shown as its on the spawn form and the
admins' lease page, and what `make up` hands its container."""

from __future__ import annotations

import pytest

from gpulab.assistant.gpus import (
    ASSISTANT,
    assistant_gpus,
    assistant_holds,
    assistant_leases,
    held_by_members,
)
from gpulab.assistant.serve import gpu_note, wanted
from gpulab.cli import main as gpulab_cli
from gpulab.dashboard.leases import lease_row
from gpulab.gpus.allocator import NotEnoughGpus, Request, leases_from_labels, resolve_inventory
from gpulab.gpus.leases import LeaseBook
from gpulab.settings import ConfigError, settings_from_yaml
from gpulab.spawn import admission
from gpulab.spawn.admission import Ask, Seen
from gpulab.spawn.form import gpu_rows
from gpulab.yamlfile import parse_yaml
from tests.unit.test_leases import (
    G0,
    G1,
    T0,
    TWO_GPUS,
    FakeDocker,
    acquire,
    container,
    no_nvml,
)

ON = "assistant:\n  model: m.gguf\n"


def settings(text):
    return settings_from_yaml(parse_yaml(text, "gpulab.yaml"))


def holding(*gpus, on=True):
    """Settings whose assistant holds *gpus*: gpulab.yaml refuses any for now (the
    assistant's llama.cpp build has no GPU backend), so they are set past the file, to
    keep what holds them tested for the day an engine with one comes."""
    return settings(ON if on else "").with_values({"assistant.gpus": tuple(gpus)})


def book(docker, s):
    return LeaseBook(docker.list, discover=no_nvml, now=lambda: T0,
                     for_services=lambda inventory: assistant_leases(assistant_gpus(s), inventory)[0])


def test_gpus_by_index_or_uuid_held_only_while_the_assistant_is_on():
    assert assistant_gpus(holding(1, G0)) == (1, G0)
    assert assistant_gpus(settings(ON)) == ()  # the CPU
    assert assistant_gpus(holding(1, on=False)) == ()  # off: holds none


@pytest.mark.parametrize("gpus, says", [
    ("[1]", "the lab assistant cannot use GPUs yet"), (f"[{G0}]", "set assistant.endpoint"),
    ("0", "no GPU backend"), ("[all]", "indexes (0, 1, ...) or UUIDs"), ("[-1]", "indexes"),
    ("[true]", "indexes"), ("[gpu-0:1]", "indexes"), ("[1, 1]", "listed twice"),
    ("{a: 1}", "indexes"),
])
def test_gpus_for_the_assistant_are_refused_with_file_and_line(gpus, says):
    with pytest.raises(ConfigError) as e:
        settings(ON + f"  gpus: {gpus}\n")
    assert "gpulab.yaml:3: assistant.gpus" in str(e.value) and says in str(e.value)
    assert settings(ON + "  gpus: []\n")["assistant.gpus"] == ()


def test_leases_of_the_named_gpus_and_a_warning_for_one_the_hub_cannot_lease():
    inventory, _ = resolve_inventory(TWO_GPUS, None)
    leases, warnings = assistant_leases((1, "GPU-not-here", 7), inventory)
    assert [(le.gpu_uuid, le.user, le.server) for le in leases] == [(G1, ASSISTANT, "assistant")]
    assert len(warnings) == 2 and "'GPU-not-here'" in warnings[0] and "7" in warnings[1]
    assert "not held for the lab assistant" in warnings[0]


async def test_the_allocator_never_gives_a_member_the_assistants_gpu():
    docker = FakeDocker()
    b = book(docker, holding(0))
    assert [g.uuid for g in await acquire(b, TWO_GPUS, Request("alice"))] == [G1]
    with pytest.raises(NotEnoughGpus) as e:
        await acquire(b, TWO_GPUS, Request("bob"))
    assert e.value.free == 0
    # two at once: only one GPU is not the assistant's
    with pytest.raises(NotEnoughGpus):
        await acquire(book(FakeDocker(), holding(0)), TWO_GPUS, Request("carol", count=2))


async def test_the_lease_table_shows_it_held_for_a_service_and_not_releasable():
    docker = FakeDocker([container("alice", [G1])])
    rows = await book(docker, holding(G0)).view(TWO_GPUS)
    assert [(r.lease.user, r.state) for r in rows] == [(ASSISTANT, "for a service"),
                                                      ("alice", "active")]
    row = lease_row(rows[0], T0)
    assert row["releasable"] is False and row["since"] is None and row["held_seconds"] is None
    assert lease_row(rows[1], T0)["releasable"] is True


async def test_the_spawn_form_says_whose_it_is_to_members_too():
    b = book(FakeDocker(), holding(1))
    inventory = b.inventory(TWO_GPUS)
    async with b.locked(inventory) as table:  # as GpulabSpawner._spawn_form reads it
        seen = Seen(TWO_GPUS, tuple(inventory), table.leases, T0.timestamp())
    holders = admission.holders(Ask("alice"), seen, [G0, G1])
    for is_admin in (False, True):
        assert [r.status for r in gpu_rows(inventory, holders, is_admin)] == [
            "free", "held for the lab assistant"]


def test_the_assistants_hold_is_none_while_gpulab_yaml_may_name_none(tmp_path, caplog):
    """An admin's edit naming GPUs for the assistant is refused (its file and line in the
    log), and the last good version, which names none, stays in force: members keep every
    GPU."""
    path = tmp_path / "gpulab.yaml"
    path.write_text(ON)
    held = assistant_holds(path)
    inventory, _ = resolve_inventory(TWO_GPUS, None)
    assert held(inventory) == []
    path.write_text(ON + "  gpus: [1]\n")
    assert held(inventory) == []
    said = [r.message for r in caplog.records if "assistant.gpus" in r.message]
    assert said and "gpulab.yaml:3: assistant.gpus: the lab assistant cannot use GPUs yet" \
        in said[0]
    path.write_text(ON)  # taken out again (and no error left for other tests)
    assert held(inventory) == []


def test_make_up_hands_the_container_no_gpu_and_stops_on_one_named(tmp_path, capsys):
    path = tmp_path / "gpulab.yaml"
    for text in (ON, ON + "  gpus: []\n", ""):
        path.write_text(text)
        assert gpulab_cli(["assistant", "gpus", str(path)]) == 0
        assert capsys.readouterr().out == "\n"
    path.write_text(ON + "  gpus: [1]\n")
    assert gpulab_cli(["assistant", "gpus", str(path)]) == 1
    assert "assistant.gpus: the lab assistant cannot use GPUs yet" in capsys.readouterr().err


def test_the_service_says_when_the_container_holds_other_gpus(tmp_path):
    assert gpu_note((1, G0), ("1", G0)) == ""
    note = gpu_note((2,), ("1",))
    assert "names 2, this container holds 1" in note and "make assistant" in note
    assert "holds none" in gpu_note((2,), ())
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    s = holding(1)
    assert wanted(s, tmp_path, ("1",))[0].on_gpus and not wanted(s, tmp_path)[0].on_gpus


def test_a_gpu_a_members_server_holds_is_named_with_her_lease():
    inventory, _ = resolve_inventory(TWO_GPUS, None)
    b = book(FakeDocker(), holding(0))
    leases = leases_from_labels([container("alice", [G0], server="train"),
                                 container("bob", [G1])])
    assert [(ref, le.user, le.server) for ref, le in held_by_members((0, G1), inventory, leases)
            ] == [(0, "alice", "train"), (G1, "bob", "")]
    assert held_by_members((0,), inventory, b.for_services(inventory)) == []  # its own: not a member
