"""The CUDA single-user image, proven on a host with no GPU: `make
test-cuda-image` builds it (gpulab/singleuser:cuda, from its lock) and runs this.

In the image, as a member's server runs it (uid 1000, no network): torch is a CUDA build
whose CUDA is that of NVIDIA's runtime wheels beside it; cuDNN, cuBLAS and NCCL load and
say their versions; without a GPU, torch says why (no driver) and the autograd walkthroughs
give their exact gradients on the CPU. What needs a GPU (CUDA kernels, the leased GPU alone
visible) is scripts/gpu-host-check.sh's, wherever one is lent."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.autograd_cell import AUTOGRAD_CELL, check_result

pytestmark = pytest.mark.cuda_image

IMAGE = os.environ.get("GPULAB_CUDA_IMAGE", "gpulab/singleuser:cuda")
PROBE = Path(__file__).with_name("probe.py")
LOCK = Path(__file__).resolve().parents[2] / "images/singleuser/requirements-cuda.lock"


def run_in_image(*argv: str, volumes: tuple[str, ...] = ()) -> str:
    mounts = [x for v in volumes for x in ("-v", v)]
    out = subprocess.run(["docker", "run", "--rm", "--network", "none", "--user", "1000:1000",
                          *mounts, IMAGE, *argv], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def report() -> dict:
    present = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True)
    if present.returncode != 0:
        pytest.fail(f"{IMAGE} is not on this Docker engine: build it with `make cuda-image` "
                    "(or run `make test-cuda-image`)")
    found = json.loads(run_in_image("python", "/tmp/probe.py",
                                    volumes=(f"{PROBE}:/tmp/probe.py:ro",)).splitlines()[-1])
    print(json.dumps(found, indent=1))
    return found


def locked(name: str) -> str:
    for line in LOCK.read_text().splitlines():
        if line.startswith(f"{name}==="):
            return line.split("===")[1].split()[0]
    raise AssertionError(f"{name} is not in {LOCK}")


def test_torch_is_a_cuda_build_of_the_cuda_its_runtime_wheels_carry(report):
    assert report["torch"].startswith(locked("torch") + "+cu"), report["torch"]
    cuda = report["torch_cuda"]
    assert cuda, "torch.version.cuda is None: a CPU build"
    runtime = report["wheels"]["nvidia-cuda-runtime"]
    assert runtime == locked("nvidia-cuda-runtime")
    assert runtime.split(".")[:2] == cuda.split("."), (runtime, cuda)
    assert report["wheels"]["cuda-toolkit"].split(".")[:2] == cuda.split(".")


def test_cudnn_cublas_and_nccl_load_and_are_the_locked_ones(report):
    cudnn = report["cudnn"]
    assert isinstance(cudnn, int), cudnn  # e.g. 92000 for 9.20.0
    major, minor = locked("nvidia-cudnn-cu13").split(".")[:2]
    assert cudnn // 10000 == int(major) and cudnn // 100 % 100 == int(minor), cudnn
    assert report["nccl"] == locked("nvidia-nccl-cu13"), report["nccl"]
    cublas = report["cublas"]
    assert isinstance(cublas, dict), cublas
    assert locked("nvidia-cublas").startswith(cublas["version"] + "."), cublas


def test_without_a_gpu_torch_says_why_and_autograd_runs_on_the_cpu(report):
    assert report["cuda_available"] is False
    assert "no NVIDIA driver" in report["cuda_init"], report["cuda_init"]
    cell = run_in_image("python", "-c", AUTOGRAD_CELL)
    check_result(json.loads(cell.splitlines()[-1]), "cpu")


def test_its_torch_takes_the_memory_cap_the_spawner_sets_on_a_shared_gpu():
    """The cap (gpulab.gpus.sharing) held on a lent H200 with torch 2.11; members' torch is
    this image's. Its allocator config parser refuses a key it does not know, so a cap it
    would ignore fails here, without a GPU."""
    from gpulab.gpus.sharing import ALLOC_CONF, FRACTION, IMAGE_LABEL, alloc_conf

    # the label by which the hub knows this image's torch takes it
    labels = json.loads(subprocess.run(
        ["docker", "image", "inspect", "-f", "{{json .Config.Labels}}", IMAGE],
        capture_output=True, text=True, check=True).stdout)
    assert labels.get(IMAGE_LABEL) == FRACTION, labels
    check = ("import torch\n"
             "torch._C._accelerator_setAllocatorSettings({!r})\n"
             "print('taken')\n")
    assert run_in_image("python", "-c", check.format(alloc_conf(2)[ALLOC_CONF])) == "taken\n"
    refused = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", IMAGE, "python", "-c",
         check.format("per_process_memory_share:0.5")], capture_output=True, text=True,
        timeout=300)
    assert refused.returncode != 0 and "Unrecognized key" in refused.stderr, refused


def test_what_the_image_weighs_and_what_takes_it():
    """Printed for the record (the closing note); asserted: the CUDA libraries are the
    weight, and PyTorch's own C++ test programs are not in it."""
    size = int(subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", IMAGE],
                              capture_output=True, text=True, check=True).stdout)
    du = run_in_image("bash", "-c", "cd /opt/venv/lib/python3.11/site-packages && "
                      "du -sm nvidia/* torch triton | sort -rn; ls torch/test 2>&1 | head -1")
    print(f"{IMAGE}: {size / 1e9:.2f} GB\n{du}")
    sizes = {line.split()[1]: int(line.split()[0]) for line in du.splitlines()
             if line[:1].isdigit()}
    assert "No such file" in du  # torch/test removed by the Dockerfile
    assert max(sizes, key=sizes.get) in ("nvidia/cu13", "torch"), sizes
    assert sum(sizes.values()) * 1e6 > 0.7 * size  # these are most of the image
