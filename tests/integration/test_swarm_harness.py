"""The simulated multi-host Swarm (tests/swarm) against what gpulab on a Swarm relies on: nodes
Ready, a GPU service placed on a chosen worker with the UUIDs the hub chose, an overlay
network between workers, a worker that dies and comes back, and a teardown that leaves
nothing and never touched the main engine. Timings are printed (the terminal, not the
captured output). The tests run in file order and share one module-scoped cluster."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from ..swarm import find_leftovers
from ..swarm.harness import clean_leftovers, process_alive, wait_for

BASE = "gpulab/base:bookworm"
SWARM_IMAGES = (BASE,)
OVERLAY = "gpulab-swarm-test"
# A one-line HTTP server that answers with its container's hostname (the node's, below).
ECHO = ("import http.server,socket\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "  def do_GET(s):\n"
        "    b=socket.gethostname().encode(); s.send_response(200); s.end_headers(); "
        "s.wfile.write(b)\n"
        "http.server.HTTPServer(('',8080),H).serve_forever()\n")


@pytest.fixture
def say(request):
    """Print a line on the terminal even while pytest captures output (CI's log shows it)."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")

    def say(line: str) -> None:
        with capture.global_and_fixture_disabled():
            print(f"\n[swarm] {line}", end="", flush=True)
    return say


# The harness's address ranges and names: none may appear on the host outside its namespaces.
OURS = ("198.18.21", "198.18.22", "198.19.", "gpulab-swarm")


def main_engine() -> dict:
    """What the harness must never change: the main engine's containers (id -> name, state,
    start time), networks and Swarm state, the host's forwarding sysctls, and the host's
    iptables rules (none may name the harness's addresses or names).

    Members' servers (``gpulab-user-*``) are left out: the stack's cullers may stop one at
    any time. The containers and networks are listed but not compared at the end: the
    rest of the suite runs beside this module and changes them (the harness never makes
    anything so named or labelled: the test checks that no container names it)."""
    def docker(*args, check=True):
        out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 or not check, out.stderr
        return out.stdout.splitlines()
    project = '{{.Label "com.docker.compose.project"}}'
    lines = docker("ps", "-a", "--no-trunc", "--format", f"{{{{.ID}}}} {{{{.Names}}}} {project}x")
    stack = {line.split()[0] for line in lines if line.endswith(" gpulabx")}
    ids = [line.split()[0] for line in lines if not line.split()[1].startswith("gpulab-user-")]
    fmt = "{{.Id}} {{.Name}} {{.State.Status}} {{.State.StartedAt}}"
    # (a container removed between ps and inspect is left out, not an error)
    containers = {line.split()[0]: line for line in
                  (docker("inspect", "--format", fmt, *ids, check=False) if ids else [])}
    networks = docker("network", "ls", "--no-trunc", "--format",
                      f"{{{{.ID}}}} {{{{.Name}}}} {project}x")
    iptables = subprocess.run(["iptables-save"], capture_output=True, text=True,
                              timeout=60).stdout
    sysctls = {name: Path(f"/proc/sys/net/{name}").read_text().strip()
               for name in ("ipv4/ip_forward", "bridge/bridge-nf-call-iptables")
               if Path(f"/proc/sys/net/{name}").exists()}
    host = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    host += subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    return {"containers": {k: v for k, v in containers.items() if k not in stack},
            "networks": sorted(n for n in networks if not n.endswith(" gpulabx")),
            "stack": {"containers": {k: v for k, v in containers.items() if k in stack},
                      "networks": sorted(n for n in networks if n.endswith(" gpulabx"))},
            "swarm": docker("info", "--format", "{{.Swarm.LocalNodeState}}"),
            "iptables naming ours": [line for line in iptables.splitlines()
                                     if any(o in line for o in OURS)],
            "host addresses and routes naming ours": [
                line for line in host.splitlines() if any(o in line for o in OURS)],
            "sysctls": sysctls}


@pytest.fixture(scope="module", autouse=True)
def main_before():
    """The main engine before the cluster starts (autouse: taken before `swarm`)."""
    return main_engine()


def running_tasks(swarm, service: str) -> list[dict]:
    """The service's tasks the manager sees running: node hostname, task and container."""
    ids = swarm.docker(swarm.manager, "service", "ps", "-q", "--no-trunc", service).split()
    tasks = json.loads(swarm.docker(swarm.manager, "inspect", *ids)) if ids else []
    hostnames = {n["ID"]: n["Description"]["Hostname"]
                 for n in json.loads(swarm.docker(swarm.manager, "node", "inspect",
                                                  *(n.hostname for n in swarm.nodes)))}
    return [{"node": hostnames.get(t.get("NodeID"), ""), "task": t["ID"],
             "desired": t["DesiredState"], "state": t["Status"]["State"],
             "container": t["Status"].get("ContainerStatus", {}).get("ContainerID"),
             "networks": t.get("NetworksAttachments", [])}
            for t in tasks if t["DesiredState"] == "running" and t["Status"]["State"] == "running"]


def wait_running_on(swarm, service: str, node, timeout: float = 60) -> dict:
    return wait_for(lambda: next((t for t in running_tasks(swarm, service)
                                  if t["node"] == node.hostname), None),
                    timeout, what=f"{service} running on {node.name}", interval=0.2)


def create_service(swarm, name: str, node, *args: str) -> None:
    """A service on *node*; *args* end with its image (by ID, see base_id) and command."""
    swarm.docker(swarm.manager, "service", "create", "--detach", "--name", name,
                 "--no-resolve-image", "--stop-signal", "SIGKILL",
                 "--constraint", f"node.hostname=={node.hostname}", *args)


def base_id(swarm) -> str:
    """BASE by its ID, as gpulab's hub names a member's image: a node given a name asks a
    registry for it before every start (test_an_image_by_name_makes_a_node_ask_a_registry)."""
    return swarm.image_id(BASE)


def test_nodes_ready_with_fake_gpus(swarm, say):
    states = swarm.node_states()
    assert states == {n.hostname: "Ready" for n in swarm.nodes}
    leader = swarm.docker(swarm.manager, "node", "inspect", swarm.manager.hostname,
                          "--format", "{{.ManagerStatus.Leader}}")
    assert leader == "true"
    all_gpus = [g for n in swarm.nodes for g in n.gpus]
    assert len(all_gpus) == len(set(all_gpus)) == 2 * len(swarm.workers)
    assert swarm.manager.gpus == ()
    for node in swarm.workers:
        labels = json.loads(swarm.docker(swarm.manager, "node", "inspect", node.hostname,
                                         "--format", "{{json .Description.Engine.Labels}}"))
        assert labels["gpulab.gpus"].split(",") == list(node.gpus)
        assert swarm.docker(node, "info", "--format", "{{.DefaultRuntime}}") == "nvidia"
        assert swarm.docker(node, "image", "ls", "-q", BASE), f"{BASE} not on {node.name}"
    t = swarm.timings
    say(f"{len(swarm.nodes)} engines up in {t['engines']:.1f} s, all Ready "
        f"{t['ready']:.1f} s later (swarm init + joins), {BASE} on every node in "
        f"{t['images']:.1f} s")


def gpu_probe(swarm) -> dict:
    """The service gpu-probe on the first worker with its second GPU, created unless a test
    before made it (so that each test that uses it passes alone); its running task."""
    worker = swarm.workers[0]
    if "gpu-probe" not in swarm.docker(swarm.manager, "service", "ls", "--format",
                                       "{{.Name}}").split():
        create_service(swarm, "gpu-probe", worker, "--env",
                       f"NVIDIA_VISIBLE_DEVICES={worker.gpus[1]}", base_id(swarm),
                       "sleep", "infinity")
    return wait_running_on(swarm, "gpu-probe", worker)


def test_gpu_service_runs_on_the_chosen_worker_with_its_uuid(swarm, say):
    worker = swarm.workers[0]
    uuid = worker.gpus[1]
    t0 = time.monotonic()
    task = gpu_probe(swarm)
    say(f"service with a node constraint running on {worker.name} after "
        f"{time.monotonic() - t0:.1f} s")
    records = swarm.runtime_records(worker)
    assert [(r["id"], r["NVIDIA_VISIBLE_DEVICES"]) for r in records] == [
        (task["container"], uuid)], records
    for other in swarm.nodes:
        if other is not worker:
            assert swarm.runtime_records(other) == []
    pid = swarm.docker(worker, "inspect", task["container"], "--format", "{{.State.Pid}}")
    env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    assert f"NVIDIA_VISIBLE_DEVICES={uuid}".encode() in env


def test_an_image_by_name_makes_a_machine_ask_a_registry(swarm, say):
    """Why services name images by ID: given a name, a machine asks a registry for it
    before every start, even when it has the image (and runs what the registry sends);
    given the ID, it asks nobody. A machine's only way out here is its outbound recorder
    (tests/swarm/outbound.py, an HTTP proxy on its own loopback that reaches nothing), so
    the lookup is seen there and never leaves this machine, not even as a DNS query."""
    worker = swarm.workers[1]
    before = len(swarm.outbound_requests(worker))
    create_service(swarm, "by-id", worker, base_id(swarm), "sleep", "infinity")
    wait_running_on(swarm, "by-id", worker)
    assert swarm.outbound_requests(worker)[before:] == []
    create_service(swarm, "by-name", worker, BASE, "sleep", "infinity")
    wait_running_on(swarm, "by-name", worker)
    asked = wait_for(lambda: swarm.outbound_requests(worker)[before:], 30,
                     what=f"{worker.name}'s dockerd to ask a registry")
    assert any("registry-1.docker.io" in line for line in asked), asked
    say(f"a service naming {BASE} made {worker.name} ask a registry first: {asked[0]}")
    assert "lookup registry-1.docker.io" not in worker.paths.log.read_text(errors="replace")
    swarm.docker(swarm.manager, "service", "rm", "by-id", "by-name")


def test_overlay_network_between_workers_by_task_ip(swarm, say):
    w1, w2 = swarm.workers[0], swarm.workers[1]
    t0 = time.monotonic()
    swarm.docker(swarm.manager, "network", "create", "--driver", "overlay", OVERLAY)
    common = ("--network", OVERLAY, "--endpoint-mode", "dnsrr")
    create_service(swarm, "echo", w2, *common, "--hostname", "{{.Node.Hostname}}",
                   base_id(swarm), "python3", "-c", ECHO)
    create_service(swarm, "client", w1, *common, base_id(swarm), "sleep", "infinity")
    echo = wait_running_on(swarm, "echo", w2)
    client = wait_running_on(swarm, "client", w1)
    ip = next(a["Addresses"][0].split("/")[0] for a in echo["networks"]
              if a["Network"]["Spec"]["Name"] == OVERLAY)
    probe = ("import socket,sys,urllib.request as u\n"
             "print(socket.gethostbyname('echo'))\n"
             "print(u.urlopen('http://%s:8080/' % sys.argv[1], timeout=3).read().decode())\n")

    def reached():
        out = subprocess.run(["docker", "-H", w1.host, "exec", client["container"],
                              "python3", "-c", probe, ip],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.split() if out.returncode == 0 else None
    resolved, answer = wait_for(reached, 30, what=f"{w1.name} to reach echo at {ip}",
                                interval=0.3)
    assert resolved == ip  # dnsrr: the service name is the task's own address
    assert answer == w2.hostname
    say(f"overlay: a container on {w1.name} reached {ip} on {w2.name} "
        f"{time.monotonic() - t0:.1f} s after the network was created")


def test_a_worker_dies_and_comes_back(swarm, say):
    worker = swarm.workers[0]
    task = gpu_probe(swarm)
    pid = int(swarm.docker(worker, "inspect", task["container"], "--format", "{{.State.Pid}}"))
    t0 = time.monotonic()
    swarm.stop_engine(worker, crash=True)  # every process of the node: a power cut
    assert not process_alive(pid), f"the task's process {pid} outlived its node"
    swarm.wait_state(worker, "Down", 60)
    down = time.monotonic() - t0
    # the manager gives up the task on the dead node (a replacement waits for the node)
    wait_for(lambda: not any(t["node"] == worker.hostname
                             for t in running_tasks(swarm, "gpu-probe")),
             15, what=f"the manager to stop counting gpu-probe as running on {worker.name}")
    assert swarm.node_states()[swarm.workers[1].hostname] == "Ready"
    say(f"{worker.name} killed: the manager reported it Down after {down:.1f} s")

    t1 = time.monotonic()
    swarm.start_engine(worker)
    swarm.wait_state(worker, "Ready", 60)
    ready = time.monotonic() - t1
    again = wait_running_on(swarm, "gpu-probe", worker)
    back = time.monotonic() - t1
    assert again["container"] != task["container"]
    seen = {r["id"]: r["NVIDIA_VISIBLE_DEVICES"] for r in swarm.runtime_records(worker)}
    assert seen[again["container"]] == seen[task["container"]] == worker.gpus[1]
    say(f"{worker.name} restarted: Ready after {ready:.1f} s, gpu-probe running there "
        f"again after {back:.1f} s")


def test_leftovers_of_a_crashed_run_are_cleaned_and_live_runs_kept(swarm, tmp_path):
    run = "0dead0"
    stem = f"gpulab-swarm-{run}"
    left_dir = swarm.tmp / stem
    (left_dir / "node" / "mnt").mkdir(parents=True)
    (left_dir / "owner").write_text("1 0\n")  # PID 1 did not start at tick 0: a dead owner
    subprocess.run(["ip", "netns", "add", f"{stem}-node"], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "none", str(left_dir / "node" / "mnt")], check=True)
    hierarchy = "/sys/fs/cgroup/pids"  # cgroup v1; v2 has one hierarchy at the root
    cgroup = f"{hierarchy if os.path.isdir(hierarchy) else '/sys/fs/cgroup'}/{stem}-node"
    os.makedirs(f"{cgroup}/child", exist_ok=True)
    cleaned = clean_leftovers(swarm.tmp)
    assert cleaned == [run]
    assert not find_leftovers(swarm.tmp, run)
    assert not os.path.exists(cgroup)
    assert swarm.node_states()[swarm.manager.hostname] == "Ready"  # this live run is kept
    assert find_leftovers(swarm.tmp, swarm.run).netns


def test_teardown_leaves_nothing_and_main_engine_untouched(swarm, main_before, say):
    left = swarm.close()
    assert not left, left
    assert not find_leftovers(swarm.tmp), find_leftovers(swarm.tmp)
    assert swarm.close() == left  # idempotent
    stops = ", ".join(f"{n.name} {swarm.timings[f'stop {n.name}']:.1f}" for n in swarm.nodes)
    killed = f"; SIGKILL after {swarm.grace:.0f} s: {', '.join(swarm.killed)}" if swarm.killed else ""
    say(f"teardown (engines stopped, mounts, cgroups, namespaces removed) in "
        f"{swarm.timings['teardown']:.1f} s; dockerd exits after (s): {stops}{killed}")
    after = main_engine()
    # make test runs this module beside the rest of the suite (scripts/test-integration.sh),
    # which starts, stops and restarts containers and networks of its own meanwhile: what
    # the harness could have touched is compared whole, the engine's containers and
    # networks only as far as the harness could have made or changed them.
    for engine in (main_before, after):
        for key in ("containers", "networks", "stack"):
            engine.pop(key)
    assert after == main_before
    assert not [line for line in subprocess.run(
        ["docker", "ps", "-a", "--format", "{{.Names}} {{.Labels}}"], capture_output=True,
        text=True, timeout=60).stdout.splitlines() if any(o in line for o in OURS)]
