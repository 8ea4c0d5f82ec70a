"""On a host with an NVIDIA driver: the real NVML through the exporter's own poller.
Skipped, with the reason, where NVML cannot initialise (no driver, as on the CI host)."""

import os
import threading
import time

import pynvml
import pytest

from gpulab_exporter.nvml import Nvml
from gpulab_exporter.server import make_registry
from gpulab_exporter.snapshot import Poller

pytestmark = pytest.mark.gpu_host


@pytest.fixture(scope="module")
def nvml():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        pytest.skip(f"no usable NVIDIA driver here, NVML init failed: {type(e).__name__}: {e}")
    try:
        count = pynvml.nvmlDeviceGetCount()
        total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        pytest.skip("NVML initialised but reports no GPUs")
    return total


def test_real_memory_total_is_reported(nvml):
    driver_total = nvml
    poller = Poller(Nvml(), interval=1, process_interval=1)
    try:
        snap = poller.poll()
        assert snap.nvml_up and not snap.fake and snap.driver_version
        reg = make_registry(poller)
        g0 = {"gpu": "0", "uuid": snap.gpus[0].uuid}
        assert snap.gpus[0].uuid.startswith(("GPU-", "MIG-"))
        assert reg.get_sample_value("gpulab_gpu_up", g0) == 1
        assert reg.get_sample_value("gpulab_gpu_memory_total_bytes", g0) == driver_total
        used = reg.get_sample_value("gpulab_gpu_memory_used_bytes", g0)
        free = reg.get_sample_value("gpulab_gpu_memory_free_bytes", g0)
        assert 0 <= used <= driver_total and 0 <= free <= driver_total
    finally:
        poller.stop()


def test_utilization_rises_under_matmul_load(nvml):
    torch = pytest.importorskip("torch", reason="torch not installed: cannot generate load")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    poller = Poller(Nvml(), interval=0.5, process_interval=0.5)
    try:
        time.sleep(2)  # let any earlier work settle
        idle = poller.poll().gpus[0].utilization_ratio
        stop = threading.Event()

        def load():
            a = torch.randn(8192, 8192, device="cuda:0")
            while not stop.is_set():
                for _ in range(20):
                    a = (a @ a).clamp_(-1, 1)
                torch.cuda.synchronize()

        worker = threading.Thread(target=load, daemon=True)
        worker.start()
        try:
            busy = 0.0
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and busy < 0.5:
                time.sleep(0.5)
                snap = poller.poll()
                busy = max(busy, snap.gpus[0].utilization_ratio or 0.0)
            procs = snap.gpus[0].processes or ()
        finally:
            stop.set()
            worker.join(30)
        assert busy >= 0.5 and busy > (idle or 0.0), f"idle {idle}, under load {busy}"
        # our own process shows up on GPU 0 (NVML PIDs are host PIDs: same namespace here)
        mine = [p for p in procs if p.pid == os.getpid()]
        assert not mine or mine[0].used_memory_bytes is None or mine[0].used_memory_bytes > 0
    finally:
        poller.stop()
