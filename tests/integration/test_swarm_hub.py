"""A real JupyterHub on a real (simulated) Swarm: gpulab's multi-node mode end to end.

The stack comes up as docs/swarm.md says: ``make up-swarm`` on the Swarm's
manager (run here in the manager's network namespace, with its Docker socket), with
hub.swarm on in its config folder and the images loaded onto the machines (no registry).
Two workers have two fake GPUs each (engine label ``gpulab.gpus``) and the stand-in
NVIDIA runtime as their default runtime, which records the GPUs each container was given.
Members reach the hub through the proxy's published port, from this machine's loopback
(:class:`tests.swarm.forward.Forward`), with their login tokens.

The tests run in order on one cluster, as a lab's week does: members spread over the
machines, one too many is refused, autograd runs on a worker, the hub restarts, a
machine dies. Each also passes alone or in any subset: those that need the cluster full
start what is not running yet (the ``running`` fixture).
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import requests

from .autograd_cell import AUTOGRAD_CELL, check_result
from .browser import answer_shown, submit_login
from .lan import StandInLan
from .probes import probe
from .stack import REPO, LabUser, StackError, wait_for
from .swarm_lab import IMAGES, SwarmLab

pytestmark = pytest.mark.integration

SWARM_NODES = 3  # a manager without GPUs, two GPU servers
SWARM_IMAGES = IMAGES  # no registry: copied onto every machine
@pytest.fixture(scope="module")
def lab(swarm, tmp_path_factory):
    lab = SwarmLab(swarm, tmp_path_factory.mktemp("swarm-hub"))
    try:
        lab.start()
        yield lab
    finally:
        lab.close()


@pytest.fixture(scope="module")
def members(lab):
    """Four members, created through the hub's REST API as gpulab's CLI does."""
    return [lab.hub.create_user(prefix=f"m{i}") for i in range(4)]


def start_every_member(lab, members) -> list[float]:
    """Every member's 1-GPU server running, the last machine's GPUs in a pool of their
    own and the third member in that pool only (gpus.yaml, read again at every spawn);
    starts those not running yet, one after another, and returns how long each took.
    Each test that needs the cluster full calls it (through ``running``), so that it
    passes alone and in any subset, not only after the tests before it."""
    last = lab.swarm.workers[-1].hostname
    (lab.root / "config" / "gpus.yaml").write_text(
        f"{lab.gpus}pools:\n  last: {{machines: [{last}]}}\n"
        f"users:\n  {members[2].name}: {{pools: [last]}}\n")
    started = []
    for user in members:
        if (lab.hub.server_model(user.name) or {}).get("ready"):
            continue
        t0 = time.monotonic()
        _spawn_once_its_gpu_is_free(user)
        wait_ready(user)
        started.append(time.monotonic() - t0)
    return started


def _spawn_once_its_gpu_is_free(user: LabUser) -> None:
    """Ask for her 1-GPU server until the hub takes it: a GPU given back just before
    (another test's server) cools for 12 s."""
    said = {}

    def spawned() -> bool:
        r = spawn(user, {"gpus": 1})
        said["last"] = r.text
        return r.status_code in (201, 202)
    wait_for(spawned, 60, interval=1,
             what=lambda: f"{user.name}'s server to start: {said.get('last')}")


@pytest.fixture
def running(lab, members):
    """The four members each have a 1-GPU server running (started here if need be)."""
    start_every_member(lab, members)


def spawn(user: LabUser, options: dict) -> requests.Response:
    return requests.post(f"{user.hub.api}/users/{user.name}/server", json=options,
                         headers=user._headers(), timeout=180)


def wait_ready(user: LabUser, timeout: float = 150) -> None:
    wait_for(lambda: (user.hub.server_model(user.name) or {}).get("ready"), timeout,
             interval=0.2, what=f"{user.name}'s server to be ready")


# ---------------------------------------------------------------- tests, in order


def test_a_machine_without_the_managers_build_of_the_image_is_named_and_runs_nothing(lab):
    """An admin rebuilt spawn.image on the manager and has not copied it to the GPU
    servers yet. The hub names the image by the manager's ID, so a machine holding the
    old build asks no registry and runs nothing: the member reads which machine lacks
    the image, the service is gone, and its GPU is free again at once (the next test
    takes every GPU, one spawn after another)."""
    image = "gpulab/singleuser:latest"
    before = lab.swarm.image_id(image)
    subprocess.run(["docker", "-H", lab.manager.host, "build", "-q", "-t", image, "-"],
                   input=f"FROM {image}\nLABEL org.gpulab.test=rebuilt-on-the-manager\n"
                         .encode(), check=True, capture_output=True, timeout=120)
    rebuilt = lab.swarm.image_id(image)
    assert rebuilt != before
    workers = {w.hostname for w in lab.swarm.workers}
    try:
        user = lab.hub.create_user(prefix="rebuilt")
        r = spawn(user, {"gpus": 1})
        assert r.status_code == 500, (r.status_code, r.text)
        message = r.json()["message"]
        print(f"the member read: {message}")
        [where] = [w for w in workers if f"{w} does not have the lab's server image" in message]
        assert rebuilt.removeprefix("sha256:")[:12] in message, message
        assert user.name not in lab.placement()
        for worker in lab.swarm.workers:  # nothing ran the old build for her
            assert not lab.swarm.docker(worker, "ps", "-aq", "--filter",
                                        f"label=org.gpulab.user={user.name}"), worker.name
        assert f"failed: {where} does not have the lab's server image" in lab.logs(
            "gpulab-hub", 40)
    finally:
        lab.docker("tag", before, image)
        lab.docker("rmi", rebuilt)
    assert lab.swarm.image_id(image) == before


def test_members_get_distinct_gpus_spread_over_the_machines(lab, members):
    last = lab.swarm.workers[-1].hostname
    started = start_every_member(lab, members)
    print(f"spawn to ready on a worker, one at a time: "
          f"{', '.join(f'{s:.1f}' for s in started)} s")
    placed = lab.placement()
    print(f"placement: {placed}")
    assert set(placed) == {u.name for u in members}
    workers = {w.hostname: w for w in lab.swarm.workers}
    pairs = [(node, gpu) for node, gpu in placed.values()]
    assert len(set(pairs)) == 4, pairs  # no GPU twice
    assert all(node in workers and gpu in workers[node].gpus for node, gpu in pairs), pairs
    # Spread: the first two members landed on different machines.
    assert placed[members[0].name][0] != placed[members[1].name][0]
    assert placed[members[2].name][0] == last  # her pool is that machine's
    # Each container got exactly its leased GPU from the node's runtime.
    given = {}
    for worker in lab.swarm.workers:
        given.update(lab.gpus_given(worker))
    for s in lab.services():
        ids = lab.docker("service", "ps", "-q", "--no-trunc", "--filter",
                         "desired-state=running", s["ID"]).split()
        [task] = json.loads(lab.docker("inspect", *ids))
        container = task["Status"]["ContainerStatus"]["ContainerID"]
        assert given.get(container) == s["Spec"]["Labels"]["org.gpulab.gpus"], (given, s)
    # No machine asked a registry for the image (services name it by ID): dockerd logs
    # "pulling image failed" for every start of a service that names it
    # (test_swarm_harness.py::test_an_image_by_name_makes_a_machine_ask_a_registry).
    for worker in lab.swarm.workers:
        log = worker.paths.log.read_text(errors="replace")
        assert "pulling image failed" not in log, lab.swarm.log_tail(worker)


def test_one_line_for_the_whole_swarm(lab, members, running):
    """Every GPU of both machines held: a fifth member waits in line, one line for the
    cluster. When a member on the other machine than the first stops, the line starts
    her server there, on the GPU that came free (a server's GPUs on one machine)."""
    waiting = lab.hub.create_user(prefix="w")
    try:
        r = spawn(waiting, {"gpus": 1, "wait": True})
        assert r.status_code == 202, r.text
        assert "number 1 in line" in r.json()["message"], r.text
        leaving = members[1]
        freed = lab.placement()[leaving.name]
        leaving.stop_server()
        t0 = time.monotonic()
        wait_ready(waiting, 120)
        print(f"the line started her server {time.monotonic() - t0:.1f} s after the stop, "
              f"on {freed[0]}")
        assert lab.placement()[waiting.name] == freed
    finally:
        lab.hub.delete_user(waiting.name)


def test_a_member_waits_for_a_gpu_on_the_machine_with_her_home(lab, members, running):
    """spawn.swarm_homes: machine (the default): her home is where her server first ran,
    and her server runs only there. Waiting in line, a GPU freed on another machine is
    not hers: it goes to whoever may have it (before: the line kept it for her and tried
    to start her server with it every round, refused every time), and her turn comes when
    one frees on her machine."""
    at = lab.placement()
    homed = members[0]
    home = at[homed.name][0]
    there = next(u for u in members if at[u.name][0] != home)
    here = next(u for u in members if u is not homed and at[u.name][0] == home)
    newcomer, other = lab.hub.create_user(prefix="x"), lab.hub.create_user(prefix="y")
    try:
        homed.stop_server()
        _spawn_once_its_gpu_is_free(newcomer)  # takes the GPU she held: her machine is full
        wait_ready(newcomer)
        assert lab.placement()[newcomer.name][0] == home
        r = spawn(homed, {"gpus": 1, "wait": True})
        assert r.status_code == 202 and "number 1 in line" in r.json()["message"], r.text

        there.stop_server()  # a GPU frees on the other machine: not hers
        _spawn_once_its_gpu_is_free(other)  # another member gets it
        wait_ready(other)
        assert lab.placement()[other.name][0] == at[there.name][0]
        (mine,) = line_of(homed)
        assert mine["state"] == "waiting" and lab.hub.server_model(homed.name) is None, mine

        here.stop_server()  # one frees on her machine: her turn
        t0 = time.monotonic()
        wait_ready(homed, 120)
        print(f"her server started on {home} {time.monotonic() - t0:.1f} s after a GPU "
              f"there came free")
        assert lab.placement()[homed.name][0] == home
    finally:
        lab.hub.delete_user(newcomer.name)
        lab.hub.delete_user(other.name)


def line_of(user: LabUser) -> list[dict]:
    r = requests.get(f"{user.hub.api}/gpulab/line/{user.name}", headers=user._headers(),
                     timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["line"]


def _neighbours(lab, members):
    """(attacker, her machine, a member on the same machine, a member on another one)."""
    at = lab.addresses()
    by_name = {u.name: u for u in members}
    attacker = members[0]
    here = at[attacker.name][0]
    same = next(n for n, (m, _) in at.items() if m == here and n != attacker.name)
    other = next(n for n, (m, _) in at.items() if m != here)
    return attacker, here, (same, at[same][1]), (other, at[other][1]), by_name


def test_a_member_reaches_the_hub_api_and_nothing_else_on_any_machine(lab, members, running):
    """Her own code, run in her server through the hub, tries every door: the neighbour's
    server on her machine and on another, the proxy, the hub's other port, the overlay's
    gateway, her machine itself, another machine's exporter and Swarm ports. Each blocked
    target is shown answering to whom it is for (the hub, the proxy, a machine)."""
    attacker, here, (same, same_ip), (other, other_ip), _ = _neighbours(lab, members)
    workers = {w.hostname: w for w in lab.swarm.workers}
    there = next(w for name, w in workers.items() if name != here)
    hub, proxy = "172.30.0.250", "172.30.0.251"
    doors = {
        "neighbour on her machine": (same_ip, 8888),
        "member on another machine": (other_ip, 8888),
        "proxy API": (proxy, 8001),
        "proxy public port": (proxy, 8000),
        "hub's dashboard port": (hub, 9447),
        "overlay gateway": ("172.30.0.1", 8888),
        "her machine (docker_gwbridge)": (lab.gateway(workers[here]), 22),
        "another machine's exporter": (there.address, 9445),
        "another machine's Swarm gossip": (there.address, 7946),
        "the manager's Swarm API": (lab.manager.address, 2377),
    }
    seen = probe(attacker, {**doors, "hub API": (hub, 8081)})
    print(f"{attacker.name} on {here}: {json.dumps(seen, indent=1)}")
    assert seen == {**{door: "unreachable" for door in doors}, "hub API": "open"}
    # Controls: every blocked door answers to whom it is for.
    assert set(lab.probe_from_container("gpulab-proxy", {
        "same": (same_ip, 8888), "other": (other_ip, 8888), "dashboard": (hub, 9447),
    }).values()) == {"open"}
    assert lab.probe_from_container("gpulab-hub", {"api": (proxy, 8001)}) == {"api": "open"}
    assert set(lab.probe_from_machine(lab.manager, {
        "exporter": (there.address, 9445), "gossip": (there.address, 7946),
    }).values()) == {"open"}
    assert lab.probe_from_machine(there, {"api": (lab.manager.address, 2377)}) == {
        "api": "open"}
    # The overlay's gateway and her machine answer "refused" (reached, nothing listens)
    # where nothing drops: from the machine itself.
    assert lab.probe_from_machine(workers[here], {"gw": (lab.gateway(workers[here]), 22)}) \
        == {"gw": "refused"}
    for name in (here, there.hostname):
        status = lab.swarm.docker(workers[name], "exec", "gpulab-netguard", "gpulab-netguard",
                               "status")
        assert status.startswith("users' network isolated on this machine"), status


def test_the_labs_private_networks_are_closed_on_every_machine(lab, members, running):
    """The lab's network (a machine of its at 10.99.0.2, a public-range stand-in beyond),
    routed from her GPU server and from the manager: her server reaches the stand-in and
    DNS there, not the lab's machine; the hub, on the manager, reaches the lab's machine
    (its directory, its SMTP server) through a way out of its own."""
    attacker, here, *_ = _neighbours(lab, members)
    workers = {w.hostname: w for w in lab.swarm.workers}
    nas, public, port = "10.99.0.2", "198.51.100.2", 18080
    with StandInLan([nas, public], [port, 53], netns=workers[here].plan.netns):
        seen = probe(attacker, {"nas": (nas, port), "nas_dns": (nas, 53),
                                "public": (public, port)})
    assert seen == {"nas": "unreachable", "nas_dns": "open", "public": "open"}
    with StandInLan([nas], [port], netns=lab.manager.plan.netns):
        assert lab.probe_from_container("gpulab-hub", {"nas": (nas, port)}) == {
            "nas": "open"}
    status = lab.swarm.docker(workers[here], "exec", "gpulab-netguard", "gpulab-netguard",
                              "status")
    assert "open on the lab's private networks: DNS (port 53) and nothing" in status, status


def test_a_flushed_overlay_firewall_is_put_back(lab, members, running):
    """A firewall reload inside a machine's overlay namespace (here: every FORWARD rule
    flushed): netguard puts the rules back within its check interval, and says so."""
    attacker, here, (same, same_ip), _, _ = _neighbours(lab, members)
    node = next(w for w in lab.swarm.workers if w.hostname == here)
    netns = lab.overlay_netns(node)
    in_overlay = ["nsenter", f"--net={netns}", "iptables"]
    drop = ["FORWARD", "-i", "br0", "-o", "br0", "-m", "comment", "--comment",
            "gpulab-netguard", "-j", "DROP"]
    subprocess.run([*in_overlay, "-C", *drop], check=True)
    subprocess.run([*in_overlay, "-F", "FORWARD"], check=True)
    assert subprocess.run([*in_overlay, "-C", *drop], capture_output=True).returncode != 0
    wait_for(lambda: subprocess.run([*in_overlay, "-C", *drop],
                                    capture_output=True).returncode == 0,
             30, interval=0.5, what="netguard to put the overlay's rules back")
    time.sleep(0.5)
    assert "had disappeared" in lab.logs("gpulab-netguard", 20, node=node)
    assert probe(attacker, {"same": (same_ip, 8888)}) == {"same": "unreachable"}
    # Stopping netguard (a restart, make swarm-node after an upgrade) leaves the rules.
    lab.swarm.docker(node, "stop", "gpulab-netguard")
    try:
        subprocess.run([*in_overlay, "-C", *drop], check=True)
        assert probe(attacker, {"same": (same_ip, 8888)}) == {"same": "unreachable"}
    finally:
        lab.swarm.docker(node, "start", "gpulab-netguard")


def test_a_machine_whose_last_server_stopped_is_closed_again_when_one_starts(lab, members, running):
    """Docker removes a machine's overlay namespace with the last of its containers there,
    and makes a new one (same name) for the next: netguard closes the new one too."""
    attacker, here, (same, _), _, by_name = _neighbours(lab, members)
    node = next(w for w in lab.swarm.workers if w.hostname == here)
    netns = lab.overlay_netns(node)
    pair = [attacker, by_name[same]]
    for user in pair:
        user.stop_server()
    stopped = time.monotonic()
    try:  # Swarm takes its time: 46 s on a quiet machine, over 60 s once in CI
        wait_for(lambda: not netns.exists(), 180, interval=0.5,
                 what=f"the overlay namespace on {here} to go with its last container")
    except StackError as e:
        raise AssertionError(f"{e}\n{_overlay_on(lab, node)}") from None
    print(f"the overlay namespace on {here} went {time.monotonic() - stopped:.1f} s after "
          f"its last server stopped")
    for user in pair:  # back on the same machine (their homes are there); its GPUs cool
        _spawn_once_its_gpu_is_free(user)
        wait_ready(user)
    assert {lab.addresses()[u.name][0] for u in pair} == {here}
    same_ip = lab.addresses()[same][1]
    assert probe(attacker, {"same": (same_ip, 8888)}) == {"same": "unreachable"}
    log = lab.logs("gpulab-netguard", 40, node=node)
    assert log.count(f"closed the users' overlay namespace {netns.name}") >= 2, log


def _overlay_on(lab, node) -> str:
    """What still holds the users' overlay on *node*: its containers and endpoints there,
    the services and tasks the manager knows."""
    return "\n".join([
        "containers on the machine:",
        lab.swarm.docker(node, "ps", "-a", "--format",
                         "{{.Names}} {{.Status}} {{.Networks}}", check=False),
        "the overlay there:",
        lab.swarm.docker(node, "network", "inspect", "-f", "{{json .Containers}}", "gpulab",
                         check=False),
        "services:", lab.docker("service", "ls", check=False),
        "tasks:", lab.docker("node", "ps", node.hostname, check=False)])


def _admin_page(lab, new_page, path: str):
    r = lab.hub.request("POST", "/gpulab/login-tokens/admin", json={"expires_in": 3600})
    assert r.status_code == 201, r.text
    page = new_page()
    submit_login(page, "admin", r.json()["token"], next_url=path, hub_url=lab.forward.url)
    return page


def test_the_dashboard_lists_every_machines_gpus_and_who_holds_them(lab, members, running, new_page):
    """Prometheus on the manager finds each GPU server's exporter (make swarm-node) in
    the Swarm's node list; the operators' dashboard, reading Prometheus, shows every
    machine's GPUs with a Node column, and per machine how many are held. A GPU
    server's exporter, published on the lab's network, answers only Prometheus' token."""
    from gpulab.contract import EXPORTER_PORT

    token = (REPO / "secrets" / "exporter-token").read_text().strip()
    for worker in lab.swarm.workers:
        url = f"http://{worker.address}:{EXPORTER_PORT}/metrics"

        def status(*headers, url=url):
            return subprocess.run(
                ["nsenter", f"--net=/run/netns/{lab.manager.plan.netns}", "curl", "-s",
                 "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", *headers, url],
                capture_output=True, text=True, timeout=30).stdout
        assert status() == "401", f"{worker.name}'s exporter answered without a token"
        assert status("-H", f"Authorization: Bearer {token}") == "200"
    page = _admin_page(lab, new_page, "/services/gpus/")
    expected = sorted(w.hostname for w in lab.swarm.workers for _ in w.gpus)

    held = {w.hostname: "2" for w in lab.swarm.workers}  # every GPU, by its member
    seen = {}

    def listed():
        page.reload()
        rows = page.locator("#node-rows tr.node")
        seen["nodes"] = {rows.nth(i).locator("td").nth(0).inner_text():
                         rows.nth(i).locator("td").nth(4).inner_text()
                         for i in range(rows.count())}
        seen["gpus"] = page.locator("#gpu-rows tr.gpu").all_inner_texts()
        return (sorted(page.locator("#gpu-rows tr.gpu td.node").all_inner_texts()) == expected
                and seen["nodes"] == held)
    try:
        # Prometheus asks the node list every 30 s and scrapes every 15 s (a first ask
        # before the read-only Docker proxy answered once left it refused for good: the
        # proxy now answers its fallback API version, docker_policy.MIN_READ_ONLY_...).
        wait_for(listed, 240, interval=3, what="the dashboard to list every machine's GPUs")
    except AssertionError:
        print(f"the dashboard showed: {seen}")
        targets = lab.docker("exec", "gpulab-hub", "python3", "-c",
                             "import urllib.request; print(urllib.request.urlopen("
                             "'http://prometheus:9090/api/v1/targets').read().decode())",
                             check=False)
        print(f"Prometheus' targets: {targets[:4000]}")
        print(f"Prometheus' log: {lab.logs('gpulab-prometheus', 40)}")
        print(f"the read-only Docker proxy's log: {lab.logs('gpulab-docker-proxy-ro', 40)}")
        raise


def test_the_lease_page_lists_every_machines_services_and_releases_a_leftover(
        lab, members, running, new_page):
    """The admins' lease page on a Swarm, in Chromium: the services holding GPUs, each GPU
    named with its machine. A running member's lease is not released from here (409); a
    leftover service (made here by hand as a crashed hub could leave one: gpulab's labels,
    no task, a member the hub does not know) is, which removes the service."""
    worker = lab.swarm.workers[-1]
    node_id = lab.swarm.docker(worker, "info", "-f", "{{.Swarm.NodeID}}").strip()
    lab.docker("service", "create", "-d", "--no-resolve-image", "--replicas", "0",
               "--name", "gpulab-user-ghost",
               "--label", "org.gpulab.managed=true", "--label", "org.gpulab.user=ghost",
               "--label", "org.gpulab.server=", "--label", f"org.gpulab.gpus={worker.gpus[-1]}",
               "--label", f"org.gpulab.node={node_id}",
               lab.swarm.image_id("gpulab/singleuser:latest"))
    page = _admin_page(lab, new_page, "/services/gpus/leases")
    assert "Service" in page.locator("#lease-table thead").inner_text()
    rows = {row.locator("td.user").inner_text(): row.locator("td").nth(0).inner_text()
            for row in page.locator("#lease-rows tr.lease").all()}
    placed = lab.placement()
    assert set(rows) == {*placed, "ghost"}, rows
    for user, (machine, _) in placed.items():
        assert f"of {machine}" in rows[user], (user, rows[user])
    assert f"of {worker.hostname}" in rows["ghost"], rows["ghost"]
    machines = page.locator("#gpu-table tr.gpu td.num:first-child .machine").all_inner_texts()
    assert sorted(machines) == sorted(w.hostname for w in lab.swarm.workers for _ in w.gpus)

    release_api = f"{lab.forward.url}/services/gpus/api/leases/release"

    def release(user: str) -> str:
        page.once("dialog", lambda d: d.accept())
        row = page.locator("#lease-rows tr.lease", has=page.locator("td.user", has_text=user))
        return answer_shown(page, release_api, row.locator("button.release").click)

    said = release(members[0].name)
    assert said.startswith("409 ") and "the hub runs this server; service running" in said, said
    said = release("ghost")
    assert said.startswith("200 ") and "removed gpulab-user-ghost" in said, said
    assert "gpulab-user-ghost" not in lab.docker("service", "ls", "--format", "{{.Name}}")
    assert set(lab.placement()) == {u.name for u in members}


def test_one_more_than_the_cluster_holds_is_refused(lab, members, running, new_page):
    late = lab.hub.create_user(prefix="late")
    r = spawn(late, {"gpus": 1})
    assert r.status_code == 409, (r.status_code, r.text)
    assert "GPU" in r.json()["message"], r.text
    assert late.name not in lab.placement()
    # Her spawn form says which machine each GPU is in, and that all are taken.
    page = new_page()
    submit_login(page, late.name, late.token, next_url="/hub/spawn", hub_url=lab.forward.url)
    rows = page.locator("#gpulab-gpu-table tbody tr").all_inner_texts()
    machines = sorted(row.split("\t")[0] for row in rows)
    assert machines == sorted(w.hostname for w in lab.swarm.workers for _ in w.gpus), rows
    assert all(row.rstrip().endswith("in use") for row in rows), rows
    # ... and where her server would start: with no GPU on the least busy machine, with
    # GPUs nowhere while all are taken.
    note = page.locator("#gpulab-machine").inner_text()
    machines = {n.hostname for n in lab.swarm.nodes}
    assert any(note.startswith(f"Your server would start with no GPU on {m}; with 1 GPU "
                               f"nowhere right now; with 2 GPUs nowhere right now.")
               for m in machines), note


@pytest.mark.parametrize("options, status", [
    ({"gpus": "all"}, 400), ({"device_ids": [0, 1]}, 400), ({"gpus": -1}, 400),
    ({"gpus": 10**9}, 400), ({"gpus": 1.5}, 400), ({"gpus": [1]}, 400),
    ({"gpus": 1, "image": "evil"}, 400), ({"gpus": 3}, 403),
])
def test_user_options_sent_straight_to_the_rest_api_are_refused_before_any_service(
        lab, options, status):
    """As on one host (test_gpu_leases): bad options a member sends the REST API are
    refused with a reason, and no service is created (max_gpus is 2 here)."""
    mallory = lab.hub.create_user(prefix="mallory")
    r = spawn(mallory, options)
    assert r.status_code == status, (r.status_code, r.text)
    assert r.json().get("message"), r.text
    assert mallory.name not in lab.placement()


def test_autograd_runs_in_a_server_on_a_worker_through_the_hub(lab, members, running):
    user = members[0]
    node, _ = lab.placement()[user.name]
    assert node in {w.hostname for w in lab.swarm.workers}
    result = json.loads(user.run_code(AUTOGRAD_CELL).strip().splitlines()[-1])
    print(f"autograd on {node}: {result['device']}, torch {result['torch']}")
    check_result(result, "cpu")  # the fake GPUs carry no CUDA device


def test_a_job_runs_on_the_machine_of_its_gpu_and_stops_itself_there(lab, members, running):
    """A job on the Swarm: its service runs on the machine of the GPU it leased (the one a
    member just gave back), says it is a job, and when its command ends its server asks
    the hub, from that machine, to stop it: the service goes and the GPU with it."""
    last = lab.swarm.workers[-1].hostname
    placed = lab.placement()
    leaving = next(u for u in members if placed[u.name][0] != last)  # not a pool's machine
    freed = placed[leaving.name]
    leaving.stop_server()
    jo = lab.hub.create_user(prefix="j")
    said = {}

    def submitted() -> bool:  # the GPU given back cools for 12 s first
        r = jo.ask_server("j1", {"gpus": 1, "job": "echo $NVIDIA_VISIBLE_DEVICES; sleep 10"})
        said["last"] = r.text
        return r.status_code in (201, 202)

    def jos() -> list[dict]:
        return [s["Spec"]["Labels"] for s in lab.services()
                if s["Spec"]["Labels"]["org.gpulab.user"] == jo.name]
    try:
        wait_for(submitted, 60, interval=1, what=lambda: f"her job to start: {said['last']}")
        (labels,) = jos()
        assert (labels["org.gpulab.server"], labels["org.gpulab.job"]) == ("j1", "true")
        assert lab.placement()[jo.name] == freed  # that GPU, on its machine
        wait_for(lambda: lab.hub.server_model(jo.name, "j1") is None and not jos(), 180,
                 interval=1, what="the job to end and its server to stop itself")
    finally:
        lab.hub.delete_user(jo.name)


def test_a_hub_restart_keeps_every_lease(lab, members, running):
    before = lab.placement()
    lab.docker("kill", "gpulab-hub")  # SIGKILL: no clean shutdown
    lab.docker("start", "gpulab-hub")
    lab.wait_hub()
    assert lab.placement() == before
    for user in members:
        assert (lab.hub.server_model(user.name) or {}).get("ready"), user.name
        r = user.api("GET", "/status")
        assert r.status_code == 200, (user.name, r.status_code, r.text[:200])
    late = lab.hub.create_user(prefix="late")
    r = spawn(late, {"gpus": 1})
    assert r.status_code == 409, (r.status_code, r.text)  # nothing was double-booked


def test_a_member_chooses_an_environment_and_its_image_runs_by_its_id(lab):
    """Environments on a Swarm (refused with hub.swarm before): the settings are taken,
    her choice goes through the REST API, and her service names the environment's image
    by its ID on the manager. The environment's image here is a second name of the
    members' image (a build of its own would have to reach the workers' image stores,
    which the harness fills before the Swarm forms); that the proxy in front of a real
    manager lets a distinct environment image by and refuses an unlisted one is
    test_docker_proxy_swarm.py's."""
    image = "gpulab/singleuser:writing"
    lab.docker("tag", "gpulab/singleuser:latest", image)
    settings = lab.root / "config" / "gpulab.yaml"
    original = settings.read_text()
    settings.write_text(original + (
        "  environments:\n"
        "    - {name: pytorch, image: 'gpulab/singleuser:latest'}\n"
        f"    - {{name: writing, image: '{image}', gpus: false}}\n"))
    user = lab.hub.create_user(prefix="writer")
    try:
        r = spawn(user, {"environment": "painting"})
        assert r.status_code == 400 and "writing" in r.json()["message"], r.text
        r = spawn(user, {"environment": "writing"})
        assert r.status_code in (201, 202), (r.status_code, r.text)
        wait_ready(user)
        [service] = [s for s in lab.services()
                     if s["Spec"]["Labels"]["org.gpulab.user"] == user.name]
        cs = service["Spec"]["TaskTemplate"]["ContainerSpec"]
        assert cs["Image"] == lab.swarm.image_id(image), cs["Image"]
        assert service["Spec"]["Labels"]["org.gpulab.gpus"] == ""  # gpus: false
    finally:
        settings.write_text(original)
        user.stop_server()
        lab.docker("rmi", image)  # the name only: gpulab/singleuser:latest keeps the image


def test_a_dead_machine_stops_its_servers_and_frees_nothing_twice(lab, members, running, new_page):
    placed = lab.placement()
    victim = lab.swarm.workers[0]
    on_victim = [u for u in members if placed[u.name][0] == victim.hostname]
    elsewhere = [u for u in members if placed[u.name][0] != victim.hostname]
    assert on_victim and elsewhere, placed
    lab.swarm.stop_engine(victim, crash=True)
    lab.swarm.wait_state(victim, "Down", 30)
    # Its servers are reported stopped and their services removed (leases released).
    for user in on_victim:
        wait_for(lambda u=user: lab.hub.server_model(u.name) is None, 60, interval=0.5,
                 what=f"{user.name}'s server on the dead machine to be reported stopped")
    wait_for(lambda: set(lab.placement()) == {u.name for u in elsewhere}, 30,
             what="the dead machine's services to be removed")
    for user in elsewhere:
        assert (lab.hub.server_model(user.name) or {}).get("ready"), user.name
    # Coming back, the member reads why on the hub's home page, in her browser.
    page = new_page()
    submit_login(page, on_victim[0].name, on_victim[0].token, next_url="/hub/home",
                 hub_url=lab.forward.url)
    notice = page.locator("#gpu-notices .gpu-notice[data-kind=stopped]")
    assert notice.inner_text().startswith(
        f"Your server was stopped: the machine it ran on ({victim.hostname}) is down."), (
        notice.inner_text())
    # Her home is on the dead machine (spawn.swarm_homes: machine): she is told so.
    back = on_victim[0]
    r = spawn(back, {"gpus": 1})
    assert r.status_code == 503, (r.status_code, r.text)
    assert (f"Your files are on the lab's machine {victim.hostname}, which is down"
            in r.json()["message"]), r.text
    # A new member: the other machine is full and the dead one gives nothing.
    new = lab.hub.create_user(prefix="new")
    r = spawn(new, {"gpus": 1})
    assert r.status_code == 409, (r.status_code, r.text)
    # A member on the live machine stops; the next spawn lands there, on that GPU, once
    # her container has had its stop grace period (the GPU "cools": LeaseBook.cool).
    freed = lab.placement()[elsewhere[0].name]
    elsewhere[0].stop_server()
    stopped = time.monotonic()
    r = spawn(new, {"gpus": 1})
    while r.status_code == 409 and time.monotonic() - stopped < 30:
        time.sleep(1)
        r = spawn(new, {"gpus": 1})
    assert r.status_code in (201, 202), r.text
    print(f"the freed GPU was given again {time.monotonic() - stopped:.1f} s after the stop")
    wait_ready(new)
    assert lab.placement()[new.name] == freed
    # The member whose files are on the live machine goes back there, and nowhere else.
    r = spawn(elsewhere[0], {"gpus": 1})
    assert r.status_code == 409, (r.status_code, r.text)
    assert (f"Your files are on the lab's machine {freed[0]}, so your server runs there"
            in r.json()["message"]), r.text
    # The spawn form says so, in her browser and in that of the member whose files are
    # on the dead machine.
    for user, said in ((elsewhere[0], f"Your files are on {freed[0]}, so your server "
                                      f"starts there, with GPUs of {freed[0]}."),
                       (back, f"Your files are on {victim.hostname}, which is down or out "
                              f"of service: your server cannot start until it is back.")):
        page = new_page()
        submit_login(page, user.name, user.token, next_url="/hub/spawn",
                     hub_url=lab.forward.url)
        assert page.locator("#gpulab-machine").inner_text() == said
