"""--fake-uuids: fake GPUs with UUIDs of their own, so that the exporters of several
machines (a Swarm's nodes, or the multi-node monitoring test) do not report the same
GPUs. Without it the fakes keep today's UUIDs (fake_uuid(index))."""

import subprocess
import sys

import pytest

from gpulab_exporter.cli import build_parser
from gpulab_exporter.fake_nvml import FakeNvml, fake_uuid

A, B = "GPU-fa4e0100-0000-4000-8000-000000000000", "GPU-fa4e0100-0000-4000-8000-000000000001"


def uuids_of(nvml):
    nvml.init()
    return [nvml.uuid(nvml.device(i)) for i in range(nvml.device_count())]


@pytest.mark.parametrize("count,uuids,expected", [
    (2, (), [fake_uuid(0), fake_uuid(1)]),  # today's fakes
    (2, (A, B), [A, B]),
    (1, (B,), [B]),
    (0, (), []),
])
def test_demo_uuids(count, uuids, expected):
    assert uuids_of(FakeNvml.demo(count, uuids=uuids)) == expected


@pytest.mark.parametrize("count,uuids,error", [
    (2, (A,), "2 fake GPUs need 2 UUIDs, got 1"),
    (1, (A, B), "1 fake GPUs need 1 UUIDs, got 2"),
    (2, (A, A), "must differ"),
])
def test_demo_refuses_wrong_uuids(count, uuids, error):
    with pytest.raises(ValueError, match=error):
        FakeNvml.demo(count, uuids=uuids)


@pytest.mark.parametrize("argv,expected", [
    ([], ()),
    (["--fake-uuids", f"{A},{B}"], (A, B)),
    (["--fake-uuids", f" {A} , {B} "], (A, B)),
])
def test_parse_fake_uuids(argv, expected):
    assert build_parser().parse_args(["--fake-gpus", "2", *argv]).fake_uuids == expected


@pytest.mark.parametrize("argv,error", [
    (["--fake-gpus", "2", "--fake-uuids", f"{A},"], "without empty ones"),
    (["--fake-gpus", "2", "--fake-uuids", A], "2 fake GPUs need 2 UUIDs, got 1"),
    (["--fake-uuids", A], "--fake-uuids needs --fake-gpus"),
])
def test_console_script_refuses_wrong_uuids(argv, error):
    p = subprocess.run([sys.executable, "-m", "gpulab_exporter", "--docker-url", "none",
                        "--listen", "127.0.0.1:1", *argv],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and error in p.stderr, p.stderr
