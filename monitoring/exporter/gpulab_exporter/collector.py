"""Snapshot -> Prometheus metric families.

:func:`build_families` is a pure function of one :class:`Snapshot`; the collector just
yields its result on every scrape. Nothing carries over between scrapes, so a GPU,
process or lease that is gone is gone from the next scrape too. A field NVML does not
support is left out (absent), never exported as 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from gpulab_exporter import __version__
from gpulab_exporter.snapshot import ATTRIBUTION_REASONS, GpuSample, Snapshot

GPU = ["gpu", "uuid"]

# (metric name, help, GpuSample attribute) for the plain per-GPU gauges.
_GAUGES: list[tuple[str, str, str]] = [
    ("gpulab_gpu_utilization_ratio",
     "Fraction of the last sample period (1/6 s to 1 s, by product) during which one or "
     "more kernels ran on the GPU (0-1). Not SM occupancy.", "utilization_ratio"),
    ("gpulab_gpu_memory_used_bytes",
     "GPU memory allocated, in bytes (NVML v2 memory info: excludes the driver's "
     "reservation, like nvidia-smi).", "memory_used_bytes"),
    ("gpulab_gpu_memory_total_bytes", "GPU memory in total, in bytes.", "memory_total_bytes"),
    ("gpulab_gpu_memory_free_bytes", "GPU memory free, in bytes.", "memory_free_bytes"),
    ("gpulab_gpu_temperature_celsius", "GPU core temperature, in degrees Celsius.",
     "temperature_celsius"),
    ("gpulab_gpu_power_watts", "GPU power draw, in watts.", "power_watts"),
    ("gpulab_gpu_clock_sm_hertz", "Current SM clock, in hertz.", "clock_sm_hertz"),
    ("gpulab_gpu_clock_memory_hertz", "Current memory clock, in hertz.", "clock_memory_hertz"),
    ("gpulab_gpu_fan_speed_ratio", "Fan speed as a fraction of its maximum (0-1).",
     "fan_speed_ratio"),
]


def _gpu_labels(g: GpuSample) -> list[str]:
    return [g.label, g.uuid]


def build_families(snap: Snapshot, process_info: bool = False) -> list[Metric]:
    """All metric families for one snapshot. ``process_info`` adds the per-PID
    ``gpulab_gpu_process_info`` series (opt-in: PIDs are unbounded)."""
    fams: list[Metric] = []

    # -- exporter health ----------------------------------------------------------------
    fams.append(_single("gpulab_exporter_nvml_up",
                        "1 if NVML answered on the last cycle, 0 if it could not load or "
                        "lost the driver (see the exporter's log for why).",
                        1.0 if snap.nvml_up else 0.0))
    fams.append(_single("gpulab_exporter_gpus_expected",
                        "1 if this host should have GPUs (NVML down is then an alert), 0 "
                        "if it has none by design (--no-gpus).",
                        1.0 if snap.expects_gpus else 0.0))
    fams.append(_single("gpulab_exporter_collection_duration_seconds",
                        "Time the last NVML poll cycle took, in seconds.",
                        snap.collection_duration_seconds))
    if snap.last_success_timestamp is not None:
        fams.append(_single("gpulab_exporter_last_success_timestamp_seconds",
                            "When NVML last answered a poll cycle (Unix time).",
                            snap.last_success_timestamp))
    fams.append(_single("gpulab_exporter_gpus", "GPUs NVML reported on the last cycle.",
                        float(len(snap.gpus))))
    if snap.docker_up is not None:
        fams.append(_single("gpulab_exporter_docker_up",
                            "1 if the container list (for user attribution) was read on the "
                            "last process cycle, 0 if the Docker API failed.",
                            1.0 if snap.docker_up else 0.0))
    info = InfoMetricFamily("gpulab_exporter", "The exporter's version, driver and backend "
                            "(backend=fake: simulated GPUs, not hardware).",
                            labels=["version", "driver", "backend"])
    info.add_metric([], {"version": __version__, "driver": snap.driver_version or "",
                         "backend": "fake" if snap.fake else "nvml"})
    fams.append(info)

    # -- per GPU -----------------------------------------------------------------------
    up = GaugeMetricFamily("gpulab_gpu_up", "1 if the GPU answered on the last cycle, 0 if "
                           "it is lost or needs a reset.", labels=GPU)
    gpu_info = InfoMetricFamily("gpulab_gpu", "GPU identity (a MIG device's gpu label is "
                                "INDEX:SLOT, as in NVIDIA_VISIBLE_DEVICES).",
                                labels=[*GPU, "model"])
    mig_info = InfoMetricFamily("gpulab_gpu_mig_device",
                                "1 per MIG device, with the UUID of the GPU it is part of. A "
                                "MIG device has its own memory and leases; temperature, power "
                                "and clocks are its GPU's.", labels=[*GPU, "parent_uuid"])
    for g in snap.gpus:
        up.add_metric(_gpu_labels(g), 1.0 if g.up else 0.0)
        if g.model is not None:
            gpu_info.add_metric([*_gpu_labels(g), g.model], {})
        if g.parent_uuid is not None:
            mig_info.add_metric([*_gpu_labels(g), g.parent_uuid], {})
    fams += [up, gpu_info, mig_info]

    for name, help_text, attr in _GAUGES:
        fam = GaugeMetricFamily(name, help_text, labels=GPU)
        for g in snap.gpus:
            value = getattr(g, attr)
            if value is not None:
                fam.add_metric(_gpu_labels(g), float(value))
        fams.append(fam)

    energy = CounterMetricFamily("gpulab_gpu_energy_joules",
                                 "Energy the GPU used since the driver loaded, in joules.",
                                 labels=GPU)
    ecc = CounterMetricFamily("gpulab_gpu_ecc_errors",
                              "ECC memory errors since the driver loaded (volatile counters).",
                              labels=[*GPU, "type"])
    for g in snap.gpus:
        if g.energy_joules is not None:
            energy.add_metric(_gpu_labels(g), g.energy_joules)
        if g.ecc_corrected is not None:
            ecc.add_metric([*_gpu_labels(g), "corrected"], float(g.ecc_corrected))
        if g.ecc_uncorrected is not None:
            ecc.add_metric([*_gpu_labels(g), "uncorrected"], float(g.ecc_uncorrected))
    fams += [energy, ecc]

    # -- who holds and uses it ---------------------------------------------------------
    lease = GaugeMetricFamily("gpulab_gpu_lease_info",
                              "1 per hub user server holding a lease on the GPU "
                              "(org.gpulab.gpus label), whether or not it runs anything; "
                              "kind: job for a job's server (org.gpulab.job), else server.",
                              labels=[*GPU, "user", "server", "kind"])
    user_mem = GaugeMetricFamily("gpulab_gpu_user_memory_used_bytes",
                                 "GPU memory held by a hub user's processes, in bytes "
                                 "(lease holders with none at 0). Processes outside hub "
                                 "containers are not counted here.",
                                 labels=[*GPU, "user"])
    attribution = GaugeMetricFamily(
        "gpulab_gpu_attribution_available",
        "1 if the GPU's processes were listed on the last process cycle, so its memory is "
        "attributed to hub users; 0 if not, with why in reason ("
        + ", ".join(ATTRIBUTION_REASONS) + "; mig: MIG mode, where NVML lists a whole GPU's "
        "processes only to root; the exporter logs each once). Absent for a GPU that is down.",
        labels=[*GPU, "reason"])
    for g in snap.gpus:
        for user, server, job in sorted({(le.user, le.server, le.job) for le in g.leases}):
            lease.add_metric([*_gpu_labels(g), user, server, "job" if job else "server"], 1.0)
        per_user = g.user_memory_bytes()
        for user, used in sorted((per_user or {}).items()):
            user_mem.add_metric([*_gpu_labels(g), user], float(used))
        if g.up:
            listed = g.processes is not None
            attribution.add_metric(
                [*_gpu_labels(g), "" if listed else g.processes_unavailable or "error"],
                1.0 if listed else 0.0)
    fams += [lease, user_mem, attribution]

    if process_info:
        procs = GaugeMetricFamily("gpulab_gpu_process_info",
                                  "1 per process using the GPU (host PID), with its hub user, "
                                  "server (named or \"\", her default one) and container "
                                  "where known.",
                                  labels=[*GPU, "pid", "user", "server", "container"])
        for g in snap.gpus:
            for p in g.processes or ():
                procs.add_metric([*_gpu_labels(g), str(p.pid), p.user or "", p.server or "",
                                  p.container or ""], 1.0)
        fams.append(procs)
    return fams


def _single(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


class GpuCollector:
    """A prometheus_client collector over the latest snapshot from ``source``."""

    def __init__(self, source: Callable[[], Snapshot], process_info: bool = False) -> None:
        self.source = source
        self.process_info = process_info

    def describe(self) -> Iterable[Metric]:
        return []  # no collect() at register time

    def collect(self) -> Iterable[Metric]:
        yield from build_families(self.source(), self.process_info)
