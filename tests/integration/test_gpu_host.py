"""On a host with NVIDIA GPUs: a spawned server sees exactly its leased GPUs, for real.

Skipped where there is no NVIDIA driver (CPU hosts, CI): test_gpu_leases.py covers the
plumbing there with a stand-in hook. Here nothing is stood in: the NVIDIA container
toolkit injects the devices, and CUDA inside the container must see exactly the GPUs
the hub leased (by UUID), no more.
"""

from __future__ import annotations

import json

import pytest

from .stack import docker, host_has_nvidia_gpu

pytestmark = [
    pytest.mark.gpu_host,
    pytest.mark.skipif(not host_has_nvidia_gpu(),
                       reason="no NVIDIA GPU on this host (nvidia-smi -L finds none)"),
]

CUDA_CELL = r'''
import json, torch
print(json.dumps({
    "count": torch.cuda.device_count(),
    "uuids": ["GPU-" + str(torch.cuda.get_device_properties(i).uuid)
              for i in range(torch.cuda.device_count())],
}))
'''


def test_container_sees_exactly_its_leased_gpus(hub, lab_user):
    user = lab_user("gpu")
    user.start_server({"gpus": 1})
    info = json.loads(docker("inspect", user.container))[0]
    leased = info["Config"]["Labels"]["org.gpulab.gpus"].split(",")
    assert len(leased) == 1 and leased[0].startswith("GPU-")
    seen = json.loads(user.run_code(CUDA_CELL).strip().splitlines()[-1])
    assert seen["count"] == len(leased)
    assert seen["uuids"] == leased
