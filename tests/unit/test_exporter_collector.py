"""The collector against FakeNvml: a fresh CollectorRegistry per test, values read with
get_sample_value (None for series that must be absent)."""

import logging

import pynvml
import pytest

from gpulab_exporter.attribution import Container, StaticContainerDirectory
from gpulab_exporter.fake_nvml import FakeGpu, FakeNvml, fake_uuid
from gpulab_exporter.nvml import GpuProcess
from gpulab_exporter.server import make_registry
from gpulab_exporter.snapshot import Poller

GiB = 1 << 30
ANN = "a" * 64
BOB = "b" * 64
STRANGER = "c" * 64  # a container the hub did not spawn


def gpu(i):
    return {"gpu": str(i), "uuid": fake_uuid(i)}


class Clock:
    def __init__(self, t=1_800_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def proc(tmp_path):
    """A fake /proc with cgroup files: 101/102 in ann's container (v2 systemd),
    201 in bob's (v1), 301 in a non-hub container, 401 on the host."""
    cgroups = {
        101: f"0::/system.slice/docker-{ANN}.scope\n",
        102: f"0::/../../system.slice/docker-{ANN}.scope\n",
        201: f"11:memory:/docker/{BOB}\n1:name=systemd:/docker/{BOB}\n",
        301: f"0::/docker/{STRANGER}\n",
        401: "0::/user.slice/user-0.slice/session-1.scope\n",
    }
    for pid, text in cgroups.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    return str(tmp_path)


def scrape(poller, process_info=False):
    poller.poll()
    return make_registry(poller, process_info=process_info)


def test_multi_gpu_values_in_base_units():
    nvml = FakeNvml([
        FakeGpu(0, utilization_percent=42, memory_total=80 * GiB, memory_used=20 * GiB,
                temperature_celsius=61, power_milliwatts=312_500, energy_millijoules=7_000_500,
                clock_sm_mhz=1410, clock_memory_mhz=1593, fan_speed_percent=55,
                ecc_corrected=3, ecc_uncorrected=1),
        FakeGpu(1, name="NVIDIA A100 (fake)"),
        FakeGpu(2),
    ])
    reg = scrape(Poller(nvml))
    v = reg.get_sample_value
    assert v("gpulab_exporter_nvml_up") == 1
    assert v("gpulab_exporter_gpus") == 3
    assert v("gpulab_exporter_info", {"version": "0.1.0", "driver": "000.00 (fake)",
                                       "backend": "fake"}) == 1
    for i in range(3):
        assert v("gpulab_gpu_up", gpu(i)) == 1
    assert v("gpulab_gpu_info", {**gpu(1), "model": "NVIDIA A100 (fake)"}) == 1
    assert v("gpulab_gpu_utilization_ratio", gpu(0)) == pytest.approx(0.42)
    assert v("gpulab_gpu_memory_used_bytes", gpu(0)) == 20 * GiB
    assert v("gpulab_gpu_memory_total_bytes", gpu(0)) == 80 * GiB
    assert v("gpulab_gpu_memory_free_bytes", gpu(0)) == 60 * GiB
    assert v("gpulab_gpu_temperature_celsius", gpu(0)) == 61
    assert v("gpulab_gpu_power_watts", gpu(0)) == pytest.approx(312.5)
    assert v("gpulab_gpu_energy_joules_total", gpu(0)) == pytest.approx(7000.5)
    assert v("gpulab_gpu_clock_sm_hertz", gpu(0)) == 1410e6
    assert v("gpulab_gpu_clock_memory_hertz", gpu(0)) == 1593e6
    assert v("gpulab_gpu_fan_speed_ratio", gpu(0)) == pytest.approx(0.55)
    assert v("gpulab_gpu_ecc_errors_total", {**gpu(0), "type": "corrected"}) == 3
    assert v("gpulab_gpu_ecc_errors_total", {**gpu(0), "type": "uncorrected"}) == 1
    # model only on the info metric
    assert v("gpulab_gpu_up", {**gpu(0), "model": "NVIDIA H200 (fake)"}) is None
    assert v("gpulab_gpu_energy_joules_created", gpu(0)) is None


def test_unsupported_fields_are_absent_not_zero():
    nvml = FakeNvml([FakeGpu(0, unsupported={"fan", "ecc", "energy", "power"}), FakeGpu(1)])
    reg = scrape(Poller(nvml))
    v = reg.get_sample_value
    assert v("gpulab_gpu_up", gpu(0)) == 1
    assert v("gpulab_gpu_fan_speed_ratio", gpu(0)) is None
    assert v("gpulab_gpu_power_watts", gpu(0)) is None
    assert v("gpulab_gpu_energy_joules_total", gpu(0)) is None
    assert v("gpulab_gpu_ecc_errors_total", {**gpu(0), "type": "corrected"}) is None
    assert v("gpulab_gpu_temperature_celsius", gpu(0)) == 35  # others on the GPU stay
    assert v("gpulab_gpu_fan_speed_ratio", gpu(1)) == pytest.approx(0.3)


def test_no_permission_and_not_found_are_absent_too():
    class Picky(FakeNvml):
        def temperature_celsius(self, handle):
            raise pynvml.NVMLError_NoPermission()

        def clock_sm_mhz(self, handle):
            raise pynvml.NVMLError_NotFound()

    reg = scrape(Poller(Picky([FakeGpu(0)])))
    assert reg.get_sample_value("gpulab_gpu_temperature_celsius", gpu(0)) is None
    assert reg.get_sample_value("gpulab_gpu_clock_sm_hertz", gpu(0)) is None
    assert reg.get_sample_value("gpulab_gpu_up", gpu(0)) == 1


def test_gpu_lost_mid_scrape_marks_only_that_gpu_down(caplog):
    nvml = FakeNvml([FakeGpu(0), FakeGpu(1, lost_after=3), FakeGpu(2)])
    poller = Poller(nvml)
    with caplog.at_level(logging.WARNING):
        reg = scrape(poller)
    v = reg.get_sample_value
    assert v("gpulab_exporter_nvml_up") == 1
    assert v("gpulab_gpu_up", gpu(0)) == 1
    assert v("gpulab_gpu_up", gpu(1)) == 0  # identity read before it went, so uuid known
    assert v("gpulab_gpu_up", gpu(2)) == 1
    assert v("gpulab_gpu_utilization_ratio", gpu(1)) is None
    assert v("gpulab_gpu_memory_used_bytes", gpu(1)) is None
    assert v("gpulab_gpu_memory_used_bytes", gpu(2)) == 0
    assert "GpuIsLost" in caplog.text
    assert poller.latest.gpus[1].error.startswith("NVMLError_GpuIsLost")


def test_gpu_lost_later_keeps_its_uuid_from_earlier_cycles():
    nvml = FakeNvml([FakeGpu(0), FakeGpu(1)])
    poller = Poller(nvml)
    poller.poll()
    nvml.gpus[1].lost_after = 0  # every read now fails, even the UUID
    reg = scrape(poller)
    assert reg.get_sample_value("gpulab_gpu_up", gpu(1)) == 0
    assert reg.get_sample_value("gpulab_gpu_info", {**gpu(1), "model": "NVIDIA H200 (fake)"}) == 1


@pytest.mark.parametrize("error", [pynvml.NVMLError_Unknown, pynvml.NVMLError_ResetRequired])
def test_other_per_gpu_failures(error):
    class Broken(FakeNvml):
        def utilization_percent(self, handle):
            if handle.index == 0:
                raise error()
            return super().utilization_percent(handle)

    reg = scrape(Poller(Broken([FakeGpu(0), FakeGpu(1)])))
    assert reg.get_sample_value("gpulab_gpu_up", gpu(0)) == 0
    assert reg.get_sample_value("gpulab_gpu_up", gpu(1)) == 1


@pytest.mark.parametrize("error", [pynvml.NVMLError_LibraryNotFound,
                                   pynvml.NVMLError_DriverNotLoaded])
def test_nvml_absent_keeps_exporting_health_and_retries(error, caplog):
    clock = Clock()
    nvml = FakeNvml([FakeGpu(0)], init_error=error)
    poller = Poller(nvml, clock=clock)
    with caplog.at_level(logging.WARNING):
        reg = scrape(poller)
    v = reg.get_sample_value
    assert v("gpulab_exporter_nvml_up") == 0
    assert v("gpulab_exporter_gpus") == 0
    assert v("gpulab_exporter_last_success_timestamp_seconds") is None
    assert v("gpulab_exporter_collection_duration_seconds") is not None
    assert v("gpulab_gpu_up", gpu(0)) is None
    assert error.__name__ in caplog.text
    assert poller.latest.nvml_error.startswith(error.__name__)

    poller.poll()  # still absent: retried, and logged once, not every cycle
    assert nvml.init_calls == 2
    assert caplog.text.count(error.__name__) == 1

    nvml.init_error = None  # the driver comes back
    clock.t += 5
    reg = scrape(poller)
    assert reg.get_sample_value("gpulab_exporter_nvml_up") == 1
    assert reg.get_sample_value("gpulab_gpu_up", gpu(0)) == 1
    assert reg.get_sample_value("gpulab_exporter_last_success_timestamp_seconds") == clock.t


def test_driver_lost_after_init_reinitialises():
    class Flaky(FakeNvml):
        gone = False

        def device_count(self):
            if self.gone:
                raise pynvml.NVMLError_DriverNotLoaded()
            return super().device_count()

    nvml = Flaky([FakeGpu(0)])
    poller = Poller(nvml)
    assert scrape(poller).get_sample_value("gpulab_exporter_nvml_up") == 1
    nvml.gone = True
    reg = scrape(poller)
    assert reg.get_sample_value("gpulab_exporter_nvml_up") == 0
    assert reg.get_sample_value("gpulab_gpu_up", gpu(0)) is None
    assert not nvml.initialised  # shut down, to be initialised again
    nvml.gone = False
    assert scrape(poller).get_sample_value("gpulab_exporter_nvml_up") == 1
    assert nvml.init_calls == 2


def test_processes_in_and_out_of_containers(proc):
    nvml = FakeNvml([FakeGpu(0), FakeGpu(1)])
    nvml.gpus[0].processes = [GpuProcess(101, 3 * GiB), GpuProcess(102, 1 * GiB),
                              GpuProcess(301, 2 * GiB), GpuProcess(401, 5 * GiB),
                              GpuProcess(999, 1 * GiB)]  # 999: exited before we looked
    nvml.gpus[1].processes = [GpuProcess(201, 7 * GiB), GpuProcess(101, None)]
    directory = StaticContainerDirectory([
        Container(ANN, "gpulab-ann", "ann", "", (fake_uuid(0),)),
        Container(BOB, "gpulab-bob--big", "bob", "big", (fake_uuid(1),)),
    ])
    reg = scrape(Poller(nvml, directory=directory, proc=proc), process_info=True)
    v = reg.get_sample_value
    assert v("gpulab_gpu_user_memory_used_bytes", {**gpu(0), "user": "ann"}) == 4 * GiB
    assert v("gpulab_gpu_user_memory_used_bytes", {**gpu(1), "user": "bob"}) == 7 * GiB
    # ann also runs on GPU 1 without a lease there; memory unknown counts as 0
    assert v("gpulab_gpu_user_memory_used_bytes", {**gpu(1), "user": "ann"}) == 0
    assert v("gpulab_gpu_user_memory_used_bytes", {**gpu(0), "user": ""}) is None
    assert v("gpulab_gpu_process_info",
             {**gpu(0), "pid": "101", "user": "ann", "server": "", "container": "gpulab-ann"}) == 1
    assert v("gpulab_gpu_process_info", {**gpu(1), "pid": "201", "user": "bob", "server": "big",
                                         "container": "gpulab-bob--big"}) == 1
    assert v("gpulab_gpu_process_info",
             {**gpu(0), "pid": "301", "user": "", "server": "", "container": STRANGER[:12]}) == 1
    for pid in ("401", "999"):
        assert v("gpulab_gpu_process_info",
                 {**gpu(0), "pid": pid, "user": "", "server": "", "container": ""}) == 1
    assert v("gpulab_gpu_lease_info", {**gpu(1), "user": "bob", "server": "big", "kind": "server"}) == 1
    assert v("gpulab_exporter_docker_up") == 1


def test_process_info_is_opt_in(proc):
    nvml = FakeNvml([FakeGpu(0, processes=[GpuProcess(101, GiB)])])
    reg = scrape(Poller(nvml, proc=proc))
    assert reg.get_sample_value("gpulab_gpu_process_info",
                                {**gpu(0), "pid": "101", "user": "", "container": ANN[:12]}) is None


def test_lease_without_processes_is_visible(proc):
    """Allocated but idle: a lease label and no process -> lease_info 1, user memory 0."""
    nvml = FakeNvml([FakeGpu(0), FakeGpu(1)])
    directory = StaticContainerDirectory([
        Container(ANN, "gpulab-ann", "ann", "", (fake_uuid(1),)),
        # lease by index also works; a job's server says so (org.gpulab.job)
        Container(BOB, "gpulab-bob--j1", "bob", "j1", ("0",), job=True),
    ])
    reg = scrape(Poller(nvml, directory=directory, proc=proc))
    v = reg.get_sample_value
    server = {"server": "", "kind": "server"}
    assert v("gpulab_gpu_lease_info", {**gpu(1), "user": "ann", **server}) == 1
    assert v("gpulab_gpu_lease_info", {**gpu(0), "user": "bob", "server": "j1",
                                       "kind": "job"}) == 1
    assert v("gpulab_gpu_lease_info", {**gpu(0), "user": "ann", **server}) is None
    assert v("gpulab_gpu_user_memory_used_bytes", {**gpu(1), "user": "ann"}) == 0
    assert v("gpulab_gpu_utilization_ratio", gpu(1)) == 0


def test_processes_refresh_on_the_slow_cycle_only(proc):
    clock = Clock()
    nvml = FakeNvml([FakeGpu(0, processes=[GpuProcess(101, GiB)])])
    directory = StaticContainerDirectory([Container(ANN, "gpulab-ann", "ann", "", ())])
    poller = Poller(nvml, directory=directory, proc=proc, interval=5, process_interval=15,
                    clock=clock)
    reg = scrape(poller)
    assert reg.get_sample_value("gpulab_gpu_user_memory_used_bytes",
                                {**gpu(0), "user": "ann"}) == GiB
    nvml.gpus[0].processes = []  # the process exits
    directory.items = []  # and its container goes
    clock.t += 5
    reg = scrape(poller)  # fast cycle: the process list is not read again yet
    assert reg.get_sample_value("gpulab_gpu_user_memory_used_bytes",
                                {**gpu(0), "user": "ann"}) == GiB
    clock.t += 10
    reg = scrape(poller)  # slow cycle: gone, and its series with it
    assert reg.get_sample_value("gpulab_gpu_user_memory_used_bytes",
                                {**gpu(0), "user": "ann"}) is None
    assert poller.latest.processes_timestamp == clock.t


def test_docker_failure_keeps_last_containers(proc):
    clock = Clock()
    nvml = FakeNvml([FakeGpu(0)])
    directory = StaticContainerDirectory([Container(ANN, "gpulab-ann", "ann", "", ("0",))])
    poller = Poller(nvml, directory=directory, proc=proc, clock=clock)
    poller.poll()
    directory.error = ConnectionError("docker.sock: connection refused")
    clock.t += 60
    reg = scrape(poller)
    assert reg.get_sample_value("gpulab_exporter_docker_up") == 0
    assert reg.get_sample_value("gpulab_gpu_lease_info", {**gpu(0), "user": "ann",
                                                          "server": "", "kind": "server"}) == 1


def test_gone_gpu_leaves_no_stale_series():
    nvml = FakeNvml([FakeGpu(0), FakeGpu(1)])
    poller = Poller(nvml)
    assert scrape(poller).get_sample_value("gpulab_gpu_up", gpu(1)) == 1
    del nvml.gpus[1]
    reg = scrape(poller)
    assert reg.get_sample_value("gpulab_gpu_up", gpu(1)) is None
    assert reg.get_sample_value("gpulab_exporter_gpus") == 1


def test_before_first_poll_the_registry_still_renders():
    poller = Poller(FakeNvml([FakeGpu(0)]))
    reg = make_registry(poller)
    assert reg.get_sample_value("gpulab_exporter_nvml_up") == 0
    assert poller.latest.nvml_error == "not polled yet"


def test_fake_rejects_unknown_field_names():
    with pytest.raises(ValueError, match="unknown fake NVML fields"):
        FakeGpu(0, unsupported={"fan_speed"})


def test_a_host_without_gpus_by_design_never_loads_nvml_and_expects_none():
    """--no-gpus: NVML is never initialised (it would fail, and log a failure, on every
    poll), the snapshot says why, and gpulab_exporter_gpus_expected is 0."""
    class Untouchable(FakeNvml):
        def init(self):
            raise AssertionError("NVML loaded on a host without GPUs by design")

    poller = Poller(Untouchable([FakeGpu(0)]), expects_gpus=False)
    snap = poller.poll()
    assert not snap.nvml_up and snap.gpus == () and not snap.expects_gpus
    assert snap.nvml_error.startswith("this host has no GPUs (--no-gpus")
    reg = scrape(poller)
    assert reg.get_sample_value("gpulab_exporter_gpus_expected") == 0.0
    assert reg.get_sample_value("gpulab_exporter_nvml_up") == 0.0
    # every other host: expected
    assert scrape(Poller(FakeNvml([FakeGpu(0)]))).get_sample_value(
        "gpulab_exporter_gpus_expected") == 1.0
