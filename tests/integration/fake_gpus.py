"""The exporter's FAKE GPUs (`make test` on hosts without GPUs: --fake-gpus 2), read and
steered by the tests through its fake-NVML control file (``--fake-control``)."""

from __future__ import annotations

import json

from .stack import docker

FAKE_CONTROL = "/dev/shm/gpulab-fake-nvml.json"  # the exporter's --fake-control default


def exporter_snapshot() -> dict:
    """The exporter's /api/gpus, read from inside the hub container (the exporter sits on
    the internal monitoring network, which the host and user containers are not on)."""
    return json.loads(docker(
        "exec", "gpulab-hub", "python3", "-c",
        "import urllib.request; print(urllib.request.urlopen("
        "'http://exporter:9445/api/gpus', timeout=10).read().decode())"))


def write_fake_control(data: dict | None) -> None:
    """Steer the exporter's FAKE GPUs (None: back to healthy fakes with no processes)."""
    script = ("import os, sys; path = sys.argv[1]\n"
              "if sys.argv[2] == 'null': os.path.exists(path) and os.remove(path)\n"
              "else: open(path + '.tmp', 'w').write(sys.argv[2]); os.replace(path + '.tmp', path)")
    docker("exec", "gpulab-exporter", "python3", "-c", script, FAKE_CONTROL, json.dumps(data))
