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
    ({"Privileged": True}, "host settings the hub never uses: Privileged"),
    ({"CapAdd": ["SYS_ADMIN"]}, "host settings the hub never uses: CapAdd"),
    ({"CapDrop": []}, "drop all capabilities"),
    ({"SecurityOpt": []}, "no-new-privileges"),
    ({"SecurityOpt": ["no-new-privileges:false"]}, "no-new-privileges"),
    ({"SecurityOpt": ["no-new-privileges", "seccomp=unconfined"]}, "no other security option"),
    ({"SecurityOpt": ["no-new-privileges", "apparmor=unconfined"]}, "no other security option"),
    ({"NetworkMode": "host"}, "NetworkMode=host"),
    ({"NetworkMode": "container:gpulab-hub"}, "NetworkMode=container:gpulab-hub"),
    ({"PidMode": "host"}, "never uses: PidMode"),
    ({"IpcMode": "container:gpulab-hub"}, "never uses: IpcMode"),
    ({"VolumesFrom": ["gpulab-docker-proxy"]}, "never uses: VolumesFrom"),
    ({"GroupAdd": ["0", "998"]}, "never uses: GroupAdd"),
    ({"Sysctls": {"kernel.x": "1"}}, "never uses: Sysctls"),
    ({"Runtime": "runc"}, "never uses: Runtime"),
    ({"CgroupParent": "/"}, "never uses: CgroupParent"),
    ({"Links": ["gpulab-hub:hub"]}, "links"),
    ({"Binds": ["/var/run/docker.sock:/var/run/docker.sock"]}, "host paths"),
    ({"Binds": ["/:/host:ro"]}, "host paths"),
    ({"Mounts": [{"Type": "bind", "Source": "/etc", "Target": "/x"}]}, "plain named volumes"),
    ({"Mounts": [{"Type": "volume", "Source": "x", "Target": "/h", "VolumeOptions": {
        "DriverConfig": {"Name": "local", "Options": {"type": "none", "o": "bind",
                                                     "device": "/var/run"}}}}]},
     "plain named volumes"),
    ({"Devices": [{"PathOnHost": "/dev/sda"}]}, "never uses: Devices"),
    ({"DeviceRequests": [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]},
     "name their devices"),
])
def test_unsafe_creates_are_refused(change, why):
    d = decide("POST", "/v1.41/containers/create", hardened(**change))
    assert not d.allowed and why in d.reason


@pytest.mark.parametrize("user", ["", "0", "root", "0:0", "root:root", "00", "+0", "-0",
                                  "1000:0", "jovyan"])
def test_root_containers_are_refused(user):
    body = json.loads(hardened())
    body["User"] = user
    d = decide("POST", "/v1.41/containers/create", json.dumps(body).encode())
    assert not d.allowed and "non-root" in d.reason


def test_unknown_top_level_settings_are_refused():
    body = json.loads(hardened())
    body["Runtime"] = "some-runtime"
    d = decide("POST", "/v1.41/containers/create", json.dumps(body).encode())
    assert not d.allowed and "never uses: Runtime" in d.reason


@pytest.mark.parametrize("target, body, why", [
    # Below 1.24 a start body replaces the checked HostConfig.
    ("/v1.23/containers/abc/start", b'{"Privileged": true, "Binds": ["/:/host"]}', "below 1.40"),
    ("/v1.41/containers/abc/start", b'{"Privileged": true}', "takes no request body"),
    ("/v1.12/containers/json", b"", "below 1.40"),
])
def test_old_api_versions_and_bodies_outside_create_are_refused(target, body, why):
    d = decide("POST" if "start" in target else "GET", target, body)
    assert not d.allowed and why in d.reason


def test_per_container_calls_name_their_container():
    assert decide("POST", "/v1.41/containers/gpulab-alice/stop").container == "gpulab-alice"
    assert decide("GET", "/v1.41/containers/json").container == ""


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

    labels = {"gpulab-alice": {"org.gpulab.managed": "true"}, "gpulab-hub": {}}

    async def upstream(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        line = head.split(b"\r\n")[0].decode()
        seen.append(line)
        name = line.split("/containers/")[-1].split("/")[0]
        if line.startswith("GET /containers/") and line.endswith("/json HTTP/1.1"):
            if name in labels:  # the proxy's own inspect: answer chunked, as dockerd does
                payload = json.dumps({"Config": {"Labels": labels[name]}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload))
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK")
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

        stop = b"POST /v1.41/containers/%s/stop HTTP/1.1\r\nHost: docker\r\n\r\n"
        assert (await _request(port, stop % b"gpulab-alice")).startswith(b"HTTP/1.1 200")
        hub = await _request(port, stop % b"gpulab-hub")
        assert hub.startswith(b"HTTP/1.1 403") and b"is not gpulab's" in hub
        gone = await _request(port, stop % b"gpulab-gone")  # Docker's own 404 gets through
        assert gone.startswith(b"HTTP/1.1 200")
        assert "POST /v1.41/containers/gpulab-hub/stop HTTP/1.1" not in seen
    finally:
        proxy.close()
        up.close()


def test_read_only_clients_may_only_list():
    assert decide("GET", "/v1.41/containers/json?filters=x", read_only=True).allowed
    assert decide("GET", "/v1.41/_ping", read_only=True).allowed
    for method, target in (("POST", "/v1.41/containers/create"),
                           ("DELETE", "/v1.41/containers/gpulab-alice"),
                           ("GET", "/v1.41/containers/gpulab-alice/logs")):
        d = decide(method, target, hardened() if "create" in target else b"", read_only=True)
        assert not d.allowed and "read-only client" in d.reason
