"""The Docker proxy against the real dockerd: what dockerd makes of what the proxy let by.

The proxy checks a create body with Python and dockerd decodes it with Go, which merges
duplicated objects, matches keys case-insensitively (``ſ`` = ``s``, ``K`` = ``k``) and
reads a HostConfig at the top level. So these tests send raw bytes (duplicates and odd
spellings survive) through a real proxy process to the real dockerd, and every request
must EITHER be refused OR create a container whose ``docker inspect`` is the hardened
container the proxy's check described. The same variants sent straight to dockerd show
that they are live (dockerd would have honoured them).

Needs only dockerd and the image ``gpulab/singleuser:latest`` (not the hub). Containers
are created, never started with a GPU; everything is named gpulab-user-difftest* /
gpulab-difftest* and removed afterwards, also on failure.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from gpulab.dockerapi.proxy import parse_response
from tests.ports import free_port

# Its containers carry the lease labels of the stand-in GPU 0 (they are what the hub
# makes): the hub counts them as holding it, so they run in the gpus lane, one after the
# tests that spawn with a GPU, never beside them (conftest.GPUS_LANE_MODULES; seen: 409s
# in another lane).

DOCKER_SOCKET = "/var/run/docker.sock"
IMAGE = "gpulab/singleuser:latest"
NETWORK = "gpulab-difftest"
# every container here is a named server of the member difftest (the proxy requires a
# container's name to be its labels' user's and server's): PREFIX + its server's name
PREFIX = "gpulab-user-difftest--"
HOME_VOLUME = "gpulab-difftest-home"
DATASETS_VOLUME = "gpulab-difftest-datasets"
GPU = "GPU-fa4e0000-0000-4000-8000-000000000000"
HOME_SIZE = str(16 * 1024**2)  # spawn.home_size of this module's settings, in bytes
PROJECT_SIZE = str(32 * 1024**2)  # and spawn.project_size
PROJECT_VOLUME = "gpulab-project-difftest"
REPO = Path(__file__).resolve().parents[2]
DAEMON_DEFAULTS: dict[str, object] = {}  # what a plain container gets from this dockerd
SETTINGS = (f"spawn:\n  image: {IMAGE}\n  network: {NETWORK}\n"
            f"  home_volume: '{HOME_VOLUME}-{{username}}'\n"
            f"  datasets_volume: {DATASETS_VOLUME}\n"
            f"  home_size: {HOME_SIZE}\n  project_size: {PROJECT_SIZE}\n")
ENVIRONMENT_IMAGE = "gpulab-difftest/environment:1"  # a second tag of IMAGE


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


def _unix():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(DOCKER_SOCKET)
    return s


def dockerd(method: str, target: str, body: bytes | None = None) -> tuple[int, object]:
    """Straight to dockerd (the proxy's upstream)."""
    status, payload = _exchange(_unix, _request(method, target, body))
    return status, json.loads(payload) if payload.strip() else None


class Pairs(list):
    """A JSON object as (key, value) pairs, so that duplicate keys survive."""


def dump(value) -> bytes:
    def enc(v) -> str:
        if isinstance(v, Pairs):
            return "{" + ", ".join(f"{json.dumps(k)}: {enc(x)}" for k, x in v) + "}"
        if isinstance(v, dict):
            return enc(Pairs(v.items()))
        if isinstance(v, list):
            return "[" + ", ".join(enc(x) for x in v) + "]"
        return json.dumps(v)
    return enc(value).encode()


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    if not os.path.exists(DOCKER_SOCKET):
        pytest.fail(f"no Docker socket at {DOCKER_SOCKET}: these tests need the real dockerd")
    try:
        status, image = dockerd("GET", f"/images/{IMAGE}/json")
    except OSError as e:
        pytest.fail(f"dockerd does not answer on {DOCKER_SOCKET}: {e}")
    if status != 200:
        pytest.fail(f"the image {IMAGE} is not on this host (docker image inspect {IMAGE}): "
                    f"build it with `make images`")
    DAEMON_DEFAULTS["ImageId"] = image["Id"]
    _cleanup()
    log = tmp_path_factory.mktemp("difftest") / "proxy.log"
    process = None
    try:
        status, out = dockerd("POST", f"/v1.41/containers/create?name={PREFIX}defaults",
                              json.dumps({"Image": IMAGE}).encode())
        assert status == 201, out
        DAEMON_DEFAULTS["CgroupnsMode"] = inspect(out["Id"])["HostConfig"].get("CgroupnsMode")
        remove(out["Id"])
        status, out = dockerd("POST", "/networks/create",
                              json.dumps({"Name": NETWORK, "CheckDuplicate": True}).encode())
        assert status == 201, out
        config = log.with_name("gpulab.yaml")
        config.write_text(SETTINGS)
        port = free_port()
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "gpulab.dockerapi.proxy", "--listen", f"127.0.0.1:{port}",
                 "--docker-socket", DOCKER_SOCKET, "--settings", str(config)],
                stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(REPO / "hub")})
        client = Client(port, config)
        deadline = time.monotonic() + 15
        while True:
            try:
                if client.send(_request("GET", "/_ping"))[0] == 200:
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the proxy did not start:\n{log.read_text()}")
            time.sleep(0.05)
        yield client
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
            print(f"\nthe proxy's log (last lines):\n{log.read_text()[-3000:]}")
        _cleanup()


def _cleanup() -> None:
    dockerd("DELETE", f"/images/{ENVIRONMENT_IMAGE}")  # the tag only: IMAGE keeps its own
    filters = json.dumps({"name": [PREFIX]})
    _, found = dockerd("GET", f"/containers/json?all=1&filters={_q(filters)}")
    for c in found or []:
        dockerd("DELETE", f"/containers/{c['Id']}?v=1&force=1")
    dockerd("DELETE", f"/networks/{NETWORK}")
    _, volumes = dockerd("GET", f"/volumes?filters={_q(json.dumps({'name': ['gpulab-difftest']}))}")
    for v in (volumes or {}).get("Volumes") or []:
        dockerd("DELETE", f"/volumes/{v['Name']}")


def _q(s: str) -> str:
    return quote(s, safe="")


class Client:
    """The hub's side of the proxy, speaking raw bytes; *settings* is the gpulab.yaml the
    proxy reads at every create."""

    def __init__(self, port: int, settings: Path):
        self.port = port
        self.settings = settings
        self.counter = 0

    def send(self, raw: bytes) -> tuple[int, bytes]:
        return _exchange(lambda: socket.create_connection(("127.0.0.1", self.port)), raw)

    def name(self) -> str:
        self.counter += 1
        return f"{PREFIX}{self.counter}"

    def create(self, body: bytes, name: str | None = None) -> tuple[int, object, str]:
        """Create *name* (the next numbered one), its server label made its name's."""
        name = name or self.name()
        if name.startswith(PREFIX):
            body = body.replace(b'"org.gpulab.server": ""',
                                f'"org.gpulab.server": "{name[len(PREFIX):]}"'.encode(), 1)
        status, payload = self.send(_request("POST", f"/v1.41/containers/create?name={name}",
                                             body))
        return status, payload, name


# ---------------------------------------------------------------- bodies


def legit_body(user: str = "difftest", gpus: tuple[str, ...] = (GPU,)) -> dict:
    """What DockerSpawner sends for a gpulab user container (captured on the running
    stack), with this test's image, network and volumes."""
    body = {
        "ExposedPorts": {"8888/tcp": None}, "User": "1000:1000", "Tty": False,
        "OpenStdin": False, "StdinOnce": False, "AttachStdin": False, "AttachStdout": True,
        "AttachStderr": True,
        "Env": ["JUPYTERHUB_API_TOKEN=0ab3", "JUPYTERHUB_CLIENT_ID=jupyterhub-user-difftest",
                'JUPYTERHUB_OAUTH_SCOPES=["access:servers!server=difftest/"]',
                "JUPYTERHUB_USER=difftest", "JUPYTERHUB_HOST=", "MEM_LIMIT=8589934592",
                "CPU_LIMIT=2.0", f"JUPYTER_IMAGE_SPEC={IMAGE}",
                f"NVIDIA_VISIBLE_DEVICES={','.join(gpus) or 'void'}",
                f"GPULAB_GPUS={','.join(gpus)}"],
        "Cmd": ["jupyterhub-singleuser"], "Image": IMAGE,
        "Volumes": {"/datasets": {}, "/home/jovyan": {}}, "NetworkDisabled": False,
        "HostConfig": {
            "Memory": 8589934592, "ShmSize": 2147483648, "NetworkMode": NETWORK,
            "CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges"],
            "Binds": [f"{HOME_VOLUME}-{user}:/home/jovyan:rw", f"{DATASETS_VOLUME}:/datasets:ro"],
            "Links": [], "CpuQuota": 200000, "CpuPeriod": 100000, "PidsLimit": 1024,
            "Init": True, "Mounts": [],
            "LogConfig": {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "3"}},
            "DeviceRequests": [{"Driver": "nvidia", "Count": 0, "DeviceIDs": list(gpus),
                                "Capabilities": [["gpu"]], "Options": {}}],
        },
        "Labels": {"org.gpulab.managed": "true", "org.gpulab.user": user,
                   "org.gpulab.server": "", "org.gpulab.gpus": ",".join(gpus)},
    }
    if not gpus:
        del body["HostConfig"]["DeviceRequests"]
    return body


def violations(info: dict, gpus: tuple[str, ...] = (GPU,)) -> list[str]:
    """How a created container (docker inspect) differs from the hardened container the
    proxy's check describes."""
    c, hc = info["Config"], info["HostConfig"]
    bad = []

    def expect(what, got, ok):
        if not ok:
            bad.append(f"{what} = {got!r}")

    expect("Config.User", c["User"], c["User"] == "1000:1000")
    expect("Image", c["Image"], info["Image"] == DAEMON_DEFAULTS["ImageId"])
    expect("CapDrop", hc.get("CapDrop"), hc.get("CapDrop") == ["ALL"])
    expect("CapAdd", hc.get("CapAdd"), not hc.get("CapAdd"))
    expect("Capabilities", hc.get("Capabilities"), not hc.get("Capabilities"))
    expect("Privileged", hc.get("Privileged"), hc.get("Privileged") is False)
    for mode in ("PidMode", "IpcMode", "UTSMode", "UsernsMode", "Cgroup"):
        value = hc.get(mode) or ""
        expect(mode, value, value != "host" and not value.startswith("container:"))
    # "host" where dockerd's default is (cgroup v1): then it is every container's mode.
    expect("CgroupnsMode", hc.get("CgroupnsMode"),
           hc.get("CgroupnsMode") == DAEMON_DEFAULTS.get("CgroupnsMode"))
    expect("NetworkMode", hc.get("NetworkMode"), hc.get("NetworkMode") == NETWORK)
    for b in hc.get("Binds") or []:
        expect("Binds", b, not b.startswith("/"))
    for m in hc.get("Mounts") or []:
        expect("HostConfig.Mounts", m, m.get("Type") == "volume" and not m.get("VolumeOptions"))
    for m in info.get("Mounts") or []:
        expect("Mounts", m, m.get("Type") == "volume" and m.get("Driver") == "local")
    expect("Devices", hc.get("Devices"), not hc.get("Devices"))
    expect("DeviceCgroupRules", hc.get("DeviceCgroupRules"), not hc.get("DeviceCgroupRules"))
    requests = hc.get("DeviceRequests") or []
    ids = sorted(i for r in requests for i in r.get("DeviceIDs") or [])
    expect("DeviceRequests", requests,
           ids == sorted(gpus) and all(r.get("Count") == 0 for r in requests))
    expect("SecurityOpt", hc.get("SecurityOpt"), hc.get("SecurityOpt") in (
        ["no-new-privileges"], ["no-new-privileges:true"], ["no-new-privileges=true"]))
    expect("PortBindings", hc.get("PortBindings"), not hc.get("PortBindings"))
    expect("PublishAllPorts", hc.get("PublishAllPorts"), not hc.get("PublishAllPorts"))
    expect("VolumesFrom", hc.get("VolumesFrom"), not hc.get("VolumesFrom"))
    expect("Runtime", hc.get("Runtime"), hc.get("Runtime") == "runc")
    expect("Sysctls", hc.get("Sysctls"), not hc.get("Sysctls"))
    expect("CgroupParent", hc.get("CgroupParent"), not hc.get("CgroupParent"))
    expect("GroupAdd", hc.get("GroupAdd"), not hc.get("GroupAdd"))
    expect("OomScoreAdj", hc.get("OomScoreAdj"), not hc.get("OomScoreAdj"))
    expect("Ulimits", hc.get("Ulimits"), not hc.get("Ulimits"))
    expect("MaskedPaths", hc.get("MaskedPaths"), bool(hc.get("MaskedPaths")))
    expect("ReadonlyPaths", hc.get("ReadonlyPaths"), bool(hc.get("ReadonlyPaths")))
    expect("Links", hc.get("Links"), not hc.get("Links"))
    expect("Memory", hc.get("Memory"), hc.get("Memory") == 8589934592)
    expect("PidsLimit", hc.get("PidsLimit"), hc.get("PidsLimit") == 1024)
    visible = [e for e in c.get("Env") or [] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    expect("Env NVIDIA_VISIBLE_DEVICES", visible,
           visible == [f"NVIDIA_VISIBLE_DEVICES={','.join(gpus) or 'void'}"])
    for net, endpoint in (info.get("NetworkSettings", {}).get("Networks") or {}).items():
        expect(f"network {net}", net, net == NETWORK)
        expect(f"{net} Aliases", endpoint.get("Aliases"), not endpoint.get("Aliases"))
        expect(f"{net} IPAMConfig", endpoint.get("IPAMConfig"), not endpoint.get("IPAMConfig"))
        expect(f"{net} MacAddress", endpoint.get("MacAddress"), not endpoint.get("MacAddress"))
    return bad


def inspect(name: str) -> dict:
    status, info = dockerd("GET", f"/containers/{name}/json")
    assert status == 200, info
    return info


def remove(name: str) -> None:
    dockerd("DELETE", f"/containers/{name}?v=1&force=1")


# ---------------------------------------------------------------- positive controls


@pytest.mark.parametrize("gpus", [(GPU,), ()], ids=["with a GPU", "without GPUs"])
def test_the_body_dockerspawner_sends_creates_a_hardened_container(proxy, gpus):
    status, payload, name = proxy.create(dump(legit_body(gpus=gpus)))
    assert status == 201, payload
    assert violations(inspect(name), gpus) == []
    remove(name)


@pytest.mark.parametrize("change", [
    lambda b: b["HostConfig"].update(SecurityOpt=["no-new-privileges:true"]),
    lambda b: b["HostConfig"].update(SecurityOpt=["no-new-privileges=true"]),
    lambda b: b.update(NetworkingConfig={"EndpointsConfig": {NETWORK: {}}}),
    lambda b: b["HostConfig"].update(Binds=[], Mounts=[
        {"Type": "volume", "Source": f"{HOME_VOLUME}-m", "Target": "/home/jovyan"},
        {"Type": "volume", "Source": DATASETS_VOLUME, "Target": "/datasets", "ReadOnly": True}]),
    lambda b: b.update(Image=IMAGE.removesuffix(":latest")),
    lambda b: b["HostConfig"].update(MemorySwap=8589934592, NanoCpus=0),
], ids=["nnp:true", "nnp=true", "endpoint", "mounts", "image without tag", "swap"])
def test_allowed_variants_create_what_was_checked(proxy, change):
    body = legit_body()
    change(body)
    status, payload, name = proxy.create(dump(body))
    assert status == 201, payload
    assert violations(inspect(name)) == []
    remove(name)


# ---------------------------------------------------------------- the finding


FINDING = (b'{"Image":"%s","User":"1000:1000","user":"","Cmd":["sleep","120"],'
           b'"Labels":{"org.gpulab.managed":"true"},"HostConfig":{"Binds":["/:/host"]},'
           b'"HostConfig":{"CapDrop":["ALL"],"SecurityOpt":["no-new-privileges"],'
           b'"capdrop":null,"securityopt":null}}' % IMAGE.encode())


def test_the_reported_request_yields_no_root_or_host_mounted_container(proxy):
    status, payload, name = proxy.create(FINDING)
    assert status in (400, 403), payload
    assert b"duplicate key 'HostConfig'" in payload

    # What dockerd alone does with it (the finding): shows the test sends live bytes.
    direct = f"{PREFIX}finding-direct"
    status, out = dockerd("POST", f"/v1.41/containers/create?name={direct}", FINDING)
    if status == 201:
        info = inspect(direct)
        print(f"\ndockerd alone: User={info['Config']['User']!r} (the image's when '') "
              f"Binds={info['HostConfig']['Binds']} CapDrop={info['HostConfig']['CapDrop']}")
        remove(direct)


# ---------------------------------------------------------------- hand-picked


def _with_hc_pairs(*extra, before=()):
    body = legit_body()
    hc = Pairs([*before, *body.pop("HostConfig").items(), *extra])
    return Pairs([*body.items(), ("HostConfig", hc)])


def _top_level_host_config_only():
    body = legit_body()
    return {**{k: v for k, v in body.items() if k != "HostConfig"}, **body["HostConfig"],
            "Privileged": True, "Binds": ["/:/host"]}


HAND_PICKED = {
    "escaped duplicate of User": dump(Pairs([*legit_body().items()])).replace(
        b'"User": "1000:1000"', b'"User": "1000:1000", "\\u0055ser": "0"'),
    "hostconfig (lower case) object": dump({**legit_body(), "hostconfig": {"Privileged": True}}),
    "HostConfig keys at the top level only": dump(_top_level_host_config_only()),
    "Privileged at the top level": dump({**legit_body(), "Privileged": True}),
    "Kelvin sign in LinKs": dump(_with_hc_pairs(("Lin\u212as", ["gpulab-hub:hub"]))),
    "long s in Privileged-free ſecurityOpt": dump(
        _with_hc_pairs(("\u017fecurityOpt", ["seccomp=unconfined"]))),
    "NaN memory": dump(legit_body()).replace(b'"Memory": 8589934592', b'"Memory": NaN'),
    "float memory": dump(legit_body()).replace(b'"Memory": 8589934592', b'"Memory": 8e9'),
    "lone surrogate label": dump(legit_body()).replace(b'"org.gpulab.server": ""',
                                                     b'"org.gpulab.server": "\\ud800"'),
    "UTF-8 BOM": b"\xef\xbb\xbf" + dump(legit_body()),
    "UTF-16 body": dump(legit_body()).decode().encode("utf-16"),
    "second JSON value after the body": dump(legit_body()) + b'{"HostConfig":{"Privileged":true}}',
    "User as a number": dump({**legit_body(), "User": 1000}),
    "bool Init as 1": dump(_with_hc_pairs()).replace(b'"Init": true', b'"Init": 1'),
    "alias gpulab-hub": dump({**legit_body(), "NetworkingConfig": {
        "EndpointsConfig": {NETWORK: {"Aliases": ["gpulab-hub"]}}}}),
    "the hub's IP": dump({**legit_body(), "NetworkingConfig": {
        "EndpointsConfig": {NETWORK: {"IPAMConfig": {"IPv4Address": "172.30.0.2"}}}}}),
    "GPUs all via env": dump(legit_body()).replace(
        f"NVIDIA_VISIBLE_DEVICES={GPU}".encode(), b"NVIDIA_VISIBLE_DEVICES=all"),
    "GPU not in the lease label": dump(legit_body()).replace(
        b'"org.gpulab.gpus": "GPU-fa4e', b'"org.gpulab.gpus": "GPU-0a4e'),
    "another image": dump({**legit_body(), "Image": "gpulab/hub:latest"}),
    "deep nesting": b'{"Labels": ' + b"[" * 100000 + b"]" * 100000 + b"}",
}


@pytest.mark.parametrize("name", HAND_PICKED)
def test_hand_picked_hostile_bodies_are_refused_or_harmless(proxy, name):
    status, payload, cname = proxy.create(HAND_PICKED[name])
    if status == 201:
        assert violations(inspect(cname)) == []
        remove(cname)
    else:
        assert status in (400, 403), payload


@pytest.mark.parametrize("raw", [
    # two names: Python would see the last, Go's FormValue the first
    _request("POST", f"/v1.41/containers/create?name={PREFIX}a&name=gpulab-hub",
             dump(legit_body())),
    _request("POST", "/v1.41/containers/create?name=gpulab-hub", dump(legit_body())),
    _request("POST", f"/v1.41/containers/create?name={PREFIX}a;name=x", dump(legit_body())),
    _request("POST", f"/v1.41/containers/create?name={PREFIX}b", dump(legit_body())).replace(
        b"Content-Length", b"Transfer-Encoding: chunked\r\nContent-Length"),
    _request("POST", f"/v1.41/containers/create?name={PREFIX}c", dump(legit_body())).replace(
        b"Content-Length", b"Content-Length: 2\r\nContent-Length"),
    _request("POST", f"/v1.23/containers/{PREFIX}x/start", b'{"Privileged": true}'),
], ids=["duplicate name", "infra name", "semicolon", "chunked", "two lengths", "v1.23 start"])
def test_request_tricks_are_refused(proxy, raw):
    status, payload = proxy.send(raw)
    assert status in (400, 403, 411), payload


# ---------------------------------------------------------------- generated variants

# (key, hostile value, where it belongs: "host" = HostConfig, "config" = top level)
DENIED = [
    ("Privileged", True, "host"), ("PidMode", "host", "host"), ("IpcMode", "host", "host"),
    ("UTSMode", "host", "host"), ("UsernsMode", "host", "host"),
    ("CgroupnsMode", "host", "host"), ("CapAdd", ["ALL"], "host"), ("CapDrop", [], "host"),
    ("Capabilities", ["CAP_SYS_ADMIN"], "host"), ("Binds", ["/:/host"], "host"),
    ("Devices", [{"PathOnHost": "/dev/mem", "PathInContainer": "/dev/mem",
                  "CgroupPermissions": "rwm"}], "host"),
    ("DeviceCgroupRules", ["a *:* rwm"], "host"),
    ("SecurityOpt", ["seccomp=unconfined"], "host"),
    ("SecurityOpt", ["apparmor=unconfined"], "host"),
    ("NetworkMode", "host", "host"),
    ("PortBindings", {"8888/tcp": [{"HostPort": "18888"}]}, "host"),
    ("PublishAllPorts", True, "host"), ("VolumesFrom", [f"{PREFIX}source"], "host"),
    ("Runtime", "io.containerd.runc.v2", "host"),
    ("Sysctls", {"net.ipv4.ip_unprivileged_port_start": "0"}, "host"),
    ("CgroupParent", "/", "host"),
    ("Mounts", [{"Type": "bind", "Source": "/", "Target": "/host"}], "host"),
    ("Mounts", [{"Type": "volume", "Source": "gpulab-difftest-evil", "Target": "/host",
                 "VolumeOptions": {"DriverConfig": {"Name": "local", "Options": {
                     "type": "none", "o": "bind", "device": "/"}}}}], "host"),
    ("DeviceRequests", [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}], "host"),
    ("GroupAdd", ["0"], "host"), ("OomScoreAdj", -1000, "host"),
    ("MaskedPaths", [], "host"), ("ReadonlyPaths", [], "host"),
    ("Ulimits", [{"Name": "nofile", "Soft": 1048576, "Hard": 1048576}], "host"),
    ("Memory", 0, "host"), ("PidsLimit", -1, "host"),
    ("User", "", "config"), ("User", "0", "config"), ("User", "root", "config"),
    ("Image", "gpulab/hub:latest", "config"),
    ("Env", ["NVIDIA_VISIBLE_DEVICES=all"], "config"),
    ("NetworkingConfig", {"EndpointsConfig": {NETWORK: {"Aliases": ["gpulab-hub"]}}},
     "config"),
]


def spellings(key: str) -> dict[str, str]:
    lower = key.lower()
    out = {"exact": key, "lower": lower, "upper": key.upper(),
           "mixed": "".join(ch.upper() if i % 2 else ch.lower() for i, ch in enumerate(key))}
    folded = lower.replace("s", "\u017f").replace("k", "\u212a")
    if folded != lower:
        out["fold"] = folded
    return out


def variants():
    """(id, raw body) for every denied field x spelling x position."""
    for n, (key, value, level) in enumerate(DENIED):
        for spelling, k in spellings(key).items():
            base = legit_body()
            hc = base.pop("HostConfig")
            top = Pairs(base.items())
            vid = f"{n}-{key}-{spelling}"
            # top level: Go reads container.Config and a deprecated HostConfig there
            yield f"{vid}-top", dump(Pairs([*top, (k, value), ("HostConfig", hc)]))
            # inside HostConfig
            yield f"{vid}-hc", dump(Pairs([*top, ("HostConfig", Pairs([*hc.items(), (k, value)]))]))
            # in a second HostConfig object, which Go merges with the first: after the
            # legit one, and before it (json.loads would see only the legit one)
            extra = ("HostConfig", Pairs([(k, value)]))
            yield f"{vid}-hc2", dump(Pairs([*top, ("HostConfig", hc), extra]))
            yield f"{vid}-hc2first", dump(Pairs([*top, extra, ("HostConfig", hc)]))
            # a duplicate key after the legit value (or a harmless null)
            if level == "host":
                pairs = list(hc.items()) if key in hc else [(key, None), *hc.items()]
                yield f"{vid}-dup", dump(Pairs([*top, ("HostConfig", Pairs([*pairs, (k, value)]))]))
            else:
                pairs = list(top) if key in base else [(key, None), *top]
                yield f"{vid}-dup", dump(Pairs([*pairs, (k, value), ("HostConfig", hc)]))


def test_generated_variants_are_refused_or_create_what_was_checked(proxy):
    sent = refused = created = 0
    live = collections.Counter()  # by spelling and position: dockerd, sent the variant
    # directly, makes an unhardened container
    failures = []
    for vid, body in variants():
        sent += 1
        status, payload, name = proxy.create(body)
        if status == 201:
            created += 1
            bad = violations(inspect(name))
            if bad:
                failures.append(f"{vid}: proxy allowed it and dockerd made {bad}")
            remove(name)
        elif status in (400, 403):
            refused += 1
        else:
            failures.append(f"{vid}: unexpected answer {status} {payload[:200]!r}")
        direct = f"{PREFIX}direct"
        status, _ = dockerd("POST", f"/v1.41/containers/create?name={direct}", body)
        if status == 201:
            if violations(inspect(direct)):
                live.update(vid.split("-")[-2:])
            remove(direct)
    print(f"\n{sent} variants sent through the proxy: {refused} refused, {created} created "
          f"(all hardened: {not failures}); sent straight to dockerd, "
          f"{sum(live.values()) // 2} would have made an unhardened container "
          f"(by spelling and position: {dict(live)})")
    assert not failures, "\n".join(failures[:20])
    assert sent == refused + created
    assert live["exact"] and live["fold"] and live["hc2"] and live["top"], (
        f"the variants should be live (dockerd honours them when sent directly): {live}")


def test_exactly_the_images_of_the_labs_environments_run(proxy):
    """spawn.environments, as an admin edits it on a running lab: the proxy reads it at
    every create, lets each listed image run (here a second tag of IMAGE) and no other,
    however it is named; removed from the list, the image is refused at the next create."""
    repo, tag = ENVIRONMENT_IMAGE.split(":")
    status, out = dockerd("POST", f"/images/{IMAGE}/tag?repo={repo}&tag={tag}")
    assert status == 201, out
    hub_id = dockerd("GET", "/images/gpulab/hub:latest/json")[1]
    listed = (f"  environments:\n    - {{name: pytorch, image: {IMAGE}}}\n"
              f"    - {{name: writing, image: {ENVIRONMENT_IMAGE}, gpus: false}}\n")
    try:
        proxy.settings.write_text(SETTINGS + listed)
        for image in (ENVIRONMENT_IMAGE, f"docker.io/{ENVIRONMENT_IMAGE}", IMAGE):
            status, payload, name = proxy.create(dump({**legit_body(gpus=()), "Image": image}))
            assert status == 201, (image, payload)
            assert violations(inspect(name), gpus=()) == []
            remove(name)
        unlisted = ["gpulab/hub:latest", f"{repo}:2", f"{ENVIRONMENT_IMAGE}@sha256:{'0' * 64}",
                    f"index.docker.io/{ENVIRONMENT_IMAGE}"]
        if isinstance(hub_id, dict):  # the hub's image by its ID (make images built it)
            unlisted.append(hub_id["Id"])
        for image in unlisted:
            status, payload, _ = proxy.create(dump({**legit_body(gpus=()), "Image": image}))
            assert status == 403 and b"only the lab's images may be run" in payload, (
                image, status, payload)
        proxy.settings.write_text(SETTINGS)  # the admin takes it off the list
        status, payload, _ = proxy.create(dump({**legit_body(gpus=()),
                                                "Image": ENVIRONMENT_IMAGE}))
        assert status == 403 and b"only the lab's images may be run" in payload, payload
    finally:
        proxy.settings.write_text(SETTINGS)
        dockerd("DELETE", f"/images/{ENVIRONMENT_IMAGE}")


# ---------------------------------------------------------------- per-container calls


def test_per_container_calls_reach_only_gpulab_containers(proxy):
    status, out = dockerd("POST", f"/v1.41/containers/create?name={PREFIX}unmanaged",
                          json.dumps({"Image": IMAGE, "Cmd": ["true"]}).encode())
    assert status == 201, out
    unmanaged_id = out["Id"]
    status, payload, managed = proxy.create(dump(legit_body(gpus=())))
    assert status == 201, payload
    managed_id = inspect(managed)["Id"]

    for ref in (f"{PREFIX}unmanaged", unmanaged_id[:12], unmanaged_id):
        for method, path in (("GET", "/json"), ("POST", "/stop"), ("DELETE", "")):
            status, payload = proxy.send(_request(method, f"/v1.41/containers/{ref}{path}"))
            assert status == 403 and b"not gpulab's" in payload, (ref, method, payload)
    status, payload = proxy.send(_request("GET", f"/v1.41/containers/{PREFIX}nobody/json"))
    assert status == 404 and b"No such container" in payload
    status, payload = proxy.send(_request("GET", f"/v1.41/containers/{managed_id[:10]}/json"))
    assert status == 200 and json.loads(payload)["Id"] == managed_id
    status, payload = proxy.send(_request("DELETE", f"/v1.41/containers/{managed}?v=1&force=1"))
    assert status == 204, payload
    assert dockerd("GET", f"/containers/{managed_id}/json")[0] == 404
    assert dockerd("GET", f"/containers/{unmanaged_id}/json")[0] == 200


def test_a_volume_is_created_only_as_a_home_or_project_folder_of_the_labs_size(proxy):
    """The volume creates the hub makes (spawn.home_size, spawn.project_size): hostile
    local-driver options through the proxy create nothing; the bodies docker-py sends for
    the spawner reach dockerd, whose own answer comes back (on an engine without project
    quotas, such as this machine's ext4, its refusal that the spawner tells the member)."""
    import docker

    name = f"{HOME_VOLUME}-vol"
    bind_root = {"Name": name, "Driver": "local",
                 "DriverOpts": {"type": "none", "o": "bind", "device": "/"}}
    hostile = [
        bind_root,
        {**bind_root, "DriverOpts": {**bind_root["DriverOpts"], "size": HOME_SIZE}},
        # Go merges a repeated object and matches field names case-insensitively
        Pairs([("Name", name), ("Driver", "local"), ("DriverOpts", {"size": HOME_SIZE}),
               ("DriverOpts", {"type": "tmpfs", "device": "tmpfs"})]),
        {"Name": name, "Driver": "local", "DriverOpts": {"size": HOME_SIZE},
         "driverOpts": {"type": "tmpfs", "device": "tmpfs"}},
        {"Name": "gpulab-hub-data", "Driver": "local", "DriverOpts": {"size": HOME_SIZE}},
        {"Name": name, "Driver": "local", "DriverOpts": {"size": "1"}},
        # a group's project folder: only its own size, and no other option either
        {"Name": PROJECT_VOLUME, "Driver": "local", "DriverOpts": {"size": HOME_SIZE}},
        {**bind_root, "Name": PROJECT_VOLUME},
        {"Name": PROJECT_VOLUME, "Driver": "local",
         "DriverOpts": {"size": PROJECT_SIZE, "type": "none", "o": "bind", "device": "/"}},
    ]
    for body in hostile:
        status, payload = proxy.send(_request("POST", "/v1.41/volumes/create", dump(body)))
        assert status in (400, 403), (body, status, payload)
        assert dockerd("GET", f"/volumes/{name}")[0] == 404, body
        assert dockerd("GET", f"/volumes/{PROJECT_VOLUME}")[0] == 404, body
    # live: dockerd alone makes the root folder a volume that any container could mount
    status, out = dockerd("POST", "/v1.41/volumes/create", dump(bind_root))
    assert status == 201, out
    assert dockerd("DELETE", f"/volumes/{name}")[0] == 204

    api = docker.APIClient(base_url=f"tcp://127.0.0.1:{proxy.port}", version="1.41")
    probe, _ = dockerd("POST", "/v1.41/volumes/create", json.dumps(
        {"Name": f"{HOME_VOLUME}-probe", "DriverOpts": {"size": HOME_SIZE}}).encode())
    dockerd("DELETE", f"/volumes/{HOME_VOLUME}-probe")
    for volume, size in ((name, HOME_SIZE), (PROJECT_VOLUME, PROJECT_SIZE)):
        if probe == 201:  # a Docker whose volumes are on XFS with pquota
            api.create_volume(volume, driver="local", driver_opts={"size": size})
            assert api.inspect_volume(volume)["Options"] == {"size": size}
            dockerd("DELETE", f"/volumes/{volume}")
        else:
            with pytest.raises(docker.errors.APIError) as refused:
                api.create_volume(volume, driver="local", driver_opts={"size": size})
            assert "quota size requested but no quota support" in str(refused.value), \
                refused.value
            assert dockerd("GET", f"/volumes/{volume}")[0] == 404


def test_the_calls_the_hub_makes_pass_through_docker_py(proxy):
    """docker-py, as DockerSpawner and gpulab's spawner call it, through the proxy."""
    import docker

    api = docker.APIClient(base_url=f"tcp://127.0.0.1:{proxy.port}", version="1.41")
    assert api.ping() is True
    assert api.version()["ApiVersion"]
    api.inspect_image(IMAGE)
    host_config = api.create_host_config(
        binds={f"{HOME_VOLUME}-py": {"bind": "/home/jovyan", "mode": "rw"},
               DATASETS_VOLUME: {"bind": "/datasets", "mode": "ro"}},
        mem_limit=8589934592, shm_size=2147483648, network_mode=NETWORK, cap_drop=["ALL"],
        security_opt=["no-new-privileges"], links={}, cpu_quota=200000, cpu_period=100000,
        pids_limit=1024, init=True, mounts=[], auto_remove=False,
        log_config={"type": "json-file", "config": {"max-size": "10m", "max-file": "3"}})
    name = f"{PREFIX}docker-py"
    created = api.create_container(
        IMAGE, command=["sleep", "30"], name=name, user="1000:1000", ports=[8888],
        environment={"NVIDIA_VISIBLE_DEVICES": "void", "GPULAB_GPUS": ""},
        volumes=["/home/jovyan", "/datasets"], host_config=host_config,
        labels={"org.gpulab.managed": "true", "org.gpulab.user": "difftest",
                "org.gpulab.server": "docker-py",
                "org.gpulab.gpus": ""})
    cid = created["Id"]
    api.inspect_volume(DATASETS_VOLUME)
    assert violations(api.inspect_container(name), ()) == []
    api.start(cid)
    api.logs(cid, tail=20)
    found = api.containers(all=True, filters={"label": "org.gpulab.managed=true",
                                              "name": PREFIX})
    assert cid in [c["Id"] for c in found]
    api.kill(cid, signal="SIGTERM")
    api.stop(cid, timeout=1)
    api.remove_container(cid, v=True)
    with pytest.raises(docker.errors.NotFound):
        api.inspect_container(cid)
    with pytest.raises(docker.errors.APIError) as refused:
        api.create_container(IMAGE, name=f"{PREFIX}root", user="0")
    assert refused.value.status_code == 403
