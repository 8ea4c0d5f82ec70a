"""On a host with an NVIDIA GPU: the real NVML through the exporter's own poller.

The one reason to skip is that there is no GPU here (as on the CI host): the skip reason
starts with "[real GPU] ", the only skip CI accepts. On a host that has a GPU (NVML
answers, or the driver's /proc entries or device nodes exist) anything missing, NVML,
torch or CUDA in torch, FAILS: a GPU host where this cannot run is a broken GPU host.

Imports nothing of the hub (no JupyterHub on a lent GPU machine): scripts/gpu-host-check.sh
runs this file with ``--noconftest``, so tests/unit/conftest.py (JupyterHub's ORM) is not
loaded either."""

import glob
import os
import threading
import time

import pynvml
import pytest

from gpulab_exporter.nvml import Nvml
from gpulab_exporter.server import make_registry
from gpulab_exporter.snapshot import Poller
from tests.conftest import REAL_GPU


def gpu_traces() -> list[str]:
    """Signs of an NVIDIA GPU that do not need NVML: the driver's /proc entries, the
    device nodes, and GPULAB_GPU_HOST=1 (scripts/gpu-host-check.sh sets it once
    nvidia-smi has answered). None on a host without a GPU."""
    traces = sorted(glob.glob("/proc/driver/nvidia/gpus/*") + glob.glob("/dev/nvidia[0-9]*"))
    if os.environ.get("GPULAB_GPU_HOST") == "1":
        traces.insert(0, "GPULAB_GPU_HOST=1")
    return traces


def no_gpu_here(why: str) -> None:
    """Skip (the one legitimate skip) where there is no GPU; fail where there is one."""
    traces = gpu_traces()
    if traces:
        pytest.fail(f"this host has an NVIDIA GPU ({', '.join(traces[:3])}) but {why}")
    pytest.skip(f"{REAL_GPU}no NVIDIA GPU on this host: {why}")


@pytest.fixture(scope="module")
def nvml():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        no_gpu_here(f"NVML init failed: {type(e).__name__}: {e}")
    try:
        count = pynvml.nvmlDeviceGetCount()
        total = (pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
                 if count else 0)
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        no_gpu_here("NVML initialised but reports no GPUs")
    return total


def cuda_torch():
    """torch with CUDA: required on a GPU host, never a reason to skip there."""
    try:
        import torch
    except ImportError as e:
        pytest.fail(f"torch is not installed on this GPU host ({e}): it is needed to put a "
                    "load on the GPU")
    if not torch.cuda.is_available():
        pytest.fail(f"torch {torch.__version__} sees no CUDA device on this GPU host (CUDA "
                    f"build: {torch.version.cuda or 'none, a CPU-only torch'})")
    return torch


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
        # this driver's process query answers, or the exporter says why it cannot
        # (MIG, or a user NVML refuses); never a query missing from the driver or failing
        g = snap.gpus[0]
        assert g.processes is not None or g.processes_unavailable in ("mig", "no_permission"), (
            g.processes_unavailable, g.processes_error)
        reason = "" if g.processes is not None else g.processes_unavailable
        assert reg.get_sample_value("gpulab_gpu_attribution_available",
                                    {**g0, "reason": reason}) == (1 if reason == "" else 0)
    finally:
        poller.stop()


def test_utilization_rises_under_matmul_load(nvml):
    torch = cuda_torch()
    poller = Poller(Nvml(), interval=0.5, process_interval=0.5)
    try:
        time.sleep(2)  # let any earlier work settle
        idle = poller.poll().gpus[0].utilization_ratio
        if idle is None:  # NVML reports none for a GPU in MIG mode, and then neither may we
            assert poller.nvml.mig_enabled(poller.nvml.device(0)), (
                "no utilization for GPU 0, which is not in MIG mode")
            return
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
