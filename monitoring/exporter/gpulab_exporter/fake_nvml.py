"""``FakeNvml``: a stand-in for NVML with the same interface as ``nvml.Nvml``.

It is a fake, named as one: it proves the exporter's plumbing (failure handling, units,
attribution, HTTP), never that a GPU works. It raises pynvml's real exception classes,
so the code under test sorts errors exactly as it does against a driver.

    nvml = FakeNvml.demo(2)                       # two healthy fake H200s
    nvml.gpus[1].unsupported.add("fan")           # NVMLError_NotSupported on fan reads
    nvml.gpus[0].lost_after = 2                   # GpuIsLost after two more reads
    nvml.gpus[0].processes = [GpuProcess(4242, 1 << 30)]
    nvml.gpus[0].errors["power"] = pynvml.NVMLLibraryMismatchError("...")  # any error
    nvml.gpus[1].mig = True                       # MIG mode, as a non-root caller sees it
    split_mig(nvml.gpus[1], 3)                    # ... with three MIG devices
    FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound)  # no driver at all

One level lower, :class:`FakeLibNvml` stands in for ``libnvidia-ml.so`` itself, under
the real pynvml and the real :class:`~gpulab_exporter.nvml.Nvml`: a driver that lacks
some functions (``nvmlDeviceGetComputeRunningProcesses_v3`` on an older driver) or
answers some with an error code, to prove how pynvml's own wrappers behave there.

A running exporter's fake GPUs are steered from outside through a *control file*
(``--fake-control``), re-read at every poll, so that an integration test can put a real
process (by its host PID) on a fake GPU and lose a fake GPU while the exporter runs:

    {"processes": {"0": [[12345, 1073741824]]}, "lost": [1], "utilization": {"0": 0}}

Fake GPU 0 then lists host process 12345 using 1 GiB (its memory.used is the sum of
its processes) and stays at 0 % utilization, and every read of fake GPU 1 raises
GpuIsLost. GPUs the file does not mention run no process, are healthy, and follow their
demo load (if animated); a missing file means exactly that. The
exporter still attributes the PID through the host's real ``/proc/<pid>/cgroup``.

``{"mig": {"1": 2}, "processes": {"1:0": [[12345, 1073741824]]}}`` puts fake GPU 1 in MIG
mode with two MIG devices (1:0 and 1:1, UUIDs from :func:`mig_uuid`), the first running
that process: its memory counts as used there, and its process list is refused to the
exporter, as NVML refuses it to a non-root caller under MIG.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpulab_exporter.nvml import GpuProcess, MemoryInfo

GiB = 1 << 30
log = logging.getLogger(__name__)

# Field names accepted in FakeGpu.unsupported (one per read method).
FIELDS = (
    "name",
    "uuid",
    "utilization",
    "memory",
    "temperature",
    "power",
    "energy",
    "clock_sm",
    "clock_memory",
    "fan",
    "ecc",
    "processes",
    "mig_mode",
)


# What NVML answers for a whole GPU only, not on a MIG device's handle.
MIG_DEVICE_ABSENT = frozenset({"temperature", "power", "energy", "clock_sm", "clock_memory",
                               "fan", "ecc", "mig_mode"})


def mig_uuid(index: int, slot: int) -> str:
    """A UUID-shaped id for MIG device *slot* of fake GPU *index*, stable across runs."""
    return f"MIG-fa4e0000-0000-4000-8001-{index:06x}{slot:06x}"


def fake_uuid(index: int) -> str:
    """A UUID-shaped id for fake GPU ``index`` ("fa4e" reads "fake"), stable across runs
    so a CPU-only stack can lease the same ids the exporter reports."""
    return f"GPU-fa4e0000-0000-4000-8000-{index:012x}"


@dataclass
class FakeGpu:
    """One fake GPU. Values are in NVML's units, as the real calls return them."""

    index: int
    name: str = "NVIDIA H200 (fake)"
    uuid: str = ""
    utilization_percent: int = 0
    memory_total: int = 141 * GiB
    memory_used: int = 0
    temperature_celsius: int = 35
    power_milliwatts: int = 75_000
    energy_millijoules: int = 1_000_000
    clock_sm_mhz: int = 1980
    clock_memory_mhz: int = 2619
    fan_speed_percent: int = 30
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    processes: list[GpuProcess] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    # Field (FIELDS) -> what its reads raise: a pynvml error class or instance, or any
    # exception (pynvml.NVMLLibraryMismatchError is not an NVMLError).
    errors: dict[str, type[BaseException] | BaseException] = field(default_factory=dict)
    # MIG mode, as NVML answers a non-root caller (the exporter's user) on the whole GPU:
    # utilization NotSupported, the process list NoPermission.
    mig: bool = False
    # None: healthy. 0: every read raises GpuIsLost. n > 0: n more reads succeed first.
    lost_after: int | None = None
    # Set by the control file: the utilization reported whatever the demo load says.
    held_utilization: int | None = None
    # A GPU in MIG mode: its MIG devices (split_mig), read through handles of their own
    # as NVML's MIG device handles are; the device's slot is its place in this list.
    instances: list[FakeGpu] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = fake_uuid(self.index)
        unknown = (self.unsupported | set(self.errors)) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown fake NVML fields {sorted(unknown)}; known: {FIELDS}")


def split_mig(gpu: FakeGpu, count: int) -> None:
    """Put *gpu* in MIG mode with *count* MIG devices sharing its memory equally, as
    ``nvidia-smi mig -cgi ... -C`` makes them (0: MIG mode off). Each answers as NVML does a
    non-root caller on a MIG device: memory, name and UUID; no utilization, no process
    list, none of the whole GPU's sensors. Devices already there are kept (their state
    too) where the count does not change."""
    if count == len(gpu.instances) and gpu.mig == (count > 0):
        return
    gpu.mig = count > 0
    size = gpu.memory_total // count if count else 0
    model = gpu.name.removesuffix(" (fake)")
    gpu.instances = [
        FakeGpu(index=gpu.index, uuid=mig_uuid(gpu.index, slot), mig=True,
                name=f"{model} MIG {7 // count}g.{size // GiB}gb (fake)", memory_total=size,
                unsupported=set(MIG_DEVICE_ABSENT), lost_after=gpu.lost_after)
        for slot in range(count)]


class FakeNvml:
    """Fake NVML with ``Nvml``'s interface. ``init_error`` (a pynvml error class or
    instance) makes ``init()`` fail until it is set back to None. ``on_read`` lets a
    demo vary values over time (called with the GPU before each read). ``control``: the
    path of a control file (see the module's doc), applied at every ``device_count()``,
    which the exporter calls once per poll."""

    is_fake = True

    def __init__(
        self,
        gpus: list[FakeGpu],
        init_error: type[pynvml.NVMLError] | pynvml.NVMLError | None = None,
        driver: str = "000.00 (fake)",
        on_read: Callable[[FakeGpu], None] | None = None,
        control: str | None = None,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.driver = driver
        self.on_read = on_read
        self.initialised = False
        self.init_calls = 0
        self.reads = 0
        self.control = control
        self._control_error: str | None = None

    @classmethod
    def demo(cls, count: int, animate: bool = False, control: str | None = None,
             uuids: Sequence[str] = ()) -> FakeNvml:
        """``count`` healthy fake H200s; with ``animate`` their load drifts over time so
        a dashboard fed by them shows movement; *control*: a control file's path;
        *uuids*: their UUIDs (default :func:`fake_uuid` of each index, the same on every
        machine: fakes on several machines need their own)."""
        if uuids and len(uuids) != count:
            raise ValueError(f"{count} fake GPUs need {count} UUIDs, got {len(uuids)}")
        if len(set(uuids)) != len(uuids):
            raise ValueError(f"fake GPU UUIDs must differ, got {list(uuids)}")
        gpus = [FakeGpu(index=i, uuid=uuids[i] if uuids else "") for i in range(count)]
        return cls(gpus, on_read=_animate if animate else None, control=control)

    # -- the control file ------------------------------------------------------------
    def apply_control(self) -> None:
        """Read the control file and set every fake GPU's processes, memory used and
        lost state from it. A file that cannot be read or parsed changes nothing (the
        last good control stays) and is logged once."""
        if not self.control:
            return
        try:
            with open(self.control, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            text = "{}"
        except OSError as e:
            self._control_failed(f"cannot read {self.control}: {e}")
            return
        try:
            control = parse_control(json.loads(text), len(self.gpus))
        except ValueError as e:  # json.JSONDecodeError is one
            self._control_failed(f"{self.control}: {e}")
            return
        self._control_error = None
        for gpu in self.gpus:
            split_mig(gpu, control.mig.get(gpu.index, 0))
            lost = 0 if gpu.index in control.lost else None
            for slot, device in [(None, gpu), *enumerate(gpu.instances)]:
                key = gpu.index if slot is None else (gpu.index, slot)
                device.processes = control.processes.get(key, [])
                device.memory_used = sum(p.used_memory or 0 for p in device.processes)
                device.lost_after = lost
            if gpu.instances:  # a MIG GPU's memory is its devices'
                gpu.memory_used = sum(d.memory_used for d in gpu.instances)
            gpu.held_utilization = control.utilization.get(gpu.index)

    def _control_failed(self, why: str) -> None:
        if why != self._control_error:
            log.warning("FAKE NVML control file ignored, the last one stays: %s", why)
        self._control_error = why

    # -- lifecycle -------------------------------------------------------------------
    def init(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            err = self.init_error
            raise err() if isinstance(err, type) else err
        self.initialised = True

    def shutdown(self) -> None:
        self.initialised = False

    def _check(self) -> None:
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()

    def driver_version(self) -> str:
        self._check()
        return self.driver

    def device_count(self) -> int:
        self._check()
        self.apply_control()  # once per poll cycle
        return len(self.gpus)

    def device(self, index: int) -> FakeGpu:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return self.gpus[index]

    # -- reads -----------------------------------------------------------------------
    def _read(self, gpu: FakeGpu, what: str) -> FakeGpu:
        self._check()
        self.reads += 1
        if gpu.lost_after is not None:
            if gpu.lost_after <= 0:
                raise pynvml.NVMLError_GpuIsLost()
            gpu.lost_after -= 1
        if what in gpu.errors:
            err = gpu.errors[what]
            raise err() if isinstance(err, type) else err
        if what in gpu.unsupported:
            raise pynvml.NVMLError_NotSupported()
        if gpu.mig and what == "utilization":
            raise pynvml.NVMLError_NotSupported()
        if gpu.mig and what == "processes":
            raise pynvml.NVMLError_NoPermission()
        if self.on_read is not None:
            self.on_read(gpu)
        return gpu

    def name(self, handle: FakeGpu) -> str:
        return self._read(handle, "name").name

    def uuid(self, handle: FakeGpu) -> str:
        return self._read(handle, "uuid").uuid

    def utilization_percent(self, handle: FakeGpu) -> int:
        gpu = self._read(handle, "utilization")
        return gpu.utilization_percent if gpu.held_utilization is None else gpu.held_utilization

    def memory_info(self, handle: FakeGpu) -> MemoryInfo:
        g = self._read(handle, "memory")
        return MemoryInfo(total=g.memory_total, used=g.memory_used,
                          free=g.memory_total - g.memory_used)

    def temperature_celsius(self, handle: FakeGpu) -> int:
        return self._read(handle, "temperature").temperature_celsius

    def power_milliwatts(self, handle: FakeGpu) -> int:
        return self._read(handle, "power").power_milliwatts

    def energy_millijoules(self, handle: FakeGpu) -> int:
        return self._read(handle, "energy").energy_millijoules

    def clock_sm_mhz(self, handle: FakeGpu) -> int:
        return self._read(handle, "clock_sm").clock_sm_mhz

    def clock_memory_mhz(self, handle: FakeGpu) -> int:
        return self._read(handle, "clock_memory").clock_memory_mhz

    def fan_speed_percent(self, handle: FakeGpu) -> int:
        return self._read(handle, "fan").fan_speed_percent

    def ecc_errors(self, handle: FakeGpu, corrected: bool) -> int:
        g = self._read(handle, "ecc")
        return g.ecc_corrected if corrected else g.ecc_uncorrected

    def processes(self, handle: FakeGpu) -> list[GpuProcess]:
        return list(self._read(handle, "processes").processes)

    def mig_enabled(self, handle: FakeGpu) -> bool:
        return self._read(handle, "mig_mode").mig

    def mig_devices(self, handle: FakeGpu) -> list[tuple[int, FakeGpu]]:
        gpu = self._read(handle, "mig_mode")
        return list(enumerate(gpu.instances)) if gpu.mig else []


class FakeLibNvml:
    """A stand-in for ``libnvidia-ml.so`` (what pynvml loads with ctypes), so that the
    real pynvml and the real ``Nvml`` run on it. A fake, named as one: it proves how
    pynvml's wrappers and the exporter behave towards a given driver, not the driver.

    Its functions take and fill pynvml's ctypes arguments as the C functions do. It has
    the few the tests need (init, shutdown, driver version, count, handle, UUID, name,
    utilization, memory v1 and v2, MIG mode and MIG device handles, and the process queries
    ``_v3`` and ``_v2``);
    every other one is absent, as from an older driver, so pynvml raises
    NVMLError_FunctionNotFound for it. Names in ``missing`` are absent too: a driver
    without ``nvmlDeviceGetComputeRunningProcesses_v3`` makes pynvml's unversioned
    ``nvmlDeviceGetComputeRunningProcesses`` raise ``NVMLLibraryMismatchError``.
    ``codes`` makes a function answer an NVML error code (``{name: NVML_ERROR_...}``).
    A GPU with ``mig=True`` answers as NVML does an unprivileged caller under MIG.

        lib = FakeLibNvml([FakeGpu(0)], missing={"nvmlDeviceGetComputeRunningProcesses_v3"})
        with lib.installed():
            Nvml().init()  # ... the real pynvml calls lib's functions

    ``installed()`` swaps pynvml's loaded library (``pynvml.nvmlLib``) and clears its
    function-pointer cache (``pynvml._nvmlGetFunctionPointer_cache``), both internals of
    nvidia-ml-py (checked against 13.615.71), and puts them back after.
    """

    def __init__(self, gpus: list[FakeGpu], missing: set[str] | frozenset[str] = frozenset(),
                 codes: dict[str, int] | None = None, driver: str = "000.00 (fake lib)"):
        self.gpus = gpus
        self.missing = set(missing)
        self.codes = dict(codes or {})
        self.driver = driver
        self.calls: list[str] = []  # functions called, in order
        self.absent_asked: list[str] = []  # functions looked up that this driver lacks
        self._symbols: dict[str, Callable[..., int]] = {
            "nvmlInitWithFlags": lambda flags: pynvml.NVML_SUCCESS,
            "nvmlShutdown": lambda: pynvml.NVML_SUCCESS,
            "nvmlSystemGetDriverVersion": self._driver_version,
            "nvmlDeviceGetCount_v2": self._count,
            "nvmlDeviceGetHandleByIndex_v2": self._handle,
            "nvmlDeviceGetUUID": lambda h, buf, size: self._text(h, buf, "uuid"),
            "nvmlDeviceGetName": lambda h, buf, size: self._text(h, buf, "name"),
            "nvmlDeviceGetUtilizationRates": self._utilization,
            "nvmlDeviceGetMemoryInfo": self._memory,
            "nvmlDeviceGetMemoryInfo_v2": self._memory,
            "nvmlDeviceGetMigMode": self._mig_mode,
            "nvmlDeviceGetMaxMigDeviceCount": self._max_mig_devices,
            "nvmlDeviceGetMigDeviceHandleByIndex": self._mig_device,
            "nvmlDeviceGetComputeRunningProcesses_v3": self._processes,
            "nvmlDeviceGetComputeRunningProcesses_v2": self._processes,
        }

    def __getattr__(self, name: str) -> Callable[..., int]:
        """A symbol of the library, as ``ctypes.CDLL`` resolves one: AttributeError if
        this driver lacks it."""
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self.missing or name not in self._symbols:
            self.absent_asked.append(name)
            raise AttributeError(f"fake libnvidia-ml: undefined symbol: {name}")
        fn = self._symbols[name]

        def call(*args: Any) -> int:
            self.calls.append(name)
            return self.codes.get(name) or fn(*args)
        return call

    @contextlib.contextmanager
    def installed(self) -> Iterator[FakeLibNvml]:
        saved_lib = pynvml.nvmlLib
        cache = pynvml._nvmlGetFunctionPointer_cache
        saved_cache = dict(cache)
        pynvml.nvmlLib = self
        cache.clear()
        try:
            yield self
        finally:
            pynvml.nvmlLib = saved_lib
            cache.clear()
            cache.update(saved_cache)

    # -- the C functions, on pynvml's ctypes arguments ---------------------------------
    # A handle is an opaque pointer: here GPU index + 1, and for a MIG device
    # (GPU index + 1) * MIG_HANDLE + slot + 1.
    MIG_HANDLE = 1000

    def _gpu(self, handle: Any) -> FakeGpu:
        gpu, slot = divmod(ctypes.cast(handle, ctypes.c_void_p).value, self.MIG_HANDLE)
        if gpu:
            return self.gpus[gpu - 1].instances[slot - 1]
        return self.gpus[slot - 1]

    @staticmethod
    def _set_handle(device: Any, value: int) -> None:
        slot = ctypes.cast(ctypes.pointer(device._obj), ctypes.POINTER(ctypes.c_void_p))
        slot.contents.value = value

    def _driver_version(self, buf: Any, size: Any) -> int:
        buf.value = self.driver.encode()
        return pynvml.NVML_SUCCESS

    def _count(self, count: Any) -> int:
        count._obj.value = len(self.gpus)
        return pynvml.NVML_SUCCESS

    def _handle(self, index: Any, device: Any) -> int:
        if not 0 <= index.value < len(self.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        self._set_handle(device, index.value + 1)
        return pynvml.NVML_SUCCESS

    def _max_mig_devices(self, handle: Any, count: Any) -> int:
        count._obj.value = 7  # as on an A100 or H100: up to seven
        return pynvml.NVML_SUCCESS

    def _mig_device(self, handle: Any, index: Any, device: Any) -> int:
        gpu = self._gpu(handle)
        if not gpu.mig:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if index.value >= len(gpu.instances):  # an empty slot
            return pynvml.NVML_ERROR_NOT_FOUND
        place = next(i for i, g in enumerate(self.gpus) if g is gpu)
        self._set_handle(device, (place + 1) * self.MIG_HANDLE + index.value + 1)
        return pynvml.NVML_SUCCESS

    def _text(self, handle: Any, buf: Any, attr: str) -> int:
        buf.value = getattr(self._gpu(handle), attr).encode()
        return pynvml.NVML_SUCCESS

    def _utilization(self, handle: Any, util: Any) -> int:
        gpu = self._gpu(handle)
        if gpu.mig:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        util._obj.gpu = gpu.utilization_percent
        return pynvml.NVML_SUCCESS

    def _memory(self, handle: Any, memory: Any) -> int:
        gpu = self._gpu(handle)
        memory._obj.total = gpu.memory_total
        memory._obj.used = gpu.memory_used
        memory._obj.free = gpu.memory_total - gpu.memory_used
        return pynvml.NVML_SUCCESS

    def _mig_mode(self, handle: Any, current: Any, pending: Any) -> int:
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if self._gpu(handle).mig else 0
        current._obj.value = pending._obj.value = mode
        return pynvml.NVML_SUCCESS

    def _processes(self, handle: Any, count: Any, infos: Any) -> int:
        gpu = self._gpu(handle)
        if gpu.mig:  # the whole GPU's list: root only
            return pynvml.NVML_ERROR_NO_PERMISSION
        wanted = len(gpu.processes)
        room = count._obj.value
        count._obj.value = wanted
        if wanted == 0:
            return pynvml.NVML_SUCCESS
        if infos is None or room < wanted:
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for info, p in zip(infos, gpu.processes, strict=False):
            info.pid = p.pid
            info.usedGpuMemory = (pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                                  if p.used_memory is None else p.used_memory)
        return pynvml.NVML_SUCCESS


@dataclass(frozen=True)
class Control:
    """A control file, parsed: processes per GPU index or (index, MIG slot), lost GPUs'
    indices, held utilization per index, and MIG devices per index (MIG mode on)."""

    processes: dict[int | tuple[int, int], list[GpuProcess]] = field(default_factory=dict)
    lost: frozenset[int] = frozenset()
    utilization: dict[int, int] = field(default_factory=dict)
    mig: dict[int, int] = field(default_factory=dict)


CONTROL_FORMAT = ('{"processes": {"INDEX" or "INDEX:SLOT": [[PID, BYTES], ...]}, '
                  '"lost": [INDEX, ...], "utilization": {"INDEX": PERCENT}, '
                  '"mig": {"INDEX": MIG DEVICES (1-7)}}')


def parse_control(data: Any, count: int) -> Control:
    """A control file's JSON -> :class:`Control`, for *count* fake GPUs; ValueError
    saying what is wrong."""
    if not isinstance(data, dict) or set(data) - {"processes", "lost", "utilization", "mig"}:
        raise ValueError(f"expected {CONTROL_FORMAT}, got {data!r}")

    def index(value: Any) -> int:
        try:
            i = int(value)
        except (TypeError, ValueError):
            i = -1
        if isinstance(value, bool) or not 0 <= i < count:
            raise ValueError(f"no fake GPU {value!r} (there are {count})")
        return i

    def counts(name: str, low: int, high: int, what: str) -> dict[int, int]:
        given = data.get(name) or {}
        if not isinstance(given, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) and low <= v <= high
                for v in given.values()):
            raise ValueError(f"{name}: expected {{\"INDEX\": {what} ({low}-{high})}}, "
                             f"got {given!r}")
        return {index(k): v for k, v in given.items()}

    mig = counts("mig", 1, 7, "MIG DEVICES")

    def device(key: str) -> int | tuple[int, int]:
        gpu, colon, slot = str(key).partition(":")
        if not colon:
            return index(gpu)
        at = index(gpu)
        if not slot.isdigit() or int(slot) >= mig.get(at, 0):
            raise ValueError(f"no MIG device {key!r}: GPU {at} has {mig.get(at, 0)} "
                             f"(\"mig\": {{\"{at}\": N}})")
        return at, int(slot)

    given = data.get("processes") or {}
    if not isinstance(given, dict):
        raise ValueError(f"processes: expected {{\"INDEX\": [[PID, BYTES], ...]}}, "
                         f"got {given!r}")
    processes: dict[int | tuple[int, int], list[GpuProcess]] = {}
    for key, rows in given.items():
        if not isinstance(rows, list) or not all(
                isinstance(r, list) and len(r) == 2 and all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in r)
                for r in rows):
            raise ValueError(f"processes of GPU {key}: expected [[PID, BYTES], ...], "
                             f"got {rows!r}")
        processes[device(key)] = [GpuProcess(pid, used) for pid, used in rows]
    lost = data.get("lost") or []
    if not isinstance(lost, list):
        raise ValueError(f"lost: expected a list of GPU indices, got {lost!r}")
    return Control(processes, frozenset(index(i) for i in lost),
                   counts("utilization", 0, 100, "PERCENT"), mig)


def _animate(gpu: FakeGpu, clock: Callable[[], float] = time.time) -> None:
    """Demo load: each fake GPU follows its own slow wave."""
    t = clock() / 60.0 + gpu.index
    load = 0.5 + 0.5 * math.sin(t)
    gpu.utilization_percent = round(100 * load)
    gpu.temperature_celsius = 35 + round(40 * load)
    gpu.power_milliwatts = 75_000 + round(550_000 * load)
    # a counter: about 300 W on average since the demo started
    gpu.energy_millijoules = 1_000_000 + round((clock() - _DEMO_START) * 300_000)


_DEMO_START = time.time()
