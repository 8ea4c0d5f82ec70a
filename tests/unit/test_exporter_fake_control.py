"""FakeNvml's control file (--fake-control): what a test writes to put host processes
on fake GPUs and lose a fake GPU while the exporter runs, read through the real Poller
and registry, with a fake /proc whose cgroup files name containers."""

import json
import logging
import os

import pytest

from gpulab_exporter.attribution import Container, StaticContainerDirectory
from gpulab_exporter.cli import FAKE_CONTROL, build_parser
from gpulab_exporter.fake_nvml import Control, FakeNvml, fake_uuid, parse_control
from gpulab_exporter.nvml import GpuProcess
from gpulab_exporter.server import make_registry
from gpulab_exporter.snapshot import Poller

GiB = 1 << 30
ANN = "a" * 64


def gpu(i):
    return {"gpu": str(i), "uuid": fake_uuid(i)}


@pytest.fixture
def proc(tmp_path):
    """A fake /proc: host PID 4242 runs in ann's container (cgroup v1, as dockerd's
    cgroupfs driver writes it), 77 on the host."""
    root = tmp_path / "proc"
    for pid, text in {4242: f"4:memory:/docker/{ANN}\n0::/docker/{ANN}\n",
                      77: "0::/init.scope\n"}.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(text)
    return str(root)


@pytest.fixture
def control(tmp_path):
    path = tmp_path / "fake-nvml.json"

    def write(data):
        path.write_text(data if isinstance(data, str) else json.dumps(data))

    write.path = str(path)
    return write


def poller(control, proc):
    directory = StaticContainerDirectory([Container(ANN, "gpulab-user-ann", "ann", "",
                                                    (fake_uuid(0),))])
    # process_interval 0: every poll is a slow cycle (processes and containers re-read)
    return Poller(FakeNvml.demo(2, control=control.path), directory=directory, proc=proc,
                  interval=1, process_interval=0)


def test_a_process_put_on_a_fake_gpu_is_attributed_through_proc(control, proc):
    control({"processes": {"0": [[4242, 3 * GiB], [77, GiB]]}})
    p = poller(control, proc)
    reg = make_registry(p)
    p.poll()
    v = reg.get_sample_value
    assert v("gpulab_gpu_user_memory_used_bytes", {**gpu(0), "user": "ann"}) == 3 * GiB
    assert v("gpulab_gpu_memory_used_bytes", gpu(0)) == 4 * GiB  # the sum of its processes
    assert v("gpulab_gpu_memory_used_bytes", gpu(1)) == 0
    g0 = p.latest.to_json()["gpus"][0]
    assert [(q["pid"], q["user"], q["container"]) for q in g0["processes"]] == [
        (4242, "ann", "gpulab-user-ann"), (77, None, None)]


def test_a_fake_gpu_marked_lost_is_down_and_comes_back_when_unmarked(control, proc):
    p = poller(control, proc)
    reg = make_registry(p)
    p.poll()  # healthy first, so that the exporter knows the lost GPU's UUID
    control({"lost": [1]})
    p.poll()
    assert reg.get_sample_value("gpulab_gpu_up", gpu(1)) == 0
    assert reg.get_sample_value("gpulab_gpu_up", gpu(0)) == 1  # the other keeps reporting
    assert reg.get_sample_value("gpulab_gpu_temperature_celsius", gpu(0)) is not None
    assert "GpuIsLost" in p.latest.gpus[1].error

    control({})
    p.poll()
    assert reg.get_sample_value("gpulab_gpu_up", gpu(1)) == 1


def test_missing_file_means_no_processes_and_nothing_lost(control, proc):
    control({"processes": {"0": [[4242, GiB]]}, "lost": [0]})
    p = poller(control, proc)
    p.poll()
    assert not p.latest.gpus[0].up
    os.unlink(control.path)
    p.poll()
    assert p.latest.gpus[0].up and p.latest.gpus[0].processes == ()


@pytest.mark.parametrize("bad, why", [
    ("{not json", "Expecting property name"),
    ({"lost": [2]}, "no fake GPU 2 (there are 2)"),
    ({"lost": [True]}, "no fake GPU True"),
    ({"lost": 1}, "lost: expected a list"),
    ({"processes": {"x": []}}, "no fake GPU 'x'"),
    ({"processes": {"0": [[4242]]}}, "processes of GPU 0: expected [[PID, BYTES], ...]"),
    ({"processes": {"0": [[4242, -1]]}}, "processes of GPU 0"),
    ({"processes": [[4242, 1]]}, "processes: expected"),
    ({"procs": {}}, 'expected {"processes"'),
])
def test_a_bad_control_file_is_logged_once_and_the_last_good_stays(control, proc, caplog,
                                                                    bad, why):
    control({"processes": {"0": [[4242, GiB]]}, "lost": [1]})
    p = poller(control, proc)
    p.poll()
    control(bad)
    with caplog.at_level(logging.WARNING, logger="gpulab_exporter.fake_nvml"):
        p.poll()
        p.poll()
    warnings = [r.getMessage() for r in caplog.records if "control file ignored" in r.getMessage()]
    assert len(warnings) == 1 and why in warnings[0], warnings
    assert p.latest.gpus[0].processes[0].pid == 4242 and not p.latest.gpus[1].up


def test_parse_control_table():
    assert parse_control({}, 2) == Control()
    assert parse_control({"processes": {"1": [[5, 6]]}, "lost": ["0"],
                          "utilization": {"1": 80}}, 2) == Control(
        {1: [GpuProcess(5, 6)]}, frozenset({0}), {1: 80})
    assert parse_control({"mig": {"1": 3}, "processes": {"1:2": [[5, 6]]}}, 2) == Control(
        {(1, 2): [GpuProcess(5, 6)]}, mig={1: 3})
    for bad in ({"utilization": {"0": 101}}, {"utilization": {"0": "busy"}},
                {"utilization": {"2": 5}}, {"utilization": [0]}, {"mig": {"0": 8}},
                {"mig": {"0": 0}}, {"processes": {"0:0": [[5, 6]]}},
                {"mig": {"0": 2}, "processes": {"0:2": [[5, 6]]}}, {"mig": {"0": True}}):
        with pytest.raises(ValueError):
            parse_control(bad, 2)


def test_held_utilization_overrides_the_demo_load(tmp_path):
    control = tmp_path / "control.json"
    nvml = FakeNvml.demo(2, animate=True, control=str(control))
    control.write_text('{"utilization": {"0": 0, "1": 80}}')
    nvml.init()
    nvml.device_count()
    assert [nvml.utilization_percent(nvml.device(i)) for i in (0, 1)] == [0, 80]
    control.write_text("{}")
    nvml.device_count()
    assert nvml.gpus[0].held_utilization is None  # the demo load decides again


def test_the_cli_reads_the_control_file_only_with_fake_gpus_by_default_path():
    args = build_parser().parse_args(["--fake-gpus", "2"])
    assert args.fake_control == FAKE_CONTROL == "/dev/shm/gpulab-fake-nvml.json"
    assert build_parser().parse_args(["--fake-control", ""]).fake_control == ""
