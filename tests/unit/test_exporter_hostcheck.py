"""The exporter-vs-nvidia-smi check (gpulab_exporter.hostcheck) without a GPU: the pure
parts against tables of real nvidia-smi output, and the whole run against fake NVML and a
stand-in ``nvidia-smi`` script on PATH. The real comparison runs in
scripts/gpu-host-check.sh on a GPU host.

The nvidia-smi values are from real captures (utkuozdemir/nvidia_gpu_exporter's
internal/captures: H200 and H100 on 590.48.01, RTX 2080 SUPER on 595.71.05, idle and
under load), whose UUIDs are masked there; the UUIDs here are made up."""

from __future__ import annotations

import contextlib
import itertools
import os
import stat

import pytest

from gpulab_exporter.fake_nvml import FakeGpu, FakeNvml
from gpulab_exporter.hostcheck import (
    MIB,
    NVIDIA_SMI,
    GpuComparison,
    HostCheckError,
    Reading,
    Timing,
    compare,
    compare_gpu,
    exporter_readings,
    failures,
    format_table,
    format_timings,
    main,
    pair_by_uuid,
    parse_smi_csv,
    parse_value,
    run_check,
    run_nvidia_smi,
    time_calls,
    with_rise,
)
from gpulab_exporter.snapshot import GpuSample, Poller, Snapshot

A = "GPU-3f9a6c2e-8d41-4b7a-9e15-2c6d0b8f7a13"
B = "GPU-b71c0d94-52e3-4f8a-a6d2-9e0f3c18b5a7"
C = "GPU-0c4e8a1f-9b27-4d63-8f5e-71a2d6c93e08"

H200_IDLE = f"0, {A}, 0, 0, 143771, 28, 77.71"
H200_LOAD = f"0, {A}, 100, 32362, 143771, 52, 627.40"
H100_MIG_LOAD = f"1, {B}, [N/A], 11125, 81559, 53, 433.78"  # MIG: no GPU utilization
RTX2080_LOAD_UNITS = f"0, {C}, 8 %, 819 MiB, 8192 MiB, 45, 111.50 W"  # without nounits
NOT_SUPPORTED = f"2, {C}, 3, 405, 6144, 47, [Not Supported]"  # older GeForce: no power
HEADER = ("index, uuid, utilization.gpu [%], memory.used [MiB], memory.total [MiB], "
          "temperature.gpu, power.draw [W]")

H200_LOAD_VALUES = {"utilization.gpu": 100.0, "memory.used": 32362.0,
                    "memory.total": 143771.0, "temperature.gpu": 52.0, "power.draw": 627.4}


# -- parsing nvidia-smi ---------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("", []),
    (H200_IDLE, [Reading(A, 0, {"utilization.gpu": 0.0, "memory.used": 0.0, "memory.total": 143771.0, "temperature.gpu": 28.0, "power.draw": 77.71})]),
    (H200_LOAD + "\n", [Reading(A, 0, H200_LOAD_VALUES)]),
    (HEADER + "\n" + H200_LOAD + "\n\n", [Reading(A, 0, H200_LOAD_VALUES)]),
    (H100_MIG_LOAD, [Reading(B, 1, {"utilization.gpu": None, "memory.used": 11125.0, "memory.total": 81559.0, "temperature.gpu": 53.0, "power.draw": 433.78}, {"utilization.gpu": "[N/A]"})]),
    (RTX2080_LOAD_UNITS, [Reading(C, 0, {"utilization.gpu": 8.0, "memory.used": 819.0, "memory.total": 8192.0, "temperature.gpu": 45.0, "power.draw": 111.5})]),
    (NOT_SUPPORTED, [Reading(C, 2, {"utilization.gpu": 3.0, "memory.used": 405.0, "memory.total": 6144.0, "temperature.gpu": 47.0, "power.draw": None}, {"power.draw": "[Not Supported]"})]),
    (f"{H200_LOAD}\n{H100_MIG_LOAD}\n", [Reading(A, 0, H200_LOAD_VALUES), Reading(B, 1, {"utilization.gpu": None, "memory.used": 11125.0, "memory.total": 81559.0, "temperature.gpu": 53.0, "power.draw": 433.78}, {"utilization.gpu": "[N/A]"})]),
], ids=["empty", "h200-idle", "h200-load", "with-header", "mig-na", "units", "not-supported", "two-gpus"])
def test_parse_smi_csv(text, expected):
    assert parse_smi_csv(text) == expected


@pytest.mark.parametrize("text, message", [
    ("No devices were found", "line 1: 1 values, expected 7"),
    (f"0, {A}, 0, 0, 143771", "line 1: 5 values, expected 7 (index, uuid, utilization.gpu"),
    (f"{H200_IDLE}\n0, {A}, busy, 0, 143771, 28, 77.71", "line 2: not a number: 'busy'"),
    (f"0, {A}, 0, 0, 143771, 28, 77.71 furlongs", "not a number: '77.71 furlongs'"),
])
def test_parse_smi_csv_refuses_what_it_cannot_read(text, message):
    with pytest.raises(ValueError, match="nvidia-smi output line") as e:
        parse_smi_csv(text)
    assert message in str(e.value)


@pytest.mark.parametrize("cell, expected", [
    ("627.40", (627.4, None)), (" 0 ", (0.0, None)), ("32362 MiB", (32362.0, None)),
    ("[N/A]", (None, "[N/A]")), ("[Not Supported]", (None, "[Not Supported]")),
    ("[Unknown Error]", (None, "[Unknown Error]")),
    ("[GPU requires reset]", (None, "[GPU requires reset]")),
])
def test_parse_value(cell, expected):
    assert parse_value(cell) == expected


# -- the exporter's side ----------------------------------------------------------------
def h200(**changes) -> GpuSample:
    """The exporter's view of H200_LOAD (its memory in bytes, not truncated to MiB)."""
    values = dict(index=0, uuid=A, model="NVIDIA H200", up=True, utilization_ratio=1.0,
                  memory_used_bytes=32362 * MIB + 700_000, memory_total_bytes=143771 * MIB,
                  memory_free_bytes=(143771 - 32363) * MIB, temperature_celsius=52.0,
                  power_watts=627.4, energy_joules=1e6, clock_sm_hertz=1.98e9)
    values.update(changes)
    return GpuSample(**values)


def snap(*gpus: GpuSample) -> Snapshot:
    return Snapshot(timestamp=0.0, nvml_up=True, gpus=gpus)


def test_exporter_readings_convert_to_nvidia_smi_units():
    lost = GpuSample(index=1, uuid=B, model=None, up=False, error="NVMLError_GpuIsLost: GPU is lost")
    mig = h200(utilization_ratio=None)
    assert exporter_readings(snap(h200(), lost, mig)) == [
        Reading(A, 0, {**H200_LOAD_VALUES, "memory.used": 32362 + 700_000 / MIB}),
        Reading(B, 1, dict.fromkeys(H200_LOAD_VALUES), dict.fromkeys(H200_LOAD_VALUES, "[GPU down: NVMLError_GpuIsLost: GPU is lost]")),
        Reading(A, 0, {**H200_LOAD_VALUES, "memory.used": 32362 + 700_000 / MIB, "utilization.gpu": None}, {"utilization.gpu": "[absent]"}),
    ]


# -- comparing --------------------------------------------------------------------------
def verdicts(c: GpuComparison) -> dict[str, str]:
    return {r.field: "OK" if r.ok else "MISMATCH" for r in c.rows if not r.ok}


@pytest.mark.parametrize("exporter, smi_line, mismatched", [
    (h200(), H200_LOAD, {}),
    (h200(memory_used_bytes=(32362 + 3) * MIB + 700_000), H200_LOAD, {}),  # 3.67 MiB <= 4
    (h200(memory_used_bytes=(32362 + 5) * MIB), H200_LOAD, {"memory.used [MiB]": "MISMATCH"}),
    # NVML v1 memory info counts the driver's reservation as used; nvidia-smi does not
    (h200(memory_used_bytes=(32362 + 562) * MIB), H200_LOAD, {"memory.used [MiB]": "MISMATCH"}),
    (h200(memory_total_bytes=141 * 1024 * MIB), H200_LOAD, {"memory.total [MiB]": "MISMATCH"}),
    (h200(utilization_ratio=0.86), H200_LOAD, {}),  # 14 points: sampled at different moments
    (h200(utilization_ratio=0.84), H200_LOAD, {"utilization.gpu [%]": "MISMATCH"}),
    (h200(temperature_celsius=54.0), H200_LOAD, {}),
    (h200(temperature_celsius=55.0), H200_LOAD, {"temperature.gpu [C]": "MISMATCH"}),
    (h200(power_watts=570.0), H200_LOAD, {}),  # 57.4 W <= 10 % of 627.4
    (h200(power_watts=560.0), H200_LOAD, {"power.draw [W]": "MISMATCH"}),
    (h200(power_watts=10.0), f"0, {A}, 100, 32362, 143771, 52, 8.50", {}),  # 2 W at least
    (h200(power_watts=11.0), f"0, {A}, 100, 32362, 143771, 52, 8.50", {"power.draw [W]": "MISMATCH"}),
    (h200(utilization_ratio=None), f"0, {A}, [N/A], 32362, 143771, 52, 627.40", {}),  # MIG: neither
    (h200(utilization_ratio=0.0), f"0, {A}, [N/A], 32362, 143771, 52, 627.40", {"utilization.gpu [%]": "MISMATCH"}),
    (h200(power_watts=None), H200_LOAD, {"power.draw [W]": "MISMATCH"}),
    (h200(index=1), H200_LOAD, {"index": "MISMATCH"}),
    (GpuSample(index=0, uuid=A, model=None, up=False, error="NVMLError_GpuIsLost"), H200_LOAD,
     dict.fromkeys(["utilization.gpu [%]", "memory.used [MiB]", "memory.total [MiB]", "temperature.gpu [C]", "power.draw [W]"], "MISMATCH")),
], ids=["agree", "memory-3MiB", "memory-5MiB", "memory-v1", "total", "util-14", "util-16",
        "temp-2", "temp-3", "power-9pct", "power-11pct", "power-floor", "power-floor-over",
        "mig-neither", "util-smi-na-only", "power-exporter-only-absent", "index", "gpu-down"])
def test_compare_gpu_tolerances(exporter, smi_line, mismatched):
    (e,), (s,) = exporter_readings(snap(exporter)), parse_smi_csv(smi_line)
    c = compare_gpu(e, s)
    assert verdicts(c) == mismatched
    assert c.ok == (not mismatched) and c.problem is None


@pytest.mark.parametrize("before, after, smi_temp, smi_power, mismatched", [
    ((50.0, 400.0), (56.0, 640.0), 53, 520.0, {}),  # warming up: nvidia-smi in between
    ((56.0, 640.0), (50.0, 400.0), 53, 520.0, {}),  # cooling down
    ((50.0, 400.0), (56.0, 640.0), 58, 700.0, {}),  # just past the later read: tolerance
    ((50.0, 400.0), (56.0, 640.0), 59, 720.0, {"temperature.gpu [C]": "MISMATCH",
                                                "power.draw [W]": "MISMATCH"}),
    ((50.0, 400.0), (50.0, 400.0), 53, 520.0, {"temperature.gpu [C]": "MISMATCH",
                                                "power.draw [W]": "MISMATCH"}),  # steady
], ids=["rising", "falling", "within-tolerance-of-later", "beyond-later", "steady-gpu"])
def test_a_moving_value_is_compared_with_the_exporter_reads_either_side(
        before, after, smi_temp, smi_power, mismatched):
    """A GPU that just started working warms and draws more between the reads: nvidia-smi,
    read between two exporter polls, is compared with the range they span."""
    (e,) = exporter_readings(snap(h200(temperature_celsius=before[0], power_watts=before[1])))
    (e2,) = exporter_readings(snap(h200(temperature_celsius=after[0], power_watts=after[1])))
    (s,) = parse_smi_csv(f"0, {A}, 100, 32362, 143771, {smi_temp}, {smi_power:.2f}")
    c = compare_gpu(e, s, e2)
    assert verdicts(c) == mismatched
    rows = {r.field: r for r in c.rows}
    if before != after:
        assert rows["temperature.gpu [C]"].note == (
            f"exporter {before[0]:g} before nvidia-smi, {after[0]:g} after")
        assert rows["temperature.gpu [C]"].exporter == min(max(smi_temp, 50), 56)


def test_absent_values_say_which_side_and_why():
    (e,) = exporter_readings(snap(h200(power_watts=None, utilization_ratio=None)))
    (s,) = parse_smi_csv(f"0, {A}, [N/A], 32362, 143771, 52, 627.40")
    notes = {r.field: (r.ok, r.note) for r in compare_gpu(e, s).rows if r.note}
    assert notes == {"utilization.gpu [%]": (True, "reported by neither: nvidia-smi [N/A]"),
                     "power.draw [W]": (False, "exporter [absent]")}


def test_gpus_pair_by_uuid_and_a_gpu_missing_from_either_side_fails():
    exporter = exporter_readings(snap(h200(), h200(index=1, uuid=B)))
    smi = parse_smi_csv(f"{H200_LOAD}\n{NOT_SUPPORTED}\n")  # C, not B
    pairs = pair_by_uuid(exporter, smi)
    assert [(e and e.uuid, s and s.uuid) for e, s in pairs] == [(A, A), (None, C), (B, None)]
    results = compare(pairs)
    assert [c.ok for c in results] == [True, False, False]
    assert failures(results, "idle") == [
        f"idle: GPU 2 ({C}): absent from the exporter (its NVML poll did not list this UUID)",
        f"idle: GPU 1 ({B}): absent from nvidia-smi (the exporter lists a UUID nvidia-smi does not)",
    ]


def test_pairing_ignores_index_order():
    exporter = exporter_readings(snap(h200(index=1), h200(index=0, uuid=B)))
    smi = parse_smi_csv(f"1, {A}, 100, 32362, 143771, 52, 627.40\n0, {B}, 100, 32362, 143771, 52, 627.40")
    assert [c.ok for c in compare(pair_by_uuid(exporter, smi))] == [True, True]


def test_failures_say_by_how_much():
    (e,), (s,) = exporter_readings(snap(h200(temperature_celsius=56.0, power_watts=None))), parse_smi_csv(H200_LOAD)
    assert failures([compare_gpu(e, s)], "under load") == [
        f"under load: GPU 0 ({A}): temperature.gpu [C]: exporter 56, nvidia-smi 52, 4 apart (allowed 2)",
        f"under load: GPU 0 ({A}): power.draw [W]: exporter -, nvidia-smi 627.40 (exporter [absent])",
    ]


def util(exporter: float | None, smi: float | None) -> GpuComparison:
    (e,) = exporter_readings(snap(h200(utilization_ratio=None if exporter is None else exporter / 100)))
    cell = "[N/A]" if smi is None else f"{smi:g}"
    (s,) = parse_smi_csv(f"0, {A}, {cell}, 32362, 143771, 52, 627.40")
    return compare_gpu(e, s)


@pytest.mark.parametrize("idle, load, ok, note", [
    ((0, 0), (100, 100), True, "each must rise >= 10"),
    ((0, 0), (100, 99), True, "each must rise >= 10"),
    ((0, 0), (9, 0), False, "each must rise >= 10"),  # both sides saw no load: fail, not agree
    ((0, 0), (100, 5), False, "each must rise >= 10"),
    ((30, 25), (35, 35), False, "each must rise >= 10"),  # busy before the load
    ((None, None), (None, None), True, "not compared: utilization not reported"),  # MIG
    (None, (100, 100), True, "not compared: utilization not reported"),  # GPU new under load
])
def test_utilization_must_rise_on_both_sides(idle, load, ok, note):
    c = with_rise(util(*load), util(*idle) if idle else None)
    rise = c.rows[-1]
    assert (rise.field, rise.ok, rise.note) == ("utilization.gpu rise [%]", ok, note)
    assert c.rows[:-1] == util(*load).rows


# -- printing ---------------------------------------------------------------------------
def test_table_for_a_gpu_that_agrees():
    (e,) = exporter_readings(snap(h200(utilization_ratio=0.97, temperature_celsius=53.0, power_watts=611.25)))
    (s,) = parse_smi_csv(H200_LOAD)
    (ie,) = exporter_readings(snap(h200(utilization_ratio=0.0)))
    (is_,) = parse_smi_csv(f"0, {A}, 0, 0, 143771, 28, 77.71")
    table = format_table(with_rise(compare_gpu(e, s), compare_gpu(ie, is_)), "under load")
    assert table == f"""\
GPU 0  {A}  [under load]
  field                     exporter  nvidia-smi  difference  allowed  verdict
  index                            0           0           0       ±0  OK
  utilization.gpu [%]             97         100          -3      ±15  OK
  memory.used [MiB]         32362.67       32362        0.67       ±4  OK
  memory.total [MiB]          143771      143771           0       ±4  OK
  temperature.gpu [C]             53          52           1       ±2  OK
  power.draw [W]              611.25      627.40      -16.15   ±62.74  OK
  utilization.gpu rise [%]        97         100          -3        -  OK  each must rise >= 10"""


def test_table_for_mismatches_and_absent_fields():
    (e,) = exporter_readings(snap(h200(memory_used_bytes=(32362 + 562) * MIB, power_watts=None, utilization_ratio=None)))
    (s,) = parse_smi_csv(f"0, {A}, [N/A], 32362, 143771, 52, 627.40")
    assert format_table(compare_gpu(e, s), "idle") == f"""\
GPU 0  {A}  [idle]
  field                exporter  nvidia-smi  difference  allowed  verdict
  index                       0           0           0       ±0  OK
  utilization.gpu [%]         -           -           -        -  OK  reported by neither: nvidia-smi [N/A]
  memory.used [MiB]       32924       32362         562       ±4  MISMATCH
  memory.total [MiB]     143771      143771           0       ±4  OK
  temperature.gpu [C]        52          52           0       ±2  OK
  power.draw [W]              -      627.40           -        -  MISMATCH  exporter [absent]"""


def test_table_for_a_gpu_only_nvidia_smi_lists():
    (c,) = compare(pair_by_uuid([], parse_smi_csv(NOT_SUPPORTED)))
    assert format_table(c, "idle") == f"""\
GPU 2  {C}  [idle]  MISMATCH: absent from the exporter (its NVML poll did not list this UUID)
  field                exporter  nvidia-smi  difference  allowed  verdict
  index                       -           2           -        -  -
  utilization.gpu [%]         -           3           -        -  -
  memory.used [MiB]           -         405           -        -  -
  memory.total [MiB]          -        6144           -        -  -
  temperature.gpu [C]         -          47           -        -  -
  power.draw [W]              -           -           -        -  -"""


def test_timings_table():
    timings = [Timing("exporter: NVML poll + /metrics", (0.0021, 0.0019, 0.0042)),
               Timing("exporter: /metrics from snapshot", (0.0003, 0.0002, 0.0004)),
               Timing("nvidia-smi + CSV parse", (0.041, 0.038, 0.090))]
    assert format_timings(timings) == """\
  method                            runs  min ms  median ms  max ms  median vs row 1
  exporter: NVML poll + /metrics       3   1.900      2.100   4.200             1.0x
  exporter: /metrics from snapshot     3   0.200      0.300   0.400             0.1x
  nvidia-smi + CSV parse               3  38.000     41.000  90.000            19.5x"""


def test_time_calls_times_each_call_with_the_given_clock():
    ticks = itertools.count(0.0, 0.5)
    calls = []
    t = time_calls("x", lambda: calls.append(1), 3, clock=lambda: next(ticks))
    assert (t.seconds, t.median, len(calls)) == ((0.5, 0.5, 0.5), 0.5, 3)


# -- the shell, with a stand-in nvidia-smi on PATH and fake NVML ------------------------
@pytest.fixture
def smi_bin(tmp_path, monkeypatch):
    """A folder first on PATH; ``install(body)`` puts an ``nvidia-smi`` script there."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")

    def install(body: str) -> None:
        script = folder / "nvidia-smi"
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)

    return install


def test_run_nvidia_smi_asks_for_the_query_fields(smi_bin, tmp_path):
    smi_bin(f'echo "$@" > {tmp_path}/args\necho "{H200_IDLE}"')
    assert run_nvidia_smi() == H200_IDLE + "\n"
    assert (tmp_path / "args").read_text().split() == list(NVIDIA_SMI[1:])


def test_run_nvidia_smi_reports_the_driver_failure(smi_bin):
    smi_bin('echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."; exit 9')
    with pytest.raises(HostCheckError, match="exited with 9: NVIDIA-SMI has failed because"):
        run_nvidia_smi()


def test_without_nvidia_smi_main_says_so_and_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here, even on a GPU host
    assert main(["--no-load"]) == 2
    err = capsys.readouterr().err
    assert err == ("gpu-host-check: nvidia-smi is not on PATH: this check needs a host with "
                   "an NVIDIA GPU and its driver (nvidia-smi comes with it)\n")


class FakeHost:
    """Fake NVML and a stand-in nvidia-smi that reads what the test says the GPU shows."""

    def __init__(self, smi_bin, tmp_path):
        self.csv = tmp_path / "smi.csv"
        smi_bin(f'cat "{self.csv}"')
        self.gpu = FakeGpu(0, uuid=A, memory_total=143771 * MIB, memory_used=0,
                           temperature_celsius=28, power_milliwatts=77_710)
        self.poller = Poller(FakeNvml([self.gpu]), interval=1, process_interval=0)
        self.show(H200_IDLE)
        self.out: list[str] = []

    def show(self, line: str) -> None:
        self.csv.write_text(line + "\n")

    @contextlib.contextmanager
    def load(self, exporter_sees: int = 100, smi_line: str = H200_LOAD):
        self.gpu.utilization_percent, self.gpu.memory_used = exporter_sees, 32362 * MIB
        self.gpu.temperature_celsius, self.gpu.power_milliwatts = 52, 627_400
        self.show(smi_line)
        yield {A}

    def check(self, **kw) -> int:
        try:
            return run_check(self.poller, runs=2, out=self.out.append, **kw)
        finally:
            self.poller.stop()

    @property
    def text(self) -> str:
        return "\n".join(self.out)


@pytest.fixture
def host(smi_bin, tmp_path):
    return FakeHost(smi_bin, tmp_path)


def test_run_check_passes_when_both_agree_idle_and_under_load(host):
    assert host.check(load=host.load) == 0
    assert "  power.draw [W]          77.71       77.71           0    ±7.77  OK" in host.out[0]
    assert f"GPU 0  {A}  [idle]" in host.text and f"GPU 0  {A}  [under load]" in host.text
    assert "utilization.gpu rise [%]       100         100" in host.text
    assert "nvidia-smi + CSV parse               2" in host.text
    assert host.out[-1] == "OK: the exporter and nvidia-smi agree on every GPU, idle and under load"
    assert "MISMATCH" not in host.text


def test_run_check_names_each_mismatch_and_exits_1(host):
    load = lambda: host.load(exporter_sees=0, smi_line=f"0, {A}, 100, 32362, 143771, 57, 627.40")  # noqa: E731
    assert host.check(load=load) == 1
    assert host.out[-4:] == [
        "MISMATCH: the exporter and nvidia-smi disagree beyond tolerance (3):",
        f"  under load: GPU 0 ({A}): utilization.gpu [%]: exporter 0, nvidia-smi 100, 100 apart (allowed 15)",
        f"  under load: GPU 0 ({A}): temperature.gpu [C]: exporter 52, nvidia-smi 57, 5 apart (allowed 2)",
        f"  under load: GPU 0 ({A}): utilization.gpu rise [%]: exporter 0, nvidia-smi 100 (each must rise >= 10)",
    ]


def test_run_check_on_a_gpu_that_warms_up_between_the_reads(host):
    """Each exporter poll finds the GPU 6 C warmer and drawing 240 W more (a GPU that
    just started working); nvidia-smi, read between two polls, sees a value between."""

    class Warming(FakeNvml):
        def device_count(self):  # once per poll
            for g in self.gpus:
                g.temperature_celsius += 6
                g.power_milliwatts += 240_000
            return super().device_count()

    gpu = FakeGpu(0, uuid=A, memory_total=143771 * MIB, temperature_celsius=44,
                  power_milliwatts=160_000)
    host.poller = Poller(Warming([gpu]), interval=1, process_interval=0)
    host.show(f"0, {A}, 0, 0, 143771, 53, 520.00")  # polls read 50 C, 400 W then 56 C, 640 W
    assert host.check(load=None) == 0, host.text
    assert "exporter 50 before nvidia-smi, 56 after" in host.text


def test_run_check_idle_only_and_a_gpu_nvidia_smi_lacks(host):
    host.show(f"1, {B}, 0, 0, 143771, 28, 77.71")
    assert host.check(load=None) == 1
    assert f"  idle: GPU 1 ({B}): absent from the exporter (its NVML poll did not list this UUID)" in host.out
    assert f"  idle: GPU 0 ({A}): absent from nvidia-smi (the exporter lists a UUID nvidia-smi does not)" in host.out
    assert "under load" not in host.text


def test_run_check_stops_with_the_reason_when_nvml_is_down(host):
    import pynvml

    host.poller = Poller(FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound))
    with pytest.raises(HostCheckError, match="the exporter's NVML did not answer: NVMLError_LibraryNotFound"):
        host.check(load=None)


def test_run_check_refuses_unreadable_nvidia_smi_output(host):
    host.show("No devices were found")
    with pytest.raises(HostCheckError, match="nvidia-smi output line 1: 1 values"):
        host.check(load=None)
