"""test_exporter_gpu_host.py may skip for one reason only: there is no GPU here. On a
host with a GPU, a missing torch (or NVML, or CUDA in torch) fails it, also under CI's
rule (tests/conftest.py: a skip passes CI only as "[real GPU] ..."). The GPU host is
simulated with FakeLibNvml under the real pynvml; torch is made absent."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REAL_GPU
from tests.unit import test_exporter_gpu_host as gpu_host

ROOT = Path(__file__).resolve().parents[2]
HOST_TEST = "tests/unit/test_exporter_gpu_host.py"


def run_host_test(tmp_path: Path, plugin: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "simulated_host.py").write_text(textwrap.dedent(plugin))
    env = {**os.environ, "CI": "true",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), str(ROOT / "monitoring/exporter"),
                                          os.environ.get("PYTHONPATH", "")])}
    env.pop("GPULAB_GPU_HOST", None)  # the plugin alone says whether a GPU is here
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "simulated_host", "-rA", *args, HOST_TEST],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


GPU_WITHOUT_TORCH = """
    import sys

    from gpulab_exporter.fake_nvml import FakeGpu, FakeLibNvml

    sys.modules["torch"] = None  # import torch: ImportError, as where it is not installed
    INSTALLED = FakeLibNvml([FakeGpu(0)]).installed()  # kept: its exit puts pynvml back
    INSTALLED.__enter__()  # NVML answers: a GPU is here
"""


def test_a_gpu_host_without_torch_fails_under_ci(tmp_path):
    done = run_host_test(tmp_path, GPU_WITHOUT_TORCH)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "1 failed, 1 passed" in out, out
    assert "FAILED tests/unit/test_exporter_gpu_host.py::test_utilization_rises_under_matmul_load" in out
    assert "torch is not installed on this GPU host" in out


def test_without_a_gpu_both_tests_skip_as_ci_allows(tmp_path):
    done = run_host_test(tmp_path, """
        import pynvml
        from gpulab_exporter.fake_nvml import FakeLibNvml

        class NoDriver(FakeLibNvml):
            def __init__(self):
                super().__init__([], codes={"nvmlInitWithFlags": pynvml.NVML_ERROR_DRIVER_NOT_LOADED})

        INSTALLED = NoDriver().installed()
        INSTALLED.__enter__()
    """)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "2 skipped" in out and out.count(f"{REAL_GPU}no NVIDIA GPU on this host") == 2, out
    assert "NVMLError_DriverNotLoaded" in out, out


def test_the_script_says_a_gpu_is_here(monkeypatch):
    """gpu-host-check.sh runs the test after nvidia-smi answered: a skip is a failure."""
    monkeypatch.setenv("GPULAB_GPU_HOST", "1")
    with pytest.raises(pytest.fail.Exception, match="GPULAB_GPU_HOST=1"):
        gpu_host.no_gpu_here("NVML init failed: NVMLError_LibraryNotFound")
    script = (ROOT / "scripts" / "gpu-host-check.sh").read_text().replace("\\\n", "")
    step = next(line for line in script.splitlines() if "test_exporter_gpu_host.py" in line
                and line.startswith("step "))
    assert "env GPULAB_GPU_HOST=1 python3 -m pytest" in step and "--noconftest" in step


def test_nvml_failing_where_the_driver_shows_a_gpu_fails(monkeypatch):
    monkeypatch.delenv("GPULAB_GPU_HOST", raising=False)
    monkeypatch.setattr(gpu_host, "gpu_traces", lambda: ["/dev/nvidia0"])
    with pytest.raises(pytest.fail.Exception, match="this host has an NVIDIA GPU"):
        gpu_host.no_gpu_here("NVML init failed: NVMLError_LibraryNotFound")
    monkeypatch.setattr(gpu_host, "gpu_traces", lambda: [])
    with pytest.raises(pytest.skip.Exception, match=r"^\[real GPU\] no NVIDIA GPU"):
        gpu_host.no_gpu_here("NVML init failed: NVMLError_LibraryNotFound")


def test_the_gpu_host_test_imports_nothing_of_the_hub(tmp_path):
    """Run as scripts/gpu-host-check.sh runs it (--noconftest), with JupyterHub and the
    hub's package made unimportable, as on a lent GPU machine: it still runs."""
    done = run_host_test(tmp_path, """
        import sys

        class NoHub:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("jupyterhub", "gpulab", "sqlalchemy", "tornado"):
                    raise ImportError(f"{name} is not installed on the GPU host")

        sys.meta_path.insert(0, NoHub())
        sys.modules["torch"] = None
    """, "--noconftest")
    out = done.stdout + done.stderr
    # no GPU here, so both skip; what matters is that collection imported no hub module
    assert done.returncode == 0 and "2 skipped" in out, out
