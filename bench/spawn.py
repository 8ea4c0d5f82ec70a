"""Spawn-to-ready latency: gpulab's hub vs a stock DockerSpawner hub, side by side.

Both hubs run in the same run, on the same image and machine. The baseline is
a second hub container (`gpulab-bench-vanilla`, port 8001) with DockerSpawner as its
documentation configures it (bench/vanilla_jupyterhub_config.py). For each hub:

* sequential: N spawns one after another (create user, POST /server, poll until the hub
  reports the server ready, stop, delete);
* concurrent: N users spawning at once.

"Ready" is what a user waits for: the hub's REST model says ready=True (the moment the
spawn page redirects to JupyterLab). Run with `make bench` or
`python -m bench.spawn --n 5 --concurrent 4` from the repository root, stack up.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from tests.integration.stack import Hub, docker, wait_for

HERE = Path(__file__).resolve().parent
VANILLA = "gpulab-bench-vanilla"
# The stock hub gets a plain bridge network of its own: gpulab's network lets only
# gpulab's hub talk to user containers (gpulab-netguard).
VANILLA_NETWORK = "gpulab-bench"


def start_vanilla_hub() -> Hub:
    token = secrets.token_hex(32)
    docker("rm", "-f", VANILLA, check=False)
    if not docker("network", "ls", "-q", "--filter", f"name=^{VANILLA_NETWORK}$"):
        docker("network", "create", VANILLA_NETWORK)
    docker(
        "run", "-d", "--name", VANILLA, "--hostname", VANILLA, "--network", VANILLA_NETWORK,
        "-p", "127.0.0.1:8001:8000",
        "-v", "/var/run/docker.sock:/var/run/docker.sock",
        "-v", f"{HERE / 'vanilla_jupyterhub_config.py'}:/srv/vanilla.py:ro",
        "-e", f"BENCH_API_TOKEN={token}",
        "gpulab/hub:latest", "jupyterhub", "--config", "/srv/vanilla.py",
    )
    hub = Hub("http://127.0.0.1:8001", token)
    wait_for(hub.is_up, 60, what="the vanilla hub")
    return hub


def stop_vanilla_hub() -> None:
    """Remove the stock hub and any user container it left behind."""
    docker("rm", "-f", VANILLA, check=False)
    for cid in docker("ps", "-aq", "--filter", "name=bench-vanilla-").split():
        docker("rm", "-f", cid, check=False)
    docker("network", "rm", VANILLA_NETWORK, check=False)


def spawn_once(hub: Hub) -> float:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    assert hub.request("POST", f"/users/{name}", json={}).status_code == 201
    t0 = time.monotonic()
    r = hub.request("POST", f"/users/{name}/server", json={}, timeout=300)
    if r.status_code not in (201, 202):
        raise RuntimeError(f"spawn failed: {r.status_code} {r.text}")
    wait_for(lambda: (hub.server_model(name) or {}).get("ready"), 300, interval=0.05,
             what=f"{name} ready")
    elapsed = time.monotonic() - t0
    hub.delete_user(name)
    return elapsed


def measure(hub: Hub, n: int, concurrent: int) -> dict[str, list[float]]:
    seq = [spawn_once(hub) for _ in range(n)]
    with ThreadPoolExecutor(concurrent) as pool:
        conc = list(pool.map(lambda _: spawn_once(hub), range(concurrent)))
    return {"sequential": seq, f"{concurrent} at once": conc}


def summary(xs: list[float]) -> str:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
    return f"{xs[0]:6.2f} {statistics.median(xs):7.2f} {p95:6.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5, help="sequential spawns per hub (default 5)")
    ap.add_argument("--concurrent", type=int, default=4, help="users spawning at once (default 4)")
    args = ap.parse_args()

    gpulab = Hub()
    if not gpulab.is_up():
        raise SystemExit("the gpulab hub is not up: run `make up` first")
    vanilla = start_vanilla_hub()
    try:
        results = {"gpulab": measure(gpulab, args.n, args.concurrent),
                   "vanilla DockerSpawner": measure(vanilla, args.n, args.concurrent)}
    finally:
        stop_vanilla_hub()

    print(f"\nspawn -> hub reports ready, seconds (n={args.n} sequential, "
          f"{args.concurrent} concurrent)")
    print(f"{'hub':24} {'phase':12} {'min':>6} {'median':>7} {'p95':>6}")
    for hub_name, phases in results.items():
        for phase, xs in phases.items():
            print(f"{hub_name:24} {phase:12} {summary(xs)}")
    for phase in results["gpulab"]:
        ratio = statistics.median(results["vanilla DockerSpawner"][phase]) / statistics.median(
            results["gpulab"][phase])
        print(f"median ratio vanilla/gpulab, {phase}: {ratio:.2f}x")


if __name__ == "__main__":
    try:
        main()
    except (requests.RequestException, subprocess.SubprocessError) as e:
        raise SystemExit(f"bench failed: {e}") from None
