"""A member's server on a Swarm (gpulab.spawn.swarm_services, gpulab.gpus.swarm_nodes): the service spec the spawner
asks for, which the Docker proxy's --swarm policy must let through as it is, and the
GPUs and leases read back from the Swarm's node and service objects."""

import json

import pytest

from gpulab.contract import ENGINE_LABEL_GPUS, LABEL_GPUS, LABEL_NODE, LABEL_SERVER, LABEL_USER
from gpulab.dockerapi.policy import proxy_verdict
from gpulab.gpus.allocator import Lease
from gpulab.gpus.swarm_nodes import (
    inventory_from_nodes,
    lease_holder,
    leases_from_services,
    node_gpus,
)
from gpulab.settings import defaults
from gpulab.spawn.swarm_services import (
    RUNNING,
    STARTING,
    STOPPED,
    ServerState,
    landing_note,
    node_for_cpu_server,
    ran_a_container,
    server_state,
    service_spec,
    task_address,
)

NODE = "3x8bq0ak2dtu0x5nq1sawbnbo"  # a swarmkit node ID (25 lowercase alphanumerics)
G0, G1 = "GPU-fa4e0000-0000-0000-0000-000000000000", "GPU-fa4e0001-0000-0000-0000-000000000000"
IMAGE_ID = "sha256:" + "3c" * 32  # spawn.image's ID on the manager
HUB_ENV = {"JUPYTERHUB_API_TOKEN": "t0ken", "JUPYTERHUB_USER": "alice",
           "NVIDIA_VISIBLE_DEVICES": "all"}  # as if someone tried: gpulab's value wins


def proxy(spec: dict) -> tuple[bool, str]:
    d = proxy_verdict("POST", "/v1.41/services/create", json.dumps(spec).encode(), swarm=True,
                      image_ids={"gpulab/singleuser:latest": IMAGE_ID})
    return d.allowed, d.reason


@pytest.mark.parametrize("gpus", [(), (G0,), (G0, G1)])
def test_the_spec_is_one_the_swarm_proxy_lets_through(gpus):
    spec = service_spec(defaults(), "alice", "", gpus, NODE, IMAGE_ID, env=HUB_ENV,
                        command=["jupyterhub-singleuser"])
    assert proxy(spec) == (True, "")


def test_the_spec_says_what_the_container_says():
    spec = service_spec(defaults(), "alice", "big", (G0, G1), NODE, IMAGE_ID, env=HUB_ENV)
    cs = spec["TaskTemplate"]["ContainerSpec"]
    assert spec["Name"] == "gpulab-user-alice--big"
    assert spec["Labels"][LABEL_NODE] == NODE
    assert spec["Labels"][LABEL_GPUS] == cs["Labels"][LABEL_GPUS] == f"{G0},{G1}"
    assert spec["TaskTemplate"]["Placement"] == {"Constraints": [f"node.id=={NODE}"]}
    env = dict(e.split("=", 1) for e in cs["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{G0},{G1}"  # gpulab's, not the "all" above
    assert env["JUPYTERHUB_API_TOKEN"] == "t0ken"
    assert cs["User"] == "1000:1000" and cs["CapabilityDrop"] == ["ALL"] and cs["Init"]
    assert cs["Image"] == IMAGE_ID  # by ID: the machine asks no registry
    assert {m["Target"]: m for m in cs["Mounts"]} == {
        "/home/jovyan": {"Type": "volume", "Source": "gpulab-home-alice",
                         "Target": "/home/jovyan", "ReadOnly": False},
        "/datasets": {"Type": "volume", "Source": "gpulab-datasets", "Target": "/datasets",
                      "ReadOnly": True},
        "/dev/shm": {"Type": "tmpfs", "Target": "/dev/shm",
                     "TmpfsOptions": {"SizeBytes": 2 * 1024**3}},
    }
    assert spec["TaskTemplate"]["Resources"] == {"Limits": {
        "MemoryBytes": 8 * 1024**3, "NanoCPUs": 4_000_000_000, "Pids": 1024}}
    assert spec["TaskTemplate"]["RestartPolicy"] == {"Condition": "none"}
    assert spec["TaskTemplate"]["LogDriver"] == {  # its log rotates on the machine
        "Name": "json-file", "Options": {"max-size": "10m", "max-file": "3"}}
    assert spec["EndpointSpec"] == {"Mode": "dnsrr"}


def test_no_gpu_is_void_and_a_tmpfs_anywhere_else_is_refused():
    spec = service_spec(defaults(), "bob", "", (), NODE, IMAGE_ID)
    env = dict(e.split("=", 1) for e in spec["TaskTemplate"]["ContainerSpec"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    spec["TaskTemplate"]["ContainerSpec"]["Mounts"][-1]["Target"] = "/tmp"
    allowed, reason = proxy(spec)
    assert not allowed and "Mounts[2]" in reason


def node(node_id, gpus, state="ready", availability="active"):
    return {"ID": node_id, "Spec": {"Availability": availability},
            "Status": {"State": state},
            "Description": {"Hostname": f"host-{node_id}",
                            "Engine": {"Labels": {ENGINE_LABEL_GPUS: ",".join(gpus)}}}}


def test_inventory_is_every_usable_nodes_gpus_by_node():
    nodes = [node("a", [G0, G1]), node("b", ["GPU-b0"]), node("c", ["GPU-c0"], state="down"),
             node("d", ["GPU-d0"], availability="drain"), node("m", [])]
    got = [(g.node, g.index, g.uuid) for g in inventory_from_nodes(nodes)]
    assert got == [("a", 0, G0), ("a", 1, G1), ("b", 0, "GPU-b0")]
    assert node_gpus({"ID": "x"}) == []


def test_a_uuid_two_nodes_claim_is_given_out_by_neither():
    nodes = [node("a", [G0, G1]), node("b", [G1])]
    assert [g.uuid for g in inventory_from_nodes(nodes)] == [G0]


def test_leases_come_back_from_the_services_labels():
    services = [
        {"CreatedAt": "2026-11-30T10:00:00.123456789Z",
         "Spec": {"Labels": {LABEL_USER: "alice", LABEL_SERVER: "", LABEL_GPUS: f"{G0},{G1}",
                             LABEL_NODE: "a"}}},
        {"CreatedAt": "2026-11-30T11:00:00Z",
         "Spec": {"Labels": {LABEL_USER: "bob", LABEL_SERVER: "x", LABEL_GPUS: ""}}},
        {"Spec": {"Labels": {}}},  # not a member's server
    ]
    leases = leases_from_services(services)
    assert [(le.gpu_uuid, le.user, le.server) for le in leases] == [
        (G0, "alice", ""), (G1, "alice", "")]
    assert isinstance(leases[0], Lease)
    assert leases[0].since.isoformat().startswith("2026-11-30T10:00:00.12345")


def service(node_id="a"):
    return {"Spec": {"Labels": {LABEL_USER: "alice", LABEL_NODE: node_id}}}


def task(state, desired="running", index=1, err=""):
    return {"DesiredState": desired, "Version": {"Index": index},
            "Status": {"State": state, **({"Err": err} if err else {})}}


@pytest.mark.parametrize("tasks, nodes, state, reason", [
    ([task("running")], [node("a", [G0])], RUNNING, ""),
    ([task("preparing")], [node("a", [G0])], STARTING, ""),
    ([], [node("a", [G0])], STARTING, ""),
    # the newest task counts
    ([task("failed", "shutdown", 1, "oom"), task("running", index=2)], [node("a", [G0])],
     RUNNING, ""),
    ([task("failed", "shutdown", 2, "task: non-zero exit (137)")], [node("a", [G0])],
     STOPPED, "it ended on host-a: task: non-zero exit (137)"),
    # the machine, whatever its tasks still say
    ([task("running")], [node("a", [G0], state="down")], STOPPED,
     "the machine it ran on (host-a) is down"),
    ([task("running")], [node("a", [G0], availability="drain")], STOPPED,
     "an admin took its machine (host-a) out of service"),
    # the manager restarted or the leader changed: every node reads "unknown" a while
    ([task("running")], [node("a", [G0], state="unknown")], RUNNING, ""),
    ([task("running")], [node("a", [G0], state="disconnected")], RUNNING, ""),
    # paused: no new servers there, the running ones keep running
    ([task("running")], [node("a", [G0], availability="pause")], RUNNING, ""),
    ([task("running")], [node("b", [G1])], STOPPED,
     "the machine it ran on has left the cluster"),
    # as dockerd 20.10 rejects a task whose image (named by ID) the machine lacks
    ([task("rejected", err=f"No such image: {IMAGE_ID}")], [node("a", [G0])], STOPPED,
     f"host-a does not have the lab's server image as the Swarm's manager has it "
     f"({IMAGE_ID[:19]}); an admin must copy it there (docs/swarm.md, the "
     f"images)"),
])
def test_server_state_from_the_swarms_view(tasks, nodes, state, reason):
    assert server_state(service(), tasks, nodes) == ServerState(state, reason)


def test_a_service_holds_its_lease_as_a_running_container_would():
    svc = {"ID": "s1", "CreatedAt": "2026-11-30T10:00:00Z",
           "Spec": {"Name": "gpulab-user-alice", "Labels": {LABEL_USER: "alice", LABEL_GPUS: G0}}}
    assert lease_holder(svc) == {"Id": "s1", "Names": ["/gpulab-user-alice"],
                                 "Labels": {LABEL_USER: "alice", LABEL_GPUS: G0},
                                 "Created": 1796032800.0, "State": "running"}


def test_a_server_without_gpus_goes_to_the_least_busy_usable_machine():
    nodes = [node("a", [G0]), node("b", [G1]), node("c", [], state="down")]
    assert node_for_cpu_server(nodes, []) == "a"  # a tie: by hostname
    assert node_for_cpu_server(nodes, [service("a")]) == "b"
    assert node_for_cpu_server(nodes, [service("a"), service("b"), service("b")]) == "a"
    assert node_for_cpu_server([node("c", [], availability="drain")], []) == ""


def test_the_tasks_address_on_the_servers_network():
    t = {"NetworksAttachments": [
        {"Network": {"Spec": {"Name": "ingress"}}, "Addresses": ["10.0.0.9/24"]},
        {"Network": {"Spec": {"Name": "gpulab"}}, "Addresses": ["10.213.0.7/24"]}]}
    assert task_address(t, "gpulab") == "10.213.0.7"
    assert task_address(t, "other") == ""
    assert task_address({}, "gpulab") == ""


@pytest.mark.parametrize("homes, home, landings, said", [
    ("machine", "gpu-2", {}, "Your files are on gpu-2, so your server starts there, with "
                             "GPUs of gpu-2."),
    ("machine", "", {0: "gpu-1", 1: "gpu-2", 2: ""},
     "Your server would start with no GPU on gpu-1; with 1 GPU on gpu-2; with 2 GPUs "
     "nowhere right now. Your files are then kept on that machine, and your server goes "
     "back to it every time."),
    ("shared", "gpu-2", {0: "gpu-1", 1: "gpu-1"},
     "Your server would start with no GPU on gpu-1; with 1 GPU on gpu-1. Your files are on "
     "the lab's shared storage."),
])
def test_the_spawn_form_says_where_the_server_would_start(homes, home, landings, said):
    assert landing_note(homes, home, landings) == said


def test_the_spawn_form_says_when_the_home_machine_is_away():
    assert landing_note("machine", "gpu-2", {}, home_up=False) == (
        "Your files are on gpu-2, which is down or out of service: your server cannot "
        "start until it is back.")


def test_only_a_task_that_got_a_container_held_a_gpu_on_its_machine():
    rejected = {"Status": {"State": "rejected", "ContainerStatus": {"ContainerID": ""}}}
    ran = {"Status": {"State": "failed", "ContainerStatus": {"ContainerID": "c0ffee"}}}
    assert not ran_a_container([rejected, {"Status": {}}, {}])
    assert ran_a_container([rejected, ran])


def test_a_shared_gpus_cap_is_let_through_by_the_swarm_proxy():
    spec = service_spec(defaults(), "alice", "", (G0,), NODE, IMAGE_ID, env=HUB_ENV,
                        command=["jupyterhub-singleuser"], gpu_share=2)
    assert "PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:0.5" in (
        spec["TaskTemplate"]["ContainerSpec"]["Env"])
    assert proxy(spec) == (True, "")
