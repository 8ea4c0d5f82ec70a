"""A thin layer over pynvml: the few NVML calls the exporter makes, in NVML's own units.

Everything above this module talks to an object with this interface (``Nvml`` here,
``FakeNvml`` in :mod:`gpulab_exporter.fake_nvml` for tests and demos), so the only code
that needs a driver is this file. Errors are pynvml's own exception classes; callers
sort them with :func:`classify`. Besides ``pynvml.NVMLError`` (one subclass per NVML
error code) that includes ``pynvml.NVMLLibraryMismatchError``, which is NOT an
NVMLError: pynvml raises it from an unversioned call (``nvmlDeviceGetComputeRunningProcesses``)
whose newest variant (``_v3``) the driver's libnvidia-ml lacks.

Units are NVML's: utilization and fan in percent, power in milliwatts, energy in
millijoules, clocks in MHz, memory in bytes. :mod:`gpulab_exporter.snapshot` converts
to base units.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any, Protocol

import pynvml

# Error codes grouped by what the exporter does about them.
ABSENT = "absent"  # the field does not exist here: drop its series
GPU_DOWN = "gpu_down"  # this GPU is broken: gpu_up 0, other GPUs carry on
REINIT = "reinit"  # the library/driver went away: nvml_up 0, init again next cycle
OTHER = "other"  # transient or unexpected: drop the field, log it

_ABSENT = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_NOT_FOUND,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
}
_GPU_DOWN = {
    pynvml.NVML_ERROR_GPU_IS_LOST,
    pynvml.NVML_ERROR_UNKNOWN,
    pynvml.NVML_ERROR_RESET_REQUIRED,
}
_REINIT = {
    pynvml.NVML_ERROR_UNINITIALIZED,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
}


def classify(error: BaseException) -> str:
    """What to do about an error from an NVML read: ABSENT, GPU_DOWN, REINIT or OTHER.
    ``NVMLLibraryMismatchError`` (a function this driver's libnvidia-ml lacks) is ABSENT,
    as ``NVML_ERROR_FUNCTION_NOT_FOUND`` is; anything that is not an NVML error is OTHER."""
    if isinstance(error, pynvml.NVMLLibraryMismatchError):
        return ABSENT
    value = getattr(error, "value", None) if isinstance(error, pynvml.NVMLError) else None
    if value in _ABSENT:
        return ABSENT
    if value in _GPU_DOWN:
        return GPU_DOWN
    if value in _REINIT:
        return REINIT
    return OTHER


@dataclass(frozen=True)
class MemoryInfo:
    total: int
    used: int
    free: int


@dataclass(frozen=True)
class GpuProcess:
    pid: int  # a host PID: NVML is not PID-namespace aware
    used_memory: int | None  # bytes; None where the driver cannot tell


# The per-process queries, newest first. pynvml's unversioned
# nvmlDeviceGetComputeRunningProcesses calls _v3 only, and raises NVMLLibraryMismatchError
# where the driver lacks it (older drivers have _v2 only); _v1 has no pynvml wrapper.
PROCESS_QUERIES = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
)


class NvmlLike(Protocol):
    """The interface both ``Nvml`` and ``FakeNvml`` provide. Every method may raise
    ``pynvml.NVMLError`` (a subclass per error code) or ``pynvml.NVMLLibraryMismatchError``
    (the driver's libnvidia-ml lacks the function)."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def device(self, index: int) -> Any: ...
    def name(self, handle: Any) -> str: ...
    def uuid(self, handle: Any) -> str: ...
    def utilization_percent(self, handle: Any) -> int: ...
    def memory_info(self, handle: Any) -> MemoryInfo: ...
    def temperature_celsius(self, handle: Any) -> int: ...
    def power_milliwatts(self, handle: Any) -> int: ...
    def energy_millijoules(self, handle: Any) -> int: ...
    def clock_sm_mhz(self, handle: Any) -> int: ...
    def clock_memory_mhz(self, handle: Any) -> int: ...
    def fan_speed_percent(self, handle: Any) -> int: ...
    def ecc_errors(self, handle: Any, corrected: bool) -> int: ...
    def processes(self, handle: Any) -> list[GpuProcess]: ...
    def mig_enabled(self, handle: Any) -> bool: ...
    def mig_devices(self, handle: Any) -> list[tuple[int, Any]]: ...


def _pynvml_version() -> str:
    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        return "version unknown"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Nvml:
    """The real NVML, through pynvml. ``init()`` raises NVMLError_LibraryNotFound or
    NVMLError_DriverNotLoaded on a host without the driver."""

    is_fake = False

    def __init__(self) -> None:
        self._initialised = False
        self._memory_v2 = True
        self._process_queries = PROCESS_QUERIES

    def init(self) -> None:
        if self._initialised:
            self.shutdown()
        pynvml.nvmlInit()
        self._initialised = True
        self._memory_v2 = True
        self._process_queries = PROCESS_QUERIES

    def shutdown(self) -> None:
        if self._initialised:
            self._initialised = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass

    def driver_version(self) -> str:
        return _text(pynvml.nvmlSystemGetDriverVersion())

    def device_count(self) -> int:
        return pynvml.nvmlDeviceGetCount()

    def device(self, index: int) -> Any:
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def name(self, handle: Any) -> str:
        return _text(pynvml.nvmlDeviceGetName(handle))

    def uuid(self, handle: Any) -> str:
        return _text(pynvml.nvmlDeviceGetUUID(handle))

    def utilization_percent(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetUtilizationRates(handle).gpu

    def memory_info(self, handle: Any) -> MemoryInfo:
        # v2 (driver >= 515) reports `used` without the driver's reservation, as
        # nvidia-smi does; v1 counts the reservation as used. Fall back once per init.
        if self._memory_v2:
            try:
                m = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
                return MemoryInfo(total=m.total, used=m.used, free=m.free)
            except pynvml.NVMLError as e:
                if classify(e) != ABSENT:
                    raise
                self._memory_v2 = False
        m = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return MemoryInfo(total=m.total, used=m.used, free=m.free)

    def temperature_celsius(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)

    def power_milliwatts(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetPowerUsage(handle)

    def energy_millijoules(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)

    def clock_sm_mhz(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)

    def clock_memory_mhz(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)

    def fan_speed_percent(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetFanSpeed(handle)

    def ecc_errors(self, handle: Any, corrected: bool) -> int:
        kind = (
            pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
            if corrected
            else pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        )
        # Volatile: counted since the driver loaded, like the energy counter.
        return pynvml.nvmlDeviceGetTotalEccErrors(handle, kind, pynvml.NVML_VOLATILE_ECC)

    def processes(self, handle: Any) -> list[GpuProcess]:
        # The newest variant this driver has: a driver without _v3 answers _v2. A variant
        # the driver lacks is dropped until the next init; with none left, pynvml's own
        # NVMLLibraryMismatchError says which were tried.
        while self._process_queries:
            query = getattr(pynvml, self._process_queries[0], None)  # older pynvml: no _v3
            try:
                if query is not None:
                    return [GpuProcess(pid=p.pid, used_memory=p.usedGpuMemory)
                            for p in query(handle)]
            except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLLibraryMismatchError):
                pass
            self._process_queries = self._process_queries[1:]
        raise pynvml.NVMLLibraryMismatchError(
            f"neither {' nor '.join(PROCESS_QUERIES)} is in this driver's libnvidia-ml "
            f"(driver {self._driver_or_unknown()}, nvidia-ml-py {_pynvml_version()})")

    def mig_enabled(self, handle: Any) -> bool:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        return current == pynvml.NVML_DEVICE_MIG_ENABLE

    def mig_devices(self, handle: Any) -> list[tuple[int, Any]]:
        """A MIG-mode GPU's MIG devices as (MIG device index, handle): the slots up to
        NVML's maximum that hold one (an empty slot answers NotFound). A GPU not in MIG
        mode has none."""
        if not self.mig_enabled(handle):
            return []
        devices = []
        for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                devices.append((slot, pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)))
            except pynvml.NVMLError_NotFound:
                continue
        return devices

    def _driver_or_unknown(self) -> str:
        try:
            return self.driver_version()
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError):
            return "version unknown"
