"""Containers hardened by default: checked with `docker inspect` and from inside a user's
own container, as a curious student would try; the infrastructure containers with least
privilege; what a compromised hub can still do through the Docker API filter. (The
network is tests/integration/test_isolation.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
import requests

from gpulab.contract import INFRA_CONTAINERS

from .stack import docker

PROBE = r'''
import json, os
lines = open("/proc/self/status").read().splitlines()
status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
print(json.dumps({
    "uid": os.getuid(), "euid": os.geteuid(),
    "cap_eff": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
    "docker_socket": os.path.exists("/var/run/docker.sock"),
}))
'''


def test_user_container_is_hardened(hub, lab_user):
    user, other = lab_user("student"), lab_user("neighbour")
    user.start_server()
    other.start_server()
    info = json.loads(docker("inspect", user.container))[0]
    hc = info["HostConfig"]
    assert info["Config"]["User"] == "1000:1000"
    assert hc["CapDrop"] == ["ALL"] and not hc["CapAdd"]
    assert hc["SecurityOpt"] == ["no-new-privileges"]
    assert hc["Privileged"] is False
    # the limits gpulab.yaml sets (config/gpulab.yaml: 8g, 2 CPUs, 1024 processes, 2g shm)
    assert hc["PidsLimit"] == 1024
    assert hc["Memory"] == 8 * 1024**3
    assert hc["CpuQuota"] == 200_000 and hc["CpuPeriod"] == 100_000
    assert hc["ShmSize"] == 2 * 1024**3
    assert hc["IpcMode"] != "host" and hc["PidMode"] == "" and hc["NetworkMode"] == "gpulab"
    assert not hc["PortBindings"]  # publishes nothing on the host
    # its log rotates: 3 files of 10 MB at most (test_logs_are_bounded writes past it)
    assert hc["LogConfig"] == {"Type": "json-file",
                               "Config": {"max-size": "10m", "max-file": "3"}}
    assert all("docker.sock" not in m["Source"] for m in info["Mounts"])

    # What the member's own code sees inside it.
    seen = json.loads(user.run_code(PROBE).strip().splitlines()[-1])
    assert (seen["uid"], seen["euid"]) == (1000, 1000)
    assert seen["cap_eff"] == "0000000000000000" and seen["no_new_privs"] == "1"
    assert seen["docker_socket"] is False
    # Through the proxy, the user's own token is refused at the neighbour's server.
    through_proxy = requests.get(f"{hub.url}/user/{other.name}/api/contents",
                                 headers={"Authorization": f"token {user.token}"}, timeout=30)
    assert through_proxy.status_code == 403


def test_only_the_proxy_and_the_ssh_gateway_publish_a_port_and_on_loopback(hub):
    assert docker("port", "gpulab-proxy") == "8000/tcp -> 127.0.0.1:8000"
    assert docker("port", "gpulab-ssh") == "2222/tcp -> 127.0.0.1:2222"
    for name in INFRA_CONTAINERS:
        if name not in ("gpulab-proxy", "gpulab-ssh"):
            assert docker("port", name) == "", name


def test_proxy_api_answers_only_with_its_token(hub):
    """The hub reaches configurable-http-proxy's REST API with a generated token; without
    it, or with another, the proxy refuses (users cannot even connect: test_isolation)."""
    out = docker("exec", "gpulab-hub", "python3", "-c", (
        "import urllib.request, urllib.error\n"
        "token = open('/srv/gpulab/secrets/proxy-token').read().strip()\n"
        "def get(t):\n"
        "    r = urllib.request.Request('http://gpulab-proxy:8001/api/routes',"
        " headers={'Authorization': 'token ' + t} if t else {})\n"
        "    try:\n"
        "        return urllib.request.urlopen(r, timeout=5).status\n"
        "    except urllib.error.HTTPError as e:\n"
        "        return e.code\n"
        "print(get(''), get('0' * 64), get(token))\n"))
    assert out == "403 403 200"


def engine_socket() -> str:
    """The socket of the engine under test (a lane's: tests/lane_engine.py), as the host
    names it."""
    host = os.environ.get("DOCKER_HOST", "")
    return host.removeprefix("unix://") if host.startswith("unix://") else "/var/run/docker.sock"


def engine_volumes() -> str:
    return docker("info", "--format", "{{.DockerRootDir}}") + "/volumes"


@pytest.mark.parametrize("name", INFRA_CONTAINERS)
def test_infrastructure_containers_run_with_least_privilege(hub, name):
    info = json.loads(docker("inspect", name))[0]
    hc = info["HostConfig"]
    assert hc["ReadonlyRootfs"] is True, name
    assert hc["CapDrop"] == ["ALL"], name
    # netguard: its firewall rules; gpulab-backup: reading every member's files
    extra = {"gpulab-netguard": ["NET_ADMIN"], "gpulab-backup": ["DAC_OVERRIDE"]}
    assert (hc["CapAdd"] or []) == extra.get(name, []), name
    # Docker adds label=disable (no SELinux label) to the exporter, which needs the host's
    # PID namespace to map NVML's host PIDs to containers.
    expected = ["no-new-privileges:true"] + (["label=disable"] if hc["PidMode"] == "host" else [])
    assert hc["SecurityOpt"] == expected, name
    assert hc["PidMode"] == ("host" if name == "gpulab-exporter" else ""), name
    assert hc["Privileged"] is False and not hc["Devices"], name
    assert hc["LogConfig"] == {"Type": "json-file",  # its log rotates (test_logs.py)
                               "Config": {"max-size": "10m", "max-file": "3"}}, name
    user = info["Config"]["User"]
    if name in ("gpulab-hub", "gpulab-netguard", "gpulab-backup"):
        # root without capabilities (the hub owns its volume and secrets) / with the one
        # capability above
        assert user in ("", "0", "root"), (name, user)
    else:
        assert user not in ("", "0", "root") and not user.startswith("0:"), (name, user)
    mounts = {m["Destination"]: (m["Source"], m["RW"]) for m in info["Mounts"]}
    sockets = {d: v for d, v in mounts.items() if v[0].endswith(".sock")}
    if name.startswith("gpulab-docker-proxy"):
        # the socket file alone, read-only: not the host's /run
        assert sockets == {"/run/docker.sock": (engine_socket(), False)}, mounts
    else:
        assert sockets == {}, (name, mounts)
    assert not any(src in ("/", "/run", "/var/run") for src, _ in mounts.values()), mounts
    # Host paths are mounted read-only; only named volumes (the hub's database,
    # Prometheus' data) are writable, and the backup repository by gpulab-backup.
    writable = {d for d, (src, rw) in mounts.items() if rw and src.startswith("/")
                and "/volumes/" not in src}
    assert writable == ({"/backup"} if name == "gpulab-backup" else set()), (name, mounts)
    if name == "gpulab-backup":
        # every volume of the engine, to read homes as members come and go: read-only
        assert mounts["/volumes"] == (engine_volumes(), False), mounts


def test_similar_usernames_get_distinct_containers_and_volumes(hub, lab_user):
    tag = uuid.uuid4().hex[:6]
    users = [lab_user(name=f"{tag}{sep}ab") for sep in (".", "-", "_")]
    for u in users:
        u.start_server()
    containers = {u.container for u in users}
    volumes = {u.home_volume for u in users}
    assert len(containers) == 3 and len(volumes) == 3
    for u in users:
        labels = json.loads(docker("inspect", u.container))[0]["Config"]["Labels"]
        assert labels["org.gpulab.user"] == u.name
        mounts = json.loads(docker("inspect", u.container))[0]["Mounts"]
        assert any(m.get("Name") == u.home_volume for m in mounts)


def test_hub_reaches_docker_only_through_the_filtering_proxy(hub):
    mounts = json.loads(docker("inspect", "gpulab-hub"))[0]["Mounts"]
    assert all("docker.sock" not in m["Source"] for m in mounts)
    # What a compromised hub would try, through the only Docker API it can reach.
    attempt = (
        "import docker\n"
        "c = docker.APIClient(base_url='tcp://docker-proxy:2375', version='auto')\n"
        "out = []\n"
        "for call in (\n"
        "    lambda: c.create_container('gpulab/singleuser:latest', user='1000',\n"
        "        host_config=c.create_host_config(privileged=True, cap_drop=['ALL'],\n"
        "            security_opt=['no-new-privileges'])),\n"
        "    lambda: c.create_container('gpulab/singleuser:latest', user='1000',\n"
        "        host_config=c.create_host_config(binds=['/var/run/docker.sock:/s'],\n"
        "            cap_drop=['ALL'], security_opt=['no-new-privileges'])),\n"
        "    lambda: c.exec_create('gpulab-hub', 'id'),\n"
        "    lambda: c.pull('alpine'),\n"
        "):\n"
        "    try:\n"
        "        call(); out.append('allowed')\n"
        "    except docker.errors.APIError as e:\n"
        "        out.append(e.status_code)\n"
        "print(out, c.ping())\n"
    )
    out = docker("exec", "gpulab-hub", "python3", "-c", attempt)
    assert out == "[403, 403, 403, 403] True"


RAW_CREATE = r'''
import socket, sys
body = sys.stdin.buffer.read()
s = socket.create_connection(("docker-proxy", 2375), timeout=10)
s.sendall(b"POST /v1.41/containers/create?name=gpulab-user-rooted HTTP/1.1\r\nHost: docker\r\n"
          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
out = b""
while chunk := s.recv(65536):
    out += chunk
print(out.split(b"\r\n", 1)[0].decode())
'''


def test_the_reported_root_container_request_is_refused_by_the_deployed_proxy(hub):
    """The request of the original finding, byte for byte (a duplicate HostConfig and
    lower-case keys that dockerd reads and Python's json ignored), sent from inside the
    hub container to the proxy the stack runs."""
    body = (b'{"Image":"gpulab/singleuser:latest","User":"1000:1000","user":"",'
            b'"Cmd":["sleep","120"],"Labels":{"org.gpulab.managed":"true"},'
            b'"HostConfig":{"Binds":["/:/host"]},'
            b'"HostConfig":{"CapDrop":["ALL"],"SecurityOpt":["no-new-privileges"],'
            b'"capdrop":null,"securityopt":null}}')
    out = subprocess.run(["docker", "exec", "-i", "gpulab-hub", "python3", "-c", RAW_CREATE],
                         input=body, capture_output=True, timeout=60)
    status = out.stdout.decode().strip()
    try:
        assert status in ("HTTP/1.1 400 Bad Request", "HTTP/1.1 403 Forbidden"), status
    finally:
        created = docker("ps", "-aq", "--filter", "name=^/gpulab-user-rooted$")
        docker("rm", "-f", created, check=False) if created else None
    assert created == ""
