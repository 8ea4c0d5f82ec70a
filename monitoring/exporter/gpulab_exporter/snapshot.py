"""One background poller reads NVML into an immutable :class:`Snapshot`.

Scrapes never touch NVML: ``/metrics`` and ``/api/gpus`` render the latest snapshot, so
concurrent scrapes cannot pile calls onto the driver (NVML calls serialise on the
driver's lock) and a slow or broken GPU never makes a scrape slow or fail.

Failure rules (see :func:`gpulab_exporter.nvml.classify`):

* NotSupported / NoPermission / NotFound on a field, or a function this driver's
  libnvidia-ml lacks (``NVMLLibraryMismatchError``): that field is None (series absent),
  logged once with the reason.
* Any other error on a field (an unexpected NVML code, or not an NVML error at all):
  that field is None too, logged once as a warning. One field never ends the poll.
* GpuIsLost / Unknown / ResetRequired: that GPU is ``up=False``; the others carry on.
* NVML cannot load or lost its driver: ``nvml_up=False`` with the reason, and init is
  retried on every later cycle.

Processes (and so the per-user attribution) that cannot be listed say why:
``GpuSample.processes_unavailable`` is one of :data:`ATTRIBUTION_REASONS` (under MIG a
non-root exporter is refused the whole GPU's list), logged once per GPU and reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import pynvml

from gpulab_exporter.attribution import Container, ContainerDirectory, container_of
from gpulab_exporter.nvml import ABSENT, GPU_DOWN, REINIT, NvmlLike, classify

log = logging.getLogger(__name__)

# Why a GPU's process list, and so its per-user attribution, is unknown: the ``reason``
# label of gpulab_gpu_attribution_available. A fixed set, so that label stays bounded.
ATTRIBUTION_REASONS: dict[str, str] = {
    "mig": "MIG mode is on, and NVML lists the processes of a whole MIG GPU only to root "
           "(the exporter runs as an unprivileged user); utilization is not reported under "
           "MIG either",
    "no_permission": "NVML refused the process list to the exporter's user "
                     "(NVML_ERROR_NO_PERMISSION)",
    "not_supported": "NVML cannot list processes on this GPU (NVML_ERROR_NOT_SUPPORTED)",
    "driver_lacks_query": "this driver's libnvidia-ml has none of the process queries "
                          "nvidia-ml-py offers (too old a driver for this nvidia-ml-py)",
    "error": "the process query failed",
}


@dataclass(frozen=True)
class ProcessSample:
    pid: int  # host PID
    used_memory_bytes: int | None
    container_id: str | None  # full 64-hex ID; None outside containers
    container: str | None  # container name where the directory knows it, else short ID
    user: str | None  # hub user; None for processes outside hub user containers
    server: str | None


@dataclass(frozen=True)
class Lease:
    """A hub user container that holds this GPU (``org.gpulab.gpus``), busy or not."""

    user: str
    server: str
    container: str
    job: bool = False  # the server runs a job (the hub's org.gpulab.job label)


@dataclass(frozen=True)
class GpuSample:
    index: int
    uuid: str  # "" only if the GPU was lost before its UUID was ever read
    model: str | None
    up: bool
    error: str | None = None
    utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    energy_joules: float | None = None
    clock_sm_hertz: float | None = None
    clock_memory_hertz: float | None = None
    fan_speed_ratio: float | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    processes: tuple[ProcessSample, ...] | None = None  # None: could not be listed
    # Why not, where an up GPU's processes could not be listed: a key of
    # ATTRIBUTION_REASONS, and what NVML said.
    processes_unavailable: str | None = None
    processes_error: str | None = None
    leases: tuple[Lease, ...] = ()
    # A MIG device of GPU ``index``: its slot there (NVIDIA_VISIBLE_DEVICES names it
    # INDEX:SLOT) and that GPU's UUID. None for a whole GPU.
    mig_device: int | None = None
    parent_uuid: str | None = None

    @property
    def label(self) -> str:
        """The ``gpu`` label: "1" for GPU 1, "1:0" for MIG device 0 of GPU 1."""
        return str(self.index) if self.mig_device is None else f"{self.index}:{self.mig_device}"

    def user_memory_bytes(self) -> dict[str, int] | None:
        """GPU memory held per hub user (lease holders without processes at 0), or None
        when the process list is unknown."""
        if self.processes is None:
            return None
        per_user = {lease.user: 0 for lease in self.leases}
        for p in self.processes:
            if p.user is not None:
                per_user[p.user] = per_user.get(p.user, 0) + (p.used_memory_bytes or 0)
        return per_user


@dataclass(frozen=True)
class Snapshot:
    timestamp: float  # wall clock, seconds since the epoch
    nvml_up: bool
    nvml_error: str | None = None
    driver_version: str | None = None
    fake: bool = False
    gpus: tuple[GpuSample, ...] = ()
    collection_duration_seconds: float = 0.0
    last_success_timestamp: float | None = None
    docker_up: bool | None = None  # None: no container directory configured
    processes_timestamp: float | None = None
    expects_gpus: bool = True  # False: a host without GPUs by design (--no-gpus)

    def to_json(self) -> dict:
        """The snapshot as plain JSON types, for ``/api/gpus``."""
        data = asdict(self)
        for gpu, sample in zip(data["gpus"], self.gpus, strict=True):
            gpu["user_memory_bytes"] = sample.user_memory_bytes()
        return data


@dataclass(frozen=True)
class _Processes:
    """One GPU's process list as last read, or why it could not be."""

    samples: tuple[ProcessSample, ...] | None
    reason: str | None = None  # a key of ATTRIBUTION_REASONS when samples is None
    error: str | None = None


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class _GpuDown(Exception):
    pass


class _NvmlGone(Exception):
    pass


class _NoGpusHere(Exception):
    pass


# What the snapshot says on a host without GPUs by design (--no-gpus).
NO_GPUS = ("this host has no GPUs (--no-gpus: make up found no NVIDIA GPU); "
           "`make up GPULAB_DEMO=1` runs a demo with simulated ones")


_FIELDS: list[tuple[str, str, float]] = [
    # snapshot field, NvmlLike method, factor to base units
    ("utilization_ratio", "utilization_percent", 0.01),
    ("temperature_celsius", "temperature_celsius", 1.0),
    ("power_watts", "power_milliwatts", 0.001),
    ("energy_joules", "energy_millijoules", 0.001),
    ("clock_sm_hertz", "clock_sm_mhz", 1e6),
    ("clock_memory_hertz", "clock_memory_mhz", 1e6),
    ("fan_speed_ratio", "fan_speed_percent", 0.01),
]


@dataclass
class Poller:
    """Reads NVML (and, on the slower cycle, processes and the container directory)
    into ``self.latest``. ``poll()`` is one synchronous cycle (tests call it directly);
    ``start()`` runs it every ``interval`` seconds on a daemon thread."""

    nvml: NvmlLike
    directory: ContainerDirectory | None = None
    proc: str = "/proc"
    interval: float = 5.0
    process_interval: float = 15.0
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    # False: this host has no GPUs by design (--no-gpus): NVML is never loaded, and the
    # snapshot says so instead of an NVML failure
    expects_gpus: bool = True
    latest: Snapshot = field(init=False)

    def __post_init__(self) -> None:
        self.latest = Snapshot(timestamp=self.clock(), nvml_up=False, nvml_error="not polled yet",
                               fake=self._fake)
        self._ready = False
        self._driver: str | None = None
        self._last_error: str | None = None
        self._last_success: float | None = None
        self._last_slow: float | None = None
        self._processes_timestamp: float | None = None
        self._containers: dict[str, Container] = {}
        self._docker_up: bool | None = None
        # GPU index, or (index, MIG slot) -> (uuid, model) as last read
        self._identity: dict[int | tuple[int, int], tuple[str, str | None]] = {}
        # GPU index -> its MIG devices as last read: (slot, uuid, model)
        self._mig_identity: dict[int, list[tuple[int | None, str, str | None]]] = {}
        self._processes: dict[str, _Processes] = {}
        self._logged: set[tuple] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def _fake(self) -> bool:
        return bool(getattr(self.nvml, "is_fake", False))

    # -- the cycle -----------------------------------------------------------------------
    def poll(self) -> Snapshot:
        started = self.monotonic()
        now = self.clock()
        slow = self._last_slow is None or now - self._last_slow >= self.process_interval
        if slow:
            self._last_slow = now
            self._refresh_containers()
        gpus: tuple[GpuSample, ...] = ()
        error = None
        try:
            if not self.expects_gpus:
                raise _NoGpusHere(NO_GPUS)
            if not self._ready:
                self.nvml.init()
                self._ready = True
                self._driver = self._optional(self.nvml.driver_version)
                log.info("NVML initialised: driver %s%s", self._driver,
                         " (FAKE NVML: simulated GPUs, not real hardware)" if self._fake else "")
            count = self.nvml.device_count()
            gpus = tuple(sample for i in range(count) for sample in self._read_gpu(i, slow))
        except _NoGpusHere as e:
            error = str(e)
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError, _NvmlGone) as e:
            error = _describe(e)
            gpus = ()
            if self._ready:
                self._ready = False
                self.nvml.shutdown()
        if error != self._last_error:
            if error == NO_GPUS:
                log.info("%s; NVML is not loaded", NO_GPUS)
            elif error:
                log.warning("NVML unavailable, GPU metrics absent until it recovers "
                            "(retrying every %ss): %s", self.interval, error)
            elif self._last_error and self._last_error != "not polled yet":
                log.info("NVML available again")
            self._last_error = error
        if error is None:
            self._last_success = now
            if slow:
                self._processes_timestamp = now
        snap = Snapshot(
            timestamp=now,
            nvml_up=error is None,
            nvml_error=error,
            driver_version=self._driver if error is None else None,
            fake=self._fake,
            gpus=gpus,
            collection_duration_seconds=self.monotonic() - started,
            last_success_timestamp=self._last_success,
            docker_up=self._docker_up,
            processes_timestamp=self._processes_timestamp,
            expects_gpus=self.expects_gpus,
        )
        self.latest = snap
        return snap

    def _refresh_containers(self) -> None:
        if self.directory is None:
            return
        try:
            items = self.directory.containers()
        except Exception as e:  # Docker down or socket missing: keep the last list
            if self._docker_up is not False:
                log.warning("cannot list containers, keeping the last list (%d): %s",
                            len(self._containers), e)
            self._docker_up = False
            return
        if self._docker_up is False:
            log.info("container directory available again")
        self._docker_up = True
        self._containers = {c.id: c for c in items}

    def _read_gpu(self, index: int, slow: bool) -> list[GpuSample]:
        """GPU *index*, then its MIG devices if it is in MIG mode. A GPU found lost takes
        its MIG devices with it: each is a lost row too (with the leases it had)."""
        uuid, model = self._identity.get(index, ("", None))
        devices: list[GpuSample] = []
        try:
            handle = self._call(self.nvml.device, index)
            uuid = self._call(self.nvml.uuid, handle) or uuid
            model = self._call(self.nvml.name, handle) or model
            self._identity[index] = (uuid, model)
            values = self._readings(handle, _FIELDS)
            values["ecc_corrected"] = self._call(self.nvml.ecc_errors, handle, True)
            values["ecc_uncorrected"] = self._call(self.nvml.ecc_errors, handle, False)
            processes = self._processes_of(str(index), uuid, handle, slow)
            for slot, mig_handle in self._optional(self.nvml.mig_devices, handle) or ():
                devices.append(self._read_mig_device(index, slot, mig_handle, uuid, slow))
            self._mig_identity[index] = [(d.mig_device, d.uuid, d.model) for d in devices]
        except _GpuDown as e:
            self._note(("down", index, str(e)), logging.WARNING,
                       "GPU %s (%s) is down: %s", index, uuid or "uuid unknown", e)
            return [GpuSample(index=index, uuid=uuid, model=model, up=False, error=str(e),
                              leases=self._leases(uuid, index)),
                    *(GpuSample(index=index, mig_device=slot, parent_uuid=uuid, uuid=u,
                                model=m, up=False, error=str(e), leases=self._leases(u))
                      for slot, u, m in self._mig_identity.get(index, ()))]
        return [GpuSample(index=index, uuid=uuid, model=model, up=True,
                          processes=processes.samples,
                          processes_unavailable=processes.reason,
                          processes_error=processes.error,
                          leases=self._leases(uuid, index), **values),
                *devices]

    def _read_mig_device(self, index: int, slot: int, handle, parent_uuid: str,
                         slow: bool) -> GpuSample:
        """MIG device *slot* of GPU *index*: its own UUID, model, memory and (where NVML
        gives it) utilization; the sensors are the whole GPU's. Raises _GpuDown as
        :meth:`_read_gpu` does."""
        uuid, model = self._identity.get((index, slot), ("", None))
        uuid = self._call(self.nvml.uuid, handle) or uuid
        model = self._call(self.nvml.name, handle) or model
        self._identity[(index, slot)] = (uuid, model)
        values = self._readings(handle, _FIELDS[:1])  # utilization only
        processes = self._processes_of(f"{index}:{slot}", uuid, handle, slow, mig_device=True)
        return GpuSample(index=index, mig_device=slot, parent_uuid=parent_uuid, uuid=uuid,
                         model=model, up=True, processes=processes.samples,
                         processes_unavailable=processes.reason,
                         processes_error=processes.error, leases=self._leases(uuid), **values)

    def _readings(self, handle, fields: list[tuple[str, str, float]]) -> dict:
        """*fields*' values (None where absent) and the memory, in base units."""
        values: dict = {}
        for name, method, factor in fields:
            raw = self._call(getattr(self.nvml, method), handle)
            values[name] = None if raw is None else raw * factor
        mem = self._call(self.nvml.memory_info, handle)
        if mem is not None:
            values.update(memory_used_bytes=mem.used, memory_total_bytes=mem.total,
                          memory_free_bytes=mem.free)
        return values

    def _processes_of(self, label: str, uuid: str, handle, slow: bool,
                      mig_device: bool = False) -> _Processes:
        """The device's process list, read again on the slow cycle (or when new)."""
        if slow or uuid not in self._processes:
            self._processes[uuid] = self._read_processes(label, handle, mig_device)
        return self._processes[uuid]

    def _read_processes(self, index: str, handle, mig_device: bool = False) -> _Processes:
        try:
            found = self.nvml.processes(handle)
        except Exception as e:
            self._raise_if_fatal(e)
            reason = self._why_no_processes(e, handle, mig_device)
            error = _describe(e)
            self._note(("attribution", index, reason), logging.WARNING,
                       "GPU %s: its processes cannot be listed, so its GPU memory is not "
                       "attributed to hub users (gpulab_gpu_user_memory_used_bytes absent, "
                       "gpulab_gpu_attribution_available{reason=\"%s\"} 0): %s. NVML said: %s",
                       index, reason, ATTRIBUTION_REASONS[reason], error)
            return _Processes(None, reason, error)
        samples = []
        for p in found:
            cid = container_of(p.pid, self.proc)
            c = self._containers.get(cid) if cid else None
            samples.append(ProcessSample(
                pid=p.pid,
                used_memory_bytes=p.used_memory,
                container_id=cid,
                container=c.name if c else (cid[:12] if cid else None),
                user=c.user if c else None,
                server=c.server if c else None,
            ))
        return _Processes(tuple(samples))

    def _why_no_processes(self, error: Exception, handle, mig_device: bool = False) -> str:
        """The ATTRIBUTION_REASONS key for a failed process query (on a MIG device's
        handle, if *mig_device*)."""
        value = getattr(error, "value", None) if isinstance(error, pynvml.NVMLError) else None
        if value in (pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_NOT_SUPPORTED):
            if mig_device or self._optional(self.nvml.mig_enabled, handle):
                return "mig"
            return ("no_permission" if value == pynvml.NVML_ERROR_NO_PERMISSION
                    else "not_supported")
        if isinstance(error, pynvml.NVMLLibraryMismatchError) or (
                value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            return "driver_lacks_query"
        return "error"

    def _leases(self, uuid: str, index: int | None = None) -> tuple[Lease, ...]:
        """The hub containers holding this GPU by UUID or (a whole GPU) by index."""
        keys = {uuid, "" if index is None else str(index)} - {""}
        return tuple(
            Lease(user=c.user, server=c.server, container=c.name, job=c.job)
            for c in sorted(self._containers.values(), key=lambda c: (c.user, c.server))
            if keys.intersection(c.gpus)
        )

    def _call(self, fn, *args):
        """One NVML read: its value, or None where it fails soft (the field is absent
        here, or failed in a way that concerns only it), logged once per field and
        reason. Raises _GpuDown or _NvmlGone for errors that end this GPU's or the whole
        cycle."""
        try:
            return fn(*args)
        except Exception as e:  # one field's failure, whatever it is, drops only it
            self._raise_if_fatal(e)
            name = getattr(fn, "__name__", repr(fn))
            if classify(e) == ABSENT and not isinstance(e, pynvml.NVMLLibraryMismatchError):
                # NotSupported & co: normal on many boards (no fan on passively cooled ones)
                self._note(("absent", name, str(e)), logging.INFO,
                           "NVML %s is not available here, its series is left out: %s",
                           name, _describe(e))
            else:
                self._note(("failed", name, str(e)), logging.WARNING,
                           "NVML %s failed, its series is left out (logged once): %s",
                           name, _describe(e))
            return None

    @staticmethod
    def _raise_if_fatal(e: Exception) -> None:
        """Re-raise an NVML error that ends this GPU's (_GpuDown) or the whole cycle
        (_NvmlGone); return for one that concerns only the field."""
        kind = classify(e)
        if kind == GPU_DOWN:
            raise _GpuDown(_describe(e)) from e
        if kind == REINIT:
            raise _NvmlGone(_describe(e)) from e

    def _optional(self, fn, *args):
        try:
            return self._call(fn, *args)
        except _GpuDown:
            return None

    def _note(self, key: tuple, level: int, msg: str, *args) -> None:
        """Log a recurring problem once, not every cycle."""
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, msg, *args)

    # -- the thread ----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpulab-poller", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._ready:
            self._ready = False
            self.nvml.shutdown()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = self.monotonic()
            try:
                self.poll()
            except Exception:  # a bug must not stop monitoring: log it, try again
                log.exception("poll cycle failed")
            self._stop.wait(max(0.0, self.interval - (self.monotonic() - began)))
