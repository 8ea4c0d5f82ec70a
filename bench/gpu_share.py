"""Two members on one GPU: what one can do to the other, and what limits it.

    PYTHONPATH=hub python3 bench/gpu_share.py [--seconds 5] [--size 8192]

On a host with an NVIDIA GPU and a CUDA build of torch (scripts/gpu-host-check.sh runs it
there). A GPU that gpus.yaml marks `shared` goes to several members' servers at once:
each container gets the same GPU by UUID, and each member's kernel is a CUDA context of
its own, which the driver time-slices. Here each member is a process of its own on GPU 0:
  1. compute: B's bf16 matmul rate alone, then while A runs the same load (B's share);
  2. memory: A holds all the GPU's free memory but 2 GiB, then B asks for 4 GiB;
  3. the same two members with the cap gpulab's spawner sets in servers on a GPU that
     two share (PYTORCH_CUDA_ALLOC_CONF, gpulab.gpus.sharing): A asks for more than
     half, then holds a little less than half, and B asks for as much meanwhile;
  4. MPS, where nvidia-cuda-mps-control exists: a pinned device memory limit
     (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) and a share of the GPU's multiprocessors
     (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), alone and two at once. The MPS daemon is
     started for this run only and told to quit at its end.
Prints figures and what each member saw; asserts nothing about speed. Exit status 1 only
if a measurement could not be made at all (a member process failed to start CUDA).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from gpulab.gpus.sharing import ALLOC_CONF, alloc_conf

GIB = 1 << 30
WORKER_TIMEOUT = 120  # s for one member process, CUDA start included


# ------------------------------------------------------------ a member (child process)

def _say(**event) -> None:
    print(json.dumps(event), flush=True)


def _error_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def member_matmul(seconds: float, size: int) -> None:
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    _say(event="running")
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        n += 10
    took = time.perf_counter() - started
    _say(event="done", tflops=round(2 * size ** 3 * n / took / 1e12, 1), products=n)


def _bytes(size: str, free: int, total: int) -> int:
    """"4": 4 GiB; "45%": of the GPU's total memory; "-2": all that is free but 2 GiB."""
    if size.endswith("%"):
        return int(float(size[:-1]) / 100 * total)
    gib = float(size)
    return int(gib * GIB) if gib > 0 else free + int(gib * GIB)


def member_hold(size: str) -> None:
    """Holds *size* (as :func:`_bytes`) until stdin closes, and says whether it got it."""
    import torch

    free, total = torch.cuda.mem_get_info()
    want = _bytes(size, free, total)
    try:
        block = torch.empty(want, dtype=torch.uint8, device="cuda")
    except Exception as e:  # torch.OutOfMemoryError
        block = None
        _say(event="held", ok=False, gib=round(want / GIB, 1), error=_error_line(e)[:300])
    else:
        free_after, _ = torch.cuda.mem_get_info()
        _say(event="held", ok=True, gib=round(want / GIB, 1),
             free_gib=round(free_after / GIB, 1), total_gib=round(total / GIB, 1))
    sys.stdin.read()
    del block


def member_alloc(sizes: list[str]) -> None:
    """Asks for each size in turn (as :func:`_bytes`, freed after), and says what
    happened."""
    import torch

    free, total = torch.cuda.mem_get_info()
    _say(event="start", free_gib=round(free / GIB, 1), total_gib=round(total / GIB, 1))
    for size in sizes:
        gib = round(_bytes(size, free, total) / GIB, 1)
        try:
            block = torch.empty(int(gib * GIB), dtype=torch.uint8, device="cuda")
            block.fill_(1)
            torch.cuda.synchronize()
            del block
            torch.cuda.empty_cache()
            _say(event="alloc", gib=gib, ok=True)
        except Exception as e:  # torch.OutOfMemoryError, RuntimeError from MPS, ...
            _say(event="alloc", gib=gib, ok=False, error=_error_line(e)[:300])


# ------------------------------------------------------------------ the measurements

class Member:
    """One member's process (this file, `member ...`), read event by event."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "member", *args], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})})
        self.events: list[dict] = []
        self.stderr = ""  # what it wrote there, once it ended

    def _events(self) -> Iterator[dict]:
        """Its events as it prints them; once it has ended, its stderr is kept."""
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.events.append(json.loads(line))
                yield self.events[-1]
        self.proc.wait(timeout=WORKER_TIMEOUT)
        self.stderr += self.proc.stderr.read()

    def next(self, event: str) -> dict:
        """The next event named *event*; raises with the member's stderr if it ended."""
        for got in self._events():
            if got.get("event") == event:
                return got
        raise RuntimeError(f"member {self.proc.args[3:]} ended (exit {self.proc.returncode}) "
                           f"before '{event}': {self.stderr[-800:]}")

    def all(self, event: str) -> list[dict]:
        """Every *event* until the member ends."""
        for _ in self._events():
            pass
        return [e for e in self.events if e.get("event") == event]

    def end(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=WORKER_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def members(*started: Member) -> Iterator[tuple[Member, ...]]:
    try:
        yield started
    finally:
        for m in started:
            m.end()


def rate(seconds: float, size: int, env: dict | None = None) -> float:
    with members(Member("matmul", str(seconds), str(size), env=env)) as (m,):
        return m.next("done")["tflops"]


def compute(seconds: float, size: int, env_a: dict | None = None,
            env_b: dict | None = None) -> tuple[float, float, float]:
    """(B alone, B beside A, A beside B) in TFLOP/s."""
    alone = rate(seconds, size, env_b)
    with members(Member("matmul", str(seconds + 8), str(size), env=env_a)) as (a,):
        a.next("running")
        shared = rate(seconds, size, env_b)
        a_rate = a.next("done")["tflops"]
    return alone, shared, a_rate


def show_compute(title: str, alone: float, shared: float, a_rate: float) -> None:
    print(f"  {title}: B alone {alone:.0f} TFLOP/s; B beside A {shared:.0f} TFLOP/s "
          f"({shared / alone:.2f} of alone); A over its whole run (part of it alone) "
          f"{a_rate:.0f}")


def show_allocs(who: str, events: list[dict]) -> None:
    for e in events:
        print(f"  {who} asks for {e['gib']:g} GiB: "
              + ("got it" if e["ok"] else f"REFUSED ({e['error']})"))


def memory() -> None:
    with members(Member("hold", "-2")) as (a,):
        held = a.next("held")
        print(f"  A holds {held['gib']} GiB of {held['total_gib']} GiB; "
              f"{held['free_gib']} GiB left free")
        with members(Member("alloc", "1", "4")) as (b,):
            start = b.next("start")
            print(f"  B starts and sees {start['free_gib']} GiB free")
            show_allocs("B", b.all("alloc"))
        print(f"  A still holds its memory: {a.proc.poll() is None}")


def capped() -> None:
    """Both members with the environment gpulab's spawner gives servers on a GPU that two
    share (gpulab.gpus.sharing)."""
    env = alloc_conf(2)
    print(f"  both members' processes with {ALLOC_CONF}={env[ALLOC_CONF]} (the spawner's "
          f"cap where max_users is 2)")
    with members(Member("alloc", "60%", env=env)) as (m,):
        m.next("start")
        show_allocs("A", m.all("alloc"))
        warning = m.stderr.strip()
    if warning:
        print(f"  torch said: {warning.splitlines()[-1][:300]}")
    with members(Member("hold", "45%", env=env)) as (a,):
        held = a.next("held")
        print(f"  A holds {held['gib']} GiB: " + ("got it" if held["ok"] else
                                                  f"REFUSED ({held.get('error')})"))
        with members(Member("alloc", "45%", env=env)) as (b,):
            b.next("start")
            show_allocs("B, meanwhile,", b.all("alloc"))


@contextlib.contextmanager
def mps_daemon(control: str) -> Iterator[dict[str, str]]:
    root = tempfile.mkdtemp(prefix="gpulab-mps-")
    env = {"CUDA_MPS_PIPE_DIRECTORY": f"{root}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{root}/log"}
    for d in env.values():
        os.makedirs(d)
    subprocess.run([control, "-d"], env={**os.environ, **env}, check=True, timeout=30)
    try:
        yield env
    finally:
        subprocess.run([control], input="quit\n", text=True, env={**os.environ, **env},
                       timeout=60, check=False)
        with contextlib.suppress(OSError):
            for line in open(f"{root}/log/control.log").read().splitlines()[-5:]:
                print(f"  (MPS control log) {line}")
        shutil.rmtree(root, ignore_errors=True)


def mps(control: str, seconds: float, size: int) -> None:
    with mps_daemon(control) as env:
        pinned = {**env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4G"}
        with members(Member("alloc", "2", "8", env=pinned)) as (m,):
            start = m.next("start")
            allocs = m.all("alloc")
        print(f"  CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4G: the member sees "
              f"{start['total_gib']} GiB total, {start['free_gib']} GiB free")
        show_allocs("the member", allocs)
        full = rate(seconds, size, env)
        quarter = rate(seconds, size, {**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"})
        print(f"  one member under MPS: {full:.0f} TFLOP/s with all multiprocessors; "
              f"{quarter:.0f} with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 "
              f"({quarter / full:.2f})")
        half = {**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
        show_compute("two members under MPS, each limited to 50 %",
                     *compute(seconds, size, half, half))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="how long each matmul rate is measured")
    parser.add_argument("--size", type=int, default=8192, help="square bf16 matrices")
    args = parser.parse_args(argv)
    failed = False
    steps = [
        ("1. compute: two members' processes time-sliced on one GPU",
         lambda: show_compute("no limit", *compute(args.seconds, args.size))),
        ("2. memory: A takes all the GPU's free memory but 2 GiB; B asks for some",
         memory),
        ("3. the same with gpulab's memory cap for a GPU two servers share", capped),
    ]
    control = shutil.which("nvidia-cuda-mps-control")
    if control:
        steps.append(("4. MPS: limits the driver enforces per client",
                      lambda: mps(control, args.seconds, args.size)))
    else:
        steps.append(("4. MPS", lambda: print("  nvidia-cuda-mps-control is not on this "
                                              "host's PATH: not measured")))
    for title, run in steps:
        print(f"\n{title}", flush=True)
        started = time.monotonic()
        try:
            run()
        except Exception as e:  # a member that could not start CUDA, MPS refusing, ...
            failed = True
            print(f"  NOT MEASURED: {_error_line(e)[:600]}")
        print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["member"]:
        kind, rest = sys.argv[2], sys.argv[3:]
        if kind == "matmul":
            member_matmul(float(rest[0]), int(rest[1]))
        elif kind == "hold":
            member_hold(rest[0])
        else:
            member_alloc(rest)
    else:
        sys.exit(main())
