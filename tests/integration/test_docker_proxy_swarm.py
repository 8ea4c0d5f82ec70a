"""The Docker proxy in front of a real Swarm manager: what dockerd makes of the service,
task and node calls the proxy lets by (``--swarm``, :mod:`gpulab.dockerapi.swarm_policy`).

As test_docker_proxy_dockerd.py does for container creates: dockerd decodes a service
spec with Go (duplicated objects merged, keys matched case-insensitively with ``ſ`` = ``s``
and ``K`` = ``k``, a deprecated top-level ``Networks`` still read), so raw bytes go through
a real proxy process to the manager of a simulated Swarm (tests/swarm, 1 manager + 1
worker with fake GPUs). A hardened spec creates a service whose container on the worker
is exactly what was checked; every trick is refused by the proxy, and the same bytes
sent straight to the manager show what dockerd would have done with them: hand-picked
tricks with what dockerd stored for each (asserted, so a dockerd that changes is
noticed), and 113 generated variants (denied fields x spellings x positions), of which
dockerd alone turned 110 into a service that is not the hardened one (the 3 others: a
second mode beside Replicated, which dockerd answers with 400).

Services name their image by ID, as the hub's do (a machine given a name asks a
registry first). The trick services name one that only the manager has, made here, whose
entry point does not exist: none of them ever runs a process (on the worker their tasks
are rejected, with no registry asked; on the manager their container cannot start); each
is inspected and removed at once.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from gpulab.dockerapi.proxy import parse_response
from tests.ports import free_port

from ..swarm.harness import wait_for
from .test_docker_proxy_dockerd import Pairs, dump

SWARM_NODES = 2
IMAGE = "gpulab/base:bookworm"
SWARM_IMAGES = (IMAGE,)
# On the manager only (made by the fixture), with no entry point: trick services never run.
ABSENT_IMAGE = "gpulab/difftest-absent:latest"
NETWORK = "gpulab-difftest-users"  # spawn.network, an overlay
OTHER_NETWORK = "gpulab-difftest-hub"  # stands for the hub's own network
DATASETS = "gpulab-difftest-datasets"
# every service here is a named server of the member difftest (the proxy requires a
# service's name to be its labels' user's and server's): PREFIX + its server's name
PREFIX = "gpulab-user-difftest--"
REPO = Path(__file__).resolve().parents[2]
MANAGED = "org.gpulab.managed"


# ---------------------------------------------------------------- raw HTTP


def _exchange(connect, raw: bytes) -> tuple[int, bytes]:
    with connect() as s:
        s.settimeout(30)
        s.sendall(raw)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return parse_response(data)


def _request(method: str, target: str, body: bytes | None = None) -> bytes:
    head = f"{method} {target} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + (body or b"")


def _json(payload: bytes):
    return json.loads(payload) if payload.strip() else None


class Endpoint:
    """Raw HTTP to the manager's socket or to the proxy's port."""

    def __init__(self, socket_path: str | None = None, port: int | None = None):
        self.socket_path, self.port = socket_path, port

    def _connect(self):
        if self.port:
            return socket.create_connection(("127.0.0.1", self.port))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.socket_path)
        return s

    def send(self, method: str, target: str, body: bytes | None = None) -> tuple[int, object]:
        status, payload = _exchange(self._connect, _request(method, target, body))
        try:
            return status, _json(payload)
        except ValueError:
            return status, payload


def q(filters: dict) -> str:
    return quote(json.dumps(filters), safe="")


# ---------------------------------------------------------------- fixtures


class Lab:
    def __init__(self, swarm, manager: Endpoint, proxy: Endpoint, settings: Path):
        self.swarm, self.manager, self.proxy, self.settings = swarm, manager, proxy, settings
        self.worker = swarm.workers[0]
        self.worker_id = manager.send("GET", f"/nodes/{self.worker.hostname}")[1]["ID"]
        self.network_id = manager.send("GET", f"/networks/{NETWORK}")[1]["Id"]
        self.counter = 0
        self.image_id = self.image(IMAGE)  # what the hub's services name
        self.absent_id = ""  # ABSENT_IMAGE's, once the fixture has made it

    def image(self, name: str) -> str:
        """*name*'s ID on the manager: the image a member's service names."""
        status, info = self.manager.send("GET", f"/images/{name}/json")
        assert status == 200, info
        return info["Id"]

    def set_image(self, image: str) -> None:
        """spawn.image in the settings file the proxy reads again at every create."""
        self.settings.write_text(f"spawn:\n  image: {image}\n  network: {NETWORK}\n"
                                 f"  datasets_volume: {DATASETS}\n")

    def name(self) -> str:
        self.counter += 1
        return f"{PREFIX}{self.counter}"

    def spec(self, image: str, gpus: tuple[str, ...] | None = None, user: str = "difftest",
             args: tuple[str, ...] = ("sleep", "60")) -> dict:
        """What a gpulab Swarm spawner sends for a member's server on the worker; *image*
        is an image ID."""
        gpus = self.worker.gpus[:1] if gpus is None else gpus
        name = self.name()
        labels = {MANAGED: "true", "org.gpulab.user": user,
                  "org.gpulab.server": name[len(PREFIX):], "org.gpulab.gpus": ",".join(gpus)}
        return {
            "Name": name,
            "Labels": {**labels, "org.gpulab.node": self.worker_id},
            "TaskTemplate": {
                "ContainerSpec": {
                    "Image": image, "Labels": labels, "Args": list(args),
                    "Env": [f"JUPYTERHUB_USER={user}",
                            f"NVIDIA_VISIBLE_DEVICES={','.join(gpus) or 'void'}"],
                    "User": "1000:1000", "Init": True, "StopGracePeriod": 1_000_000_000,
                    "Mounts": [{"Type": "volume", "Source": f"gpulab-difftest-home-{user}",
                                "Target": "/home/jovyan", "ReadOnly": False},
                               {"Type": "volume", "Source": DATASETS, "Target": "/datasets",
                                "ReadOnly": True}],
                    "CapabilityDrop": ["ALL"],
                },
                "Resources": {"Limits": {"MemoryBytes": 1 << 30, "NanoCPUs": 1_000_000_000,
                                         "Pids": 256}},
                "RestartPolicy": {"Condition": "none"},
                "Placement": {"Constraints": [f"node.id=={self.worker_id}"]},
                "Networks": [{"Target": NETWORK}],
                "LogDriver": {"Name": "json-file",
                              "Options": {"max-size": "10m", "max-file": "3"}},
            },
            "Mode": {"Replicated": {"Replicas": 1}},
            "EndpointSpec": {"Mode": "dnsrr"},
        }

    def service(self, ref: str) -> dict:
        status, info = self.manager.send("GET", f"/services/{ref}")
        assert status == 200, info
        return info

    def attached(self, service_id: str) -> list[str]:
        """The networks the Swarm's allocator attached the service's task to."""
        def networks():
            status, tasks = self.manager.send(
                "GET", f"/tasks?filters={q({'service': [service_id]})}")
            assert status == 200, tasks
            return next((sorted(a["Network"]["Spec"]["Name"] for a in t["NetworksAttachments"])
                         for t in tasks if t.get("NetworksAttachments")), None)
        return wait_for(networks, 10, what="the task's network attachments", interval=0.1)

    def running_task(self, service: str) -> dict:
        """The service's running task, asked through the proxy as the hub asks."""
        def running():
            status, tasks = self.proxy.send(
                "GET", f"/v1.41/tasks?filters={q({'service': [service]})}")
            assert status == 200, tasks
            return next((t for t in tasks if t["Status"]["State"] == "running"), None)
        return wait_for(running, 30, what="the member's server to run", interval=0.2)

    def remove(self, ref: str) -> None:
        self.manager.send("DELETE", f"/services/{ref}")


@pytest.fixture(scope="module")
def lab(swarm, tmp_path_factory):
    manager = Endpoint(str(swarm.manager.paths.socket))
    for name in (NETWORK, OTHER_NETWORK):
        status, out = manager.send("POST", "/networks/create", json.dumps(
            {"Name": name, "Driver": "overlay", "CheckDuplicate": True}).encode())
        assert status == 201, out
    run = tmp_path_factory.mktemp("swarm-proxy")
    settings, log = run / "gpulab.yaml", run / "proxy.log"
    port = free_port()
    process = None
    try:
        lab = Lab(swarm, manager, Endpoint(port=port), settings)
        subprocess.run(["docker", "-H", swarm.manager.host, "build", "-q", "-t", ABSENT_IMAGE,
                        "-"], check=True, capture_output=True, timeout=60,
                       input=f"FROM {IMAGE}\nENTRYPOINT [\"/gpulab-difftest-never-runs\"]\n"
                             .encode())
        lab.absent_id = lab.image(ABSENT_IMAGE)
        lab.set_image(IMAGE)
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "gpulab.dockerapi.proxy", "--swarm",
                 "--listen", f"127.0.0.1:{port}", "--docker-socket", manager.socket_path,
                 "--settings", str(settings)],
                stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(REPO / "hub")})

        def up():
            if process.poll() is not None:
                pytest.fail(f"the proxy exited:\n{log.read_text()}")
            try:
                return lab.proxy.send("GET", "/_ping")[0] == 200
            except OSError:
                return False
        wait_for(up, 15, what="the proxy to answer")
        yield lab
    finally:
        if process is not None:
            process.terminate()
            process.wait(10)
            print(f"\nthe proxy's log (last lines):\n{log.read_text()[-3000:]}")


# ---------------------------------------------------------------- positive control


def test_a_hardened_member_server_runs_on_its_node_as_checked(lab):
    spec = lab.spec(lab.image_id)
    gpu = spec["Labels"]["org.gpulab.gpus"]
    status, out = lab.proxy.send("POST", "/v1.41/services/create", dump(spec))
    assert status == 201, out
    service_id = out["ID"]
    stored = lab.service(service_id)["Spec"]
    cs = stored["TaskTemplate"]["ContainerSpec"]
    assert (cs["User"], cs["CapabilityDrop"], cs.get("CapabilityAdd")) == (
        "1000:1000", ["ALL"], None)
    assert stored["TaskTemplate"]["Resources"]["Limits"]["Pids"] == 256
    assert stored["TaskTemplate"]["Placement"]["Constraints"] == [f"node.id=={lab.worker_id}"]

    # The hub's calls, through the proxy: the task list of this service, until it runs.
    task = lab.running_task(spec["Name"])
    assert task["NodeID"] == lab.worker_id
    container = task["Status"]["ContainerStatus"]["ContainerID"]
    info = json.loads(lab.swarm.docker(lab.worker, "inspect", container))[0]
    assert info["Config"]["User"] == "1000:1000"
    assert info["HostConfig"]["CapDrop"] == ["ALL"] and not info["HostConfig"]["CapAdd"]
    assert info["HostConfig"]["PidsLimit"] == 256 and not info["HostConfig"]["Privileged"]
    assert [m["Type"] for m in info["Mounts"]] == ["volume", "volume"]
    assert info["Config"]["Labels"]["org.gpulab.gpus"] == gpu
    records = [r for r in lab.swarm.runtime_records(lab.worker) if r["id"] == container]
    assert [r["NVIDIA_VISIBLE_DEVICES"] for r in records] == [gpu]

    status, found = lab.proxy.send(
        "GET", f"/v1.41/services?filters={q({'label': [f'{MANAGED}=true']})}")
    assert status == 200 and [s["ID"] for s in found] == [service_id], found
    status, nodes = lab.proxy.send("GET", "/v1.41/nodes")
    assert status == 200
    labels = {n["ID"]: n["Description"]["Engine"]["Labels"] for n in nodes}
    assert labels[lab.worker_id]["gpulab.gpus"].split(",") == list(lab.worker.gpus)
    status, node = lab.proxy.send("GET", f"/v1.41/nodes/{lab.worker_id}")
    assert status == 200 and node["Status"]["State"] == "ready"
    status, _ = lab.proxy.send("GET", f"/v1.41/services/{spec['Name']}?insertDefaults=true")
    assert status == 200
    status, out = lab.proxy.send("DELETE", f"/v1.41/services/{spec['Name']}")
    assert status == 200, out
    assert lab.manager.send("GET", f"/services/{service_id}")[0] == 404


def test_a_service_may_run_an_environments_image_by_id_and_no_unlisted_one(lab):
    """Environments members choose, on a Swarm: with spawn.environments listing a second
    image, the proxy lets a service name that image's ID on the manager, still refuses an
    image the manager has that is not listed, and, once the list is gone, refuses the
    second image too (the settings file is read again at every create). The second image
    is on the manager only: its task is rejected on the worker, which is not the point."""
    image = "gpulab/difftest-environment:latest"
    subprocess.run(["docker", "-H", lab.swarm.manager.host, "build", "-q", "-t", image, "-"],
                   check=True, capture_output=True, timeout=60,
                   input=f"FROM {IMAGE}\nLABEL org.gpulab.test=an-environment\n".encode())
    image_id = lab.image(image)
    assert image_id != lab.image_id
    lab.settings.write_text(
        f"spawn:\n  image: {IMAGE}\n  network: {NETWORK}\n  datasets_volume: {DATASETS}\n"
        f"  environments:\n    - {{name: base, image: '{IMAGE}'}}\n"
        f"    - {{name: light, image: '{image}', gpus: false}}\n")
    try:
        spec = lab.spec(image_id, gpus=())
        status, out = lab.proxy.send("POST", "/v1.41/services/create", dump(spec))
        assert status == 201, out
        assert lab.service(out["ID"])["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"] == (
            image_id)
        lab.remove(out["ID"])
        status, out = lab.proxy.send("POST", "/v1.41/services/create",
                                     dump(lab.spec(lab.absent_id, gpus=())))
        assert status == 403 and "is none of the lab's images on this manager now" in (
            out["message"]), out
        lab.set_image(IMAGE)  # no environments: spawn.image alone
        status, out = lab.proxy.send("POST", "/v1.41/services/create",
                                     dump(lab.spec(image_id, gpus=())))
        assert status == 403 and f"{IMAGE} is {lab.image_id}" in out["message"], out
    finally:
        lab.set_image(IMAGE)
        subprocess.run(["docker", "-H", lab.swarm.manager.host, "rmi", "-f", image],
                       capture_output=True, timeout=60)


def test_the_spawners_own_spec_runs_where_the_allocator_put_it(lab):
    """gpulab.spawn.swarm_services and gpulab.gpus.swarm_nodes end to end: the GPUs of the nodes the proxy lists, one leased
    by the allocator, the service spec the spawner builds for it (through the proxy, as
    it is), its task on that GPU's node with that GPU and a sized /dev/shm, and the lease
    read back from the service the manager lists."""
    from gpulab.gpus.allocator import Request, allocate
    from gpulab.gpus.config import parse_gpus_config
    from gpulab.gpus.swarm_nodes import inventory_from_nodes, leases_from_services
    from gpulab.settings import defaults
    from gpulab.spawn.swarm_services import service_spec

    status, nodes = lab.proxy.send("GET", "/v1.41/nodes")
    assert status == 200, nodes
    inventory = inventory_from_nodes(nodes)
    assert {g.node for g in inventory} == {lab.worker_id}  # the manager has no GPUs
    assert [g.uuid for g in inventory] == list(lab.worker.gpus)
    config = parse_gpus_config("inventory: auto\ndefaults: {gpus: 1, max_gpus: 2}\n")
    [gpu] = allocate(config, inventory, [], Request("swarmspec"))
    settings = {**defaults(), "spawn.image": IMAGE, "spawn.network": NETWORK,
                "spawn.datasets_volume": DATASETS, "spawn.mem_limit": 1 << 30,
                "spawn.cpu_limit": 1.0, "spawn.shm_size": 64 << 20}
    spec = service_spec(settings, "swarmspec", "", [gpu.uuid], gpu.node, lab.image_id,
                        env={"JUPYTERHUB_USER": "swarmspec"}, command=["sleep", "60"])
    status, out = lab.proxy.send("POST", "/v1.41/services/create", dump(spec))
    assert status == 201, out
    try:
        task = lab.running_task(spec["Name"])
        assert task["NodeID"] == gpu.node
        container = task["Status"]["ContainerStatus"]["ContainerID"]
        records = [r for r in lab.swarm.runtime_records(lab.worker) if r["id"] == container]
        assert [r["NVIDIA_VISIBLE_DEVICES"] for r in records] == [gpu.uuid]
        shm = lab.swarm.docker(lab.worker, "exec", container, "df", "-B1", "--output=size",
                               "/dev/shm")
        assert shm.split()[-1] == str(64 << 20), shm
        ident = lab.swarm.docker(lab.worker, "exec", container, "id", "-u")
        assert ident.strip() == "1000"
        status, services = lab.proxy.send(
            "GET", f"/v1.41/services?filters={q({'label': [f'{MANAGED}=true']})}")
        assert status == 200, services
        assert [(le.gpu_uuid, le.user) for le in leases_from_services(services)] == [
            (gpu.uuid, "swarmspec")]
    finally:
        lab.remove(spec["Name"])


def test_the_calls_pass_through_docker_py(lab):
    """docker-py's service types and calls, as a SwarmSpawner uses them, through the proxy."""
    import docker
    from docker import types

    api = docker.APIClient(base_url=f"tcp://127.0.0.1:{lab.proxy.port}", version="1.41")
    spec = lab.spec(lab.image_id, gpus=(), args=("sleep", "30"))
    cs = _ct(spec)
    resources = types.Resources(mem_limit=1 << 30, cpu_limit=1_000_000_000)
    resources["Limits"]["Pids"] = 256  # docker-py has no argument for it
    tt = types.TaskTemplate(
        types.ContainerSpec(cs["Image"], args=cs["Args"], env=cs["Env"], user=cs["User"],
                            labels=cs["Labels"], init=True, cap_drop=["ALL"],
                            mounts=[types.Mount(m["Target"], m["Source"],
                                                read_only=m["ReadOnly"])
                                    for m in cs["Mounts"]]),
        resources=resources, restart_policy=types.RestartPolicy("none"),
        placement=types.Placement(constraints=[f"node.id=={lab.worker_id}"]),
        networks=[NETWORK],
        log_driver=types.DriverConfig("json-file", {"max-size": "10m", "max-file": "3"}))
    created = api.create_service(tt, name=spec["Name"], labels=spec["Labels"],
                                 mode=types.ServiceMode("replicated", 1),
                                 endpoint_spec=types.EndpointSpec(mode="dnsrr"))
    assert api.inspect_service(spec["Name"])["ID"] == created["ID"]
    assert [s["ID"] for s in api.services(filters={"label": f"{MANAGED}=true"})] == [
        created["ID"]]
    assert wait_for(lambda: api.tasks(filters={"service": spec["Name"]}), 10,
                    what="a task")[0]["ServiceID"] == created["ID"]
    assert {n["ID"] for n in api.nodes()} >= {lab.worker_id}
    api.inspect_node(lab.worker_id)
    api.remove_service(created["ID"])
    with pytest.raises(docker.errors.NotFound):
        api.inspect_service(created["ID"])
    with pytest.raises(docker.errors.APIError) as refused:
        api.update_service(created["ID"], 1, tt)
    assert refused.value.status_code == 403


# ---------------------------------------------------------------- per-service calls


def test_per_service_calls_reach_only_gpulab_services(lab):
    status, out = lab.manager.send("POST", "/services/create", json.dumps({
        "Name": "gpulab-difftest-unmanaged", "Labels": {"infra": "yes"},
        "TaskTemplate": {"ContainerSpec": {"Image": ABSENT_IMAGE,
                                           "Env": ["SECRET=from-the-infra"]}},
        "Mode": {"Replicated": {"Replicas": 0}}}).encode())
    assert status == 201, out
    unmanaged = out["ID"]
    try:
        for ref in ("gpulab-difftest-unmanaged", unmanaged[:8], unmanaged):
            for method, target in (("GET", f"/v1.41/services/{ref}"),
                                   ("DELETE", f"/v1.41/services/{ref}"),
                                   ("GET", f"/v1.41/tasks?filters={q({'service': [ref]})}")):
                status, payload = lab.proxy.send(method, target)
                assert status == 403 and "not gpulab's" in payload["message"], (ref, payload)
        status, payload = lab.proxy.send("GET", f"/v1.41/services/{PREFIX}nobody")
        assert status == 404, payload
        for filters in ({}, {"label": ["infra=yes"]}, {"name": ["gpulab-difftest"]},
                        {"label": [f"{MANAGED}=true", MANAGED]}):
            status, payload = lab.proxy.send("GET", f"/v1.41/services?filters={q(filters)}")
            assert status == 403, (filters, payload)
        # what the refused list would have shown: another service's environment
        status, found = lab.manager.send("GET", "/services")
        assert "SECRET=from-the-infra" in json.dumps(found)
        assert lab.manager.send("GET", f"/services/{unmanaged}")[0] == 200
    finally:
        lab.remove(unmanaged)


# ---------------------------------------------------------------- tricks


def _ct(spec: dict) -> dict:
    return spec["TaskTemplate"]["ContainerSpec"]


def _pairs_with(spec: dict, path: tuple[str, ...], *extra: tuple[str, object]) -> Pairs:
    """*spec* as Pairs, with *extra* pairs appended to the object at *path*."""
    def build(obj: dict, rest: tuple[str, ...]) -> Pairs:
        pairs = Pairs((k, build(v, rest[1:]) if rest and k == rest[0] else v)
                      for k, v in obj.items())
        if not rest:
            pairs.extend(extra)
        return pairs
    return build(spec, path)


CS = ("TaskTemplate", "ContainerSpec")


def _without(pairs: Pairs, path: tuple[str, ...]) -> Pairs:
    """*pairs* without the key at *path*."""
    if len(path) == 1:
        return Pairs((k, v) for k, v in pairs if k != path[0])
    return Pairs((k, _without(Pairs(v.items()) if isinstance(v, dict) else v, path[1:])
                  if k == path[0] else v) for k, v in pairs)


ATTACHED = "the networks its task is attached to"


def tricks(lab) -> dict[str, tuple[bytes, str, object]]:
    """name -> (raw body, target, what to read from the stored spec when sent straight to
    the manager)."""
    s = lambda: lab.spec(lab.absent_id)  # noqa: E731
    hc = lambda spec: _ct(spec)  # noqa: E731
    return {
        "duplicate User": (
            dump(_pairs_with(s(), CS, ("User", "0"))), "/v1.41/services/create",
            lambda st: hc(st).get("User")),
        "root User hidden by case folding (user)": (
            dump(_pairs_with(s(), CS, ("user", "0"))), "/v1.41/services/create",
            lambda st: hc(st).get("User")),
        "taskTemplate merged into TaskTemplate": (
            dump(_pairs_with(s(), (), ("taskTemplate", {"ContainerSpec": {"User": "0"}}))),
            "/v1.41/services/create",
            lambda st: (hc(st).get("User"), hc(st).get("Image"))),
        "Kelvin K in TasKTemplate adds capabilities": (
            dump(_pairs_with(s(), (), ("Tas\u212aTemplate", {"ContainerSpec": {
                "CapabilityAdd": ["ALL"]}}))), "/v1.41/services/create",
            lambda st: (hc(st).get("CapabilityAdd"), hc(st).get("CapabilityDrop"))),
        "long s in Mountſ binds the host's /": (
            dump(_pairs_with(s(), CS, ("Mount\u017f", [
                {"Type": "bind", "Source": "/", "Target": "/host"}]))),
            "/v1.41/services/create",
            lambda st: [(m["Type"], m.get("Source")) for m in hc(st).get("Mounts", [])]),
        "CapabilityAdd spelled capabilityADD": (
            dump(_pairs_with(s(), CS, ("capabilityADD", ["SYS_ADMIN"]))),
            "/v1.41/services/create", lambda st: hc(st).get("CapabilityAdd")),
        "CapabilityAdd": (
            dump(_pairs_with(s(), CS, ("CapabilityAdd", ["NET_ADMIN"]))),
            "/v1.41/services/create", lambda st: hc(st).get("CapabilityAdd")),
        "deprecated top-level Networks instead of TaskTemplate's": (
            dump(_without(_pairs_with(s(), (), ("Networks", [{"Target": OTHER_NETWORK}])),
                          ("TaskTemplate", "Networks"))),
            "/v1.41/services/create", ATTACHED),
        "placement widened by a second Placement": (
            dump(_pairs_with(s(), ("TaskTemplate",), ("placement", {
                "Constraints": ["node.role==manager"]}))), "/v1.41/services/create",
            lambda st: st["TaskTemplate"]["Placement"].get("Constraints")),
        "Privileges: SELinux disabled, Seccomp, NoNewPrivileges": (
            dump(_pairs_with(s(), CS, ("Privileges", {
                "SELinuxContext": {"Disable": True},
                "Seccomp": {"Mode": "unconfined"}, "NoNewPrivileges": False}))),
            "/v1.41/services/create", lambda st: hc(st).get("Privileges")),
        "Sysctls": (
            dump(_pairs_with(s(), CS, ("Sysctls", {"net.ipv4.ip_forward": "1"}))),
            "/v1.41/services/create", lambda st: hc(st).get("Sysctls")),
        "GenericResources (GPUs by the Swarm)": (
            dump(_pairs_with(s(), ("TaskTemplate", "Resources"), ("Reservations", {
                "GenericResources": [{"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU",
                                                               "Value": 1}}]}))),
            "/v1.41/services/create",
            lambda st: st["TaskTemplate"]["Resources"].get("Reservations")),
        "published port on the host": (
            dump(_pairs_with(s(), ("EndpointSpec",), ("Ports", [
                {"TargetPort": 8888, "PublishedPort": 18888, "PublishMode": "host"}]))),
            "/v1.41/services/create", lambda st: st["EndpointSpec"].get("Ports")),
        "API 1.40 (drops CapabilityDrop and Pids)": (
            dump(s()), "/v1.40/services/create",
            lambda st: (hc(st).get("CapabilityDrop"),
                        st["TaskTemplate"]["Resources"]["Limits"].get("Pids"))),
    }


# name -> (why the proxy refuses it, what the manager's dockerd 20.10 did with the same
# bytes: observed here, and asserted so that a dockerd that changes is noticed)
EXPECTED = {
    "duplicate User": ("duplicate key 'User'", "created; stored spec: 0"),
    "root User hidden by case folding (user)": (
        "key 'user' is not allowed", "created; stored spec: 0"),
    "taskTemplate merged into TaskTemplate": (
        "key 'taskTemplate' is not allowed",
        "created; stored spec: ('0', 'ABSENT_ID')"),  # ABSENT_IMAGE's ID
    "Kelvin K in TasKTemplate adds capabilities": (
        "key 'Tas\u212aTemplate' is not allowed", "created; stored spec: (['ALL'], ['ALL'])"),
    "long s in Mountſ binds the host's /": (
        "key 'Mount\u017f' is not allowed", "created; stored spec: [('bind', '/')]"),
    "CapabilityAdd spelled capabilityADD": (
        "key 'capabilityADD' is not allowed", "created; stored spec: ['SYS_ADMIN']"),
    "CapabilityAdd": ("key 'CapabilityAdd' is not allowed",
                      "created; stored spec: ['NET_ADMIN']"),
    "deprecated top-level Networks instead of TaskTemplate's": (
        "body: key 'Networks' is not allowed", f"created; task attached to ['{OTHER_NETWORK}']"),
    "placement widened by a second Placement": (
        "key 'placement' is not allowed", "created; stored spec: ['node.role==manager']"),
    # dockerd 20.10 keeps SELinuxContext and drops Seccomp and NoNewPrivileges (API 1.44+)
    "Privileges: SELinux disabled, Seccomp, NoNewPrivileges": (
        "key 'Privileges' is not allowed",
        "created; stored spec: {'CredentialSpec': None, 'SELinuxContext': {'Disable': True, "
        "'User': '', 'Role': '', 'Type': '', 'Level': ''}}"),
    "Sysctls": ("key 'Sysctls' is not allowed",
                "created; stored spec: {'net.ipv4.ip_forward': '1'}"),
    "GenericResources (GPUs by the Swarm)": (
        "key 'GenericResources' is not allowed",
        "created; stored spec: {'GenericResources': [{'DiscreteResourceSpec': "
        "{'Kind': 'NVIDIA-GPU', 'Value': 1}}]}"),
    "published port on the host": (
        "EndpointSpec: no published ports",
        "created; stored spec: [{'Protocol': 'tcp', 'TargetPort': 8888, "
        "'PublishedPort': 18888, 'PublishMode': 'host'}]"),
    "API 1.40 (drops CapabilityDrop and Pids)": (
        "need Docker API version 1.41", "created; stored spec: (None, None)"),
}


def test_tricks_are_refused_and_live(lab, capsys):
    """Each trick is refused by the proxy; sent straight to the manager, dockerd stores
    (and would run) what the trick asked for. The observations are printed."""
    lab.set_image(ABSENT_IMAGE)
    seen = {}
    try:
        for name, (body, target, read) in tricks(lab).items():
            status, payload = lab.proxy.send("POST", target, body)
            assert status in (400, 403), (name, status, payload)
            assert EXPECTED[name][0] in payload["message"], (name, payload)
            status, out = lab.manager.send("POST", target, body)
            if status == 201:
                try:
                    if read == ATTACHED:
                        seen[name] = f"created; task attached to {lab.attached(out['ID'])}"
                    else:
                        seen[name] = (f"created; stored spec: "
                                      f"{read(lab.service(out['ID'])['Spec'])}")
                finally:
                    lab.remove(out["ID"])
            else:
                seen[name] = f"dockerd answered {status}: {out}"
    finally:
        lab.set_image(IMAGE)
    with capsys.disabled():
        print("\nwhat the Swarm manager's dockerd did with each body the proxy refused:")
        for name, what in seen.items():
            print(f"  {name}: {what}")
    assert seen == {name: what.replace("ABSENT_ID", lab.absent_id)
                    for name, (_, what) in EXPECTED.items()}


# ---------------------------------------------------------------- generated variants

TT = ("TaskTemplate",)
# (the object it belongs in, key, hostile value)
DENIED = [
    (CS, "User", "0"), (CS, "User", ""), (CS, "CapabilityAdd", ["ALL"]),
    (CS, "CapabilityDrop", []), (CS, "Privileges", {"SELinuxContext": {"Disable": True}}),
    (CS, "Sysctls", {"net.ipv4.ip_forward": "1"}), (CS, "Groups", ["0"]),
    (CS, "Mounts", [{"Type": "bind", "Source": "/", "Target": "/host"}]),
    (CS, "Image", "gpulab/hub:latest"), (CS, "Env", ["NVIDIA_VISIBLE_DEVICES=all"]),
    (TT, "Placement", {"Constraints": ["node.role==manager"]}),
    (TT, "Networks", [{"Target": OTHER_NETWORK}]),
    (TT, "RestartPolicy", {"Condition": "any"}),
    (TT, "Resources", {"Limits": {"MemoryBytes": 1 << 30}, "Reservations": {
        "GenericResources": [{"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU", "Value": 1}}]}}),
    ((), "Mode", {"Global": {}}),
    ((), "EndpointSpec", {"Mode": "dnsrr", "Ports": [{"TargetPort": 8888, "PublishedPort":
                                                      18888, "PublishMode": "host"}]}),
    ((), "Networks", [{"Target": OTHER_NETWORK}]),
]


def spellings(key: str) -> dict[str, str]:
    lower = key.lower()
    out = {"exact": key, "lower": lower, "upper": key.upper()}
    folded = lower.replace("s", "\u017f").replace("k", "\u212a")
    if folded != lower:
        out["fold"] = folded
    return out


def variants(lab):
    """(id, raw body) for every denied field x spelling x position: after the legit key in
    its own object ("dup"), and in a second parent object spelled in lower case, which Go
    merges into the first ("merged")."""
    for n, (parent, key, value) in enumerate(DENIED):
        for spelling, k in spellings(key).items():
            vid = f"{n}-{key}-{spelling}"
            yield f"{vid}-dup", dump(_pairs_with(lab.spec(lab.absent_id), parent, (k, value)))
            if parent:
                nested: object = {k: value}
                yield f"{vid}-merged", dump(_pairs_with(
                    lab.spec(lab.absent_id), parent[:-1], (parent[-1].lower(), nested)))


def violations(lab, spec: dict) -> list[str]:
    """How a stored service spec differs from the hardened server the proxy checks for."""
    tt, cs = spec["TaskTemplate"], spec["TaskTemplate"]["ContainerSpec"]
    checks = {
        "User": cs.get("User") == "1000:1000",
        "CapabilityDrop": cs.get("CapabilityDrop") == ["ALL"],
        "CapabilityAdd": not cs.get("CapabilityAdd"),
        "Privileges": not (cs.get("Privileges") or {}).get("SELinuxContext"),
        "Sysctls": not cs.get("Sysctls"), "Groups": not cs.get("Groups"),
        "Mounts": all(m["Type"] == "volume" for m in cs.get("Mounts", [])),
        "Image": cs.get("Image") == lab.absent_id,
        "Env": f"NVIDIA_VISIBLE_DEVICES={lab.worker.gpus[0]}" in cs.get("Env", []),
        "Placement": tt.get("Placement", {}).get("Constraints") == [
            f"node.id=={lab.worker_id}"],
        "Networks": [n["Target"] for n in tt.get("Networks", [])] == [lab.network_id]
        and not spec.get("Networks"),
        "RestartPolicy": tt.get("RestartPolicy", {}).get("Condition") == "none",
        "Resources": not tt.get("Resources", {}).get("Reservations", {}).get(
            "GenericResources") and tt.get("Resources", {}).get("Limits", {}).get("Pids"),
        "Mode": spec.get("Mode") == {"Replicated": {"Replicas": 1}},
        "EndpointSpec": not spec.get("EndpointSpec", {}).get("Ports"),
    }
    return [k for k, ok in checks.items() if not ok]


def test_generated_variants_are_refused_and_live(lab):
    lab.set_image(ABSENT_IMAGE)
    sent = refused = 0
    live = {"spelling": {}, "position": {}}
    failures, harmless = [], []  # harmless: dockerd alone made the hardened service anyway
    try:
        for vid, body in variants(lab):
            sent += 1
            status, payload = lab.proxy.send("POST", "/v1.41/services/create", body)
            if status in (400, 403):
                refused += 1
            else:
                failures.append(f"{vid}: the proxy answered {status} {str(payload)[:200]}")
                if status == 201:
                    lab.remove(payload["ID"])
            status, out = lab.manager.send("POST", "/v1.41/services/create", body)
            if status != 201:
                harmless.append(f"{vid} ({status})")
            else:
                try:
                    if violations(lab, lab.service(out["ID"])["Spec"]):
                        spelling, position = vid.split("-")[-2:]
                        for what, value in (("spelling", spelling), ("position", position)):
                            live[what][value] = live[what].get(value, 0) + 1
                    else:
                        harmless.append(vid)
                finally:
                    lab.remove(out["ID"])
    finally:
        lab.set_image(IMAGE)
    made = sum(live["position"].values())
    print(f"\n{sent} variants: {refused} refused by the proxy; sent straight to the manager, "
          f"{made} made a service that is not the hardened one ({live}); not: {harmless}")
    assert not failures, "\n".join(failures[:20])
    assert refused == sent
    assert all(live["spelling"].get(s) for s in ("exact", "lower", "upper", "fold")), live
    assert live["position"].get("merged"), live


def test_a_dead_machine_stops_its_servers_and_their_leases_go_with_them(lab):
    """The worker's engine killed (a power cut): what the hub reads through the proxy
    says the member's server stopped because its machine is down; the hub then removes
    the service, and its lease is gone. The worker comes back for whatever runs next."""
    from gpulab.gpus.swarm_nodes import leases_from_services
    from gpulab.settings import defaults
    from gpulab.spawn.swarm_services import RUNNING, STOPPED, server_state, service_spec

    gpu = lab.worker.gpus[0]
    settings = {**defaults(), "spawn.image": IMAGE, "spawn.network": NETWORK,
                "spawn.datasets_volume": DATASETS, "spawn.mem_limit": 1 << 30,
                "spawn.cpu_limit": 1.0, "spawn.shm_size": 64 << 20}
    spec = service_spec(settings, "swarmdead", "", [gpu], lab.worker_id, lab.image_id,
                        command=["sleep", "600"])
    status, out = lab.proxy.send("POST", "/v1.41/services/create", dump(spec))
    assert status == 201, out

    def state():
        service = lab.proxy.send("GET", f"/v1.41/services/{spec['Name']}")[1]
        tasks = lab.proxy.send("GET", f"/v1.41/tasks?filters={q({'service': [spec['Name']]})}")[1]
        nodes = lab.proxy.send("GET", "/v1.41/nodes")[1]
        return server_state(service, tasks, nodes)

    try:
        wait_for(lambda: state().state == RUNNING, 30, what="the server to run")
        lab.swarm.stop_engine(lab.worker, crash=True)
        stopped = wait_for(lambda: (s := state()).state == STOPPED and s, 60,
                           what="the hub to see the server stopped", interval=0.5)
        assert stopped.reason == f"the machine it ran on ({lab.worker.hostname}) is down"
        managed = f"/v1.41/services?filters={q({'label': [f'{MANAGED}=true']})}"
        assert [le.gpu_uuid for le in leases_from_services(lab.proxy.send("GET", managed)[1])
                ] == [gpu]  # held until the hub removes the service
        status, out = lab.proxy.send("DELETE", f"/v1.41/services/{spec['Name']}")
        assert status == 200, out
        assert leases_from_services(lab.proxy.send("GET", managed)[1]) == []
    finally:
        lab.remove(spec["Name"])
        if lab.worker.pid is None:
            lab.swarm.start_engine(lab.worker)
        lab.swarm.wait_state(lab.worker, "Ready", 60)
