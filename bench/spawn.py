"""Spawn-to-ready latency: gpulab's hub vs a stock DockerSpawner hub, side by side.

Both hubs run in the same run, on the same image and machine. The baseline is
a second hub container (`gpulab-bench-vanilla`, port 8001) with DockerSpawner as its
documentation configures it (bench/vanilla_jupyterhub_config.py). For each hub:

* sequential: N spawns one after another (create user, POST /server, poll until the hub
  reports the server ready, stop, delete);
* concurrent: N users spawning at once.

"Ready" is what a user waits for: the hub's REST model says ready=True (the moment the
spawn page redirects to JupyterLab). Each sequential spawn is also taken apart phase by
phase (bench/timeline.py: container created, started, server imports done, listening,
hub sees it ready, route added), from the timestamps Docker keeps.

`--image` runs gpulab's hub once per single-user image, side by side in one run (the
bench sets `spawn.image` in config/gpulab.yaml and puts the file back after), for
example the image before and after a change:

    git stash; make images; docker tag gpulab/singleuser:cpu gpulab/singleuser:before
    git stash pop; make images
    python -m bench.spawn --image gpulab/singleuser:before --image gpulab/singleuser:cpu

`--swarm` adds gpulab on a simulated Swarm (tests/swarm: a manager and two GPU
servers, each a dockerd in a network namespace of its own, on this machine), brought up
with `make up-swarm` as docs/swarm.md says: the same spawns, each landing on a worker,
against the single-host stack's, in the same run. Its hub is reached through the
manager's published port (tests/swarm/forward.py); Docker's timestamps are on the
workers, so it has no phase breakdown.

Run with `make bench` or `python -m bench.spawn --n 5 --concurrent 4` from the
repository root, stack up.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests

from bench.timeline import PHASES, spawn_timeline
from gpulab.contract import HUB_CONTAINER, PROXY_CONTAINER
from gpulab.spawn.naming import container_name
from tests.integration.stack import Hub, LabConfig, docker, wait_for

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


@dataclass
class Target:
    """A hub under test, and where its logs are."""

    label: str
    hub: Hub
    hub_container: str
    proxy_container: str
    user_container: object  # username -> the name of their server's container
    login_tokens: bool  # gpulab's hub: members get a login token, as in real use
    phases: bool = True  # Docker's timestamps for its containers are on this machine


def gpulab_target(label: str) -> Target:
    return Target(label, Hub(), HUB_CONTAINER, PROXY_CONTAINER, container_name,
                  login_tokens=True)


def vanilla_target(hub: Hub) -> Target:
    return Target("vanilla DockerSpawner", hub, VANILLA, VANILLA,
                  lambda name: f"bench-vanilla-{name}", login_tokens=False)


def logs(container: str, since: float) -> str:
    out = subprocess.run(["docker", "logs", "--timestamps", "--since", f"{since - 1:.3f}",
                          container], capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


def spawn_once(target: Target, phases: bool = False) -> dict[str, float | None]:
    """Spawn a new user's server; {"total": seconds to ready} and, with *phases*, the
    timeline of bench/timeline.py."""
    hub = target.hub
    name = f"bench{uuid.uuid4().hex[:8]}"  # no "-": DockerSpawner escapes it in names
    if target.login_tokens:
        hub.create_user(name=name)
    else:
        assert hub.request("POST", f"/users/{name}", json={}).status_code == 201
    try:
        deadline = time.time() + 60
        while True:
            t0 = time.time()
            r = hub.request("POST", f"/users/{name}/server", json={}, timeout=300)
            # On a Swarm a stopped server's GPUs stay busy through the stop grace period
            # (12 s), so that no GPU is given twice: the spawn is timed once one is free.
            if r.status_code != 409 or "in use" not in r.text or time.time() > deadline:
                break
            time.sleep(0.5)
        if r.status_code not in (201, 202):
            raise RuntimeError(f"spawn failed: {r.status_code} {r.text}")
        wait_for(lambda: (hub.server_model(name) or {}).get("ready"), 300, interval=0.05,
                 what=f"{name} ready")
        ready = time.time()
        result: dict[str, float | None] = {"total": ready - t0}
        if phases:
            container = target.user_container(name)
            created, started = docker("inspect", "-f", "{{.Created}} {{.State.StartedAt}}",
                                      container).split()
            result.update(spawn_timeline(
                name, t0, created, started, logs(container, t0),
                logs(target.hub_container, t0), logs(target.proxy_container, t0), ready))
        return result
    finally:
        hub.delete_user(name)


def measure(target: Target, n: int, concurrent: int) -> dict[str, list]:
    seq = [spawn_once(target, phases=target.phases) for _ in range(n)]
    with ThreadPoolExecutor(concurrent) as pool:
        conc = list(pool.map(lambda _: spawn_once(target)["total"], range(concurrent)))
    return {"sequential": [s["total"] for s in seq], f"{concurrent} at once": conc,
            "timeline": seq}


def with_image(image: str):
    """config/gpulab.yaml with spawn.image set to *image* (the hub and the Docker proxy
    read it at each spawn); LabConfig puts the file back."""
    config = LabConfig()
    text = config.original("gpulab.yaml")
    lines = [line for line in text.splitlines() if line.strip().startswith("image:")]
    if len(lines) != 1:
        raise SystemExit("bench: config/gpulab.yaml must have exactly one `image:` line")
    indent = lines[0][:len(lines[0]) - len(lines[0].lstrip())]
    config.write("gpulab.yaml", text.replace(lines[0], f"{indent}image: {image}"))
    return config


def with_spawn_setting(key: str, value: str):
    """config/gpulab.yaml with spawn.KEY set to *value* (read at each spawn); LabConfig puts
    the file back."""
    config = LabConfig()
    text = config.original("gpulab.yaml")
    if "\nspawn:\n" not in text or f"\n  {key}:" in text:
        raise SystemExit(f"bench: config/gpulab.yaml must have a `spawn:` section without "
                         f"{key}")
    config.write("gpulab.yaml", text.replace("\nspawn:\n", f"\nspawn:\n  {key}: {value}\n", 1))
    return config


def summary(xs: list[float]) -> str:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
    return f"{xs[0]:6.2f} {statistics.median(xs):7.2f} {p95:6.2f}"


def median(xs: list[float | None]) -> str:
    xs = [x for x in xs if x is not None]
    return f"{statistics.median(xs):.2f}" if xs else "-"


def swarm_results(n: int, concurrent: int) -> dict[str, list]:
    """measure() on gpulab's stack on a simulated Swarm, torn down afterwards."""
    import tempfile

    from tests.integration.swarm_lab import IMAGES, SwarmLab
    from tests.swarm import Swarm

    print("starting a simulated Swarm (1 manager, 2 GPU servers) and make up-swarm ...",
          flush=True)
    with Swarm(nodes=3, images=IMAGES) as cluster, \
            tempfile.TemporaryDirectory(prefix="gpulab-bench-swarm-") as root:
        lab = SwarmLab(cluster, Path(root))
        try:
            lab.start()
            target = Target("gpulab, Swarm worker", lab.hub, "", "", None, login_tokens=True,
                            phases=False)
            return measure(target, n, concurrent)
        finally:
            lab.close()


def print_timelines(results: dict[str, dict]) -> None:
    results = {k: v for k, v in results.items() if all(len(t) > 1 for t in v["timeline"])}
    labels = list(results)
    width = max(12, *(len(label) for label in labels))
    print("\none spawn, phase by phase: seconds since the request at the end of each phase "
          "(median of the sequential spawns)")
    print(f"{'phase':22}" + "".join(f" {label:>{width}}" for label in labels))
    for phase in PHASES:
        row = [median([t[phase] for t in results[label]["timeline"]]) for label in labels]
        print(f"{phase:22}" + "".join(f" {cell:>{width}}" for cell in row))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5, help="sequential spawns per hub (default 5)")
    ap.add_argument("--concurrent", type=int, default=4, help="users spawning at once (default 4)")
    ap.add_argument("--image", action="append", default=[],
                    help="single-user image for gpulab's hub; repeat to compare images side "
                         "by side (default: the one config/gpulab.yaml sets)")
    ap.add_argument("--no-vanilla", action="store_true",
                    help="skip the stock DockerSpawner baseline")
    ap.add_argument("--swarm", action="store_true",
                    help="also gpulab on a simulated Swarm, servers on its workers")
    args = ap.parse_args()

    if not Hub().is_up():
        raise SystemExit("the gpulab hub is not up: run `make up` first")
    results = {}
    for image in args.image or [None]:
        label = f"gpulab, {image.rpartition('/')[2]}" if image else "gpulab"
        config = with_image(image) if image else None
        try:
            results[label] = measure(gpulab_target(label), args.n, args.concurrent)
        finally:
            if config:
                config.restore()
    if args.swarm:
        results["gpulab, Swarm worker"] = swarm_results(args.n, args.concurrent)
    if not args.no_vanilla:
        vanilla = start_vanilla_hub()
        try:
            results["vanilla DockerSpawner"] = measure(vanilla_target(vanilla), args.n,
                                                        args.concurrent)
        finally:
            stop_vanilla_hub()

    print(f"\nspawn -> hub reports ready, seconds (n={args.n} sequential, "
          f"{args.concurrent} concurrent)")
    width = max(24, *(len(label) for label in results))
    print(f"{'hub':{width}} {'phase':12} {'min':>6} {'median':>7} {'p95':>6}")
    for label, phases in results.items():
        for phase in ("sequential", f"{args.concurrent} at once"):
            print(f"{label:{width}} {phase:12} {summary(phases[phase])}")
    print_timelines(results)
    labels = list(results)
    pairs = [(other, labels[0]) if other == "gpulab, Swarm worker" else (labels[0], other)
             for other in labels[1:] if other != "vanilla DockerSpawner"]
    if "vanilla DockerSpawner" in results:
        pairs += [("vanilla DockerSpawner", label) for label in labels[:-1]]
    for slower, faster in pairs:
        for phase in ("sequential", f"{args.concurrent} at once"):
            ratio = statistics.median(results[slower][phase]) / statistics.median(
                results[faster][phase])
            print(f"median ratio {slower} / {faster}, {phase}: {ratio:.2f}x")


if __name__ == "__main__":
    try:
        main()
    except (requests.RequestException, subprocess.SubprocessError) as e:
        raise SystemExit(f"bench failed: {e}") from None
