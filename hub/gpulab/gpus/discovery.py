"""Discover the host's GPUs with NVML, for ``inventory: auto`` in config/gpus.yaml.

The hub container sees the GPUs for discovery only (docker-compose.gpu.yml gives it the
``utility`` capability: NVML, no compute). Where NVML cannot load (no driver, no GPU,
a CPU-only host) discovery returns no GPUs and says why, once, in the log. In the demo
for a host without GPUs (``GPULAB_DEMO=1``), it returns the simulated GPUs the exporter's
``--fake-gpus`` reports.

A GPU in MIG mode is found as its MIG devices, not as itself: each is leased
on its own by its MIG-... UUID, under its GPU's index, and the GPU is not given out whole.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from gpulab.contract import DEMO_ENV, DEMO_GPUS, demo_gpu_uuid

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DiscoveredGpu:
    index: int
    uuid: str
    model: str
    parent: str = ""  # a MIG device: the UUID of the GPU it is part of


def _mig_devices(pynvml, handle) -> list:
    """The MIG devices' handles of a GPU in MIG mode; [] for a GPU that is not (or
    cannot be: NotSupported)."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:
        return []
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return []
    devices = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            devices.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
        except pynvml.NVMLError_NotFound:
            continue
    return devices


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def discover_gpus() -> list[DiscoveredGpu]:
    if os.environ.get(DEMO_ENV) == "1":
        log.warning("DEMO: %d simulated GPUs (%s=1, make up GPULAB_DEMO=1), not hardware",
                    DEMO_GPUS, DEMO_ENV)
        return [DiscoveredGpu(i, demo_gpu_uuid(i), "simulated GPU (demo)")
                for i in range(DEMO_GPUS)]
    try:
        import pynvml
    except ImportError:
        log.warning("nvidia-ml-py is not installed: inventory 'auto' finds no GPUs")
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        log.info("NVML unavailable (%s): inventory 'auto' finds no GPUs on this host", e)
        return []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            mig = _mig_devices(pynvml, handle)
            if mig:
                log.info("GPU %d (%s) is in MIG mode: its %d MIG devices are leased, not it",
                         i, uuid, len(mig))
            gpus += [DiscoveredGpu(i, _text(pynvml.nvmlDeviceGetUUID(d)),
                                   _text(pynvml.nvmlDeviceGetName(d)), uuid) for d in mig]
            if not mig:
                gpus.append(DiscoveredGpu(i, uuid, _text(pynvml.nvmlDeviceGetName(handle))))
        return gpus
    except pynvml.NVMLError as e:
        log.error("NVML failed while listing GPUs (%s): no GPUs will be leased", e)
        return []
    finally:
        pynvml.nvmlShutdown()
