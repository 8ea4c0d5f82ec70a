"""MIG devices in the hub: discovered in place of their GPU, listed under its
index in an explicit inventory, and leased one member each like whole GPUs.

Discovery runs the hub's real code on the real pynvml over :class:`FakeLibNvml` (a stand-in
for libnvidia-ml, named as one): GPU 1 in MIG mode with three MIG devices."""

from datetime import UTC, datetime

import pytest

from gpulab.gpus.allocator import NotEnoughGpus, Request, add_leases, allocate, resolve_inventory
from gpulab.gpus.config import parse_gpus_config
from gpulab.gpus.discovery import DiscoveredGpu, discover_gpus
from gpulab.yamlfile import ConfigError
from gpulab_exporter.fake_nvml import FakeGpu, FakeLibNvml, fake_uuid, mig_uuid, split_mig

NOW = datetime(2026, 12, 4, tzinfo=UTC)
MIG_MODEL = "NVIDIA H200 MIG 2g.47gb (fake)"


def discovered() -> list[DiscoveredGpu]:
    gpus = [FakeGpu(0), FakeGpu(1)]
    split_mig(gpus[1], 3)
    with FakeLibNvml(gpus).installed():
        return discover_gpus()


def test_a_gpu_in_mig_mode_is_discovered_as_its_mig_devices():
    assert discovered() == [
        DiscoveredGpu(0, fake_uuid(0), "NVIDIA H200 (fake)"),
        *(DiscoveredGpu(1, mig_uuid(1, slot), MIG_MODEL, fake_uuid(1)) for slot in range(3))]


def test_mig_devices_are_leased_one_member_each_like_whole_gpus():
    config = parse_gpus_config("defaults: {gpus: 1, max_gpus: 2}\n", "gpus.yaml")
    inventory, warnings = resolve_inventory(config, discovered())
    assert warnings == []
    assert [(g.index, g.uuid) for g in inventory] == [
        (0, fake_uuid(0)), *((1, mig_uuid(1, slot)) for slot in range(3))]
    leases, given = [], {}
    for member in ("ann", "bob", "cat", "dan"):
        given[member] = allocate(config, inventory, leases, Request(member))
        leases = add_leases(leases, Request(member), given[member], NOW)
    assert sorted(g.uuid for gpus in given.values() for g in gpus) == sorted(
        g.uuid for g in inventory)  # four devices, four members, none twice
    with pytest.raises(NotEnoughGpus):
        allocate(config, inventory, leases, Request("eve"))
    mig = next(g for gpus in given.values() for g in gpus if g.uuid == mig_uuid(1, 2))
    assert mig.label() == f"GPU 1 ({MIG_MODEL})"


def test_an_explicit_inventory_lists_mig_devices_under_their_gpus_index():
    text = (f"inventory:\n  - {{index: 0, uuid: {fake_uuid(0)}}}\n"
            f"  - {{index: 1, uuid: {mig_uuid(1, 0)}, model: H200 MIG 3g.71gb}}\n"
            f"  - {{index: 1, uuid: {mig_uuid(1, 1)}, model: H200 MIG 3g.71gb}}\n")
    inventory, warnings = resolve_inventory(parse_gpus_config(text, "gpus.yaml"),
                                            [(0, fake_uuid(0), "H200"),
                                             (1, mig_uuid(1, 0), "H200 MIG 3g.71gb"),
                                             (1, mig_uuid(1, 1), "H200 MIG 3g.71gb")])
    assert [g.uuid for g in inventory] == [fake_uuid(0), mig_uuid(1, 0), mig_uuid(1, 1)]
    assert warnings == []


@pytest.mark.parametrize("second", [fake_uuid(1), mig_uuid(1, 0)])
def test_a_whole_gpu_and_a_mig_device_under_one_index_is_a_clear_error(second):
    first = mig_uuid(1, 1) if second == fake_uuid(1) else fake_uuid(1)
    text = (f"inventory:\n  - {{index: 1, uuid: {first}}}\n"
            f"  - {{index: 1, uuid: {second}}}\n")
    with pytest.raises(ConfigError) as e:
        parse_gpus_config(text, "gpus.yaml")
    assert str(e.value).startswith("gpus.yaml:3: inventory[1].index")
    assert "as a whole GPU and as a MIG device (first on line 2)" in str(e.value)
