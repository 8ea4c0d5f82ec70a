"""Containers and network, hardened by default: checked with `docker inspect` and from
inside a user's own container, as a curious student would try."""

from __future__ import annotations

import json
import uuid

import requests

from .stack import docker

TCP = r'''
import socket
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "open"
    except socket.gaierror:
        return "no such host"
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        return "unreachable" if "timed out" in str(e) or "unreachable" in str(e) else repr(e)
'''

PROBE = TCP + r'''
import json, os, urllib.request
lines = open("/proc/self/status").read().splitlines()
status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
hub_api = urllib.request.urlopen("http://gpulab-hub:8081/hub/api", timeout=5).status
print(json.dumps({
    "uid": os.getuid(), "euid": os.geteuid(),
    "cap_eff": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
    "hub_api": hub_api,
    "proxy_api": tcp("gpulab-hub", 8001),
    "exporter_by_name": tcp("exporter", 9445),
    "exporter_by_ip": tcp(EXPORTER_IP, 9445),
    "prometheus_by_ip": tcp(PROMETHEUS_IP, 9090),
    "docker_socket": os.path.exists("/var/run/docker.sock"),
}))
'''


def monitoring_ip(container: str) -> str:
    nets = json.loads(docker("inspect", container))[0]["NetworkSettings"]["Networks"]
    return nets["gpulab-monitoring"]["IPAddress"]


def test_user_container_is_hardened_and_cannot_reach_what_is_not_theirs(hub, lab_user):
    user, other = lab_user("student"), lab_user("neighbour")
    user.start_server()
    other.start_server()
    info = json.loads(docker("inspect", user.container))[0]
    hc = info["HostConfig"]
    assert info["Config"]["User"] == "1000:1000"
    assert hc["CapDrop"] == ["ALL"] and not hc["CapAdd"]
    assert hc["SecurityOpt"] == ["no-new-privileges"]
    assert hc["Privileged"] is False
    assert hc["PidsLimit"] == 1024 and hc["Memory"] > 0 and hc["NanoCpus"] + hc["CpuQuota"] > 0
    assert hc["IpcMode"] != "host" and hc["PidMode"] == "" and hc["NetworkMode"] == "gpulab"
    assert not hc["PortBindings"]  # publishes nothing on the host
    assert all("docker.sock" not in m["Source"] for m in info["Mounts"])

    code = PROBE.replace("EXPORTER_IP", repr(monitoring_ip("gpulab-exporter"))) \
                .replace("PROMETHEUS_IP", repr(monitoring_ip("gpulab-prometheus")))
    seen = json.loads(user.run_code(code).strip().splitlines()[-1])
    assert (seen["uid"], seen["euid"]) == (1000, 1000)
    assert seen["cap_eff"] == "0000000000000000" and seen["no_new_privs"] == "1"
    assert seen["hub_api"] == 200  # the hub API (and DNS) work
    assert seen["proxy_api"] == "refused"  # the proxy's REST API listens on loopback only
    assert seen["exporter_by_name"] == "no such host"
    assert seen["exporter_by_ip"] == "unreachable"
    assert seen["prometheus_by_ip"] == "unreachable"
    assert seen["docker_socket"] is False

    # The neighbour's server is on the same network, but no packet passes between two
    # users' containers (scripts/isolate-users.sh); through the proxy, the user's own
    # token is refused there.
    ip = json.loads(docker("inspect", other.container))[0]["NetworkSettings"]["Networks"][
        "gpulab"]["IPAddress"]
    neighbour = user.run_code(TCP + f"print(tcp({ip!r}, 8888))\n")
    assert neighbour.strip() == "unreachable"
    through_proxy = requests.get(f"{hub.url}/user/{other.name}/api/contents",
                                 headers={"Authorization": f"token {user.token}"}, timeout=30)
    assert through_proxy.status_code == 403


def test_published_ports_are_loopback_only(hub):
    assert docker("port", "gpulab-hub") == "8000/tcp -> 127.0.0.1:8000"
    assert docker("port", "gpulab-exporter") == ""
    assert docker("port", "gpulab-prometheus") == ""


def test_proxy_api_requires_its_generated_token(hub):
    out = docker("exec", "gpulab-hub", "python3", "-c",
                 "import urllib.request, urllib.error\n"
                 "try:\n    urllib.request.urlopen('http://127.0.0.1:8001/api/routes', timeout=5)\n"
                 "    print('open')\n"
                 "except urllib.error.HTTPError as e:\n    print(e.code)\n")
    assert out == "403"


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
