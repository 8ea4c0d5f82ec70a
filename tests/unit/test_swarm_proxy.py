"""The Docker proxy in front of a Swarm manager (``--swarm``): its policy
(gpulab.dockerapi.swarm_policy, through gpulab.dockerapi.policy.decide) as tables, and the I/O shell's
per-service resolution against a small fake manager on a unix socket.
tests/integration/test_docker_proxy_swarm.py sends the same kinds of requests to a real
Swarm manager."""

import asyncio
import json
import re
from urllib.parse import parse_qsl, quote

import pytest

from gpulab.contract import LABEL_NODE
from gpulab.dockerapi.policy import is_create, proxy_verdict
from gpulab.dockerapi.proxy import Proxy
from gpulab.dockerapi.swarm_policy import ID_SLOT, SERVICE_SPEC
from gpulab.environments import Environment
from gpulab.settings import defaults

NODE = "3x0kq1v8hn2b7c4d5e6f7g8h9"  # a Swarm node ID: 25 of [0-9a-z]
GPU = "GPU-fa4e0200-1111-2222-3333-444444444444"
CREATE = "/v1.41/services/create"
CS = ("TaskTemplate", "ContainerSpec")
IMAGE_ID = "sha256:" + "5f" * 32  # spawn.image's ID on the manager
OTHER_ID = "sha256:" + "a0" * 32


def legit(gpus=(GPU,), node=NODE) -> dict:
    """The spec a gpulab Swarm spawner sends for alice's server on *node*."""
    labels = {"org.gpulab.managed": "true", "org.gpulab.user": "alice",
              "org.gpulab.server": "", "org.gpulab.gpus": ",".join(gpus)}
    return {
        "Name": "gpulab-user-alice",
        "Labels": {**labels, LABEL_NODE: node},
        "TaskTemplate": {
            "ContainerSpec": {
                "Image": IMAGE_ID, "Labels": dict(labels),
                "Command": None, "Args": ["jupyterhub-singleuser"],
                "Env": ["JUPYTERHUB_USER=alice",
                        f"NVIDIA_VISIBLE_DEVICES={','.join(gpus) or 'void'}"],
                "User": "1000:1000", "Init": True, "Dir": "/home/jovyan",
                "StopGracePeriod": 10_000_000_000, "StopSignal": "SIGTERM",
                "Mounts": [{"Type": "volume", "Source": "gpulab-home-alice",
                            "Target": "/home/jovyan", "ReadOnly": False},
                           {"Type": "volume", "Source": "gpulab-datasets",
                            "Target": "/datasets", "ReadOnly": True}],
                "CapabilityDrop": ["ALL"],
            },
            "Resources": {"Limits": {"MemoryBytes": 8 << 30, "NanoCPUs": 2_000_000_000,
                                     "Pids": 1024},
                          "Reservations": {"MemoryBytes": 1 << 30, "NanoCPUs": 0}},
            "RestartPolicy": {"Condition": "none", "Delay": 0, "MaxAttempts": 0, "Window": 0},
            "Placement": {"Constraints": [f"node.id=={node}"]},
            "Networks": [{"Target": "gpulab"}],
            "LogDriver": {"Name": "json-file", "Options": {"max-size": "10m", "max-file": "3"}},
        },
        "Mode": {"replicated": {"Replicas": 1}},
        "EndpointSpec": {"Mode": "dnsrr"},
    }


def at(spec: dict, path: tuple[str, ...]) -> dict:
    for key in path:
        spec = spec[key]
    return spec


def changed(path: tuple[str, ...], **change) -> dict:
    spec = legit()
    at(spec, path).update(change)
    return spec


def without(path: tuple[str, ...], key: str) -> dict:
    spec = legit()
    del at(spec, path)[key]
    return spec


def lab_ids(image_id: str | None, settings=None) -> dict[str, str | None]:
    """spawn.image with *image_id*, its ID on the manager, as the proxy asks it."""
    return {(settings or defaults())["spawn.image"]: image_id}


def create(spec, target=CREATE, settings=None, image_id=IMAGE_ID, image_ids=None):
    body = spec if isinstance(spec, bytes) else json.dumps(spec).encode()
    return proxy_verdict("POST", target, body, settings=settings, swarm=True,
                         image_ids=lab_ids(image_id, settings) if image_ids is None
                         else image_ids)


def refused_for(spec, target=CREATE) -> str:
    d = create(spec, target)
    assert not d.allowed, "expected a refusal"
    return d.reason


def q(filters) -> str:
    return quote(filters if isinstance(filters, str) else json.dumps(filters), safe="")


# ---------------------------------------------------------------- routes


@pytest.mark.parametrize("method, target", [
    ("POST", CREATE), ("POST", "/services/create"),
    ("GET", f"/v1.41/services?filters={q({'label': ['org.gpulab.managed=true']})}"),
    ("GET", f"/v1.41/services?filters={q({'label': {'org.gpulab.managed=true': True}})}&status=1"),
    ("GET", "/v1.41/services/gpulab-user-alice"),
    ("GET", "/v1.41/services/gpulab-user-alice?insertDefaults=True"),
    ("DELETE", "/v1.41/services/gpulab-user-alice"),
    # docker-py's tasks(filters=...), as SwarmSpawner calls it
    ("GET", f"/v1.41/tasks?filters={q({'service': ['gpulab-user-alice'], 'desired-state': ['running']})}"),
    ("GET", f"/v1.41/tasks?filters={q({'service': {'gpulab-user-alice': True}})}"),
    ("GET", "/v1.41/nodes"), ("GET", f"/v1.41/nodes?filters={q({'role': ['worker']})}"),
    ("GET", f"/v1.41/nodes/{NODE}"), ("GET", "/v1.41/nodes/gpu-server-2.lab"),
    # docker-py's service_logs(tail=20): a server that failed to start, for its member
    ("GET", "/v1.41/services/gpulab-user-alice/logs?details=False&follow=False&stdout=True"
            "&stderr=True&since=0&timestamps=False&tail=20"),
])
def test_the_swarm_calls_the_hub_makes_pass(method, target):
    body = json.dumps(legit()).encode() if method == "POST" else b""
    d = proxy_verdict(method, target, body, swarm=True, image_ids=lab_ids(IMAGE_ID))
    assert d.allowed, d.reason
    assert not proxy_verdict(method, target, body, image_ids=lab_ids(IMAGE_ID)).allowed  # not without --swarm
    # a read-only client (Prometheus' discovery) may list the nodes, nothing more
    read_only = proxy_verdict(method, target, body, swarm=True, read_only=True,
                              image_ids=lab_ids(IMAGE_ID)).allowed
    assert read_only == (target == "/v1.41/nodes" or target.startswith("/v1.41/nodes?"))


@pytest.mark.parametrize("method, target", [
    ("POST", "/v1.41/services/gpulab-user-alice/update?version=1"),
    ("GET", "/v1.41/tasks/abc"),
    ("GET", "/v1.41/tasks/abc/logs"), ("POST", f"/v1.41/nodes/{NODE}/update?version=1"),
    ("DELETE", f"/v1.41/nodes/{NODE}"), ("GET", "/v1.41/swarm"), ("POST", "/v1.41/swarm/init"),
    ("POST", "/v1.41/swarm/join"), ("POST", "/v1.41/swarm/leave"),
    ("POST", "/v1.41/swarm/update"), ("GET", "/v1.41/swarm/unlockkey"),
    ("GET", "/v1.41/secrets"), ("POST", "/v1.41/secrets/create"), ("GET", "/v1.41/configs"),
    ("POST", "/v1.41/configs/create"), ("GET", "/v1.41/plugins"),
    ("POST", "/v1.41/plugins/pull"), ("GET", "/v1.41/info"),
    ("POST", "/v1.41/networks/create"), ("GET", "/v1.41/distribution/alpine/json"),
    ("POST", "/v1.41/services/create/"), ("GET", "/v1.41/services/a/b"),
])
def test_everything_else_is_refused(method, target):
    d = proxy_verdict(method, target, swarm=True)
    assert not d.allowed and "not among the calls the hub needs" in d.reason


def test_a_service_log_is_read_not_followed():
    # A followed log would hold a proxy connection open for as long as the server runs.
    d = proxy_verdict("GET", "/v1.41/services/gpulab-user-alice/logs?stdout=1&follow=1", swarm=True)
    assert not d.allowed and "follow='1' is not allowed" in d.reason


@pytest.mark.parametrize("target", [
    "/v1.40/services/create", "/v1.40/services/gpulab-user-alice",
    f"/v1.40/tasks?filters={q({'service': ['x']})}",
])
def test_swarm_calls_need_api_1_41(target):
    method = "POST" if target.endswith("create") else "GET"
    body = json.dumps(legit()).encode() if method == "POST" else b""
    d = proxy_verdict(method, target, body, swarm=True)
    assert not d.allowed and "1.41 or later" in d.reason


@pytest.mark.parametrize("method, target", [
    ("POST", f"{CREATE}?version=1"),
    ("GET", "/v1.41/services/x?insertDefaults=1&insertDefaults=0"),
    ("GET", "/v1.41/services/x?insertDefaults=maybe"),
    ("DELETE", "/v1.41/services/x?force=1"),
    ("GET", f"/v1.41/nodes/{NODE}?size=1"),
    ("GET", f"/v1.41/tasks?filters={q({'service': ['x']})}&all=1"),
])
def test_query_parameters_are_allow_listed_per_route(method, target):
    body = json.dumps(legit()).encode() if method == "POST" else b""
    d = proxy_verdict(method, target, body, swarm=True)
    assert not d.allowed and "query parameter" in d.reason


# ---------------------------------------------------------------- list filters


@pytest.mark.parametrize("filters, why", [
    (None, "filters on exactly label=org.gpulab.managed=true"),
    ({}, "filters on exactly label=org.gpulab.managed=true"),
    ({"name": ["gpulab-user-"]}, "filters on exactly label=org.gpulab.managed=true"),
    ({"label": ["org.gpulab.managed"]}, "filters on exactly"),
    ({"label": ["org.gpulab.managed=false"]}, "filters on exactly"),
    # dockerd reduces label filters to one value per key (moby's ConvertKVStringsToMap over
    # a Go map, so which one is not fixed): only the exact one is accepted
    ({"label": ["org.gpulab.managed=true", "org.gpulab.managed"]}, "filters on exactly"),
    ({"label": ["org.gpulab.managed=true", "org.gpulab.managed=x"]}, "filters on exactly"),
    ({"label": ["org.gpulab.managed=true"], "mode": ["global"]}, "'mode' is not allowed"),
    ({"label": ["org.gpulab.managed=true"], "Label": ["x"]}, "'Label' is not allowed"),
    ({"label": {"org.gpulab.managed=true": False}}, "a list of strings or an object"),
    ({"label": "org.gpulab.managed=true"}, "a list of strings or an object"),
    ('{"label": ["org.gpulab.managed=true"], "label": []}', "duplicate key 'label'"),
    ("[]", "expected an object"),
    ("{", "not valid JSON"),
])
def test_a_service_list_filters_on_the_managed_label(filters, why):
    target = "/v1.41/services" + ("" if filters is None else f"?filters={q(filters)}")
    d = proxy_verdict("GET", target, swarm=True)
    assert not d.allowed and why in d.reason, d.reason


@pytest.mark.parametrize("filters, why", [
    (None, "names exactly one service"),
    ({}, "names exactly one service"),
    ({"desired-state": ["running"]}, "names exactly one service"),
    ({"service": ["gpulab-user-a", "gpulab-hub"]}, "names exactly one service"),
    ({"service": ["gpulab-user-a"], "node": ["x"]}, "'node' is not allowed"),
    ({"service": ["gpulab-user-a"], "label": ["x"]}, "'label' is not allowed"),
    ({"service": ["gpulab-user-a"], "desired-state": ["remove"]}, "is not allowed"),
    ({"service": ["../x"]}, "is not allowed"),
    ('{"service": ["gpulab-user-a"], "service": ["gpulab-hub"]}', "duplicate key 'service'"),
])
def test_a_task_list_names_one_service(filters, why):
    target = "/v1.41/tasks" + ("" if filters is None else f"?filters={q(filters)}")
    d = proxy_verdict("GET", target, swarm=True)
    assert not d.allowed and why in d.reason, d.reason


def test_filters_are_forwarded_re_encoded_and_a_task_list_with_the_resolved_id():
    d = proxy_verdict("GET", f"/v1.41/tasks?filters={q({'desired-state': ['running', 'running'], 'service': ['gpulab-user-alice']})}",
               swarm=True)
    assert d.service == "gpulab-user-alice" and not d.container
    path, _, query = d.target("f" * 25).partition("?")
    assert path == "/v1.41/tasks" and ID_SLOT not in query
    assert json.loads(dict(parse_qsl(query))["filters"]) == {
        "desired-state": {"running": True}, "service": {"f" * 25: True}}
    d = proxy_verdict("GET", f"/v1.41/services?filters={q({'label': ['org.gpulab.managed=true']})}",
               swarm=True)
    assert d.target() == "/v1.41/services?filters=" + q(
        {"label": {"org.gpulab.managed=true": True}}).replace("%20", "+")
    assert proxy_verdict("GET", "/v1.41/nodes", swarm=True).target() == "/v1.41/nodes"


def test_node_list_filters_are_checked():
    for filters in ({"role": ["root"]}, {"name": ["a b"]}, {"x": ["y"]}, "{"):
        assert not proxy_verdict("GET", f"/v1.41/nodes?filters={q(filters)}", swarm=True).allowed


def test_per_service_calls_name_their_service():
    d = proxy_verdict("DELETE", "/v1.41/services/gpulab-user-alice", swarm=True)
    assert (d.service, d.container) == ("gpulab-user-alice", "")
    assert d.target("a" * 25) == f"/v1.41/services/{'a' * 25}"
    assert proxy_verdict("GET", "/services/x?insertDefaults=1", swarm=True).target("b" * 25) == (
        f"/services/{'b' * 25}?insertDefaults=1")
    node = proxy_verdict("GET", f"/v1.41/nodes/{NODE}", swarm=True)
    assert (node.service, node.container, node.target()) == ("", "", f"/v1.41/nodes/{NODE}")


def test_is_create_covers_service_creates():
    assert is_create("POST", CREATE) and is_create("POST", "/services/create")
    assert not is_create("GET", CREATE)


# ---------------------------------------------------------------- service creates


@pytest.mark.parametrize("gpus", [(GPU,), (), (GPU, "GPU-fa4e0201-1111")])
def test_a_hardened_member_server_may_be_created(gpus):
    d = create(legit(gpus=gpus))
    assert d.allowed, d.reason


@pytest.mark.parametrize("change", [
    lambda s: s.update(Mode={"Replicated": {"Replicas": 1}}),
    lambda s: s["TaskTemplate"].update(RestartPolicy={"Condition": "none"}),
    lambda s: at(s, CS).update(Command=["jupyterhub-singleuser"], Args=None),
    lambda s: at(s, CS).pop("Mounts"),
    lambda s: s["TaskTemplate"]["Resources"].pop("Reservations"),
], ids=["Replicated", "bare restart policy", "Command", "no mounts", "no reservations"])
def test_allowed_variants(change):
    spec = legit()
    change(spec)
    d = create(spec)
    assert d.allowed, d.reason


def test_what_is_forwarded_is_the_checked_object_re_serialized():
    raw = b'{"Name" :"gpulab-user-alice",\n' + json.dumps(legit()).encode()[1:].replace(
        b'"Name": "gpulab-user-alice", ', b"")
    d = create(raw)
    assert d.allowed, d.reason
    assert d.body == json.dumps(json.loads(raw)).encode() != raw
    assert (d.target(), d.service) == (CREATE, "")


@pytest.mark.parametrize("spec, why", [
    # the top level
    (changed((), Name="gpulab-hub"), "named gpulab-user-<user>"),
    (changed((), Name="gpulab-user-"), "named gpulab-user-<user>"),
    (changed((), Name="gpulab-user-a/b"), "is not a service name"),
    (changed((), Mode={"Replicated": {"Replicas": 2}}), "one replica"),
    (changed((), Mode={"Global": {}}), "one replica"),
    (changed((), Mode={"Replicated": {"Replicas": 1}, "replicated": {"Replicas": 1}}),
     "one replica"),
    (changed((), Mode={"ReplicatedJob": {}}), "one replica"),
    (changed((), EndpointSpec={"Mode": "vip"}), "no virtual IP"),
    (changed((), EndpointSpec={"Mode": "dnsrr", "Ports": [{"TargetPort": 8888,
                                                           "PublishedPort": 80}]}),
     "no published ports"),
    (changed((), Networks=[{"Target": "gpulab-hub-net"}]), "key 'Networks' is not allowed"),
    (changed((), UpdateConfig={"Parallelism": 1}), "key 'UpdateConfig' is not allowed"),
    (changed((), RollbackConfig={}), "key 'RollbackConfig' is not allowed"),
    (changed((), HostConfig={"Privileged": True}), "key 'HostConfig' is not allowed"),
    (changed((), taskTemplate={}), "did you mean 'TaskTemplate'?"),
    (changed((), name="gpulab-hub"), "did you mean 'Name'?"),
    # the task template
    (changed(("TaskTemplate",), RestartPolicy={"Condition": "any"}), "never restarted"),
    (changed(("TaskTemplate",), RestartPolicy={"Condition": "on-failure"}), "never restarted"),
    (changed(("TaskTemplate",), RestartPolicy={"Condition": "none", "Delay": -1}),
     "out of range"),
    (changed(("TaskTemplate",), Placement={"Constraints": []}), "expected 1 to 1 items"),
    (changed(("TaskTemplate",), Placement={}), "'Constraints' is required"),
    (changed(("TaskTemplate",), Placement={"Constraints": [f"node.id=={NODE}",
                                                           "node.role==manager"]}),
     "expected 1 to 1 items"),
    (changed(("TaskTemplate",), Placement={"Constraints": ["node.role==worker"]}),
     "is not node.id==<node ID>"),
    (changed(("TaskTemplate",), Placement={"Constraints": [f"node.id!={NODE}"]}),
     "is not node.id==<node ID>"),
    (changed(("TaskTemplate",), Placement={"Constraints": [f"node.id == {NODE}"]}),
     "is not node.id==<node ID>"),
    (changed(("TaskTemplate",), Placement={"Constraints": [f"NODE.ID=={NODE}"]}),
     "is not node.id==<node ID>"),
    (changed(("TaskTemplate",), Placement={"Constraints": ["node.hostname==gpu2"]}),
     "is not node.id==<node ID>"),
    (changed(("TaskTemplate",), Placement={"Constraints": [f"node.id=={NODE}"],
                                           "Preferences": [{"Spread": {}}]}),
     "key 'Preferences' is not allowed (the hub places each server on one node)"),
    (changed(("TaskTemplate",), Placement={"Constraints": [f"node.id=={NODE}"],
                                           "MaxReplicas": 1}), "key 'MaxReplicas'"),
    (changed(("TaskTemplate",), Placement={"Constraints": [f"node.id=={NODE}"],
                                           "Platforms": []}), "key 'Platforms'"),
    (changed(("TaskTemplate",), Networks=[{"Target": "ingress"}]),
     "only the users' network gpulab"),
    (changed(("TaskTemplate",), Networks=[{"Target": "gpulab"}, {"Target": "other"}]),
     "expected 1 to 1 items"),
    (changed(("TaskTemplate",), Networks=[{"Target": "gpulab", "Aliases": ["gpulab-hub"]}]),
     "key 'Aliases' is not allowed (it could take another server's or the hub's name)"),
    (changed(("TaskTemplate",), Networks=[{"Target": "gpulab", "DriverOpts": {}}]),
     "key 'DriverOpts' is not allowed"),
    (changed(("TaskTemplate",), Runtime="plugin"), "key 'Runtime' is not allowed"),
    (changed(("TaskTemplate",), PluginSpec={}), "key 'PluginSpec' is not allowed"),
    (changed(("TaskTemplate",), NetworkAttachmentSpec={}), "key 'NetworkAttachmentSpec'"),
    # logs sent elsewhere, or kept without a bound
    (changed(("TaskTemplate",), LogDriver={"Name": "syslog"}), "TaskTemplate.LogDriver: a "
     "member's server's log rotates"),
    (changed(("TaskTemplate",), LogDriver={"Name": "json-file", "Options": {}}),
     "or it could fill a machine's disk"),
    (changed(("TaskTemplate",), ForceUpdate=1), "key 'ForceUpdate'"),
    # resources
    (changed(("TaskTemplate", "Resources"), Limits={"MemoryBytes": 1 << 30}),
     "'Pids' is required"),
    (changed(("TaskTemplate", "Resources"), Limits={"Pids": 100}), "'MemoryBytes' is required"),
    (changed(("TaskTemplate", "Resources", "Limits"), MemoryBytes=0), "out of range"),
    (changed(("TaskTemplate", "Resources", "Limits"), Pids=0), "out of range"),
    (changed(("TaskTemplate", "Resources", "Limits"), Pids=-1), "out of range"),
    (changed(("TaskTemplate", "Resources", "Limits"), MemoryBytes="8g"), "expected an integer"),
    (changed(("TaskTemplate", "Resources", "Limits"), MemoryBytes=8e9), "expected an integer"),
    (changed(("TaskTemplate", "Resources", "Limits"), Pids=True), "expected an integer"),
    (changed(("TaskTemplate", "Resources", "Reservations"), GenericResources=[
        {"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU", "Value": 1}}]),
     "GPUs go by NVIDIA_VISIBLE_DEVICES, not generic resources"),
    (changed(("TaskTemplate", "Resources", "Limits"), GenericResources=[]),
     "key 'GenericResources' is not allowed"),
    # the container spec
    (changed(CS, CapabilityDrop=[]), "drop all capabilities"),
    (changed(CS, CapabilityDrop=["all"]), "drop all capabilities"),
    (changed(CS, CapabilityDrop=["NET_RAW"]), "drop all capabilities"),
    (changed(CS, CapabilityAdd=["SYS_ADMIN"]), "key 'CapabilityAdd' is not allowed"),
    (changed(CS, CapabilityAdd=[]), "key 'CapabilityAdd' is not allowed"),
    (changed(CS, capabilityAdd=["ALL"]), "key 'capabilityAdd' is not allowed"),
    (changed(CS, Privileges={"SELinuxContext": {"Disable": True}}), "key 'Privileges'"),
    (changed(CS, Privileges={"CredentialSpec": {"File": "x"}}), "key 'Privileges'"),
    (changed(CS, Privileges={"Seccomp": {"Mode": "unconfined"}}), "key 'Privileges'"),
    (changed(CS, Privileges={"AppArmor": {"Mode": "disabled"}}), "key 'Privileges'"),
    (changed(CS, Privileges=None), "key 'Privileges'"),
    (changed(CS, Sysctls={"net.ipv4.ip_forward": "1"}), "key 'Sysctls' is not allowed"),
    (changed(CS, Isolation="process"), "key 'Isolation' is not allowed"),
    (changed(CS, Groups=["0"]), "key 'Groups' is not allowed"),
    (changed(CS, Ulimits=[{"Name": "nofile", "Soft": 1, "Hard": 1}]), "key 'Ulimits'"),
    (changed(CS, Hosts=["172.30.0.66 gpulab-hub"]), "key 'Hosts' is not allowed"),
    (changed(CS, DNSConfig={"Nameservers": ["1.1.1.1"]}), "key 'DNSConfig' is not allowed"),
    (changed(CS, Secrets=[{"SecretName": "hub"}]), "key 'Secrets' is not allowed"),
    (changed(CS, Configs=[{"ConfigName": "x"}]), "key 'Configs' is not allowed"),
    (changed(CS, Hostname="gpulab-hub"), "key 'Hostname' is not allowed"),
    (changed(CS, TTY=True), "key 'TTY' is not allowed"),
    (changed(CS, Init=1), "expected a boolean, got an integer"),
    (changed(CS, Image="gpulab/hub:latest"), "only the lab's image"),
    (changed(CS, Image="alpine"), "only the lab's image"),
    (changed(CS, Image=OTHER_ID), f"{OTHER_ID} is none of the lab's images on this manager "
                                  f"now (gpulab/singleuser:latest is {IMAGE_ID}): one was "
                                  f"rebuilt or retagged while the server was starting"),
    (changed(CS, Image=IMAGE_ID.upper()), "is not an image name"),
    (changed(CS, Image=f"gpulab/singleuser@{IMAGE_ID}"), "only the lab's image"),
    (changed(CS, Dir="relative"), "not an absolute path"),
    (changed(CS, StopGracePeriod=-1), "out of range"),
    (changed(CS, Command="sh -c x"), "expected a list"),
    (changed(CS, Mounts=[{"Type": "bind", "Source": "/", "Target": "/host"}]),
     'must be "volume"'),
    (changed(CS, Mounts=[{"Type": "tmpfs", "Target": "/x"}]), 'must be "volume"'),
    (changed(CS, Mounts=[{"Type": "volume", "Source": "/etc", "Target": "/x"}]),
     "not a volume name"),
    (changed(CS, Mounts=[{"Type": "volume", "Source": "x", "Target": "/h", "VolumeOptions": {
        "DriverConfig": {"Name": "local", "Options": {"type": "none", "o": "bind",
                                                      "device": "/"}}}}]),
     "key 'VolumeOptions' is not allowed"),
    (changed(CS, Mounts=[{"Type": "volume", "Source": "x", "Target": "/h", "BindOptions": {}}]),
     "key 'BindOptions' is not allowed"),
    (changed(CS, Mounts=[{"Type": "volume", "Source": "x", "Target": "/h",
                          "Consistency": "cached"}]), "key 'Consistency' is not allowed"),
    (changed(CS, Mounts=[{"Type": "volume", "Source": "x",
                          "Target": "/var/run/nvidia-container-devices/all"}]),
     "would select GPUs"),
    (changed(CS, Mounts=[{"Type": "volume", "Source": "gpulab-hub-data", "Target": "/x"}]),
     "volume gpulab-hub-data is gpulab's own"),
    (changed(CS, Mounts=[{"Type": "volume", "Source": "gpulab-datasets", "Target": "/d"}]),
     "mounted read-only"),
    (changed(CS, Mounts=[{"Type": "volume", "Source": "gpulab-datasets", "Target": "/d",
                          "ReadOnly": False}]), "mounted read-only"),
    # GPUs, labels and the node
    (changed(CS, Env=["NVIDIA_VISIBLE_DEVICES=all"]), "NVIDIA_VISIBLE_DEVICES must be set once"),
    (changed(CS, Env=[]), "NVIDIA_VISIBLE_DEVICES must be set once"),
    (changed(CS, Env=[f"NVIDIA_VISIBLE_DEVICES={GPU}", f"NVIDIA_VISIBLE_DEVICES={GPU}"]),
     "must be set once"),
    (changed(CS, Env=[f"NVIDIA_VISIBLE_DEVICES={GPU}", "NVIDIA_DRIVER_CAPABILITIES=all"]),
     "NVIDIA_DRIVER_CAPABILITIES is not allowed"),
    (changed(CS, Env=[f"NVIDIA_VISIBLE_DEVICES={GPU}", "NOEQUALS"]), "is not KEY=VALUE"),
    (changed(("Labels",), **{"org.gpulab.managed": "false"}), "org.gpulab.managed must be 'true'"),
    (changed(("Labels",), **{"org.gpulab.user": ""}), "org.gpulab.user must name the user"),
    (changed(("Labels",), **{"org.gpulab.gpus": "GPU-1, GPU-2"}), "distinct GPU UUIDs"),
    (changed(("Labels",), **{"org.gpulab.gpus": "GPU-fa4e0200-9999"}),
     "NVIDIA_VISIBLE_DEVICES must be set once, to 'GPU-fa4e0200-9999'"),
    (changed(("Labels",), **{LABEL_NODE: "aaaaaaaaaaaaaaaaaaaaaaaaa"}),
     "org.gpulab.node must be the node of the placement constraint"),
    (without(("Labels",), LABEL_NODE), "org.gpulab.node must be the node"),
    (without(("Labels",), "org.gpulab.gpus"), "org.gpulab.gpus is required"),
    (changed(("Labels",), **{"org.gpulab.managed": True}), "expected a string, got a boolean"),
    (changed(CS, Labels={}), "ContainerSpec.Labels: org.gpulab.managed must be the service's"),
    (changed(CS + ("Labels",), **{"org.gpulab.user": "bob"}),
     "ContainerSpec.Labels: org.gpulab.user must be the service's 'alice'"),
    (changed(CS + ("Labels",), **{"org.gpulab.gpus": ""}),
     "ContainerSpec.Labels: org.gpulab.gpus must be the service's"),
])
def test_unsafe_service_specs_are_refused(spec, why):
    assert why in refused_for(spec)


@pytest.mark.parametrize("path, key", [
    ((), "Name"), ((), "Labels"), ((), "TaskTemplate"), ((), "Mode"), ((), "EndpointSpec"),
    (("TaskTemplate",), "ContainerSpec"), (("TaskTemplate",), "Resources"),
    (("TaskTemplate",), "RestartPolicy"), (("TaskTemplate",), "Placement"),
    (("TaskTemplate",), "Networks"), (("TaskTemplate", "Resources"), "Limits"),
    (CS, "Image"), (CS, "User"), (CS, "CapabilityDrop"), (CS, "Env"), (CS, "Labels"),
])
def test_hardening_limits_and_placement_are_required(path, key):
    assert f"{key!r} is required" in refused_for(without(path, key))


@pytest.mark.parametrize("user", ["", "0", "root", "0:0", "1000:0", "01000", "jovyan", 1000,
                                  None])
def test_root_servers_are_refused(user):
    assert "non-root" in refused_for(changed(CS, User=user))


@pytest.mark.parametrize("raw, why, status", [
    (b'{"Name": "gpulab-user-a", "Name": "gpulab-hub"}', "duplicate key 'Name'", 400),
    (json.dumps(legit()).encode().replace(b'"User": "1000:1000"',
                                          b'"User": "1000:1000", "User": "0"'),
     "duplicate key 'User'", 400),
    (json.dumps(legit()).encode().replace(b'"User": "1000:1000"',
                                          b'"User": "1000:1000", "user": "0"'),
     "key 'user' is not allowed (keys are matched exactly; did you mean 'User'?)", 403),
    (json.dumps(legit()).encode().replace(b'"User": "1000:1000"',
                                          b'"User": "1000:1000", "\\u0055ser": "0"'),
     "duplicate key 'User'", 400),
    (json.dumps(legit()).encode().replace(b'"Mounts"', '"Mount\u017f"'.encode()),
     "did you mean 'Mounts'?", 403),
    (json.dumps({**legit(), "Tas\u212aTemplate": {}}).encode(),
     "did you mean 'TaskTemplate'?", 403),
    (json.dumps(legit()).encode().replace(b'"Pids": 1024', b'"Pids": NaN'),
     "NaN is not a JSON number", 400),
    (json.dumps(legit()).encode() + b"{}", "not valid JSON", 400),
    (b"\xef\xbb\xbf" + json.dumps(legit()).encode(), "not valid JSON", 400),
    (b"[]", "expected an object", 403),
])
def test_service_bodies_are_read_strictly(raw, why, status):
    d = create(raw)
    assert not d.allowed and why in d.reason and d.status == status, d.reason


def test_the_allow_list_is_documented_where_it_is_spelled():
    assert set(SERVICE_SPEC.fields) == {"Name", "Labels", "TaskTemplate", "Mode",
                                        "EndpointSpec"}


def test_the_lab_settings_decide_image_network_and_datasets():
    settings = {"spawn.image": "lab/nb:v2", "spawn.network": "lab-users",
                "spawn.datasets_volume": "gpulab-datasets"}
    reason = create(changed(CS, Image="lab/nb:v2"), settings=settings,
                    image_id=OTHER_ID).reason
    assert f"only the lab's images (spawn.image, spawn.environments) may be run, by their " \
           f"IDs on this manager (lab/nb:v2 is {OTHER_ID};" in reason
    assert "only the users' network lab-users" in reason
    spec = changed(CS, Image=OTHER_ID)
    spec["TaskTemplate"]["Networks"] = [{"Target": "lab-users"}]
    assert create(spec, settings=settings, image_id=OTHER_ID).allowed


@pytest.mark.parametrize("name", ["gpulab/singleuser:latest", "gpulab/singleuser",
                                  "docker.io/gpulab/singleuser:latest"])
def test_the_lab_image_by_name_is_refused(name):
    """A machine given a name asks a registry for it before every start (and runs what
    the registry sends, which for Docker Hub's gpulab/singleuser is anyone's to push);
    given the manager's ID, it asks nobody."""
    reason = refused_for(changed(CS, Image=name))
    assert "by name, each machine would ask a registry for it first" in reason, reason


def test_no_service_while_the_manager_lacks_the_lab_image():
    d = create(legit(), image_id=None)
    assert not d.allowed and d.status == 503, d
    assert "the lab's image gpulab/singleuser:latest is not on the Swarm's manager" in d.reason
    # A malformed body is still a 400 first, whatever the manager holds.
    assert create(b"{", image_id=None).status == 400


def test_a_service_may_run_any_of_the_lab_environments_images_by_id():
    """Environments members choose, on a Swarm: each listed image by its ID on the manager,
    nothing else; one missing image holds up only the services that would need it."""
    settings = {**defaults(), "spawn.environments": (
        Environment("pytorch", "gpulab/singleuser:latest"),
        Environment("writing", "lab/light:2026", gpus=False))}
    ids = {"gpulab/singleuser:latest": IMAGE_ID, "lab/light:2026": OTHER_ID}
    assert create(changed(CS, Image=OTHER_ID), settings=settings, image_ids=ids).allowed
    assert create(legit(), settings=settings, image_ids=ids).allowed
    third = "sha256:" + "7e" * 32
    reason = create(changed(CS, Image=third), settings=settings, image_ids=ids).reason
    assert (f"{third} is none of the lab's images on this manager now (gpulab/singleuser:"
            f"latest is {IMAGE_ID}, lab/light:2026 is {OTHER_ID})") in reason
    assert "only the lab's images" in create(changed(CS, Image="lab/light:2026"),
                                             settings=settings, image_ids=ids).reason
    # lab/light:2026 not built on the manager yet: its servers wait, the others start
    gone = {**ids, "lab/light:2026": None}
    assert create(legit(), settings=settings, image_ids=gone).allowed
    d = create(changed(CS, Image=third), settings=settings, image_ids=gone)
    assert d.status == 503 and "the lab's image lab/light:2026 is not on the Swarm's " \
        "manager" in d.reason, d


# ---------------------------------------------------------------- the shell


class FakeManager:
    """A small Swarm manager on a unix socket: resolves service references as dockerd does
    (full ID, name, unique ID prefix) and records every request that reached it."""

    def __init__(self, services: dict[str, dict[str, str]],
                 images: dict[str, str] | None = None):
        self.services = services  # name -> labels
        self.images = images or {}  # image name -> ID
        self.ids = {name: chr(ord("a") + i) * 25 for i, name in enumerate(services)}
        self.seen: list[str] = []

    def resolve(self, ref: str) -> str | None:
        for name, sid in self.ids.items():
            if ref in (sid, name):
                return name
        prefixed = [name for name, sid in self.ids.items() if sid.startswith(ref)]
        return prefixed[0] if len(prefixed) == 1 else None

    async def handle(self, reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"Content-Length: (\d+)", head)
        if length:
            await reader.readexactly(int(length.group(1)))
        line = head.split(b"\r\n")[0].decode()
        self.seen.append(line)
        m = re.fullmatch(r"GET /services/([^/?]+) HTTP/1.1", line)
        image = re.fullmatch(r"GET /images/(.+)/json HTTP/1.1", line)
        if image:
            found = self.images.get(image.group(1))
            status = b"200 OK" if found else b"404 Not Found"
            payload = json.dumps({"Id": found} if found else {"message": "No such image"})
            writer.write(b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s"
                         % (status, len(payload), payload.encode()))
        elif m:
            name = self.resolve(m.group(1))
            if name is None:
                payload = json.dumps({"message": f"service {m.group(1)} not found"}).encode()
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(payload), payload))
            else:
                payload = json.dumps({"ID": self.ids[name], "Spec": {
                    "Name": name, "Labels": self.services[name]}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(payload), payload))
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK")
        await writer.drain()
        writer.close()


async def _send(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    writer.write_eof()
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


@pytest.fixture
async def manager(tmp_path):
    fake = FakeManager({"gpulab-user-alice": {"org.gpulab.managed": "true"},
                        "gpulab-exporter": {}})
    sock = str(tmp_path / "docker.sock")
    up = await asyncio.start_unix_server(fake.handle, sock)
    proxy = await asyncio.start_server(Proxy(sock, swarm=True).handle, "127.0.0.1", 0)
    try:
        yield fake, proxy.sockets[0].getsockname()[1]
    finally:
        proxy.close()
        up.close()


async def test_per_service_calls_and_task_lists_are_forwarded_with_the_full_id(manager):
    fake, port = manager
    alice, other = fake.ids["gpulab-user-alice"], fake.ids["gpulab-exporter"]
    for ref in ("gpulab-user-alice", alice[:5], alice):
        fake.seen.clear()
        answer = await _send(port, f"DELETE /v1.41/services/{ref} HTTP/1.1\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 200")
        assert fake.seen == [f"GET /services/{ref} HTTP/1.1",
                             f"DELETE /v1.41/services/{alice} HTTP/1.1"]
    fake.seen.clear()
    tasks = f"GET /v1.41/tasks?filters={q({'service': ['gpulab-user-alice']})} HTTP/1.1\r\n\r\n"
    assert (await _send(port, tasks.encode())).startswith(b"HTTP/1.1 200")
    assert fake.seen[-1] == (f"GET /v1.41/tasks?filters="
                             f"{q({'service': {alice: True}}).replace('%20', '+')} HTTP/1.1")
    fake.seen.clear()
    for ref in ("gpulab-exporter", other[:4]):
        for raw in (f"GET /v1.41/services/{ref} HTTP/1.1\r\n\r\n",
                    f"DELETE /v1.41/services/{ref} HTTP/1.1\r\n\r\n",
                    f"GET /v1.41/tasks?filters={q({'service': [ref]})} HTTP/1.1\r\n\r\n"):
            answer = await _send(port, raw.encode())
            assert answer.startswith(b"HTTP/1.1 403") and b"is not gpulab's" in answer
    assert all(line.startswith("GET /services/") for line in fake.seen)
    gone = await _send(port, b"GET /v1.41/services/gpulab-user-gone HTTP/1.1\r\n\r\n")
    assert gone.startswith(b"HTTP/1.1 404")
    assert json.loads(gone.split(b"\r\n\r\n", 1)[1]) == {
        "message": "service gpulab-user-gone not found"}


async def test_without_swarm_the_proxy_refuses_service_calls(tmp_path):
    fake = FakeManager({"gpulab-user-alice": {"org.gpulab.managed": "true"}})
    sock = str(tmp_path / "docker.sock")
    up = await asyncio.start_unix_server(fake.handle, sock)
    proxy = await asyncio.start_server(Proxy(sock).handle, "127.0.0.1", 0)
    try:
        answer = await _send(proxy.sockets[0].getsockname()[1],
                             b"GET /v1.41/services/gpulab-user-alice HTTP/1.1\r\n\r\n")
    finally:
        proxy.close()
        up.close()
    assert answer.startswith(b"HTTP/1.1 403") and fake.seen == []


async def test_a_service_create_names_the_image_id_the_manager_has(tmp_path):
    """The shell asks the manager for spawn.image's ID at every service create: the
    hub's spec with that ID is forwarded, the same spec by name is not, and while the
    manager has no such image nothing is created."""
    fake = FakeManager({}, images={"gpulab/singleuser:latest": IMAGE_ID})
    sock = str(tmp_path / "docker.sock")
    up = await asyncio.start_unix_server(fake.handle, sock)
    proxy = await asyncio.start_server(Proxy(sock, swarm=True).handle, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]

    def post(spec: dict) -> bytes:
        body = json.dumps(spec).encode()
        return (f"POST {CREATE} HTTP/1.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    try:
        assert (await _send(port, post(legit()))).startswith(b"HTTP/1.1 200")
        assert fake.seen == ["GET /images/gpulab/singleuser:latest/json HTTP/1.1",
                             f"POST {CREATE} HTTP/1.1"]
        by_name = await _send(port, post(changed(CS, Image="gpulab/singleuser:latest")))
        assert by_name.startswith(b"HTTP/1.1 403") and b"ask a registry" in by_name
        fake.images.clear()
        fake.seen.clear()
        gone = await _send(port, post(legit()))
        assert gone.startswith(b"HTTP/1.1 503") and b"not on the Swarm's manager" in gone
        assert fake.seen == ["GET /images/gpulab/singleuser:latest/json HTTP/1.1"]
    finally:
        proxy.close()
        up.close()
