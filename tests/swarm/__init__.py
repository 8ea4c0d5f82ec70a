"""A simulated multi-host Docker Swarm for tests: N real dockerd engines on this one
machine, each in a network namespace of its own, joined into one real Swarm.

``Swarm(nodes=3, gpus_per_worker=2, images=[...])`` starts 1 manager and N-1 workers.
Each worker has fake GPUs (UUIDs ``GPU-fa4e...``) in its engine label ``gpulab.gpus``
(``docker node inspect`` -> ``Description.Engine.Labels``; ``Node.gpus`` in Python), and a
STAND-IN ``nvidia`` runtime as its default runtime that records each container's
NVIDIA_VISIBLE_DEVICES (``Swarm.runtime_records(node)``) and runs it with runc: GPUs are
chosen by whoever creates the service and passed as that variable, as on real GPU nodes
with NVIDIA's runtime as their default. The pytest fixture is ``swarm`` in
tests/integration/conftest.py.

It lives here, beside the integration tests rather than inside them, because it is a
piece of its own (a planner that unit tests check, the I/O, the stand-in runtime that each
node executes) that later integration tests and benchmarks import.

What it cannot simulate: real GPUs (nothing is injected), separate kernels (the nodes
share this machine's kernel, cgroups and mount table), IPVS (service VIPs and the ingress
mesh: use ``--endpoint-mode dnsrr`` and ``--publish mode=host``), encrypted overlays.
"""

from .harness import Leftovers, Node, Swarm, SwarmError, clean_leftovers, find_leftovers

__all__ = ["Leftovers", "Node", "Swarm", "SwarmError", "clean_leftovers", "find_leftovers"]
