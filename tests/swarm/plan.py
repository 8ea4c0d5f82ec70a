"""Pure planning for the simulated Swarm: names, addresses, fake GPUs and the command lines
of each node's dockerd. Nothing here touches the machine; harness.py does the I/O.

Address plan (all inside 198.18.0.0/15, reserved for benchmarks, and only ever configured
inside the harness's own network namespaces, never on the host):

- 198.18.210.0/24   the nodes' shared link: node i (1-based) is .i, the bridge is .254
                    (test_https.py uses 198.18.203.0/24; the stack 172.30.0.0/24 and
                    Docker's defaults 172.17-31.x and 192.168.x)
- 198.18.(210+i).0/24  node i's docker0 (--bip)
- 198.19.(8*(i-1)).0/21  node i's local networks (docker_gwbridge...): --default-address-pool
- 198.19.128.0/17   the Swarm's overlay networks (swarm init --default-addr-pool), /24 each
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import uuid
from dataclasses import dataclass
from pathlib import Path

from gpulab.contract import ENGINE_LABEL_GPUS

PREFIX = "gpulab-swarm-"  # every namespace, cgroup, temp dir and hostname the harness makes
MAX_NODES = 16
LINK = ipaddress.ip_network("198.18.210.0/24")
BRIDGE_ADDRESS = LINK[254]
SWARM_POOL = ipaddress.ip_network("198.19.128.0/17")
SWARM_POOL_MASK = 24
SWARM_PORT = 2377
GPU_LABEL = ENGINE_LABEL_GPUS  # engine label: the node's fake GPU UUIDs, comma-separated
NODE_LABEL = "gpulab.swarm.node"  # engine label: the harness's name of the node
RUNTIME = "nvidia"  # what NVIDIA's toolkit calls its runtime; here the stand-in
# A fixed namespace for uuid5, so that a node's fake GPUs are the same in every run.
_GPU_NAMESPACE = uuid.UUID("6d0f7a52-3c1e-4f7b-9a57-6770756c6162")
_RUN_ID = re.compile(r"^[0-9a-f]{6}$")


@dataclass(frozen=True)
class NodePlan:
    """One node: its names, addresses and fake GPUs. ``index`` is 1-based; node 1 is the
    manager."""

    run: str
    index: int
    name: str  # "manager", "worker1", ...
    address: ipaddress.IPv4Address
    bip: ipaddress.IPv4Interface
    local_pool: ipaddress.IPv4Network
    gpus: tuple[str, ...]

    @property
    def role(self) -> str:
        return "manager" if self.index == 1 else "worker"

    @property
    def hostname(self) -> str:
        """What Swarm calls the node (``node.hostname==...`` in constraints)."""
        return f"{PREFIX}{self.name}"

    @property
    def netns(self) -> str:
        return f"{PREFIX}{self.run}-{self.name}"

    @property
    def cgroup_parent(self) -> str:
        return f"/{PREFIX}{self.run}-{self.name}"

    @property
    def veth(self) -> str:
        """The bridge side of the node's link, in the bridge's own namespace."""
        return f"n{self.index}"


def bridge_netns(run: str) -> str:
    return f"{PREFIX}{run}-link"


def check_run_id(run: str) -> str:
    if not _RUN_ID.match(run):
        raise ValueError(f"run id must be 6 lowercase hex digits, not {run!r}")
    return run


def fake_gpu_uuids(node_index: int, count: int) -> tuple[str, ...]:
    """*count* UUIDs shaped like NVIDIA's (``GPU-8-4-4-4-12`` hex), unique per node and the
    same in every run; they start ``GPU-fa4e`` ("fake") so that no one takes them for real."""
    out = []
    for gpu in range(count):
        tail = str(uuid.uuid5(_GPU_NAMESPACE, f"{node_index}/{gpu}"))[8:]
        out.append(f"GPU-fa4e{node_index:02x}{gpu:02x}{tail}")
    return tuple(out)


def plan_nodes(run: str, nodes: int = 3, gpus_per_worker: int = 2) -> list[NodePlan]:
    """1 manager (no GPUs: it stands for the hub's machine) and *nodes*-1 workers with
    *gpus_per_worker* fake GPUs each."""
    check_run_id(run)
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"a simulated Swarm has 1 to {MAX_NODES} nodes, not {nodes}")
    if gpus_per_worker < 0:
        raise ValueError(f"gpus_per_worker must be >= 0, not {gpus_per_worker}")
    plans = []
    for i in range(1, nodes + 1):
        plans.append(NodePlan(
            run=run,
            index=i,
            name="manager" if i == 1 else f"worker{i - 1}",
            address=LINK[i],
            bip=ipaddress.ip_interface(f"198.18.{210 + i}.1/24"),
            local_pool=ipaddress.ip_network(f"198.19.{8 * (i - 1)}.0/21"),
            gpus=() if i == 1 else fake_gpu_uuids(i, gpus_per_worker),
        ))
    return plans


@dataclass(frozen=True)
class NodePaths:
    """Where a node keeps its state, all under the run's temp dir."""

    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def exec(self) -> Path:
        return self.root / "exec"

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def pidfile(self) -> Path:
        return self.root / "dockerd.pid"

    @property
    def log(self) -> Path:
        return self.root / "dockerd.log"

    @property
    def config(self) -> Path:
        return self.root / "daemon.json"

    @property
    def runtime(self) -> Path:
        return self.root / "nvidia-runtime"

    @property
    def runtime_record(self) -> Path:
        return self.root / "gpu-runtime.jsonl"

    @property
    def outbound(self) -> Path:
        """What the node's dockerd tried to reach outside (tests/swarm/outbound.py)."""
        return self.root / "outbound-requests.log"


def dockerd_argv(node: NodePlan, paths: NodePaths) -> list[str]:
    """The node's dockerd, started in the node's network namespace with its own hostname.

    ``nsenter --net`` only (not ``ip netns exec``, whose fresh /sys hides the cgroup v1
    hierarchy); ``unshare --uts`` so that ``hostname`` changes the node's name only. The
    ``sh -c`` takes the hostname and the command as arguments, never spliced into text."""
    dockerd = [
        "dockerd",
        "--config-file", str(paths.config),  # not the host's /etc/docker/daemon.json
        "--host", f"unix://{paths.socket}",
        "--data-root", str(paths.data),
        "--exec-root", str(paths.exec),
        "--pidfile", str(paths.pidfile),
        "--bip", str(node.bip),
        "--default-address-pool", f"base={node.local_pool},size=24",
        "--cgroup-parent", node.cgroup_parent,
        "--add-runtime", f"{RUNTIME}={paths.runtime}",
        "--default-runtime", RUNTIME,
        "--label", f"{NODE_LABEL}={node.name}",
        "--shutdown-timeout", "2",
    ]
    if node.gpus:
        dockerd += ["--label", f"{GPU_LABEL}={','.join(node.gpus)}"]
    return [
        "nsenter", f"--net=/run/netns/{node.netns}", "--",
        "unshare", "--uts", "--",
        "sh", "-c", 'hostname "$0" && exec "$@"', node.hostname,
        *dockerd,
    ]


def runtime_wrapper(python: str, script: Path, record: Path, runc: str) -> str:
    """The node's ``nvidia`` runtime: a two-line sh file that runs the stand-in (which
    records NVIDIA_VISIBLE_DEVICES in *record*, then execs *runc*)."""
    argv = [python, "-I", "-S", str(script), str(record), runc]
    return "#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in argv) + ' "$@"\n'


def swarm_init_args(manager: NodePlan) -> list[str]:
    return ["swarm", "init",
            "--advertise-addr", str(manager.address),
            "--listen-addr", f"{manager.address}:{SWARM_PORT}",
            "--dispatcher-heartbeat", "1s",
            "--default-addr-pool", str(SWARM_POOL),
            "--default-addr-pool-mask-length", str(SWARM_POOL_MASK)]


def swarm_join_args(worker: NodePlan, manager: NodePlan, token: str) -> list[str]:
    return ["swarm", "join", "--token", token,
            "--advertise-addr", str(worker.address),
            "--listen-addr", f"{worker.address}:{SWARM_PORT}",
            f"{manager.address}:{SWARM_PORT}"]


def _unescape_mount(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as octal escapes
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts_under(proc_mounts: str, root: str) -> list[str]:
    """Mount points at or under *root* in a /proc/mounts text, deepest first (the order to
    unmount them in). A path is under *root* only at a ``/`` boundary."""
    root = root.rstrip("/")
    found = set()
    for line in proc_mounts.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        point = _unescape_mount(fields[1])
        if point == root or point.startswith(root + "/"):
            found.add(point)
    return sorted(found, key=lambda p: (-p.count("/"), p))


def run_id_of(name: str) -> str | None:
    """The run id in a name the harness made (``gpulab-swarm-<run>`` or
    ``gpulab-swarm-<run>-<what>``), or None for any other name."""
    if not name.startswith(PREFIX):
        return None
    run = name[len(PREFIX):].split("-", 1)[0]
    return run if _RUN_ID.match(run) else None
