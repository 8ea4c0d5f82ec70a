import asyncio
import json

import pytest

from gpulab.containers import container_options
from gpulab.docker_proxy import Proxy, decide
from gpulab.settings import defaults


def hardened(**host_config):
    """The create body DockerSpawner sends for a gpulab user container (as docker-py
    serializes it), with *host_config* overriding HostConfig keys."""
    opts = container_options(defaults(), "alice", gpu_uuids=["GPU-1"])
    hc = {
        "Binds": ["gpulab-home-alice:/home/jovyan:rw", "gpulab-datasets:/datasets:ro"],
        "Mounts": [],
        "ShmSize": opts.host_config["shm_size"],
        "PidsLimit": 1024,
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges"],
        "Init": True,
        "NetworkMode": "gpulab",
        "DeviceRequests": [{"Driver": "nvidia", "Count": 0, "DeviceIDs": ["GPU-1"],
                            "Capabilities": [["gpu"]], "Options": {}}],
    }
    hc.update(host_config)
    return json.dumps({"Image": "gpulab/singleuser:latest", "User": "1000:1000",
                       "Labels": opts.labels, "HostConfig": hc}).encode()


@pytest.mark.parametrize("method, target", [
    ("GET", "/_ping"), ("GET", "/v1.41/version"),
    ("GET", "/v1.41/containers/json?all=1&filters=%7B%22label%22%3A+%5B%5D%7D"),
    ("GET", "/v1.41/containers/gpulab-alice/json"),
    ("GET", "/v1.41/containers/abc123/logs?stderr=1&stdout=1&tail=20"),
    ("POST", "/v1.41/containers/abc123/start"), ("POST", "/v1.41/containers/abc123/stop?t=10"),
    ("DELETE", "/v1.41/containers/abc123?v=True"),
    ("GET", "/v1.41/images/gpulab/singleuser:latest/json"),
    ("GET", "/v1.41/volumes/gpulab-datasets"),
])
def test_the_calls_the_hub_makes_pass(method, target):
    assert decide(method, target).allowed


@pytest.mark.parametrize("method, target", [
    ("POST", "/v1.41/containers/abc/exec"), ("POST", "/v1.41/exec/abc/start"),
    ("POST", "/v1.41/images/create?fromImage=evil"), ("POST", "/v1.41/build"),
    ("POST", "/v1.41/containers/abc/attach"), ("GET", "/v1.41/containers/abc/archive"),
    ("PUT", "/v1.41/containers/abc/archive"), ("POST", "/v1.41/volumes/create"),
    ("DELETE", "/v1.41/volumes/gpulab-home-alice"), ("POST", "/v1.41/networks/create"),
    ("POST", "/v1.41/swarm/init"), ("GET", "/v1.41/secrets"), ("POST", "/v1.41/plugins/pull"),
    ("GET", "/v1.41/containers/../../info"), ("GET", "/v1.41/info"),
])
def test_everything_else_is_refused(method, target):
    d = decide(method, target)
    assert not d.allowed and "not among the calls the hub needs" in d.reason


def test_a_hardened_user_container_may_be_created():
    assert decide("POST", "/v1.41/containers/create?name=gpulab-alice", hardened()).allowed


@pytest.mark.parametrize("change, why", [
    ({"Privileged": True}, "privileged"),
    ({"CapAdd": ["SYS_ADMIN"]}, "adding capabilities"),
    ({"CapDrop": []}, "drop all capabilities"),
    ({"SecurityOpt": []}, "no-new-privileges"),
    ({"NetworkMode": "host"}, "NetworkMode=host"),
    ({"PidMode": "host"}, "PidMode=host"),
    ({"IpcMode": "host"}, "IpcMode=host"),
    ({"Binds": ["/var/run/docker.sock:/var/run/docker.sock"]}, "host paths"),
    ({"Binds": ["/:/host:ro"]}, "host paths"),
    ({"Mounts": [{"Type": "bind", "Source": "/etc", "Target": "/x"}]}, "only named volumes"),
    ({"Devices": [{"PathOnHost": "/dev/sda"}]}, "host devices"),
    ({"DeviceRequests": [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]},
     "name their devices"),
])
def test_unsafe_creates_are_refused(change, why):
    d = decide("POST", "/v1.41/containers/create", hardened(**change))
    assert not d.allowed and why in d.reason


@pytest.mark.parametrize("user", ["", "0", "root", "0:0", "root:root"])
def test_root_containers_are_refused(user):
    body = json.loads(hardened())
    body["User"] = user
    d = decide("POST", "/v1.41/containers/create", json.dumps(body).encode())
    assert not d.allowed and "non-root" in d.reason


def test_garbage_create_body_is_refused():
    assert not decide("POST", "/v1.41/containers/create", b"{not json").allowed


async def _request(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


async def test_proxy_forwards_allowed_calls_and_answers_403_itself(tmp_path):
    """A real proxy on loopback in front of a small upstream on a unix socket (standing
    in for dockerd: it records what reached it and answers 200)."""
    seen = []

    async def upstream(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b"\r\n")[0].decode())
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK')
        await writer.drain()
        writer.close()

    sock = str(tmp_path / "docker.sock")
    up = await asyncio.start_unix_server(upstream, sock)
    proxy = await asyncio.start_server(Proxy(sock).handle, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    try:
        ok = await _request(port, b"GET /v1.41/_ping HTTP/1.1\r\nHost: docker\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200") and ok.endswith(b"OK")
        body = b'{"User": "0"}'
        refused = await _request(
            port, b"POST /v1.41/containers/create HTTP/1.1\r\nHost: docker\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert refused.startswith(b"HTTP/1.1 403")
        assert b"non-root" in refused
        assert seen == ["GET /v1.41/_ping HTTP/1.1"]  # the refused call never reached docker
    finally:
        proxy.close()
        up.close()
