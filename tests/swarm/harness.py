"""A real Docker Swarm of N engines on one machine, for tests (see tests/swarm/__init__.py).

Every engine is a dockerd of its own in a network namespace the harness creates, joined to
the others by one bridge in a namespace of its own; the Swarm between them is real
(raft, dispatcher heartbeats, overlay VXLAN, scheduling). Everything it creates carries the
``gpulab-swarm-<run>`` prefix: namespaces, cgroups, hostnames and the temp dir that holds
each node's data root, exec root, socket, pidfile and log. It never changes the host's own
network, iptables or the main Docker engine (it only reads images from it: their files,
linked, or ``docker save``). Processes are stopped by PID, never by name.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import outbound
from . import plan as P
from .image_store import can_link, copy_images

NETNS_DIR = Path("/run/netns")
CGROUP_ROOT = Path("/sys/fs/cgroup")
SYSTEM_CONTAINERD = Path("/run/containerd/containerd.sock")
STANDIN_RUNTIME = Path(__file__).with_name("standin_nvidia_runtime.py")
REPO = Path(__file__).resolve().parents[2]


class SwarmError(RuntimeError):
    pass


def _is_mount_point(path: Path) -> bool:
    with open("/proc/self/mountinfo") as mounts:
        return any(line.split()[4] == str(path) for line in mounts)


def run(argv: list[str], *, check: bool = True, timeout: float = 60,
        input: str | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
    if check and out.returncode != 0:
        raise SwarmError(f"{' '.join(argv)} failed ({out.returncode}): "
                         f"{(out.stderr or out.stdout).strip()}")
    return out


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    """Poll *predicate* until it returns something truthy; SwarmError after *timeout* s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SwarmError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# ---- what a run leaves on the machine, found by its prefix -------------------------------

def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22: start time in clock ticks


def _owner_alive(run_dir: Path) -> bool:
    try:
        pid, started = (run_dir / "owner").read_text().split()
    except (OSError, ValueError):
        return False
    return _start_time(int(pid)) == started


def _cgroup_tops(pattern: str) -> list[Path]:
    """The harness's top cgroups named like *pattern* (a glob), in every hierarchy
    (cgroup v1 and v2); each node's containers are below its own (--cgroup-parent)."""
    hierarchies = [CGROUP_ROOT, *(p for p in CGROUP_ROOT.iterdir() if p.is_dir())]
    return sorted({top for h in hierarchies for top in h.glob(pattern) if top.is_dir()})


def _processes(needle: str) -> list[int]:
    """PIDs whose command line contains *needle* (the harness's own dockerd, containerd and
    shims name the run's temp dir in their arguments)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(entry.name))
    return sorted(found)


def _cgroup_pids(tops: list[Path]) -> list[int]:
    pids = set()
    for top in tops:
        for procs in top.rglob("cgroup.procs"):
            try:
                pids.update(int(p) for p in procs.read_text().split())
            except (OSError, ValueError):
                continue
    return sorted(pids)


@dataclass
class Leftovers:
    """What remains of harness runs on the machine (all of them, or one run's)."""

    netns: list[str]
    mounts: list[str]
    processes: list[int]
    cgroups: list[str]
    dirs: list[str]

    def __bool__(self) -> bool:
        return any((self.netns, self.mounts, self.processes, self.cgroups, self.dirs))


def find_leftovers(tmp: Path, run: str | None = None) -> Leftovers:
    stem = f"{P.PREFIX}{run}" if run else P.PREFIX
    netns = sorted(n.name for n in NETNS_DIR.glob(f"{stem}*")) if NETNS_DIR.is_dir() else []
    if run:
        netns = [n for n in netns if P.run_id_of(n) == run]
    dirs = sorted(str(d) for d in tmp.glob(f"{stem}*") if P.run_id_of(d.name))
    mounts = [m for m in P.mounts_under(Path("/proc/mounts").read_text(), "/")
              if any(P.run_id_of(part) and part.startswith(stem) for part in m.split("/"))]
    tops = _cgroup_tops(f"{P.PREFIX}{run}-*" if run else f"{P.PREFIX}*")
    pids = set(_processes(f"{tmp}/{stem}"))
    pids.update(_cgroup_pids(tops))
    return Leftovers(netns=netns, mounts=mounts, processes=sorted(pids),
                     cgroups=[str(t) for t in tops], dirs=dirs)


def _kill(pids: list[int], sig: int, timeout: float) -> list[int]:
    """Send *sig* to each PID, wait up to *timeout* s for all to go; the PIDs still there."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if process_alive(p)]
    return alive


def process_alive(pid: int) -> bool:
    """Whether *pid* runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _remove_cgroups(tops: list[Path]) -> None:
    for top in tops:
        for _ in range(50):  # a cgroup whose last task just exited can be busy briefly
            try:
                for dirpath, _dirs, _files in os.walk(top, topdown=False):
                    os.rmdir(dirpath)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


def purge(tmp: Path, run_id: str, *, under: Path | None = None) -> Leftovers:
    """Remove what run *run_id* left (or, with *under*, only one node's processes, mounts and
    cgroups): SIGKILL its processes by PID, ``umount -l`` its mounts deepest first, remove
    its cgroups, then (whole runs only) its namespaces and temp dir. Returns what could
    not be removed."""
    root = under or tmp / f"{P.PREFIX}{run_id}"
    tops = _cgroup_tops(f"{P.PREFIX}{run_id}-{under.name}" if under else f"{P.PREFIX}{run_id}-*")
    pids = sorted(set(_processes(f"{root}/")) | set(_cgroup_pids(tops)))
    _kill(pids, signal.SIGKILL, 10)
    for point in P.mounts_under(Path("/proc/mounts").read_text(), str(root)):
        run(["umount", "-l", point], check=False)
    _remove_cgroups(tops)
    if under is None:
        for name in find_leftovers(tmp, run_id).netns:
            run(["ip", "netns", "del", name], check=False)
        if not P.mounts_under(Path("/proc/mounts").read_text(), str(root)):
            shutil.rmtree(root, ignore_errors=True)
        return find_leftovers(tmp, run_id)
    return Leftovers([], P.mounts_under(Path("/proc/mounts").read_text(), str(root)),
                     _processes(f"{root}/"), [str(t) for t in tops if t.exists()], [])


def clean_leftovers(tmp: Path) -> list[str]:
    """Remove what earlier runs left when they died without teardown (a killed pytest):
    every ``gpulab-swarm-<run>`` whose owner process is gone. Live runs are left alone.
    Returns the run ids cleaned."""
    found = find_leftovers(tmp)
    runs = {P.run_id_of(n) for n in found.netns}
    runs |= {P.run_id_of(Path(d).name) for d in found.dirs}
    runs |= {P.run_id_of(Path(c).name) for c in found.cgroups}
    runs |= {P.run_id_of(part) for m in found.mounts for part in m.split("/")}
    cleaned = []
    for run_id in sorted(r for r in runs if r):
        if _owner_alive(tmp / f"{P.PREFIX}{run_id}"):
            continue
        purge(tmp, run_id)
        cleaned.append(run_id)
    return cleaned


# ---- the cluster -------------------------------------------------------------------------

@dataclass
class Node:
    """One simulated machine: a dockerd in its own network namespace."""

    plan: P.NodePlan
    paths: P.NodePaths
    process: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def hostname(self) -> str:
        return self.plan.hostname

    @property
    def address(self) -> str:
        return str(self.plan.address)

    @property
    def gpus(self) -> tuple[str, ...]:
        return self.plan.gpus

    @property
    def host(self) -> str:
        """The node's Docker API, for ``docker -H`` or docker-py's ``base_url``."""
        return f"unix://{self.paths.socket}"

    @property
    def pid(self) -> int | None:
        running = self.process is not None and self.process.poll() is None
        return self.process.pid if running else None

    def __repr__(self) -> str:
        return f"<Node {self.name} {self.address} pid={self.pid}>"


class Swarm:
    """N nodes: ``nodes[0]`` is the manager, the rest are workers with fake GPUs.

    Use as a context manager (or ``start()`` / ``close()``)::

        with Swarm(nodes=3, images=["gpulab/base:bookworm"]) as swarm:
            swarm.docker(swarm.manager, "node", "ls")
    """

    def __init__(self, nodes: int = 3, gpus_per_worker: int = 2, images: tuple = (),
                 tmp: Path | None = None):
        self.tmp = Path(tmp or tempfile.gettempdir())
        self.run = os.urandom(3).hex()
        self.dir = self.tmp / f"{P.PREFIX}{self.run}"
        self.images = tuple(images)
        self.nodes = [Node(p, P.NodePaths(self.dir / p.name))
                      for p in P.plan_nodes(self.run, nodes, gpus_per_worker)]
        self.timings: dict[str, float] = {}
        self.grace = 8.0  # seconds a dockerd gets to stop on SIGTERM (~2 s seen)
        self.killed: list[str] = []  # nodes whose dockerd needed SIGKILL after the grace
        self._closed = False

    @property
    def manager(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> list[Node]:
        return self.nodes[1:]

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if name in (n.name, n.hostname))

    # -- life cycle --

    def __enter__(self) -> Swarm:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self._preflight()
        t0 = time.monotonic()
        cleaned = clean_leftovers(self.tmp)
        if cleaned:
            print(f"[swarm] removed what crashed runs left: {', '.join(cleaned)}")
        # The run dir appears with its owner already in it (made under a dot name, then
        # renamed), so that another run's clean_leftovers never takes it for a dead one.
        staging = self.tmp / f".{self.dir.name}"
        staging.mkdir(mode=0o700)
        (staging / "owner").write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
        staging.rename(self.dir)
        self._link()
        for node in self.nodes:
            self._prepare(node)
        if self.images:
            t2 = time.monotonic()
            self._seed_images(self.images)
            self.timings["images"] = time.monotonic() - t2
            t0 = time.monotonic()
        for node in self.nodes:
            self._launch(node)
        for node in self.nodes:
            self._wait_engine(node, 30)
        self.timings["engines"] = time.monotonic() - t0
        t1 = time.monotonic()
        manager = self.manager
        self.docker(manager, *P.swarm_init_args(manager.plan))
        token = self.docker(manager, "swarm", "join-token", "-q", "worker")
        for worker in self.workers:
            self.docker(worker, *P.swarm_join_args(worker.plan, manager.plan, token))
        wait_for(lambda: all(s == "Ready" for s in self.node_states().values())
                 and len(self.node_states()) == len(self.nodes), 30,
                 what=f"{len(self.nodes)} nodes Ready")
        self.timings["ready"] = time.monotonic() - t1

    def close(self) -> Leftovers:
        """Stop every node's dockerd (SIGTERM by PID, all at once; SIGKILL after
        :attr:`grace` s), then purge the run. Idempotent; returns what could not be
        removed (empty when all went)."""
        if self._closed:
            return find_leftovers(self.tmp, self.run)
        t0 = time.monotonic()
        running = [n for n in self.nodes if n.pid]
        for node in running:
            node.process.send_signal(signal.SIGTERM)
        for node in running:
            self._reap(node, t0 + self.grace)
            self.timings[f"stop {node.name}"] = time.monotonic() - t0
        left = purge(self.tmp, self.run)
        self._closed = True
        self.timings["teardown"] = time.monotonic() - t0
        return left

    def _reap(self, node: Node, deadline: float) -> None:
        """Wait for *node*'s dockerd to exit until *deadline*, then SIGKILL it (and say so
        in :attr:`killed`). dockerd 20.10 sometimes hangs for ~25 s in a shutdown that
        removes an overlay network (libnetwork waits on a lock; seen here 1 run in ~8
        after a node was restarted): nothing of the node outlives the purge that follows
        anyway."""
        try:
            node.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.killed.append(node.name)
            node.process.kill()
            node.process.wait(timeout=10)

    def _preflight(self) -> None:
        if os.geteuid() != 0:
            raise SwarmError("the Swarm harness creates network namespaces and runs dockerd: "
                             "run it as root")
        for tool in ("dockerd", "docker", "nsenter", "unshare", "ip", "runc", "umount"):
            if shutil.which(tool) is None:
                raise SwarmError(f"{tool} not found: install docker.io, iproute2 and "
                                 f"util-linux (.ci/run and scripts/test-host.sh do)")
        if SYSTEM_CONTAINERD.exists():
            # dockerd uses a containerd it finds there instead of starting its own: the
            # nodes would share one containerd (and its "moby" namespace) with each other
            # and with the main engine.
            raise SwarmError(f"a system containerd listens on {SYSTEM_CONTAINERD}; the "
                             f"simulated nodes need containerds of their own")

    def _link(self) -> None:
        """The bridge namespace and one veth per node; nothing in the host's namespace."""
        br = P.bridge_netns(self.run)
        run(["ip", "netns", "add", br])
        run(["ip", "-n", br, "link", "set", "lo", "up"])
        run(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", br, "addr", "add", f"{P.BRIDGE_ADDRESS}/{P.LINK.prefixlen}",
             "dev", "br0"])
        run(["ip", "-n", br, "link", "set", "br0", "up"])
        for node in self.nodes:
            ns, veth = node.plan.netns, node.plan.veth
            run(["ip", "netns", "add", ns])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
            run(["ip", "-n", br, "link", "add", veth, "type", "veth",
                 "peer", "name", "eth0", "netns", ns])
            run(["ip", "-n", br, "link", "set", veth, "master", "br0", "up"])
            run(["ip", "-n", ns, "addr", "add", f"{node.address}/{P.LINK.prefixlen}",
                 "dev", "eth0"])
            run(["ip", "-n", ns, "link", "set", "eth0", "up"])  # and no default route

    def _prepare(self, node: Node) -> None:
        node.paths.root.mkdir(mode=0o700)
        node.paths.config.write_text("{}\n")
        runc = shutil.which("runc")
        node.paths.runtime.write_text(P.runtime_wrapper(
            sys.executable, STANDIN_RUNTIME, node.paths.runtime_record, runc))
        node.paths.runtime.chmod(0o755)

    def _launch(self, node: Node) -> None:
        self._share_exec_root(node)
        self._start_outbound_recorder(node)
        no_proxy = [str(n.plan.address) for n in self.nodes]
        with open(node.paths.log, "ab") as log:
            node.process = subprocess.Popen(
                P.dockerd_argv(node.plan, node.paths), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                # As a lab's engines: no DOCKER_SERVICE_PREFER_OFFLINE_IMAGE, so a service
                # that names its image asks a registry first. Its only way out is the
                # node's recorder (tests/swarm/outbound.py), which reaches nothing: not even
                # a DNS lookup leaves the machine. Services name images by ID.
                env={**os.environ, **outbound.proxy_env(no_proxy)})

    def _start_outbound_recorder(self, node: Node) -> None:
        """The node's outbound recorder on its own loopback (its argv names the node's
        folder, so that purge() ends it with the node)."""
        node.paths.outbound.unlink(missing_ok=True)
        subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{node.plan.netns}", "--", sys.executable,
             str(Path(outbound.__file__)), "--record", str(node.paths.outbound)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        wait_for(node.paths.outbound.exists, 10, what=f"{node.name}'s outbound recorder")

    def outbound_requests(self, node: Node) -> list[str]:
        """What *node*'s dockerd tried to reach outside the machine, oldest first."""
        return outbound.requests_seen(node.paths.outbound)

    @staticmethod
    def _share_exec_root(node: Node) -> None:
        """Make the node's exec root a mount point with shared propagation, as every
        directory is on a systemd host (this machine's / is private): gpulab-netguard
        mounts ``<exec-root>/netns`` with ``rslave`` to see the network namespaces Docker
        makes after it started, and Docker refuses that propagation from a private mount."""
        exec_root = str(node.paths.exec)
        node.paths.exec.mkdir(mode=0o700, exist_ok=True)
        if exec_root not in P.mounts_under(Path("/proc/mounts").read_text(), exec_root):
            run(["mount", "--bind", exec_root, exec_root])
        run(["mount", "--make-rshared", exec_root])

    def _wait_engine(self, node: Node, timeout: float) -> None:
        def up():
            if node.process.poll() is not None:
                raise SwarmError(f"dockerd of {node.name} exited ({node.process.returncode}):\n"
                                 f"{self.log_tail(node)}")
            try:
                return self.docker(node, "version", "--format", "{{.Server.Version}}",
                                   check=False, timeout=5)
            except subprocess.TimeoutExpired:
                # listening but not answering yet: a dockerd restarted after a crash
                # restores its Swarm state first (CI saw one take over 5 s on a busy host)
                return ""
        wait_for(up, timeout, what=f"dockerd of {node.name} to answer on {node.host}")

    def log_tail(self, node: Node, lines: int = 30) -> str:
        try:
            return "\n".join(node.paths.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- using it --

    def docker(self, node: Node, *args: str, check: bool = True, timeout: float = 60) -> str:
        """``docker -H <node's socket> ARGS``; its stdout, stripped."""
        out = run(["docker", "-H", node.host, *args], check=False, timeout=timeout)
        if check and out.returncode != 0:
            raise SwarmError(f"docker on {node.name}: {' '.join(args)} failed: "
                             f"{(out.stderr or out.stdout).strip()}")
        return out.stdout.strip() if out.returncode == 0 else ""

    def image_id(self, name: str, node: Node | None = None) -> str:
        """*name*'s image ID on *node* (default: the manager): what a service names, so
        that no machine asks a registry for it (as gpulab's hub does)."""
        return self.docker(node or self.manager, "image", "inspect", "-f", "{{.Id}}", name)

    def node_states(self) -> dict[str, str]:
        """Hostname -> Ready / Down / Unknown, as the manager sees them."""
        text = self.docker(self.manager, "node", "ls", "--format",
                           "{{.Hostname}}\t{{.Status}}", check=False, timeout=10)
        return dict(line.split("\t", 1) for line in text.splitlines() if "\t" in line)

    def wait_state(self, node: Node, state: str, timeout: float) -> float:
        """Wait until the manager reports *node* in *state*; seconds taken."""
        t0 = time.monotonic()
        wait_for(lambda: self.node_states().get(node.hostname) == state, timeout,
                 what=f"the manager to report {node.name} {state}", interval=0.2)
        return time.monotonic() - t0

    def runtime_records(self, node: Node) -> list[dict]:
        """What the stand-in nvidia runtime saw on *node*: one dict per container created."""
        try:
            text = node.paths.runtime_record.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def _main_engine(self, images: tuple[str, ...]) -> dict:
        """``docker info`` of the main engine once it answers, after checking that it
        has *images*. It may be restarting right now: `make test` runs these modules
        beside the rest of the suite, whose recovery tests restart it (seconds)."""
        wait_for(lambda: run(["docker", "info"], check=False, timeout=30).returncode == 0,
                 120, what="the main Docker engine to answer", interval=1)
        for image in images:
            if run(["docker", "image", "inspect", image], check=False).returncode != 0:
                raise SwarmError(f"image {image} is not on the main Docker engine: "
                                 f"build it with `make images`")
        return json.loads(run(["docker", "info", "--format", "{{json .}}"]).stdout)

    def load_images(self, *images: str, nodes: list[Node] | None = None) -> None:
        """Copy *images* from the main engine to every node (or to *nodes*): ``docker
        save`` once, then ``docker load`` on those nodes at once. No registry."""
        nodes = self.nodes if nodes is None else nodes
        self._main_engine(images)
        archive = self.dir / "images.tar"
        for attempt in range(3):
            saved = run(["docker", "save", "-o", str(archive), *images], timeout=300,
                        check=attempt == 2)
            if saved.returncode == 0:
                break
            wait_for(lambda: run(["docker", "info"], check=False, timeout=30).returncode == 0,
                     120, what="the main Docker engine to answer again", interval=1)
        try:
            with ThreadPoolExecutor(len(nodes)) as pool:
                list(pool.map(lambda n: self.docker(n, "load", "-q", "-i", str(archive),
                                                    timeout=300), nodes))
        finally:
            archive.unlink(missing_ok=True)

    # dockerd's image store: its images and their layers. Nothing else of a data root
    # (networks, containers, Swarm state, the engine's identity) is seeded.
    IMAGE_STORE = ("image", "overlay2")

    def _seed_images(self, images: tuple[str, ...]) -> None:
        """Before the engines first start: *images* in every machine's image store, with
        the IDs the main engine gives them, as ``docker load`` would. Where the main
        engine's store is overlay2 on this filesystem, its images' files are linked in
        (image_store.link_images: 2 s for the hub's modules' 4 images here); otherwise
        they are loaded once, into the manager's engine, which then stops, and the
        workers get its store as hard links (``cp -al``): one ``docker load`` instead of
        one per machine (3 x 2.3 GB of writes, 130 s of the hub's modules' setup)."""
        info = self._main_engine(images)
        root = Path(info.get("DockerRootDir", ""))
        manager = self.manager
        manager.paths.data.mkdir(mode=0o710, exist_ok=True)
        if info.get("Driver") == "overlay2" and (root / "image" / "overlay2").is_dir():
            tags = {image: run(["docker", "image", "inspect", "-f", "{{.Id}}", image]
                               ).stdout.strip() for image in images}
            self._copy_images_from(root, manager.paths.data, tags)
        else:
            self._launch(manager)
            self._wait_engine(manager, 30)
            self.load_images(*images, nodes=[manager])
            self.stop_engine(manager)
        for worker in self.workers:
            worker.paths.data.mkdir(mode=0o710, exist_ok=True)
            for part in self.IMAGE_STORE:
                run(["cp", "-al", str(manager.paths.data / part),
                     str(worker.paths.data / part)], timeout=300)

    @staticmethod
    def _copy_images_from(root: Path, dest: Path, tags: dict[str, str]) -> None:
        """The main engine's images *tags* into the data root *dest*: as hard links where
        they can be (a copy writes 2.3 GB for the hub's modules: 120 s here), else copied.
        Here the main engine's root /var/lib/docker is a bind mount of the very directory
        under it, so hard links fail across that mount; in a mount namespace of its own
        without that mount, the same files lie on the mount of *dest*."""
        if can_link(root, dest):
            copy_images(root, dest, tags)
            return
        if _is_mount_point(root):  # os.path.ismount misses a bind mount of the same device
            inode = (root / "image" / "overlay2" / "repositories.json").stat().st_ino
            linked = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          'umount -l "$1" && exec "$2" -m tests.swarm.image_store "$1" "$3" '
                          '"$4" "$5"', "sh", str(root), sys.executable, str(dest),
                          json.dumps(tags), str(inode)], capture_output=True, timeout=600,
                         cwd=REPO)
            if linked.returncode == 0:
                return
        copy_images(root, dest, tags, hard_links=False)

    def stop_engine(self, node: Node, crash: bool = False) -> None:
        """Take *node* down: SIGTERM its dockerd (a clean shutdown that stops its
        containers; SIGKILL after :attr:`grace` s) or, with *crash*, SIGKILL the node's
        every process, as a power cut does. Either way its mounts and cgroups then go, as at a reboot; its data root
        and Swarm membership stay for :meth:`start_engine`."""
        if node.pid:
            node.process.send_signal(signal.SIGKILL if crash else signal.SIGTERM)
            self._reap(node, time.monotonic() + self.grace)
        left = purge(self.tmp, self.run, under=node.paths.root)
        if left:
            raise SwarmError(f"{node.name} still has {left} after its engine stopped")

    def start_engine(self, node: Node, timeout: float = 30) -> None:
        """Boot *node* again: its dockerd rejoins the Swarm by itself."""
        if node.pid:
            raise SwarmError(f"dockerd of {node.name} is already running (PID {node.pid})")
        for attempt in (1, 2):
            self._launch(node)
            try:
                self._wait_engine(node, timeout)
                return
            except SwarmError:
                # dockerd 20.10 gives up on its own containerd after ~13 s: seen once in
                # CI on a host busy with the disruptive lane's dockerd restarts. A real
                # machine's init would start it again; so does this, once.
                if attempt == 2 or node.pid or \
                        "failed to start containerd" not in self.log_tail(node, 5):
                    raise
                print(f"[swarm] {node.name}: dockerd gave up waiting for its containerd; "
                      f"starting it again")
                purge(self.tmp, self.run, under=node.paths.root)
