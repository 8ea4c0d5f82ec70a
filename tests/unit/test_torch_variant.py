"""The single-user image's torch is the build its variant (TORCH_VARIANT) asks for.

A local build such as ``torch-2.13.0+cpu`` meets ``torch==2.13.0``, and this kind of
machine's pip configuration has a find-links folder that holds one: the CUDA variant
could silently carry a CPU build. Three guards, each tested without Docker or a
registry: the pin (``===``, here), scripts/lock.py refusing a local build for a public pin
(tests/unit/test_lock.py, with a real pip; the locks then hold each wheel's hash), and the
image build's own check of ``torch.version.cuda`` (here).

(Named test_exporter_* only because of how this change's files were scoped; it is about
the single-user image.)"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
SINGLEUSER = ROOT / "images" / "singleuser"


def torch_requirement(variant: str) -> Requirement:
    lines = (SINGLEUSER / f"requirements-{variant}.txt").read_text().splitlines()
    (req,) = [Requirement(line) for line in lines if line.strip().startswith("torch")]
    return req


def test_the_cuda_pin_admits_only_the_build_from_the_index():
    spec = torch_requirement("cuda").specifier
    assert spec.contains("2.13.0")
    for local in ("2.13.0+cpu", "2.13.0+cu126", "2.13.0+rocm6.4"):
        assert not spec.contains(local), f"requirements-cuda.txt's {spec} admits {local}"


def test_the_cpu_pin_admits_only_the_cpu_build():
    spec = torch_requirement("cpu").specifier
    assert spec.contains("2.13.0+cpu") and not spec.contains("2.13.0")


# -- the image build's check (images/singleuser/Dockerfile) ------------------------------
def dockerfile_check() -> str:
    """The Python program of the Dockerfile's RUN that checks torch.version.cuda, with
    continuation lines joined as Docker joins them."""
    text = (SINGLEUSER / "Dockerfile").read_text().replace("\\\n", "")
    runs = [line for line in text.splitlines()
            if line.startswith("RUN ") and "torch.version.cuda" in line]
    assert len(runs) == 1, "no RUN in the Dockerfile checks torch.version.cuda"
    match = re.fullmatch(r'RUN /opt/venv/bin/python -B -c "(.*)"', runs[0])
    assert match, runs[0]
    return match.group(1)


@pytest.mark.parametrize(("variant", "version", "cuda", "ok"), [
    ("cuda", "2.13.0", "13.0", True),
    ("cuda", "2.13.0+cpu", None, False),
    ("cpu", "2.13.0+cpu", None, True),
    ("cpu", "2.13.0", "13.0", False),
])
def test_the_image_build_fails_on_the_wrong_torch_build(tmp_path, variant, version, cuda, ok):
    fake = tmp_path / "torch"  # a stand-in torch package: only what the check reads
    fake.mkdir()
    (fake / "__init__.py").write_text(f"from . import version\n__version__ = {version!r}\n")
    (fake / "version.py").write_text(f"cuda = {cuda!r}\n")
    done = subprocess.run([sys.executable, "-B", "-c", dockerfile_check()],
                          env={**os.environ, "TORCH_VARIANT": variant, "PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode == 0) == ok, done.stdout + done.stderr
    assert f"[gpulab] TORCH_VARIANT={variant}: torch {version}" in done.stdout
    if not ok:
        assert f"requirements-{variant}.txt" in done.stderr and "===" in done.stderr
