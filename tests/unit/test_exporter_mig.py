"""Why a GPU's memory is not attributed to hub users, said instead of left quietly empty.

Under MIG, NVML reports no utilization for the whole GPU (NVML_ERROR_NOT_SUPPORTED) and
lists its processes only to root (NVML_ERROR_NO_PERMISSION), and the exporter runs as an
unprivileged user: ``gpulab_gpu_attribution_available`` is 0 with ``reason="mig"``, and
the exporter logs it once."""

import json
import logging

import pynvml
import pytest

from gpulab_exporter.attribution import Container, StaticContainerDirectory
from gpulab_exporter.fake_nvml import FakeGpu, FakeLibNvml, FakeNvml, fake_uuid
from gpulab_exporter.nvml import GpuProcess, Nvml
from gpulab_exporter.server import make_registry
from gpulab_exporter.snapshot import Poller

GiB = 1 << 30
ANN = "a" * 64
# The reason label's values (a fixed set: alerts and dashboards may match on them)
REASONS = ("mig", "no_permission", "not_supported", "driver_lacks_query", "error")


def gpu(i, reason=None):
    labels = {"gpu": str(i), "uuid": fake_uuid(i)}
    return labels if reason is None else {**labels, "reason": reason}


def test_a_mig_gpu_says_why_its_memory_is_not_attributed(tmp_path, caplog):
    (tmp_path / "101").mkdir()
    (tmp_path / "101" / "cgroup").write_text(f"0::/docker/{ANN}\n")
    nvml = FakeNvml([FakeGpu(0, mig=True, processes=[GpuProcess(101, GiB)]),
                     FakeGpu(1, processes=[GpuProcess(101, GiB)])])
    directory = StaticContainerDirectory([
        Container(ANN, "gpulab-ann", "ann", "", (fake_uuid(0), fake_uuid(1)))])
    poller = Poller(nvml, directory=directory, proc=str(tmp_path), process_interval=0)
    with caplog.at_level(logging.INFO):
        poller.poll()
        reg = make_registry(poller)
        poller.poll()  # another process cycle: nothing logged twice
    v = reg.get_sample_value
    assert v("gpulab_gpu_up", gpu(0)) == 1
    assert v("gpulab_gpu_attribution_available", gpu(0, "mig")) == 0
    assert v("gpulab_gpu_attribution_available", gpu(0, "")) is None
    assert v("gpulab_gpu_utilization_ratio", gpu(0)) is None  # not supported under MIG
    assert v("gpulab_gpu_lease_info", {**gpu(0), "user": "ann", "server": "", "kind": "server"}) == 1
    assert v("gpulab_gpu_user_memory_used_bytes", {**gpu(0), "user": "ann"}) is None
    # the GPU beside it is attributed as before
    assert v("gpulab_gpu_attribution_available", gpu(1, "")) == 1
    assert v("gpulab_gpu_user_memory_used_bytes", {**gpu(1), "user": "ann"}) == GiB

    g0 = json.loads(json.dumps(poller.latest.to_json()))["gpus"][0]  # /api/gpus
    assert (g0["processes"], g0["processes_unavailable"]) == (None, "mig")
    assert g0["processes_error"] == "NVMLError_NoPermission: Insufficient Permissions"

    said = [r for r in caplog.records if "cannot be listed" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "GPU 0" in said[0].getMessage() and "MIG" in said[0].getMessage()
    assert "root" in said[0].getMessage() and "NoPermission" in said[0].getMessage()


def test_mig_through_the_real_pynvml():
    """The same, with the real ``Nvml`` asking pynvml (nvmlDeviceGetMigMode included)."""
    with FakeLibNvml([FakeGpu(0, mig=True), FakeGpu(1)]).installed():
        poller = Poller(Nvml())
        try:
            reg = make_registry(poller)
            poller.poll()
        finally:
            poller.stop()
    assert reg.get_sample_value("gpulab_gpu_attribution_available", gpu(0, "mig")) == 0
    assert reg.get_sample_value("gpulab_gpu_attribution_available", gpu(1, "")) == 1
    assert reg.get_sample_value("gpulab_gpu_utilization_ratio", gpu(0)) is None
    assert reg.get_sample_value("gpulab_gpu_utilization_ratio", gpu(1)) == 0


@pytest.mark.parametrize(("error", "reason"), [
    (pynvml.NVMLError_NoPermission, "no_permission"),
    (pynvml.NVMLError_NotSupported, "not_supported"),
    (pynvml.NVMLError_FunctionNotFound, "driver_lacks_query"),
    (pynvml.NVMLError_Timeout, "error"),
    (OSError("not an NVML error"), "error"),
])
def test_each_reason_without_mig(error, reason):
    assert reason in REASONS
    reg = make_registry(poller := Poller(FakeNvml([FakeGpu(0, errors={"processes": error})])))
    poller.poll()
    assert reg.get_sample_value("gpulab_gpu_attribution_available", gpu(0, reason)) == 0
    assert reg.get_sample_value("gpulab_exporter_nvml_up") == 1


def test_a_gpu_that_is_down_has_no_attribution_series():
    nvml = FakeNvml([FakeGpu(0), FakeGpu(1)])
    reg = make_registry(poller := Poller(nvml))
    poller.poll()
    nvml.gpus[0].lost_after = 0
    poller.poll()
    assert reg.get_sample_value("gpulab_gpu_up", gpu(0)) == 0
    for reason in ("", *REASONS):
        assert reg.get_sample_value("gpulab_gpu_attribution_available", gpu(0, reason)) is None
    assert reg.get_sample_value("gpulab_gpu_attribution_available", gpu(1, "")) == 1


def test_the_reasons_are_the_exporters():
    from gpulab_exporter.snapshot import ATTRIBUTION_REASONS

    assert tuple(ATTRIBUTION_REASONS) == REASONS
