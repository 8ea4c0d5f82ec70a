"""Stand-in GPUs for hosts without one: the inventory an admin would declare, and what a
container got. The UUIDs are the ones the exporter's --fake-gpus reports, so the lease
labels, the exporter and the dashboard all agree about which GPU is which."""

from __future__ import annotations

import json
import subprocess

from .stack import docker

GPU0 = "GPU-fa4e0000-0000-4000-8000-000000000000"  # the exporter's --fake-gpus UUIDs
GPU1 = "GPU-fa4e0000-0000-4000-8000-000000000001"
# fake GPU 1's MIG devices where the exporter's control file puts it in MIG mode
# ({"mig": {"1": 2}}; gpulab_exporter.fake_nvml.mig_uuid)
MIG10 = "MIG-fa4e0000-0000-4000-8001-000001000000"
MIG11 = "MIG-fa4e0000-0000-4000-8001-000001000001"
STANDIN_GPUS = f"""
inventory:
  - {{index: 0, uuid: {GPU0}, model: stand-in}}
  - {{index: 1, uuid: {GPU1}, model: stand-in}}
defaults:
  gpus: 0
  max_gpus: 1
"""



def dockerd_has_nvidia_driver() -> bool:
    probe = subprocess.run(["docker", "run", "--rm", "--gpus", "all", "gpulab/base:bookworm",
                            "true"], capture_output=True, text=True, timeout=60)
    return probe.returncode == 0



def gpus_of(container: str) -> dict:
    info = json.loads(docker("inspect", container))[0]
    requests = info["HostConfig"]["DeviceRequests"] or []
    return {
        "device_ids": [d for r in requests for d in r["DeviceIDs"]],
        "env": docker("exec", container, "printenv", "NVIDIA_VISIBLE_DEVICES"),
        "label": info["Config"]["Labels"]["org.gpulab.gpus"],
    }


def memory_cap(container: str) -> str:
    """PyTorch's memory cap in a server on a shared GPU (gpulab.gpus.sharing), "" for
    none."""
    env = json.loads(docker("inspect", container))[0]["Config"]["Env"]
    return dict(e.split("=", 1) for e in env).get("PYTORCH_CUDA_ALLOC_CONF", "")


