"""Try gpulab's multi-node mode on one machine: a simulated Swarm that stays up until
Ctrl-C (docs/swarm.md, "Try it on one machine").

    .venv/bin/python -m tests.swarm [--nodes 3] [--gpus-per-worker 2] [IMAGE ...]

IMAGE defaults to the four gpulab images, copied onto every machine (no registry). It
prints the commands that bring the stack up on the manager, then waits; Ctrl-C (or
SIGTERM) tears the cluster down. Do not run it while the test suite runs: both use the
same addresses.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from . import Swarm, SwarmError

IMAGES = ("gpulab/hub:latest", "gpulab/exporter:latest", "gpulab/prometheus:latest",
          "gpulab/singleuser:latest")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.swarm", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--nodes", type=int, default=3, help="machines, the manager included")
    ap.add_argument("--gpus-per-worker", type=int, default=2)
    ap.add_argument("images", nargs="*", default=list(IMAGES))
    args = ap.parse_args(argv)
    cluster = Swarm(nodes=args.nodes, gpus_per_worker=args.gpus_per_worker,
                    images=tuple(args.images))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        print(f"starting {args.nodes} machines and copying {len(args.images)} image(s) onto "
              f"each (a minute or two) ...", flush=True)
        cluster.start()
        m = cluster.manager
        sock = m.paths.socket
        for node in cluster.nodes:
            print(f"  {node.hostname:24} {node.plan.role:8} {len(node.gpus)} fake GPU(s)")
        nodes = "\n".join(f"""  nsenter --net=/run/netns/{w.plan.netns} make swarm-node BUILD_IMAGES=no \\
    DOCKER_HOST={w.host} GPULAB_DOCKER_SOCKET={w.paths.socket} \\
    GPULAB_DOCKER_EXEC_ROOT={w.paths.exec} GPULAB_NODE_ADDRESS={w.address} \\
    GPULAB_EXPORTER_FLAGS="--fake-gpus {len(w.gpus)} --fake-uuids {','.join(w.gpus)}"
""" for w in cluster.workers)
        print(f"""
The Swarm is up. In another shell, on the manager (its network namespace and engine):

  mkdir -p /tmp/gpulab-swarm-config && cp config/* /tmp/gpulab-swarm-config/
  # then set  hub: {{swarm: true}}  in /tmp/gpulab-swarm-config/gpulab.yaml
  nsenter --net=/run/netns/{m.plan.netns} make up-swarm BUILD_IMAGES=no \\
    GPULAB_CONFIG=/tmp/gpulab-swarm-config DOCKER_HOST={m.host} \\
    GPULAB_DOCKER_SOCKET={sock} GPULAB_DOCKER_EXEC_ROOT={m.paths.exec}

and on each GPU server (its netguard, and its exporter with its fake GPUs):

{nodes}
  export DOCKER_HOST={m.host}   # docker node ls, docker service ls
  nsenter --net=/run/netns/{m.plan.netns} curl -s http://127.0.0.1:8000/hub/api

Ctrl-C here tears the cluster down.""", flush=True)
        stop.wait()
    except SwarmError as e:
        print(f"the simulated Swarm did not start: {e}", file=sys.stderr)
        return 1
    finally:
        print("tearing the cluster down ...", flush=True)
        left = cluster.close()
        if left:
            print(f"left behind: {left}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
