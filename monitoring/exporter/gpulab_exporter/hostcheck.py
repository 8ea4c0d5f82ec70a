"""The exporter beside ``nvidia-smi`` on a real GPU, and what a scrape of each costs.

``python3 -m gpulab_exporter.hostcheck`` (``scripts/gpu-host-check.sh`` runs it on a GPU
host; in the exporter's container, which has nvidia-smi but no torch, add ``--no-load``):

1. reads every GPU through the exporter's own poller (:class:`Poller` over the real
   :class:`Nvml`), then through ``nvidia-smi --query-gpu=...``, then through the poller
   again, idle and then under a torch matmul load on every GPU, and prints a table per
   GPU: field, exporter, nvidia-smi, difference, allowed, OK/MISMATCH. A value that moves
   while they are read (the temperature and power of a GPU that just started working)
   is compared with whichever exporter read is nearer nvidia-smi's, so a steady climb
   between the reads is no mismatch and the tolerances stay those of a steady GPU. Exit
   status 1 if any field differs by more than its tolerance (:data:`FIELDS`), each one
   named; 2 if the check cannot run.
2. times N exporter cycles (NVML poll + ``/metrics`` render) against N runs of
   nvidia-smi + CSV parsing (how utkuozdemir/nvidia_gpu_exporter scrapes) and prints
   min/median/max. Figures only: nothing is asserted on time.

Everything between the CSV text or the snapshot and the printed table is a pure function,
tested without a GPU in tests/unit/test_exporter_hostcheck.py; :func:`main` is the shell.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import generate_latest

from gpulab_exporter.nvml import Nvml
from gpulab_exporter.server import make_registry
from gpulab_exporter.snapshot import Poller, Snapshot

MIB = 1 << 20


@dataclass(frozen=True)
class Field:
    """One value both sides report: nvidia-smi's query field and the snapshot attribute
    the exporter exports it from, compared in nvidia-smi's unit."""

    smi: str  # nvidia-smi --query-gpu field
    snapshot: str  # GpuSample attribute (gpulab_gpu_<snapshot> in /metrics)
    unit: str  # nvidia-smi's unit, in which both sides are compared
    factor: float  # snapshot value * factor = value in ``unit``
    abs_tol: float  # allowed |difference| in ``unit``, or
    rel_tol: float = 0.0  # this fraction of the larger value, whichever is more

    @property
    def label(self) -> str:
        return f"{self.smi} [{self.unit}]"

    def allowed(self, a: float, b: float) -> float:
        return max(self.abs_tol, self.rel_tol * max(abs(a), abs(b)))


FIELDS: tuple[Field, ...] = (
    # Sampled by the driver over 1/6 s to 1 s: two reads a moment apart can differ.
    Field("utilization.gpu", "utilization_ratio", "%", 100.0, 15.0),
    # The same NVML counter (v2: driver reservation excluded); nvidia-smi truncates to MiB.
    Field("memory.used", "memory_used_bytes", "MiB", 1 / MIB, 4.0),
    Field("memory.total", "memory_total_bytes", "MiB", 1 / MIB, 4.0),
    Field("temperature.gpu", "temperature_celsius", "C", 1.0, 2.0),
    # A 1 s average on recent boards, instantaneous on older ones: 10 % (2 W at least).
    Field("power.draw", "power_watts", "W", 1.0, 2.0, 0.10),
)
QUERY: tuple[str, ...] = ("index", "uuid", *(f.smi for f in FIELDS))
NVIDIA_SMI: tuple[str, ...] = ("nvidia-smi", "--query-gpu=" + ",".join(QUERY),
                               "--format=csv,noheader,nounits")
_UNITS = {"%", "MiB", "W", "C"}  # what nvidia-smi appends without ``nounits``
UTILIZATION = FIELDS[0]
MIN_RISE = 10.0  # points each side's utilization must rise under the load


class HostCheckError(Exception):
    """The check cannot run here (no nvidia-smi, no NVML, no torch): exit status 2."""


# -- the two sides, as comparable readings ------------------------------------------------
@dataclass(frozen=True)
class Reading:
    """One GPU as one side saw it: values by nvidia-smi field name in nvidia-smi's units,
    None where absent, with why in ``missing`` (nvidia-smi's own words, e.g. "[N/A]")."""

    uuid: str
    index: int | None
    values: dict[str, float | None]
    missing: dict[str, str] = field(default_factory=dict)


def parse_value(text: str) -> tuple[float | None, str | None]:
    """One CSV cell: ``(value, None)``, or ``(None, why)`` for "[N/A]", "[Not Supported]"
    and nvidia-smi's other bracketed answers. A unit suffix ("627.40 W") is dropped."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        return None, text
    number, _, unit = text.partition(" ")
    if unit and unit not in _UNITS:
        raise ValueError(f"not a number: {text!r}")
    try:
        return float(number), None
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None


def parse_smi_csv(text: str) -> list[Reading]:
    """``nvidia-smi --query-gpu=<QUERY> --format=csv[,noheader][,nounits]`` output, one
    :class:`Reading` per line. Raises ValueError naming the line it cannot read."""
    readings = []
    for lineno, line in enumerate(text.splitlines(), 1):
        cells = [c.strip() for c in line.split(",")]
        if not line.strip() or cells[0] == "index":  # blank, or the header
            continue
        try:
            if len(cells) != len(QUERY):
                raise ValueError(f"{len(cells)} values, expected {len(QUERY)} "
                                 f"({', '.join(QUERY)})")
            index, why = parse_value(cells[0])
            values, missing = {}, {}
            for f, cell in zip(FIELDS, cells[2:], strict=True):
                values[f.smi], reason = parse_value(cell)
                if reason:
                    missing[f.smi] = reason
        except ValueError as e:
            raise ValueError(f"nvidia-smi output line {lineno}: {e}: {line!r}") from None
        readings.append(Reading(uuid=cells[1], index=None if why else int(index),
                                values=values, missing=missing))
    return readings


def exporter_readings(snap: Snapshot) -> list[Reading]:
    """The snapshot's GPUs in nvidia-smi's units (what ``/metrics`` exports, converted).
    Whole GPUs only: ``--query-gpu`` lists no MIG devices (:func:`mig_problems` checks
    those against ``nvidia-smi -L``)."""
    readings = []
    for g in snap.gpus:
        if g.mig_device is not None:
            continue
        values, missing = {}, {}
        for f in FIELDS:
            raw = getattr(g, f.snapshot)
            values[f.smi] = None if raw is None else raw * f.factor
            if raw is None:
                missing[f.smi] = "[absent]" if g.up else f"[GPU down: {g.error}]"
        readings.append(Reading(uuid=g.uuid, index=g.index, values=values, missing=missing))
    return readings


def pair_by_uuid(exporter: Sequence[Reading], smi: Sequence[Reading]
                 ) -> list[tuple[Reading | None, Reading | None]]:
    """(exporter, nvidia-smi) per GPU, matched by UUID (indexes may differ): nvidia-smi's
    order first, then GPUs only the exporter saw; None for the side that lacks one."""
    mine = {r.uuid: r for r in exporter}
    pairs: list[tuple[Reading | None, Reading | None]] = [(mine.pop(s.uuid, None), s)
                                                           for s in smi]
    return pairs + [(e, None) for e in mine.values()]


# -- comparing ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    field: str
    exporter: float | None
    smi: float | None
    allowed: float | None  # tolerance applied, in the field's unit; None: not compared
    ok: bool
    note: str = ""  # why absent values pass or fail, or what was required

    @property
    def difference(self) -> float | None:
        if self.exporter is None or self.smi is None:
            return None
        return self.exporter - self.smi


@dataclass(frozen=True)
class GpuComparison:
    uuid: str
    index: int | None  # nvidia-smi's, else the exporter's
    rows: tuple[Row, ...]
    problem: str | None = None  # the GPU is missing from one side

    @property
    def ok(self) -> bool:
        return self.problem is None and all(r.ok for r in self.rows)


def compare_gpu(exp: Reading | None, smi: Reading | None,
                exp_after: Reading | None = None) -> GpuComparison:
    """Field by field, within :data:`FIELDS`' tolerances. A field absent on both sides
    (utilization under MIG, power on some boards) passes; absent on one side fails. A GPU
    only one side lists fails as a whole (``problem``), its values shown, not compared.

    ``exp_after``: the exporter's reading of the same GPU just after nvidia-smi's (``exp``
    being the one just before). Where the two differ, nvidia-smi's value is compared with
    the range between them (the difference is 0 inside it), so a value that climbs while
    the three are read is no mismatch; the row says what the exporter read either side."""
    if exp is None or smi is None:
        only = smi or exp
        assert only is not None, "a pair has at least one side"
        problem = ("absent from the exporter (its NVML poll did not list this UUID)"
                   if exp is None else
                   "absent from nvidia-smi (the exporter lists a UUID nvidia-smi does not)")
        rows = [Row("index", None if exp is None else only.index,
                    None if smi is None else only.index, None, False)]
        rows += [Row(f.label, None if exp is None else only.values.get(f.smi),
                     None if smi is None else only.values.get(f.smi), None, False)
                 for f in FIELDS]
        return GpuComparison(uuid=only.uuid, index=only.index, rows=tuple(rows),
                             problem=problem)
    rows = [Row("index", exp.index, smi.index, 0.0, exp.index == smi.index)]
    for f in FIELDS:
        e, s = exp.values.get(f.smi), smi.values.get(f.smi)
        later = exp_after.values.get(f.smi) if exp_after is not None else None
        if e is not None and s is not None:
            note = ""
            if later is not None and later != e:
                note = f"exporter {_num(e)} before nvidia-smi, {_num(later)} after"
                lo, hi = sorted((e, later))
                e = min(max(s, lo), hi)  # the exporter's read nearest nvidia-smi's
            allowed = f.allowed(e, s)
            rows.append(Row(f.label, e, s, allowed, abs(e - s) <= allowed + 1e-9, note))
        elif e is None and s is None:
            rows.append(Row(f.label, None, None, None, True,
                            f"reported by neither: nvidia-smi {smi.missing.get(f.smi, '?')}"))
        elif e is None:
            rows.append(Row(f.label, None, s, None, False,
                            f"exporter {exp.missing.get(f.smi, '[absent]')}"))
        else:
            rows.append(Row(f.label, e, None, None, False,
                            f"nvidia-smi {smi.missing.get(f.smi, '[absent]')}"))
    return GpuComparison(uuid=smi.uuid, index=smi.index, rows=tuple(rows))


def compare(pairs: Sequence[tuple[Reading | None, Reading | None]]) -> list[GpuComparison]:
    return [compare_gpu(e, s) for e, s in pairs]


def with_rise(load: GpuComparison, idle: GpuComparison | None,
              min_rise: float = MIN_RISE) -> GpuComparison:
    """``load`` plus a row: how far each side's utilization rose from ``idle``. Both must
    rise by ``min_rise`` points; not compared where a side reports none (MIG)."""
    label = f"{UTILIZATION.smi} rise [{UTILIZATION.unit}]"

    def util(c: GpuComparison | None) -> tuple[float | None, float | None]:
        row = next((r for r in (c.rows if c else ()) if r.field == UTILIZATION.label), None)
        return (row.exporter, row.smi) if row else (None, None)

    (ie, is_), (le, ls) = util(idle), util(load)
    if None in (ie, is_, le, ls):
        row = Row(label, None, None, None, True, "not compared: utilization not reported")
    else:
        e, s = le - ie, ls - is_
        row = Row(label, e, s, None, e >= min_rise and s >= min_rise,
                  f"each must rise >= {min_rise:g}")
    return dataclasses.replace(load, rows=(*load.rows, row))


def failures(comparisons: Sequence[GpuComparison], phase: str) -> list[str]:
    """One line per mismatch, saying which GPU, which field and by how much."""
    lines = []
    for c in comparisons:
        gpu = f"{phase}: GPU {c.index if c.index is not None else '?'} ({c.uuid or 'no UUID'})"
        if c.problem:
            lines.append(f"{gpu}: {c.problem}")
            continue
        for r in c.rows:
            if r.ok:
                continue
            if r.difference is not None and r.allowed is not None:
                lines.append(f"{gpu}: {r.field}: exporter {_num(r.exporter)}, nvidia-smi "
                             f"{_num(r.smi)}, {_num(abs(r.difference))} apart "
                             f"(allowed {_num(r.allowed)})" + (f" ({r.note})" if r.note else ""))
            else:
                lines.append(f"{gpu}: {r.field}: exporter {_num(r.exporter)}, nvidia-smi "
                             f"{_num(r.smi)} ({r.note})")
    return lines


# -- printing -----------------------------------------------------------------------------
def _num(v: float | None) -> str:
    if v is None:
        return "-"
    v = round(float(v), 2)  # 77.71 - 77.71000000000001 reads 0, not 0.00
    return str(int(v)) if v.is_integer() else f"{v:.2f}"


_HEADER = ("field", "exporter", "nvidia-smi", "difference", "allowed", "verdict")


def format_table(c: GpuComparison, phase: str) -> str:
    """One GPU's comparison as an aligned text table."""
    index = c.index if c.index is not None else "?"
    lines = [f"GPU {index}  {c.uuid or '(no UUID)'}  [{phase}]"
             + (f"  MISMATCH: {c.problem}" if c.problem else "")]
    rows = [_HEADER]
    for r in c.rows:
        verdict = "-" if c.problem else "OK" if r.ok else "MISMATCH"
        rows.append((r.field, _num(r.exporter), _num(r.smi), _num(r.difference),
                     "-" if r.allowed is None else f"±{_num(r.allowed)}",
                     f"{verdict}  {r.note}".rstrip()))
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER) - 1)]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [v.rjust(w) for v, w in zip(row[1:-1], widths[1:],
                                                                          strict=True)]
        lines.append("  " + "  ".join([*cells, row[-1]]))
    return "\n".join(lines)


@dataclass(frozen=True)
class Timing:
    name: str
    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def format_timings(timings: Sequence[Timing]) -> str:
    """min/median/max in ms per method, and each median over the first row's."""
    base = timings[0].median
    rows = [("method", "runs", "min ms", "median ms", "max ms", "median vs row 1")]
    for t in timings:
        rows.append((t.name, str(len(t.seconds)), f"{min(t.seconds) * 1e3:.3f}",
                     f"{t.median * 1e3:.3f}", f"{max(t.seconds) * 1e3:.3f}",
                     f"{t.median / base:.1f}x" if base > 0 else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join([row[0].ljust(widths[0]),
                                       *(v.rjust(w) for v, w in zip(row[1:], widths[1:],
                                                                    strict=True))])
                     for row in rows)


def time_calls(name: str, fn: Callable[[], object], runs: int,
               clock: Callable[[], float] = time.perf_counter) -> Timing:
    seconds = []
    for _ in range(runs):
        began = clock()
        fn()
        seconds.append(clock() - began)
    return Timing(name, tuple(seconds))


# -- the shell: nvidia-smi, NVML, torch ---------------------------------------------------
def run_nvidia_smi(timeout: float = 30.0) -> str:
    """nvidia-smi's CSV for :data:`QUERY`; HostCheckError where it is missing or fails."""
    try:
        done = subprocess.run(NVIDIA_SMI, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise HostCheckError("nvidia-smi is not on PATH: this check needs a host with an "
                             "NVIDIA GPU and its driver (nvidia-smi comes with it)") from None
    except subprocess.TimeoutExpired:
        raise HostCheckError(f"nvidia-smi did not answer in {timeout:g} s") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip() or "(nothing)"
        raise HostCheckError(f"{' '.join(NVIDIA_SMI)} exited with {done.returncode}: {said}")
    return done.stdout


NVIDIA_SMI_LIST: tuple[str, ...] = ("nvidia-smi", "-L")
_MIG_LINE = re.compile(r"^\s+MIG .*\(UUID: (MIG-[0-9A-Za-z-]+)\)\s*$", re.MULTILINE)


def mig_uuids_listed(text: str) -> set[str]:
    """The MIG devices' UUIDs in ``nvidia-smi -L``'s output (the indented ``MIG ...
    Device N: (UUID: MIG-...)`` lines under each GPU in MIG mode)."""
    return set(_MIG_LINE.findall(text))


def mig_problems(snap: Snapshot, listed: str) -> tuple[str, list[str]]:
    """(what was seen, problems): the exporter's MIG devices against ``nvidia-smi -L``'s,
    by UUID, and each exported one tied to a GPU the exporter also exports."""
    smi = mig_uuids_listed(listed)
    mine = {g.uuid: g for g in snap.gpus if g.mig_device is not None}
    gpus = {g.uuid for g in snap.gpus if g.mig_device is None}
    lines = [f"MIG devices: {len(mine)} exported, {len(smi)} in nvidia-smi -L"]
    for u, g in sorted(mine.items(), key=lambda item: item[1].label):
        total = None if g.memory_total_bytes is None else g.memory_total_bytes / MIB
        lines.append(f"  {g.label} {u} of {g.parent_uuid}, memory {_num(total)} MiB")
    problems = [f"MIG device {u} is in nvidia-smi -L but not exported"
                for u in sorted(smi - set(mine))]
    problems += [f"MIG device {u} is exported but not in nvidia-smi -L"
                 for u in sorted(set(mine) - smi)]
    problems += [f"MIG device {u}'s GPU {g.parent_uuid} is not exported"
                 for u, g in sorted(mine.items()) if g.parent_uuid not in gpus]
    seen = "\n".join(lines)
    return seen, problems


def run_nvidia_smi_list(timeout: float = 30.0) -> str:
    """``nvidia-smi -L``'s output; HostCheckError where it fails."""
    try:
        done = subprocess.run(NVIDIA_SMI_LIST, capture_output=True, text=True, timeout=timeout)
    except (FileNotFoundError, subprocess.TimeoutExpired) as e:
        raise HostCheckError(f"nvidia-smi -L: {e}") from None
    if done.returncode != 0:
        raise HostCheckError(f"nvidia-smi -L exited with {done.returncode}: "
                             f"{(done.stderr or done.stdout).strip() or '(nothing)'}")
    return done.stdout


def sample(poller: Poller, smi: Callable[[], str]) -> list[GpuComparison]:
    """An exporter poll, an nvidia-smi read, and another exporter poll, compared (see
    :func:`compare_gpu`: nvidia-smi's value against the exporter's on either side)."""

    def poll() -> Snapshot:
        snap = poller.poll()
        if not snap.nvml_up:
            raise HostCheckError(f"the exporter's NVML did not answer: {snap.nvml_error}")
        return snap

    before = poll()
    text = smi()
    after = {r.uuid: r for r in exporter_readings(poll())}
    try:
        smi_readings = parse_smi_csv(text)
    except ValueError as e:
        raise HostCheckError(str(e)) from None
    return [compare_gpu(e, s, after.get(e.uuid) if e is not None else None)
            for e, s in pair_by_uuid(exporter_readings(before), smi_readings)]


def _torch_uuids(torch, count: int) -> set[str] | None:
    """NVML-style UUIDs of torch's devices, or None where this torch does not tell."""
    uuids = set()
    for i in range(count):
        u = str(getattr(torch.cuda.get_device_properties(i), "uuid", "") or "")
        if not u:
            return None
        uuids.add(u if u.startswith(("GPU-", "MIG-")) else f"GPU-{u}")
    return uuids


@contextlib.contextmanager
def matmul_load(size: int = 8192, settle: float = 2.0) -> Iterator[set[str] | None]:
    """Keeps every GPU torch sees busy with matmuls, one thread each, until exit. Yields
    once every GPU has finished a first batch and ``settle`` seconds more have passed (so
    the driver's utilization sample covers only the load), with the loaded GPUs' UUIDs
    (None where torch does not say)."""
    try:
        import torch
    except ImportError:
        raise HostCheckError("torch is not installed, so no load can be put on the GPU; "
                             "install it, or pass --no-load to compare at idle only") from None
    if not torch.cuda.is_available():
        raise HostCheckError("torch sees no CUDA device (a CPU-only torch build?); "
                             "pass --no-load to compare at idle only")
    count = torch.cuda.device_count()
    stop, errors = threading.Event(), []
    started = threading.Barrier(count + 1)

    def work(device: str) -> None:
        try:
            a = torch.randn(size, size, device=device)
            batches = 0
            while not stop.is_set():
                for _ in range(20):
                    a = (a @ a).clamp_(-1, 1)
                torch.cuda.synchronize(device)
                batches += 1
                if batches == 1:
                    started.wait(120)
        except threading.BrokenBarrierError:
            pass  # another device failed or the start took too long: reported below
        except Exception as e:
            errors.append(f"{device}: {type(e).__name__}: {e}")
            started.abort()

    threads = [threading.Thread(target=work, args=(f"cuda:{i}",), daemon=True)
               for i in range(count)]
    for t in threads:
        t.start()
    try:
        try:
            started.wait(120)
        except threading.BrokenBarrierError:
            raise HostCheckError("the matmul load did not start on every GPU within 120 s: "
                                 + ("; ".join(errors) or "no error reported")) from None
        time.sleep(settle)
        yield _torch_uuids(torch, count)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    if errors:
        raise HostCheckError("the matmul load failed while it ran: " + "; ".join(errors))


def scrape_costs(poller: Poller, smi: Callable[[], str], runs: int) -> list[Timing]:
    registry = make_registry(poller)
    poller.poll()
    return [
        time_calls("exporter: NVML poll + /metrics", lambda: (poller.poll(),
                                                              generate_latest(registry)), runs),
        time_calls("exporter: /metrics from snapshot", lambda: generate_latest(registry), runs),
        time_calls("nvidia-smi + CSV parse", lambda: parse_smi_csv(smi()), runs),
    ]


def run_check(poller: Poller, smi: Callable[[], str] = run_nvidia_smi, runs: int = 20,
              load: Callable[[], contextlib.AbstractContextManager] | None = matmul_load,
              out: Callable[[str], None] = print,
              smi_list: Callable[[], str] | None = None) -> int:
    """The whole check against ``poller``: 0 all agree, 1 mismatches (each printed).
    *smi_list*: ``nvidia-smi -L``, to check the MIG devices (None: not checked)."""
    problems: list[str] = []
    idle = sample(poller, smi)
    for c in idle:
        out(format_table(c, "idle") + "\n")
    problems += failures(idle, "idle")
    if smi_list is not None:
        seen, wrong = mig_problems(poller.latest, smi_list())
        out(seen + "\n")
        problems += wrong
    if load is not None:
        with load() as loaded:
            under = sample(poller, smi)
        by_uuid = {c.uuid: c for c in idle}
        if loaded is not None and not loaded & {c.uuid for c in under}:
            loaded = None  # torch's UUIDs do not look like NVML's: assume all are loaded
        under = [with_rise(c, by_uuid.get(c.uuid)) if loaded is None or c.uuid in loaded
                 else c for c in under]
        for c in under:
            out(format_table(c, "under load") + "\n")
        problems += failures(under, "under load")
    out(f"Scrape cost, {runs} runs each (process list read on every poll; "
        f"nvidia-smi with the {len(QUERY)} fields above):")
    out(format_timings(scrape_costs(poller, smi, runs)) + "\n")
    if problems:
        out(f"MISMATCH: the exporter and nvidia-smi disagree beyond tolerance "
            f"({len(problems)}):")
        for p in problems:
            out(f"  {p}")
        return 1
    out("OK: the exporter and nvidia-smi agree on every GPU" + (
        "" if load is None else ", idle and under load"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m gpulab_exporter.hostcheck",
                                description="Compare the exporter's values with nvidia-smi's on "
                                            "every GPU, idle and under a torch matmul load, "
                                            "and time a scrape each way.")
    p.add_argument("--runs", type=int, default=20, metavar="N",
                   help="scrapes timed per method (default: %(default)s)")
    p.add_argument("--no-load", action="store_true",
                   help="compare at idle only (where torch is not installed)")
    args = p.parse_args(argv)
    poller = Poller(Nvml(), interval=1.0, process_interval=0.0)
    try:
        run_nvidia_smi()  # first, so a host without a GPU stops here with the reason
        return run_check(poller, runs=max(1, args.runs),
                         load=None if args.no_load else matmul_load,
                         smi_list=run_nvidia_smi_list)
    except HostCheckError as e:
        print(f"gpu-host-check: {e}", file=sys.stderr)
        return 2
    finally:
        poller.stop()


if __name__ == "__main__":
    raise SystemExit(main())
