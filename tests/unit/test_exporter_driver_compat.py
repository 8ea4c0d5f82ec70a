"""The exporter on drivers other than the one nvidia-ml-py was written for.

The real pynvml and the real ``Nvml`` run on :class:`FakeLibNvml`, a stand-in for
``libnvidia-ml.so`` that lacks the functions an older driver lacks. pynvml's unversioned
``nvmlDeviceGetComputeRunningProcesses`` calls ``_v3`` only and, where the driver lacks
it, raises ``NVMLLibraryMismatchError``, which is not an ``NVMLError``: before gpulab
handled it, that exception left every poll cycle, for good."""

import logging

import pynvml
import pytest

from gpulab_exporter.fake_nvml import FakeGpu, FakeLibNvml, FakeNvml, fake_uuid
from gpulab_exporter.nvml import GpuProcess, Nvml
from gpulab_exporter.server import make_registry
from gpulab_exporter.snapshot import Poller

MiB = 1 << 20
V3 = "nvmlDeviceGetComputeRunningProcesses_v3"  # libnvidia-ml's names
V2 = "nvmlDeviceGetComputeRunningProcesses_v2"
# Missing from the driver: as on one older than the nvidia-ml-py in use.
NO_V3 = {V3}
NO_QUERY = {V3, V2}


def gpu(i):
    return {"gpu": str(i), "uuid": fake_uuid(i)}


def test_pynvml_raises_a_mismatch_error_that_is_not_an_nvml_error():
    """What the fixes below are for, as nvidia-ml-py does it (checked on 13.615.71)."""
    assert not issubclass(pynvml.NVMLLibraryMismatchError, pynvml.NVMLError)
    with FakeLibNvml([FakeGpu(0)], missing=NO_V3).installed():
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            with pytest.raises(pynvml.NVMLLibraryMismatchError, match="_v2"):
                pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            with pytest.raises(pynvml.NVMLError_FunctionNotFound):
                pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)
        finally:
            pynvml.nvmlShutdown()


def test_a_driver_without_v3_is_asked_with_v2():
    lib = FakeLibNvml([FakeGpu(0, processes=[GpuProcess(101, 5 * MiB), GpuProcess(102, None)])],
                      missing=NO_V3)
    with lib.installed():
        poller = Poller(Nvml(), process_interval=0)
        try:
            first, second = poller.poll(), poller.poll()
        finally:
            poller.stop()
    assert first.nvml_up and second.nvml_up
    g = second.gpus[0]
    assert [(p.pid, p.used_memory_bytes) for p in g.processes] == [(101, 5 * MiB), (102, None)]
    assert g.processes_unavailable is None
    # v3 is tried once; from then on this driver is asked with v2 only
    assert lib.absent_asked.count(V3) == 1 and V3 not in lib.calls
    assert lib.calls.count(V2) == 4  # two polls, each asks for the size, then the list


def test_a_driver_with_no_process_query_keeps_polling_and_says_why(caplog):
    lib = FakeLibNvml([FakeGpu(0, memory_used=3 * MiB, processes=[GpuProcess(101, MiB)])],
                      missing=NO_QUERY, driver="470.00 (fake lib)")
    with lib.installed(), caplog.at_level(logging.INFO):
        poller = Poller(Nvml(), process_interval=0)
        try:
            poller.poll()
            reg = make_registry(poller)
            poller.poll()  # the next cycle: still up, logged no more
        finally:
            poller.stop()
    v = reg.get_sample_value
    assert v("gpulab_exporter_nvml_up") == 1
    assert v("gpulab_gpu_up", gpu(0)) == 1
    assert v("gpulab_gpu_memory_used_bytes", gpu(0)) == 3 * MiB  # the other fields stay
    assert v("gpulab_gpu_attribution_available", {**gpu(0), "reason": "driver_lacks_query"}) == 0
    assert v("gpulab_gpu_attribution_available", {**gpu(0), "reason": ""}) is None
    g = poller.latest.gpus[0]
    assert g.processes is None and g.processes_unavailable == "driver_lacks_query"
    assert V3 in g.processes_error and V2 in g.processes_error and "470.00" in g.processes_error
    said = [r.getMessage() for r in caplog.records if "cannot be listed" in r.getMessage()]
    assert len(said) == 1 and "driver_lacks_query" in said[0] and V2 in said[0], said


@pytest.mark.parametrize("error", [
    pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version "
                                    "does not match the NVML lib version"),
    RuntimeError("not an NVML error at all"),
    pynvml.NVMLError_Timeout(),
])
def test_any_error_on_one_field_drops_that_series_only(error, caplog):
    nvml = FakeNvml([FakeGpu(0, errors={"power": error}), FakeGpu(1)])
    poller = Poller(nvml)
    with caplog.at_level(logging.WARNING):
        poller.poll()
        reg = make_registry(poller)
        poller.poll()
    v = reg.get_sample_value
    assert v("gpulab_exporter_nvml_up") == 1
    assert v("gpulab_gpu_up", gpu(0)) == 1
    assert v("gpulab_gpu_power_watts", gpu(0)) is None
    assert v("gpulab_gpu_power_watts", gpu(1)) == 75
    assert v("gpulab_gpu_temperature_celsius", gpu(0)) == 35
    said = [r.getMessage() for r in caplog.records if "power_milliwatts" in r.getMessage()]
    assert len(said) == 1 and type(error).__name__ in said[0], said


def test_a_mismatch_on_the_process_query_is_a_reason_not_a_failed_poll():
    error = pynvml.NVMLLibraryMismatchError("use a versioned function such as ..._v2")
    nvml = FakeNvml([FakeGpu(0, errors={"processes": error})])
    reg = make_registry(poller := Poller(nvml))
    poller.poll()
    assert reg.get_sample_value("gpulab_exporter_nvml_up") == 1
    assert reg.get_sample_value("gpulab_gpu_attribution_available",
                                {**gpu(0), "reason": "driver_lacks_query"}) == 0
