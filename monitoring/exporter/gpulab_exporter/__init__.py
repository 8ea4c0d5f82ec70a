"""gpulab's GPU exporter: one NVML poller thread, a Prometheus collector built from its
latest snapshot, and a small JSON API for the operators' dashboard."""

__version__ = "0.1.0"
