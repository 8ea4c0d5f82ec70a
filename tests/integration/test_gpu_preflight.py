"""make up's GPU preflight (scripts/gpu-preflight.sh) against the real Docker engine.

On a GPU host, `make up` first starts a probe container the way the hub starts members'
servers (one GPU by UUID, unprivileged, no capabilities) and looks for that GPU inside.
This host has no GPU; its dockerd has the STAND-IN hook (tests/gpu_standin), which
accepts GPU requests and injects nothing: exactly what a toolkit that ignores gpulab's
requests does (NVIDIA_VISIBLE_DEVICES refused for unprivileged containers), whose
servers would start without their GPUs and no error. The host side is a STAND-IN
nvidia-smi that answers the preflight's questions as a driver 580 host with one GPU.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from ..conftest import REAL_GPU
from .stack import REPO, host_has_nvidia_gpu
from .standin import GPU0, dockerd_has_nvidia_driver

STANDIN_NVIDIA_SMI = f"""#!/bin/sh
# STAND-IN nvidia-smi (tests/integration/test_gpu_preflight.py): a driver 580 host with
# one GPU, for the questions scripts/gpu-preflight.sh asks. Nothing here is a GPU.
case "$*" in
  *driver_version*) echo 580.82.07 ;;
  *uuid*) echo {GPU0} ;;
  *compute_cap*) echo 9.0 ;;
  *-L*) echo "GPU 0: stand-in (UUID: {GPU0})" ;;
  *) exit 9 ;;
esac
"""


def test_a_host_whose_gpu_containers_get_no_gpu_is_refused_with_the_reason(hub, tmp_path):
    if host_has_nvidia_gpu():
        pytest.skip(f"{REAL_GPU}this host has real GPUs: make up's own preflight covers it")
    assert dockerd_has_nvidia_driver(), "dockerd lacks the stand-in hook (scripts/test-host.sh)"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(STANDIN_NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    out = subprocess.run([str(REPO / "scripts" / "gpu-preflight.sh"),
                          "gpulab/singleuser:latest"], capture_output=True, text=True,
                         timeout=180, env={**os.environ,
                                           "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert f"a container started with GPU {GPU0} has no GPU inside" in out.stderr, out.stderr
    assert "Members' servers would start without their GPUs" in out.stderr
    assert "nothing was started" in out.stderr
