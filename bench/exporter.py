"""Benchmark the GPU exporter: /metrics scrape latency over real HTTP and the exporter's
RSS, for 8 fake GPUs and 200 GPU processes in 20 hub user containers; and, where
nvidia-smi exists, the cost of shelling out to it per scrape, for comparison.

    .venv/bin/python bench/exporter.py [--scrapes 2000] [--process-info]

The exporter runs in a child process (so its RSS is its own), serving snapshots taken
by its poller from FakeNvml; scrapes never call NVML, so the figures are the same shape
on a GPU host (the poller's NVML time is reported separately there as
gpulab_exporter_collection_duration_seconds).
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

GPUS, PROCESSES, USERS = 8, 200, 20
TARGET_P99_MS, TARGET_RSS_MIB = 5.0, 60.0


def child(port_file: str, process_info: bool) -> None:
    """The exporter under test: 8 fake GPUs, 200 processes, 20 user containers."""
    from gpulab_exporter.attribution import Container, StaticContainerDirectory
    from gpulab_exporter.fake_nvml import FakeGpu, FakeNvml, fake_uuid
    from gpulab_exporter.nvml import GpuProcess
    from gpulab_exporter.server import make_app, make_registry, serve
    from gpulab_exporter.snapshot import Poller

    proc = tempfile.mkdtemp(prefix="bench-proc-")
    cids = [f"{u:064x}" for u in range(1, USERS + 1)]
    gpus = [FakeGpu(i, utilization_percent=10 * i, memory_used=(i + 1) << 30) for i in range(GPUS)]
    for n in range(PROCESSES):
        pid = 10_000 + n
        os.makedirs(os.path.join(proc, str(pid)))
        with open(os.path.join(proc, str(pid), "cgroup"), "w") as f:
            f.write(f"0::/system.slice/docker-{cids[n % USERS]}.scope\n")
        gpus[n % GPUS].processes.append(GpuProcess(pid, 256 << 20))
    directory = StaticContainerDirectory([
        Container(cid, f"gpulab-user{u}", f"user{u}", "", (fake_uuid(u % GPUS),))
        for u, cid in enumerate(cids)
    ])
    poller = Poller(FakeNvml(gpus), directory=directory, proc=proc, interval=5,
                    process_interval=15)
    poller.poll()
    poller.start()
    server, _ = serve(make_app(poller, make_registry(poller, process_info=process_info)),
                      "127.0.0.1:0")
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.server_port))
    os.rename(port_file + ".tmp", port_file)
    while True:
        time.sleep(3600)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def scrape_latencies(port: int, n: int) -> tuple[list[float], int]:
    times, size = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        times.append((time.perf_counter() - t0) * 1000)
        assert resp.status == 200
        size = len(body)
    return times, size


def nvidia_smi(n: int) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "not available here (no nvidia-smi on PATH)"
    cmd = [exe, "--query-gpu=index,uuid,name,utilization.gpu,memory.used,memory.total,"
           "temperature.gpu,power.draw,clocks.sm,clocks.mem,fan.speed",
           "--format=csv,noheader,nounits"]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, timeout=30)
        times.append((time.perf_counter() - t0) * 1000)
        if p.returncode != 0:
            return f"fails here: {p.stderr.decode().strip()[:120]}"
    median, p99 = statistics.median(times), percentile(times, 0.99)
    return f"median {median:.1f} ms, p99 {p99:.1f} ms ({n} runs)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scrapes", type=int, default=2000)
    ap.add_argument("--smi-runs", type=int, default=50)
    ap.add_argument("--process-info", action="store_true",
                    help="also export the per-PID info series (200 more series)")
    ap.add_argument("--child", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.process_info)
        return 0

    port_file = os.path.join(tempfile.mkdtemp(prefix="bench-"), "port")
    cmd = [sys.executable, __file__, "--child", port_file]
    if args.process_info:
        cmd.append("--process-info")
    p = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(port_file):
            if time.monotonic() > deadline or p.poll() is not None:
                raise SystemExit("exporter child did not start")
            time.sleep(0.05)
        port = int(open(port_file).read())
        rss_idle = rss_mib(p.pid)
        scrape_latencies(port, 50)  # warm up
        times, size = scrape_latencies(port, args.scrapes)
        rss_after = rss_mib(p.pid)
    finally:
        p.terminate()
        p.wait(10)

    p50, p99 = statistics.median(times), percentile(times, 0.99)
    rows = [
        ("setup", f"{GPUS} fake GPUs, {PROCESSES} processes, {USERS} users"
                  f"{', --process-info' if args.process_info else ''}"),
        ("/metrics size", f"{size / 1024:.1f} KiB"),
        ("scrapes", f"{args.scrapes} over HTTP on 127.0.0.1, new connection each"),
        ("scrape median", f"{p50:.2f} ms"),
        ("scrape p99", f"{p99:.2f} ms   (target < {TARGET_P99_MS} ms: "
                       f"{'ok' if p99 < TARGET_P99_MS else 'MISSED'})"),
        ("scrape max", f"{max(times):.2f} ms"),
        ("exporter RSS", f"{rss_idle:.1f} MiB at start, {rss_after:.1f} MiB after scrapes "
                         f"(target < {TARGET_RSS_MIB} MiB: "
                         f"{'ok' if rss_after < TARGET_RSS_MIB else 'MISSED'})"),
        ("nvidia-smi per scrape", nvidia_smi(args.smi_runs)),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0 if p99 < TARGET_P99_MS and rss_after < TARGET_RSS_MIB else 1


if __name__ == "__main__":
    raise SystemExit(main())
