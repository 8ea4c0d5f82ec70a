"""MIG devices: a GPU in MIG mode is exported with each of its MIG devices,
each with its own UUID, model, memory and leases, labelled gpu="INDEX:SLOT" (as
NVIDIA_VISIBLE_DEVICES names them) and tied to its GPU by gpulab_gpu_mig_device_info.

The fake NVML answers as NVML does the exporter's non-root user under MIG: no utilization,
no process list (so attribution says reason="mig"), the sensors only on the whole GPU. The
same path runs through the real pynvml on :class:`FakeLibNvml`."""

import json

from gpulab_exporter.attribution import Container, StaticContainerDirectory
from gpulab_exporter.fake_nvml import FakeGpu, FakeLibNvml, FakeNvml, fake_uuid, mig_uuid, split_mig
from gpulab_exporter.nvml import Nvml
from gpulab_exporter.server import make_registry
from gpulab_exporter.snapshot import Poller

GiB = 1 << 30
ANN, BOB = "a" * 64, "b" * 64


def device(index, slot=None):
    if slot is None:
        return {"gpu": str(index), "uuid": fake_uuid(index)}
    return {"gpu": f"{index}:{slot}", "uuid": mig_uuid(index, slot)}


def mig_poller(tmp_path, control):
    """Two fake GPUs steered by *control*; ann holds MIG device 1:0, bob GPU 0."""
    path = tmp_path / "control.json"
    path.write_text(json.dumps(control))
    directory = StaticContainerDirectory([
        Container(ANN, "gpulab-ann", "ann", "", (mig_uuid(1, 0),)),
        Container(BOB, "gpulab-bob", "bob", "", (fake_uuid(0),))])
    nvml = FakeNvml.demo(2, control=str(path))
    return Poller(nvml, directory=directory, proc=str(tmp_path), process_interval=0), path


def test_a_mig_gpu_is_exported_with_each_mig_device_and_its_holder(tmp_path):
    poller, _ = mig_poller(tmp_path, {"mig": {"1": 3}, "processes": {"1:0": [[101, 2 * GiB]]}})
    reg = make_registry(poller)
    snap = poller.poll()
    assert [g.label for g in snap.gpus] == ["0", "1", "1:0", "1:1", "1:2"]
    v = reg.get_sample_value
    for slot in range(3):
        assert v("gpulab_gpu_mig_device_info", {**device(1, slot),
                                                "parent_uuid": fake_uuid(1)}) == 1
        assert v("gpulab_gpu_up", device(1, slot)) == 1
        assert v("gpulab_gpu_memory_total_bytes", device(1, slot)) == 47 * GiB
        assert v("gpulab_gpu_utilization_ratio", device(1, slot)) is None  # not under MIG
        assert v("gpulab_gpu_temperature_celsius", device(1, slot)) is None  # the GPU's
        assert v("gpulab_gpu_attribution_available", {**device(1, slot), "reason": "mig"}) == 0
    assert v("gpulab_gpu_info", {**device(1, 0), "model": "NVIDIA H200 MIG 2g.47gb (fake)"}) == 1
    # the whole GPUs: no mig_device_info; the MIG GPU's memory is its devices'
    assert v("gpulab_gpu_mig_device_info", {**device(1), "parent_uuid": ""}) is None
    assert v("gpulab_gpu_memory_used_bytes", device(1, 0)) == 2 * GiB
    assert v("gpulab_gpu_memory_used_bytes", device(1)) == 2 * GiB
    assert v("gpulab_gpu_temperature_celsius", device(1)) == 35
    # leases by UUID: ann's MIG device is hers, not the whole GPU's nor a sibling's
    assert v("gpulab_gpu_lease_info", {**device(1, 0), "user": "ann", "server": "", "kind": "server"}) == 1
    for other in (device(1), device(1, 1), device(0)):
        assert v("gpulab_gpu_lease_info", {**other, "user": "ann", "server": "", "kind": "server"}) is None
    assert v("gpulab_gpu_lease_info", {**device(0), "user": "bob", "server": "", "kind": "server"}) == 1
    assert v("gpulab_exporter_gpus") == 5

    row = json.loads(json.dumps(snap.to_json()))["gpus"][2]  # /api/gpus
    assert (row["index"], row["mig_device"], row["parent_uuid"]) == (1, 0, fake_uuid(1))
    assert row["processes_unavailable"] == "mig"
    assert [le["user"] for le in row["leases"]] == ["ann"]


def test_a_lost_mig_gpu_takes_its_mig_devices_and_their_leases_down_with_it(tmp_path):
    poller, path = mig_poller(tmp_path, {"mig": {"1": 2}})
    reg = make_registry(poller)
    poller.poll()
    path.write_text(json.dumps({"mig": {"1": 2}, "lost": [1]}))
    snap = poller.poll()
    assert [(g.label, g.up) for g in snap.gpus] == [("0", True), ("1", False), ("1:0", False),
                                                     ("1:1", False)]
    v = reg.get_sample_value
    assert v("gpulab_gpu_up", device(1, 0)) == 0
    assert v("gpulab_gpu_lease_info", {**device(1, 0), "user": "ann", "server": "", "kind": "server"}) == 1
    assert v("gpulab_gpu_mig_device_info", {**device(1, 1), "parent_uuid": fake_uuid(1)}) == 1
    path.write_text(json.dumps({"mig": {"1": 2}}))  # back on the bus
    assert [g.up for g in poller.poll().gpus] == [True] * 4


def test_mig_mode_turned_off_leaves_no_mig_devices(tmp_path):
    poller, path = mig_poller(tmp_path, {"mig": {"1": 2}})
    assert len(poller.poll().gpus) == 4
    path.write_text("{}")
    snap = poller.poll()
    assert [g.label for g in snap.gpus] == ["0", "1"]
    assert snap.gpus[1].utilization_ratio is not None  # a whole GPU again


def test_mig_devices_through_the_real_pynvml():
    """The real ``Nvml`` walks NVML's MIG slots (nvmlDeviceGetMaxMigDeviceCount, then
    nvmlDeviceGetMigDeviceHandleByIndex, empty slots answering NotFound)."""
    gpus = [FakeGpu(0), FakeGpu(1)]
    split_mig(gpus[1], 2)
    with FakeLibNvml(gpus).installed():
        poller = Poller(Nvml())
        try:
            reg = make_registry(poller)
            snap = poller.poll()
        finally:
            poller.stop()
    assert [(g.label, g.uuid) for g in snap.gpus] == [
        ("0", fake_uuid(0)), ("1", fake_uuid(1)), ("1:0", mig_uuid(1, 0)),
        ("1:1", mig_uuid(1, 1))]
    v = reg.get_sample_value
    assert v("gpulab_gpu_memory_total_bytes", device(1, 1)) == 70 * GiB + GiB // 2
    assert v("gpulab_gpu_attribution_available", {**device(1, 1), "reason": "mig"}) == 0
    assert v("gpulab_gpu_mig_device_info", {**device(1, 0), "parent_uuid": fake_uuid(1)}) == 1


def smi_list(*mig_slots):
    """`nvidia-smi -L` as a driver prints it, GPU 1 in MIG mode with these devices."""
    return (f"GPU 0: NVIDIA H200 (UUID: {fake_uuid(0)})\n"
            f"GPU 1: NVIDIA H200 (UUID: {fake_uuid(1)})\n"
            + "".join(f"  MIG 3g.71gb     Device  {s}: (UUID: {mig_uuid(1, s)})\n"
                      for s in mig_slots))


def test_the_host_check_compares_mig_devices_with_nvidia_smi_list():
    """scripts/gpu-host-check.sh's step 3 on a MIG host: whole GPUs against --query-gpu
    (which lists no MIG devices), MIG devices by UUID against nvidia-smi -L."""
    from gpulab_exporter.hostcheck import exporter_readings, mig_problems

    nvml = FakeNvml.demo(2)
    split_mig(nvml.gpus[1], 2)
    poller = Poller(nvml)
    snap = poller.poll()
    assert [r.uuid for r in exporter_readings(snap)] == [fake_uuid(0), fake_uuid(1)]
    seen, problems = mig_problems(snap, smi_list(0, 1))
    assert problems == [] and seen.startswith("MIG devices: 2 exported, 2 in nvidia-smi -L")
    assert f"1:1 {mig_uuid(1, 1)} of {fake_uuid(1)}, memory 72192 MiB" in seen
    _, problems = mig_problems(snap, smi_list(0, 1, 2))
    assert problems == [f"MIG device {mig_uuid(1, 2)} is in nvidia-smi -L but not exported"]
    _, problems = mig_problems(snap, smi_list(0))
    assert problems == [f"MIG device {mig_uuid(1, 1)} is exported but not in nvidia-smi -L"]
