"""The Docker proxy: its policy (gpulab.dockerapi.policy) as tables, and its I/O shell
(gpulab.dockerapi.proxy) as a real proxy on loopback in front of a small fake dockerd on a
unix socket. tests/integration/test_docker_proxy_dockerd.py sends the same kinds of
requests to the real dockerd."""

import asyncio
import json
import re
import socket

import pytest

from gpulab import live_config
from gpulab.contract import LABEL_SERVER, LABEL_USER
from gpulab.dockerapi.policy import CREATE_BODY, HOST_CONFIG, is_create, proxy_verdict, strict_json
from gpulab.dockerapi.proxy import Proxy, parse_head, serve, watch_socket
from gpulab.settings import Settings, defaults
from gpulab.spawn.containers import container_options
from tests.ports import free_port

GPU = "GPU-1"
CREATE = "/v1.41/containers/create?name=gpulab-user-alice"


def legit(gpus=(GPU,), **host_config) -> dict:
    """The create body DockerSpawner sends for a gpulab user container (as docker-py
    serializes it), with *host_config* overriding HostConfig keys."""
    opts = container_options(defaults(), "alice", gpu_uuids=list(gpus))
    hc = {
        "Memory": opts.mem_limit,
        "ShmSize": opts.host_config["shm_size"],
        "NetworkMode": "gpulab",
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges"],
        "Binds": ["gpulab-home-alice:/home/jovyan:rw", "gpulab-datasets:/datasets:ro"],
        "Links": [],
        "CpuQuota": 200000,
        "CpuPeriod": 100000,
        "PidsLimit": 1024,
        "Init": True,
        "Mounts": [],
        "LogConfig": {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "3"}},
        "DeviceRequests": [{"Driver": "nvidia", "Count": 0, "DeviceIDs": list(gpus),
                            "Capabilities": [["gpu"]], "Options": {}}],
    }
    if not gpus:
        del hc["DeviceRequests"]
    hc.update(host_config)
    return {
        "ExposedPorts": {"8888/tcp": None}, "User": "1000:1000", "Tty": False,
        "OpenStdin": False, "StdinOnce": False, "AttachStdin": False, "AttachStdout": True,
        "AttachStderr": True,
        "Env": ["JUPYTERHUB_USER=alice", "JUPYTERHUB_HOST=",
                *(f"{k}={v}" for k, v in opts.environment.items())],
        "Cmd": ["jupyterhub-singleuser"], "Image": opts.image,
        "Volumes": {"/datasets": {}, "/home/jovyan": {}}, "NetworkDisabled": False,
        "HostConfig": hc, "Labels": opts.labels,
    }


def hardened(**host_config) -> bytes:
    return json.dumps(legit(**host_config)).encode()


def create(body, target=CREATE, settings=None):
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    return proxy_verdict("POST", target, body, settings=settings)


def refused_for(body, target=CREATE, settings=None) -> str:
    d = create(body, target, settings)
    assert not d.allowed, "expected a refusal"
    return d.reason


# ---------------------------------------------------------------- routes


@pytest.mark.parametrize("method, target", [
    ("GET", "/_ping"), ("HEAD", "/_ping"), ("GET", "/v1.41/version"),
    ("GET", "/v1.41/containers/json?all=1&filters=%7B%22label%22%3A+%5B%5D%7D"),
    # docker-py 7.2's own parameters, exactly as it sends them
    ("GET", "/v1.41/containers/json?limit=-1&all=1&size=0&trunc_cmd=0&filters=%7B%7D"),
    ("GET", "/v1.41/containers/gpulab-user-alice/json"),
    ("GET", "/v1.41/containers/abc123/logs?stderr=1&stdout=1&timestamps=0&follow=0&tail=20"),
    ("POST", "/v1.41/containers/abc123/start"), ("POST", "/v1.41/containers/abc123/stop?t=10"),
    ("POST", "/v1.41/containers/abc123/kill"), ("POST", "/v1.41/containers/abc123/kill?signal=SIGKILL"),
    ("DELETE", "/v1.41/containers/abc123?v=True&link=False&force=False"),
    ("GET", "/v1.41/images/gpulab/singleuser:latest/json"),
    # spawn.image from a lab-local registry, and pinned by digest (docker-py quotes the @)
    ("GET", "/v1.41/images/registry.lab:5000/gpulab/singleuser:1/json"),
    ("GET", f"/v1.41/images/gpulab/singleuser%40sha256:{'ab' * 32}/json"),
    ("GET", "/v1.41/volumes/gpulab-datasets"),
])
def test_the_calls_the_hub_makes_pass(method, target):
    assert proxy_verdict(method, target).allowed


@pytest.mark.parametrize("method, target", [
    ("POST", "/v1.41/containers/abc/exec"), ("POST", "/v1.41/exec/abc/start"),
    ("POST", "/v1.41/images/create?fromImage=evil"), ("POST", "/v1.41/build"),
    ("POST", "/v1.41/containers/abc/attach"), ("GET", "/v1.41/containers/abc/archive"),
    ("PUT", "/v1.41/containers/abc/archive"), ("POST", "/v1.41/volumes/prune"),
    ("DELETE", "/v1.41/volumes/gpulab-home-alice"), ("POST", "/v1.41/networks/create"),
    ("POST", "/v1.41/swarm/init"), ("GET", "/v1.41/secrets"), ("POST", "/v1.41/plugins/pull"),
    ("GET", "/v1.41/containers/../../info"), ("GET", "/v1.41/info"),
    # percent-encoded or otherwise odd paths are simply not matched
    ("POST", "/v1.41/containers/abc%2Fexec/start"), ("GET", "/v1.41/images/../../info/json"),
    ("POST", "/v1.41//containers/create"), ("POST", "/v1.41/containers/create/"),
    ("GET", "/v1.41/containers/a/json/"), ("GET", "/v1.41/images/x/../../y/json"),
])
def test_everything_else_is_refused(method, target):
    d = proxy_verdict(method, target)
    assert not d.allowed and "not among the calls the hub needs" in d.reason


@pytest.mark.parametrize("method, target", [
    ("POST", f"{CREATE}&platform=linux"),
    ("POST", "/v1.41/containers/abc/start?detachKeys=ctrl-x"),
    ("GET", "/v1.41/containers/abc/logs?follow=1"),
    ("DELETE", "/v1.41/containers/abc?link=True"),
    ("POST", "/v1.41/containers/abc/stop?t=10&t=0"),
    ("GET", "/v1.41/containers/abc/json?size=1"),
    ("GET", "/v1.41/containers/json?all=1&all=0"),
    ("POST", "/v1.41/containers/abc/stop?t=1;x"),
])
def test_query_parameters_are_allow_listed_per_route(method, target):
    d = proxy_verdict(method, target, hardened() if "create" in target else b"")
    assert not d.allowed and "query parameter" in d.reason


def test_the_forwarded_query_is_re_encoded_from_what_was_checked():
    d = proxy_verdict("GET", "/v1.41/containers/json?all=1&filters=%7B%22a%22%3A+1%7D")
    assert d.target() == "/v1.41/containers/json?all=1&filters=%7B%22a%22%3A+1%7D"
    assert proxy_verdict("POST", "/v1.41/containers/x/stop?t=10").target("f" * 64) == (
        f"/v1.41/containers/{'f' * 64}/stop?t=10")


# ---------------------------------------------------------------- creates


def test_a_hardened_user_container_may_be_created():
    for gpus in ((GPU,), (), ("GPU-a", "GPU-b")):
        d = create(legit(gpus=gpus))
        assert d.allowed, d.reason


def test_what_is_forwarded_is_the_checked_object_re_serialized():
    raw = b'{"User" :"1000:1000" ,\n' + hardened()[1:].replace(b'"User": "1000:1000", ', b"")
    d = create(raw)
    assert d.allowed, d.reason
    assert d.body == json.dumps(json.loads(raw)).encode()
    assert d.body != raw
    assert json.loads(d.body) == json.loads(raw)


@pytest.mark.parametrize("change, why", [
    ({"Privileged": True}, "HostConfig: key 'Privileged' is not allowed"),
    ({"CapAdd": ["SYS_ADMIN"]}, "key 'CapAdd' is not allowed"),
    ({"CapDrop": []}, "drop all capabilities"),
    ({"CapDrop": ["all"]}, "drop all capabilities"),
    ({"CapDrop": ["ALL", "ALL"]}, "drop all capabilities"),
    ({"SecurityOpt": []}, "no-new-privileges"),
    ({"SecurityOpt": ["no-new-privileges:false"]}, "no-new-privileges"),
    ({"SecurityOpt": ["no-new-privileges", "seccomp=unconfined"]}, "no other security option"),
    ({"SecurityOpt": ["no-new-privileges", "apparmor=unconfined"]}, "no other security option"),
    ({"SecurityOpt": ["no-new-privileges", "no-new-privileges"]}, "no other security option"),
    ({"NetworkMode": "host"}, "only the users' network gpulab"),
    ({"NetworkMode": "bridge"}, "only the users' network gpulab"),
    ({"NetworkMode": "container:gpulab-hub"}, "'container:gpulab-hub' is not a network name"),
    ({"PidMode": "host"}, "key 'PidMode' is not allowed"),
    ({"IpcMode": "container:gpulab-hub"}, "key 'IpcMode' is not allowed"),
    ({"UsernsMode": "host"}, "key 'UsernsMode' is not allowed"),
    ({"VolumesFrom": ["gpulab-docker-proxy"]}, "key 'VolumesFrom' is not allowed"),
    ({"VolumeDriver": "evil"}, "key 'VolumeDriver' is not allowed"),
    ({"GroupAdd": ["0", "998"]}, "key 'GroupAdd' is not allowed"),
    ({"Sysctls": {"kernel.x": "1"}}, "key 'Sysctls' is not allowed"),
    ({"Runtime": "runc"}, "key 'Runtime' is not allowed"),
    ({"CgroupParent": "/"}, "key 'CgroupParent' is not allowed"),
    ({"PortBindings": {"8888/tcp": [{"HostPort": "80"}]}}, "key 'PortBindings' is not allowed"),
    ({"PublishAllPorts": True}, "key 'PublishAllPorts' is not allowed"),
    ({"Links": ["gpulab-hub:hub"]}, "links are not allowed"),
    ({"Binds": ["/var/run/docker.sock:/var/run/docker.sock"]}, "is not a named volume"),
    ({"Binds": ["/:/host:ro"]}, "is not a named volume"),
    ({"Binds": ["vol:/x:ro,z"]}, "is not a named volume"),
    ({"Binds": ["vol:/x:rshared"]}, "is not a named volume"),
    ({"Binds": ["a/b:/x"]}, "is not a named volume"),
    ({"Binds": ["vol:relative"]}, "is not a named volume"),
    ({"Binds": ["vol:/x/../etc"]}, "not an absolute path"),
    ({"Binds": ["vol:/var/run/nvidia-container-devices/all"]}, "would select GPUs"),
    ({"Binds": ["gpulab-hub-data:/x"]}, "volume gpulab-hub-data is gpulab's own"),
    ({"Binds": ["gpulab-datasets:/datasets:rw"]}, "mounted read-only"),
    ({"Binds": ["gpulab-datasets:/datasets"]}, "mounted read-only"),
    ({"Mounts": [{"Type": "bind", "Source": "/etc", "Target": "/x"}]}, 'must be "volume"'),
    ({"Mounts": [{"Type": "tmpfs", "Target": "/x"}]}, 'must be "volume"'),
    ({"Mounts": [{"Type": "volume", "Source": "/etc", "Target": "/x"}]}, "not a volume name"),
    ({"Mounts": [{"Type": "volume", "Source": "x", "Target": "/h", "VolumeOptions": {
        "DriverConfig": {"Name": "local", "Options": {"type": "none", "o": "bind",
                                                     "device": "/var/run"}}}}]},
     "key 'VolumeOptions' is not allowed"),
    ({"Mounts": [{"Type": "volume", "Source": "x", "Target": "/h", "BindOptions": {}}]},
     "key 'BindOptions' is not allowed"),
    ({"Mounts": [{"Type": "volume", "Source": "x", "Target": "/h", "ReadOnly": "yes"}]},
     "expected a boolean"),
    ({"Devices": [{"PathOnHost": "/dev/sda"}]}, "key 'Devices' is not allowed"),
    ({"DeviceRequests": [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]},
     "name their devices"),
    ({"DeviceRequests": [{"Driver": "nvidia", "Count": 1, "DeviceIDs": [GPU],
                          "Capabilities": [["gpu"]]}]}, "name their devices"),
    ({"DeviceRequests": [{"Driver": "nvidia", "DeviceIDs": ["all"],
                          "Capabilities": [["gpu"]]}]}, "is not a GPU UUID"),
    ({"DeviceRequests": [{"Driver": "nvidia", "DeviceIDs": [],
                          "Capabilities": [["gpu"]]}]}, "expected 1 to"),
    ({"DeviceRequests": [{"Driver": "", "DeviceIDs": [GPU], "Capabilities": [["gpu"]]}]},
     'must be "nvidia"'),
    ({"DeviceRequests": [{"Driver": "nvidia", "DeviceIDs": [GPU],
                          "Capabilities": [["gpu", "compute"]]}]}, "Capabilities: must be"),
    ({"DeviceRequests": [{"Driver": "nvidia", "DeviceIDs": [GPU], "Capabilities": [["gpu"]],
                          "Options": {"x": "y"}}]}, "Options: must be {}"),
    ({"DeviceRequests": [{"Driver": "nvidia", "DeviceIDs": ["GPU-2"],
                          "Capabilities": [["gpu"]]}]}, "exactly the leased ones"),
    ({"DeviceRequests": []}, "exactly the leased ones"),
    ({"Memory": 0}, "out of range"),
    ({"Memory": True}, "expected an integer, got a boolean"),
    ({"Memory": 8589934592.0}, "expected an integer, got a number"),
    ({"Memory": "8g"}, "expected an integer, got a string"),
    ({"Memory": 2**63}, "out of range"),
    ({"Memory": None}, "expected an integer, got null"),
    ({"MemorySwap": -1}, "out of range"),
    ({"MemorySwap": 1024}, "MemorySwap: must be at least Memory"),
    ({"PidsLimit": -1}, "out of range"),
    ({"PidsLimit": 0}, "out of range"),
    ({"ShmSize": 0}, "out of range"),
    ({"CpuQuota": -1}, "out of range"),
    ({"NanoCpus": 1.5}, "expected an integer"),
    ({"Init": 1}, "expected a boolean, got an integer"),
    # a log without a bound (it fills the host's disk), or sent off the host
    ({"LogConfig": {"Type": "json-file", "Config": {}}}, "log rotates"),
    ({"LogConfig": {"Type": "json-file", "Config": {"max-size": "10g", "max-file": "3"}}},
     "log rotates"),
    ({"LogConfig": {"Type": "syslog", "Config": {"syslog-address": "udp://10.0.0.9:514"}}},
     "log rotates"),
])
def test_unsafe_creates_are_refused(change, why):
    assert why in refused_for(legit(**change))


@pytest.mark.parametrize("required", ["Memory", "PidsLimit", "LogConfig", "CapDrop",
                                      "SecurityOpt", "NetworkMode"])
def test_limits_and_hardening_are_required(required):
    body = legit()
    del body["HostConfig"][required]
    assert f"HostConfig: {required!r} is required" in refused_for(body)


@pytest.mark.parametrize("user", ["", "0", "root", "0:0", "root:root", "00", "+0", "-0",
                                  "1000:0", "jovyan", "01000", "1000:01000", " 1000", "1000:",
                                  "99999999999", 1000, None])
def test_root_containers_are_refused(user):
    body = legit()
    body["User"] = user
    assert "non-root" in refused_for(body)


@pytest.mark.parametrize("change, why", [
    ({"Image": "gpulab/hub:latest"}, "only the lab's images may be run (gpulab/singleuser:latest:"),
    ({"Image": "gpulab/singleuser:other"}, "only the lab's image"),
    ({"Image": "alpine"}, "only the lab's image"),
    ({"Env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "NVIDIA_VISIBLE_DEVICES must be set once"),
    ({"Env": [f"NVIDIA_VISIBLE_DEVICES={GPU}", f"NVIDIA_VISIBLE_DEVICES={GPU}"]},
     "must be set once"),
    ({"Env": []}, "must be set once"),
    ({"Env": [f"NVIDIA_VISIBLE_DEVICES={GPU}", "NVIDIA_MIG_CONFIG_DEVICES=all"]},
     "NVIDIA_MIG_CONFIG_DEVICES is not allowed"),
    ({"Env": [f"NVIDIA_VISIBLE_DEVICES={GPU}", "NO_EQUALS"]}, "is not KEY=VALUE"),
    ({"Env": [f"NVIDIA_VISIBLE_DEVICES={GPU}", "=x"]}, "is not KEY=VALUE"),
    ({"Labels": {"org.gpulab.user": "alice", "org.gpulab.gpus": GPU}},
     "org.gpulab.managed must be 'true'"),
    ({"Labels": {"org.gpulab.managed": "true", "org.gpulab.user": "", "org.gpulab.gpus": GPU}},
     "org.gpulab.user must name the user"),
    ({"Labels": {"org.gpulab.managed": "true", "org.gpulab.user": "alice"}},
     "org.gpulab.gpus is required"),
    ({"Labels": {"org.gpulab.managed": "true", "org.gpulab.user": "a",
                 "org.gpulab.gpus": "GPU-1, GPU-2"}}, "distinct GPU UUIDs"),
    ({"Labels": {"org.gpulab.managed": True, "org.gpulab.user": "a", "org.gpulab.gpus": GPU}},
     "expected a string, got a boolean"),
    ({"ExposedPorts": {"8888": None}}, "not a port such as 8888/tcp"),
    ({"ExposedPorts": {"8888/tcp": {"HostPort": "80"}}}, "must be null or {}"),
    ({"Volumes": {"relative": {}}}, "not an absolute path"),
    ({"Volumes": {"/var/run/nvidia-container-devices/all": {}}}, "would select GPUs"),
    ({"NetworkingConfig": {"EndpointsConfig": {"gpulab": {"Aliases": ["gpulab-hub"]}}}},
     "key 'Aliases' is not allowed (it could take the hub's name or address)"),
    ({"NetworkingConfig": {"EndpointsConfig": {"gpulab": {"IPAMConfig": {
        "IPv4Address": "172.30.0.2"}}}}}, "key 'IPAMConfig' is not allowed"),
    ({"NetworkingConfig": {"EndpointsConfig": {"gpulab": {"IPAddress": "172.30.0.2"}}}},
     "key 'IPAddress' is not allowed"),
    ({"NetworkingConfig": {"EndpointsConfig": {"gpulab": {"MacAddress": "02:42:ac:1e:00:02"}}}},
     "key 'MacAddress' is not allowed"),
    ({"NetworkingConfig": {"EndpointsConfig": {"gpulab": {"Links": ["gpulab-hub"]}}}},
     "key 'Links' is not allowed"),
    ({"NetworkingConfig": {"EndpointsConfig": {"gpulab-monitoring": {}}}},
     "only the users' network gpulab, got 'gpulab-monitoring'"),
    ({"NetworkingConfig": {"EndpointsConfig": {"gpulab": None}}}, "expected an object"),
    ({"MacAddress": "02:42:ac:1e:00:02"}, "body: key 'MacAddress' is not allowed"),
    ({"Hostname": "gpulab-hub"}, "body: key 'Hostname' is not allowed"),
    ({"Privileged": True}, "body: key 'Privileged' is not allowed"),  # top-level HostConfig
    ({"Binds": ["/:/host"]}, "body: key 'Binds' is not allowed"),
    ({"Memory": 0}, "body: key 'Memory' is not allowed"),
    ({"Cpuset": "0"}, "body: key 'Cpuset' is not allowed"),
])
def test_what_the_lab_decides_is_checked(change, why):
    body = legit()
    body.update(change)
    assert why in refused_for(body)


def test_the_lease_the_gpus_and_the_visible_devices_must_agree():
    body = legit(gpus=())
    body["HostConfig"]["DeviceRequests"] = [{"Driver": "nvidia", "DeviceIDs": [GPU],
                                             "Capabilities": [["gpu"]]}]
    assert "exactly the leased ones" in refused_for(body)
    body = legit(gpus=())
    body["Env"] = [e for e in body["Env"] if not e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    body["Env"].append("NVIDIA_VISIBLE_DEVICES=all")
    assert "to 'void'" in refused_for(body)
    assert create(legit(gpus=("GPU-a", "GPU-b"))).allowed
    swapped = legit(gpus=("GPU-a", "GPU-b"))
    swapped["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] = ["GPU-a", "GPU-a"]
    assert "exactly the leased ones" in refused_for(swapped)


@pytest.mark.parametrize("target", [
    "/v1.41/containers/create", "/v1.41/containers/create?name=gpulab-hub",
    "/v1.41/containers/create?name=gpulab-alice", "/v1.41/containers/create?name=gpulab-user-",
    "/v1.41/containers/create?name=/gpulab-user-alice",
    "/v1.41/containers/create?name=gpulab-user-alice/x",
    "/v1.41/containers/create?name=gpulab-user-%C3%A9",
])
def test_user_containers_are_named_with_the_user_prefix(target):
    assert "user containers are named gpulab-user-" in refused_for(legit(), target)


def test_a_named_servers_container_may_be_created_with_its_own_labels():
    body = legit()
    body["Labels"] = {**body["Labels"], LABEL_SERVER: "train"}
    assert create(body, "/v1.41/containers/create?name=gpulab-user-alice--train").allowed


@pytest.mark.parametrize("name, labels, why", [
    # a container whose labels say another member's server: the culler, the exporter and
    # the lease table would count it as hers
    ("gpulab-user-alice", {LABEL_USER: "bob"},
     "'gpulab-user-alice' is not the name of 'bob''s server ''"),
    ("gpulab-user-alice", {LABEL_SERVER: "train"},
     "'gpulab-user-alice' is not the name of 'alice''s server 'train'"),
    ("gpulab-user-alice--train", {},
     "'gpulab-user-alice--train' is not the name of 'alice''s server ''"),
    ("gpulab-user-alice", {LABEL_SERVER: None}, f"{LABEL_SERVER} is required"),
])
def test_a_containers_name_is_its_labels_user_and_server(name, labels, why):
    body = legit()
    body["Labels"] = {k: v for k, v in {**body["Labels"], **labels}.items() if v is not None}
    assert why in refused_for(body, f"/v1.41/containers/create?name={name}")


def test_the_lab_settings_decide_image_and_network():
    settings = Settings({**defaults(), "spawn.image": "lab/nb:v2", "spawn.network": "users",
                         "spawn.datasets_volume": ""})
    body = legit(gpus=(), NetworkMode="users", Binds=["gpulab-home-alice:/home/jovyan:rw"])
    body["Image"] = "lab/nb:v2"
    assert create(body, settings=settings).allowed
    assert "lab/nb:v2" in refused_for(legit(gpus=()), settings=settings)
    body["HostConfig"]["Binds"].append("gpulab-datasets:/datasets:ro")
    assert "volume gpulab-datasets is gpulab's own" in refused_for(body, settings=settings)
    body = legit(gpus=())
    body["Image"] = "docker.io/gpulab/singleuser"
    assert create(body).allowed  # name == name:latest
    local = Settings({**defaults(), "spawn.image": "registry.lab:5000/gpulab/nb:1"})
    body["Image"] = "registry.lab:5000/gpulab/nb:1"
    assert create(body, settings=local).allowed  # from a lab-local registry
    body["Image"] = "registry.lab:5000/gpulab/nb:2"
    assert "only the lab's image" in refused_for(body, settings=local)


# ---------------------------------------------------------------- what dockerd would read


def _dup(raw: bytes, where: bytes, extra: bytes) -> bytes:
    assert where in raw
    return raw.replace(where, where + extra, 1)


@pytest.mark.parametrize("raw", [
    # top level
    _dup(hardened(), b'"User": "1000:1000"', b', "User": "0"'),
    _dup(hardened(), b'"HostConfig": {', b'"Privileged": false}, "HostConfig": {'),
    # inside HostConfig
    _dup(hardened(), b'"CapDrop": ["ALL"]', b', "CapDrop": []'),
    # inside a DeviceRequests item
    _dup(hardened(), b'"Count": 0', b', "Count": -1'),
    # inside Labels (a map), inside ExposedPorts / Volumes / a Mounts item / EndpointsConfig
    _dup(hardened(), b'"org.gpulab.managed": "true"', b', "org.gpulab.managed": "true"'),
    _dup(hardened(), b'"8888/tcp": null', b', "8888/tcp": null'),
    _dup(hardened(), b'"/datasets": {}', b', "/datasets": {}'),
    _dup(hardened(Mounts=[{"Type": "volume", "Source": "v", "Target": "/v"}]),
         b'"Type": "volume"', b', "Type": "bind"'),
    _dup(json.dumps({**legit(), "NetworkingConfig": {"EndpointsConfig": {"gpulab": {}}}}).encode(),
         b'"gpulab": {}', b', "gpulab": {}'),
    # the same key spelled with an escape
    _dup(hardened(), b'"User": "1000:1000"', b', "\\u0055ser": "0"'),
])
def test_duplicate_keys_are_refused_at_every_depth(raw):
    d = create(raw)
    assert not d.allowed and d.status == 400 and "duplicate key" in d.reason


def _spellings(key: str) -> list[str]:
    lower = key.lower()
    out = {lower, key.upper(), key.swapcase(), lower.replace("s", "\u017f").replace("k", "\u212a"),
           key.replace("s", "\u017f").replace("S", "\u017f").replace("k", "\u212a")}
    return sorted(out - {key})


@pytest.mark.parametrize("key, spelling", [
    (key, s) for key in ("CapDrop", "SecurityOpt", "Privileged", "Binds", "PidsLimit", "Links",
                         "Mounts", "DeviceRequests", "NetworkMode", "Memory", "ShmSize")
    for s in _spellings(key)])
def test_other_spellings_of_host_config_keys_are_refused(key, spelling):
    for value in (None, False, [], {}, 0, "", ["ALL"], True):
        body = legit()
        body["HostConfig"][spelling] = value
        reason = refused_for(body)
        assert f"key {spelling!r} is not allowed" in reason
        if key in HOST_CONFIG.fields:
            assert f"did you mean {key!r}?" in reason


@pytest.mark.parametrize("spelling", ["user", "USER", "uſer", "hostconfig", "HOSTCONFIG",
                                      "hoſtconfig", "image", "labels", "env", "Labelſ",
                                      "networkingconfig"])
def test_other_spellings_of_top_level_keys_are_refused(spelling):
    body = legit()
    body[spelling] = None
    reason = refused_for(body)
    assert f"body: key {spelling!r} is not allowed (keys are matched exactly; did you mean" in reason
    assert any(k.casefold() == spelling.casefold() for k in CREATE_BODY.fields)


@pytest.mark.parametrize("key", ["Privileged", "CapAdd", "PidMode", "Devices", "Runtime",
                                 "capdrop", "Sysctls", "VolumesFrom", "PortBindings",
                                 "PublishAllPorts", "OomScoreAdj", "MaskedPaths"])
@pytest.mark.parametrize("value", [None, False, [], {}, 0, ""])
def test_unknown_keys_are_refused_whatever_their_value(key, value):
    assert f"key {key!r} is not allowed" in refused_for(legit(**{key: value}))
    top = legit()
    top[key] = value
    assert f"body: key {key!r} is not allowed" in refused_for(top)


@pytest.mark.parametrize("raw, why", [
    (b"{not json", "not valid JSON"),
    (b"", "not valid JSON"),
    (b"[]", "expected an object"),
    (b"null", "expected an object"),
    (hardened().replace(b"8589934592", b"NaN"), "NaN is not a JSON number"),
    (hardened().replace(b"8589934592", b"Infinity"), "Infinity is not a JSON number"),
    (hardened().replace(b"8589934592", b"-Infinity"), "-Infinity is not a JSON number"),
    (hardened().replace(b'"org.gpulab.server": ""', b'"org.gpulab.server": "\\udc00"'),
     "lone surrogate"),
    (hardened().replace(b'"org.gpulab.server": ""', b'"\\ud800": ""'), "lone surrogate"),
    (b"\xef\xbb\xbf" + hardened(), "not valid JSON"),
    (hardened().decode().encode("utf-16"), "not valid JSON"),
    (hardened().replace(b'"alice"', b'"\xff"'), "not valid JSON"),
    (hardened() + b'{"HostConfig": {"Privileged": true}}', "not valid JSON"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
])
def test_bodies_that_are_not_strict_json_are_refused(raw, why):
    d = create(raw)
    assert not d.allowed and why in d.reason


def test_strict_json_keeps_surrogate_pairs_and_escapes():
    assert strict_json(b'{"a": "\\ud83d\\ude00", "b": "\\u00e9"}') == {"a": "\U0001f600",
                                                                       "b": "\u00e9"}


def test_reasons_say_what_was_refused_and_why():
    body = legit()
    body["HostConfig"]["capdrop"] = None
    body["user"] = ""
    d = create(body)
    assert d.reasons == (
        "HostConfig: key 'capdrop' is not allowed (keys are matched exactly; did you mean "
        "'CapDrop'?)",
        "body: key 'user' is not allowed (keys are matched exactly; did you mean 'User'?)",
    )


# ---------------------------------------------------------------- other calls


@pytest.mark.parametrize("target, body, why", [
    # Below 1.24 a start body replaces the checked HostConfig.
    ("/v1.23/containers/abc/start", b'{"Privileged": true, "Binds": ["/:/host"]}', "below 1.24"),
    ("/v1.41/containers/abc/start", b'{"Privileged": true}', "takes no request body"),
    ("/v1.12/containers/json", b"", "below 1.24"),
    ("/v1.39/containers/create?name=gpulab-user-a", b"{}", "below 1.40 are refused for POST"),
])
def test_old_api_versions_and_bodies_outside_create_are_refused(target, body, why):
    d = proxy_verdict("POST" if "start" in target or "create" in target else "GET", target, body)
    assert not d.allowed and why in d.reason


@pytest.mark.parametrize("target", ["/v1.24/_ping", "/v1.24/containers/json?all=1",
                                    "/v1.24/nodes", "/v1.24/version"])
def test_read_only_calls_are_answered_at_a_failed_negotiations_fallback_version(target):
    """A Docker client whose version negotiation's ping failed keeps 1.24 for good
    (Prometheus' Swarm discovery, started before the proxy answered): its lists still
    work, and its writes would not."""
    method = "HEAD" if target.endswith("_ping") else "GET"
    assert proxy_verdict(method, target, read_only=True, swarm=True).allowed
    assert not proxy_verdict("POST", "/v1.24/services/create", b"{}", swarm=True).allowed


def test_per_container_calls_name_their_container():
    d = proxy_verdict("POST", "/v1.41/containers/gpulab-user-alice/stop?t=5")
    assert d.container == "gpulab-user-alice"
    assert d.target("0" * 64) == f"/v1.41/containers/{'0' * 64}/stop?t=5"
    assert proxy_verdict("GET", "/v1.41/containers/json").container == ""
    assert proxy_verdict("DELETE", "/containers/abc?force=1").target("f" * 64) == (
        f"/containers/{'f' * 64}?force=1")


def test_is_create():
    assert is_create("POST", "/v1.41/containers/create?name=x")
    assert is_create("POST", "/v1.41/volumes/create")
    assert is_create("POST", "/containers/create")
    assert not is_create("GET", "/v1.41/containers/create")
    assert not is_create("POST", "/v1.41/containers/v1.41/create")


# ---------------------------------------------------------------- a home of spawn.home_size

SIZED = Settings({**defaults(), "spawn.home_size": 10 * 1024**3})
VOLUMES = "/v1.41/volumes/create"


def home(**change) -> dict:
    """What docker-py's create_volume sends for home_volume_create(SIZED, "alice")."""
    body = {"Name": "gpulab-home-alice", "Driver": "local",
            "DriverOpts": {"size": str(10 * 1024**3)}}
    return {**body, **change}


def test_a_home_of_the_labs_size_may_be_created():
    d = create(home(), VOLUMES, SIZED)
    assert d.allowed, d.reason
    assert json.loads(d.body) == home() and d.target() == VOLUMES
    assert create(home(Name="gpulab-home-zo-k---1b2c3d4e", Labels={}), VOLUMES, SIZED).allowed


@pytest.mark.parametrize("change, why", [
    # the local driver's other options mount a host folder, a device or a share
    ({"DriverOpts": {"size": "1", "type": "none", "o": "bind", "device": "/"}},
     "only a volume's size is set"),
    ({"DriverOpts": {"type": "nfs", "o": "addr=10.0.0.1", "device": ":/x"}}, "'size' is required"),
    ({"DriverOpts": {"Size": str(10 * 1024**3)}}, "did you mean 'size'"),
    ({"Driver": "rexray"}, "use Docker's local driver"),
    ({"Name": "gpulab-hub-data"}, "only members' homes"),
    ({"Name": "gpulab-datasets"}, "only members' homes"),
    ({"Name": "gpulab-home-"}, "only members' homes"),
    ({"Name": "evil"}, "only members' homes"),
    ({"DriverOpts": {"size": "1048576"}}, "homes hold 10737418240 bytes"),
    ({"DriverOpts": {"size": "10g"}}, "is not a size in bytes"),
    ({"Labels": {"a": "b"}}, "must be null or {}"),
    ({"CreateOptions": {}}, "key 'CreateOptions' is not allowed"),
])
def test_any_other_volume_is_refused(change, why):
    assert why in refused_for(home(**change), VOLUMES, SIZED)


PROJECTS_SIZED = Settings({**defaults(), "spawn.project_size": 2 * 1024**4})


def project(**change) -> dict:
    """What docker-py's create_volume sends for project_volume_create(.., "cars")."""
    return {"Name": "gpulab-project-cars", "Driver": "local",
            "DriverOpts": {"size": str(2 * 1024**4)}, **change}


def test_a_project_folder_of_the_labs_size_may_be_created_and_nothing_else():
    d = create(project(), VOLUMES, PROJECTS_SIZED)
    assert d.allowed, d.reason
    assert json.loads(d.body) == project()
    # its own size, not a home's; homes not at all while only projects are sized
    assert "project folders hold 2199023255552 bytes (spawn.project_size)" in refused_for(
        project(DriverOpts={"size": str(10 * 1024**3)}), VOLUMES, PROJECTS_SIZED)
    assert "spawn.home_size is not set" in refused_for(home(), VOLUMES, PROJECTS_SIZED)
    assert "spawn.project_size is not set" in refused_for(project(), VOLUMES, SIZED)
    for name in ("gpulab-project-", "gpulab-project-Cars", "gpulab-project--x",
                 "gpulab-project-" + "a" * 41, "gpulab-projects-cars"):
        assert "group project folders (gpulab-project-NAME)" in refused_for(
            project(Name=name), VOLUMES, PROJECTS_SIZED), name
    assert "is not a volume name" in refused_for(project(Name="gpulab-project-../x"),
                                                 VOLUMES, PROJECTS_SIZED)


def test_no_volume_is_created_while_homes_have_no_size():
    assert "spawn.home_size is not set" in refused_for(home(), VOLUMES)
    assert "duplicate key" in refused_for(
        b'{"Name": "gpulab-home-alice", "Name": "x", "Driver": "local", '
        b'"DriverOpts": {"size": "10737418240"}}', VOLUMES, SIZED)
    assert "query parameter" in refused_for(home(), VOLUMES + "?name=x", SIZED)


def test_read_only_clients_may_only_list():
    assert proxy_verdict("GET", "/v1.41/containers/json?filters=x", read_only=True).allowed
    assert proxy_verdict("GET", "/v1.41/_ping", read_only=True).allowed
    assert proxy_verdict("GET", "/version", read_only=True).allowed
    for method, target in (("POST", CREATE), ("DELETE", "/v1.41/containers/gpulab-user-alice"),
                           ("GET", "/v1.41/containers/gpulab-user-alice/logs"),
                           ("GET", "/v1.41/containers/gpulab-user-alice/json")):
        d = proxy_verdict(method, target, hardened() if "create" in target else b"", read_only=True)
        assert not d.allowed and "read-only client" in d.reason


# ---------------------------------------------------------------- the request head


@pytest.mark.parametrize("head, status, why", [
    (b"GET /_ping HTTP/1.1\nHost: x\r\n\r\n", 400, "bare LF"),
    (b"GET /_ping HTTP/1.1\r\nHost: x\rX: y\r\n\r\n", 400, "bare LF or CR"),
    (b"GET /_ping HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 400, "obs-fold"),
    (b"GET /_ping HTTP/1.1\r\nHost: x\r\n\tfolded\r\n\r\n", 400, "obs-fold"),
    (b"POST /x HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n", 400,
     "more than one Content-Length"),
    (b"POST /x HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 3\r\n\r\n", 400,
     "more than one Content-Length"),
    (b"POST /x HTTP/1.1\r\nContent-Length: +2\r\n\r\n", 400, "not a number"),
    (b"POST /x HTTP/1.1\r\nContent-Length: 2, 2\r\n\r\n", 400, "not a number"),
    (b"POST /x HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", 400, "not a number"),
    (b"POST /x HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413, "too large"),
    (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411, "Transfer-Encoding"),
    (b"POST /x HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n", 400, "malformed header"),
    (b"POST /x HTTP/1.1\r\nContent-Length : 5\r\n\r\n", 400, "malformed header"),
    (b"POST /x HTTP/1.1\r\nNoColon\r\n\r\n", 400, "malformed header"),
    (b"POST /x HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400, "malformed header"),
    (b"GET  /_ping HTTP/1.1\r\n\r\n", 400, "request line"),
    (b"GET /_ping HTTP/1.2\r\n\r\n", 400, "request line"),
    (b"GET /_ping HTTP/2\r\n\r\n", 400, "request line"),
    (b"GET /_ping\r\n\r\n", 400, "request line"),
    (b"GET http://docker/_ping HTTP/1.1\r\n\r\n", 400, "request line"),
    (b"GET * HTTP/1.1\r\n\r\n", 400, "request line"),
    (b"get /_ping HTTP/1.1\r\n\r\n", 400, "request line"),
    (b"GET /_p\xffing HTTP/1.1\r\n\r\n", 400, "request line"),
    (b"GET /_ping HTTP/1.1 \r\n\r\n", 400, "request line"),
])
def test_request_heads_that_parsers_could_read_differently_are_refused(head, status, why):
    from gpulab.dockerapi.proxy import Refusal
    with pytest.raises(Refusal) as e:
        parse_head(head)
    assert e.value.status == status and why in str(e.value)


def test_a_plain_request_head_is_read():
    r = parse_head(b"POST /v1.41/containers/create?name=x HTTP/1.1\r\nHost: docker\r\n"
                   b"Content-Length: 12\r\nContent-Type: application/json\r\n\r\n")
    assert (r.method, r.target, r.content_length) == ("POST", "/v1.41/containers/create?name=x", 12)


# ---------------------------------------------------------------- the shell, end to end


class FakeDockerd:
    """A small dockerd on a unix socket: resolves references as Docker does (full ID,
    name, unique ID prefix), answers its inspect chunked as dockerd does, and records
    every request that reached it."""

    def __init__(self, containers: dict[str, dict[str, str]]):
        self.containers = containers  # name -> labels
        self.ids = {name: f"{i:x}" * 64 for i, name in enumerate(containers, start=10)}
        self.seen: list[bytes] = []
        self.tasks: set[asyncio.Task] = set()  # Python 3.11's start_server keeps none

    def resolve(self, ref: str) -> str | None:
        for name, cid in self.ids.items():
            if ref in (cid, name):
                return name
        prefixed = [name for name, cid in self.ids.items() if cid.startswith(ref)]
        return prefixed[0] if len(prefixed) == 1 else None

    async def handle(self, reader, writer):
        self.tasks.add(asyncio.current_task())
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"Content-Length: (\d+)", head)
        body = await reader.readexactly(int(length.group(1))) if length else b""
        self.seen.append(head + body)
        line = head.split(b"\r\n")[0].decode()
        m = re.fullmatch(r"GET (?:/v[\d.]+)?/containers/([^/?]+)/json HTTP/1.1", line)
        if m:
            name = self.resolve(m.group(1))
            if name is None:
                payload = json.dumps({"message": f"No such container: {m.group(1)}"}).encode()
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
            else:
                payload = json.dumps({"Id": self.ids[name], "Name": f"/{name}",
                                      "Config": {"Labels": self.containers[name]}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload))
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK")
        await writer.drain()
        writer.close()

    def lines(self) -> list[str]:
        return [r.split(b"\r\n")[0].decode() for r in self.seen]


async def _send(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    writer.write_eof()  # the client has said all it will say
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


@pytest.fixture
async def stack(tmp_path):
    """(fake dockerd, proxy port) with a real proxy on loopback in front of it."""
    dockerd = FakeDockerd({"gpulab-user-alice": {"org.gpulab.managed": "true"},
                           "gpulab-hub": {}})
    sock = str(tmp_path / "docker.sock")
    up = await asyncio.start_unix_server(dockerd.handle, sock)
    proxy = await asyncio.start_server(Proxy(sock).handle, "127.0.0.1", 0)
    try:
        yield dockerd, proxy.sockets[0].getsockname()[1]
    finally:
        proxy.close()
        up.close()


async def test_proxy_forwards_allowed_calls_and_answers_403_itself(stack):
    dockerd, port = stack
    ok = await _send(port, b"GET /v1.41/_ping HTTP/1.1\r\nHost: docker\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200") and ok.endswith(b"OK")
    body = b'{"User": "0"}'
    refused = await _send(port, b"POST /v1.41/containers/create HTTP/1.1\r\nHost: docker\r\n"
                                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    assert refused.startswith(b"HTTP/1.1 403")
    assert b"non-root" in refused
    assert dockerd.lines() == ["GET /v1.41/_ping HTTP/1.1"]  # the refusal never reached docker


async def test_per_container_calls_are_forwarded_with_the_full_id(stack):
    dockerd, port = stack
    alice, hub = dockerd.ids["gpulab-user-alice"], dockerd.ids["gpulab-hub"]
    stop = b"POST /v1.41/containers/%s/stop?t=5 HTTP/1.1\r\nHost: docker\r\n\r\n"
    for ref in (b"gpulab-user-alice", alice[:6].encode(), alice.encode()):
        dockerd.seen.clear()
        assert (await _send(port, stop % ref)).startswith(b"HTTP/1.1 200")
        assert dockerd.lines() == [f"GET /containers/{ref.decode()}/json HTTP/1.1",
                                   f"POST /v1.41/containers/{alice}/stop?t=5 HTTP/1.1"]
    dockerd.seen.clear()
    for ref in (b"gpulab-hub", hub[:6].encode()):
        refused = await _send(port, stop % ref)
        assert refused.startswith(b"HTTP/1.1 403") and b"is not gpulab's" in refused
    assert all("/stop" not in line for line in dockerd.lines())
    gone = await _send(port, stop % b"gpulab-user-gone")
    assert gone.startswith(b"HTTP/1.1 404")
    assert json.loads(gone.split(b"\r\n\r\n", 1)[1]) == {
        "message": "No such container: gpulab-user-gone"}


async def test_forwarded_requests_carry_fresh_headers_and_the_checked_body(stack):
    dockerd, port = stack
    raw = b'{ "User":"1000:1000", ' + hardened()[1:].replace(b'"User": "1000:1000", ', b"")
    await _send(port, b"POST /v1.41/containers/create?name=gpulab-user-alice HTTP/1.1\r\n"
                      b"Host: evil\r\nX-Registry-Auth: secret\r\nContent-Type: text/plain\r\n"
                      b"Connection: keep-alive\r\nContent-Length: %d\r\n\r\n%s" % (len(raw), raw))
    forwarded = json.dumps(json.loads(raw)).encode()
    assert dockerd.seen == [
        b"POST /v1.41/containers/create?name=gpulab-user-alice HTTP/1.1\r\nHost: docker\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
        % (len(forwarded), forwarded)]
    dockerd.seen.clear()
    await _send(port, b"POST /v1.41/containers/gpulab-user-alice/start HTTP/1.1\r\n"
                      b"Host: x\r\nContent-Length: 0\r\n\r\n")
    assert dockerd.seen[-1] == (
        f"POST /v1.41/containers/{dockerd.ids['gpulab-user-alice']}/start HTTP/1.1\r\n"
        f"Host: docker\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").encode()


@pytest.mark.parametrize("raw, status", [
    (b"GET /v1.41/_ping HTTP/1.1\nHost: docker\n\n", b"400"),  # never a CRLF CRLF
    (b"GET /v1.41/_ping HTTP/1.1\r\nHost: docker\nX: y\r\n\r\n", b"400"),
    (b"GET /v1.41/_ping HTTP/1.1\r\nHost: docker\r\n x\r\n\r\n", b"400"),
    (b"POST /v1.41/containers/a/start HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 0"
     b"\r\n\r\n", b"400"),
    (b"POST /v1.41/containers/a/start HTTP/1.1\r\nContent-Length: zero\r\n\r\n", b"400"),
    (b"POST /v1.41/containers/a/start HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
     b"411"),
    (b"GET /v1.41/_ping#x HTTP/1.1\r\n\r\n", b"400"),
    (b"GET /v1.41/_ping HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", b"400"),  # short body
])
async def test_the_proxy_refuses_odd_request_heads(stack, raw, status):
    dockerd, port = stack
    answer = await _send(port, raw)
    assert answer.startswith(b"HTTP/1.1 " + status), answer
    assert dockerd.seen == []


async def test_creates_use_the_settings_file_and_keep_the_last_good_one(tmp_path):
    config = tmp_path / "gpulab.yaml"
    config.write_text("spawn:\n  image: lab/nb:v1\n")
    proxy = Proxy("/nonexistent.sock", settings_path=str(config))
    assert proxy.settings()["spawn.image"] == "lab/nb:v1"
    config.write_text("spawn:\n  image: lab/nb:v2\n")  # an admin's edit applies
    assert proxy.settings()["spawn.image"] == "lab/nb:v2"
    config.write_text("spawn:\n  imagee: oops\n")  # an invalid edit keeps the last good one
    assert proxy.settings()["spawn.image"] == "lab/nb:v2"
    live_config.settings_file.errors.clear()
    assert Proxy("/nonexistent.sock").settings()["spawn.image"] == defaults()["spawn.image"]


async def test_serve_reads_the_settings_at_start_so_a_later_bad_edit_keeps_them(tmp_path):
    """A proxy restarted after the last spawn (dockerd restarted) and before an admin's
    invalid edit still creates with the last good settings, as the hub does."""
    config = tmp_path / "gpulab.yaml"
    config.write_text("spawn:\n  image: lab/nb:v3\n")
    status = await asyncio.wait_for(
        serve("127.0.0.1", 0, str(tmp_path / "never.sock"), settings_path=str(config),
              exit_when_socket_gone=True, watch_interval=0.02), 5)
    assert status == 1
    config.write_text("spawn:\n  mem_limit: plenty\n")
    try:
        assert Proxy("/nonexistent.sock", settings_path=str(config)).settings()[
            "spawn.image"] == "lab/nb:v3"
    finally:
        live_config.settings_file.errors.clear()


async def test_a_create_is_refused_while_the_settings_never_validated(tmp_path):
    config = tmp_path / "broken.yaml"
    config.write_text("spawn: [\n")
    proxy = await asyncio.start_server(
        Proxy(str(tmp_path / "none.sock"), settings_path=str(config)).handle, "127.0.0.1", 0)
    body = hardened()
    try:
        answer = await _send(proxy.sockets[0].getsockname()[1],
                             b"POST %s HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s"
                             % (CREATE.encode(), len(body), body))
    finally:
        proxy.close()
    assert answer.startswith(b"HTTP/1.1 503") and b"settings cannot be read" in answer


# ---------------------------------------------------------------- the socket watchdog


async def test_the_watchdog_reports_a_socket_that_stays_dead(tmp_path):
    path = str(tmp_path / "docker.sock")
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(path)
    listening.listen(64)
    watch = asyncio.create_task(watch_socket(path, interval=0.02, failures=3))
    await asyncio.sleep(0.2)
    assert not watch.done()  # connections succeed: keeps watching
    # A restarted dockerd leaves a file bind mount with the old socket: the file is still
    # there, nobody listens on it (ECONNREFUSED).
    listening.close()
    why = await asyncio.wait_for(watch, 2)
    # one refused connection is enough: nobody will ever listen on that inode again
    assert "refused" in why and "ConnectionRefusedError" in why


async def test_a_request_that_finds_the_socket_refused_ends_serve_at_once(tmp_path):
    """dockerd restarted between two looks of the watchdog: the first request that finds
    the old socket refused answers 502 and makes the proxy exit for its restart, without
    waiting for the watchdog (which looks only every few seconds here)."""
    path = str(tmp_path / "docker.sock")
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(path)
    listening.listen(64)
    port = free_port()
    served = asyncio.create_task(serve("127.0.0.1", port, path, exit_when_socket_gone=True,
                                       watch_interval=30))
    await asyncio.sleep(0.3)
    listening.close()  # the engine is gone; the file stays
    answer = await _send(port, b"GET /_ping HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 502") and b"unreachable" in answer
    assert await asyncio.wait_for(served, 2) == 1


async def test_serve_exits_with_status_1_when_the_socket_is_gone(tmp_path):
    status = await asyncio.wait_for(
        serve("127.0.0.1", 0, str(tmp_path / "never.sock"), exit_when_socket_gone=True,
              watch_interval=0.02), 5)
    assert status == 1
