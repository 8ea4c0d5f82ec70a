"""The users' network, attacked from inside a user's own container.

A member's code can open any TCP connection it likes. From their server it must reach
the hub's API and the outside world, and nothing else: not another member's server,
not the proxy's REST API or the hub's other ports, not any service on the host, not a
link-local (cloud metadata) address. Each "blocked" is paired with a control that shows
the same target answering from somewhere else, so a dead listener cannot pass for a
firewall. The link-local target is a listener in a network namespace this test makes
(never a real metadata service).
"""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import threading
import time
import uuid

import pytest
import yaml

from .lan import StandInLan, connects
from .probes import TCP, probe
from .stack import container_logs, docker, wait_for


def probe_from_default_bridge(host: str, port: int) -> str:
    """The same probe from a throwaway container on Docker's default bridge (not gpulab's)."""
    code = TCP + f"print(tcp({host!r}, {port}))"
    return docker("run", "--rm", "gpulab/base:bookworm", "python3", "-c", code)


def ip_on(container: str, network: str) -> str:
    return json.loads(docker("inspect", container))[0]["NetworkSettings"]["Networks"][
        network]["IPAddress"]


class Listener:
    """A TCP listener that accepts and closes, in the host's namespace or a netns."""

    def __init__(self, address: str = "0.0.0.0"):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self):
        self.sock.close()


@pytest.fixture
def host_listener():
    listener = Listener("0.0.0.0")
    yield listener
    listener.close()


# The lab's network, stood in by a namespace of the test's (tests/integration/lan.py): a
# machine on each closed range, one the admin opens, and a public-range stand-in
# (TEST-NET-2) for the internet, which stays open. Not TEST-NET-3: the machines this was
# written on answer every outside name with an address there.
LAB_NAS, OPENED, CGNAT, PRINTER, OTHER_LAB = ("10.99.0.2", "10.99.1.2", "100.64.99.2",
                                              "192.168.250.2", "172.16.99.2")
METADATA, PUBLIC = "169.254.77.2", "198.51.100.2"
PORT, OTHER_PORT, DNS = 18080, 18081, 53


@pytest.fixture(scope="module")
def lan():
    with StandInLan([LAB_NAS, OPENED, CGNAT, PRINTER, OTHER_LAB, METADATA, PUBLIC],
                    [PORT, OTHER_PORT, DNS]) as lan:
        yield lan


@pytest.fixture
def network_allow(lab_config):
    """Set gpulab.yaml's network.allow (on top of the admin's own file), as an admin does."""

    def set_(entries: list[str]):
        doc = yaml.safe_load(lab_config.original("gpulab.yaml")) or {}
        doc.setdefault("network", {})["allow"] = entries
        lab_config.write("gpulab.yaml", yaml.safe_dump(doc))

    yield set_
    lab_config.restore()


def test_users_reach_the_hub_api_and_nothing_else_of_the_stack(hub, lab_user):
    user, other = lab_user("student"), lab_user("neighbour")
    user.start_server()
    other.start_server()
    seen = probe(user, {
        "hub_api": ("gpulab-hub", 8081),
        "hub_dashboard_port": ("gpulab-hub", 9447),
        "proxy_api": ("gpulab-proxy", 8001),
        "proxy_public": ("gpulab-proxy", 8000),
        "neighbour": (ip_on(other.container, "gpulab"), 8888),
        "exporter": ("exporter", 9445),
        "docker_proxy": ("docker-proxy", 2375),
        "prometheus_by_ip": (ip_on("gpulab-prometheus", "gpulab-monitoring"), 9090),
        "ssh_gateway_by_ip": (ip_on("gpulab-ssh", "gpulab-ssh"), 2222),
        "ssh_gateway": ("gpulab-ssh", 2222),
    })
    assert seen == {
        "hub_api": "open",
        "hub_dashboard_port": "unreachable",
        "proxy_api": "unreachable",
        "proxy_public": "unreachable",
        "neighbour": "unreachable",
        "exporter": "no such host",
        "docker_proxy": "no such host",
        "prometheus_by_ip": "unreachable",
        "ssh_gateway_by_ip": "unreachable",
        "ssh_gateway": "no such host",
    }
    # Controls: those ports do answer, to whom they are for.
    # (the dashboard listens on the hub's address on the gpulab network, where the proxy
    # reaches it: gpulab.hubconfig, service "gpus")
    hub_side = docker("exec", "gpulab-hub", "python3", "-c", TCP + (
        f"print(tcp('gpulab-proxy', 8001), tcp({ip_on('gpulab-hub', 'gpulab')!r}, 9447), "
        f"tcp({ip_on(other.container, 'gpulab')!r}, 8888))"))
    assert hub_side == "open open open"


def gateway(network: str) -> str:
    """The host's address on a Docker bridge network. Its IPAM config names it, except
    after dockerd restarted on a bridge that already existed (CI's run saw the default
    bridge without a Gateway then): the bridge's own address is the same one."""
    [info] = json.loads(docker("network", "inspect", network))
    named = (info["IPAM"]["Config"] or [{}])[0].get("Gateway")
    if named:
        return named
    bridge = info["Options"].get("com.docker.network.bridge.name") or f"br-{info['Id'][:12]}"
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", bridge],
                         capture_output=True, text=True, check=True).stdout
    return out.split()[3].split("/")[0]


def test_users_cannot_reach_the_host(hub, lab_user, host_listener):
    user = lab_user("prober")
    user.start_server()
    users_gateway = gateway("gpulab")
    assert connects("127.0.0.1", host_listener.port)  # control: it listens
    default_bridge = gateway("bridge")
    assert probe_from_default_bridge(default_bridge, host_listener.port) == "open"  # control
    seen = probe(user, {"gateway": (users_gateway, host_listener.port),
                        "docker0": (default_bridge, host_listener.port)})
    assert seen == {"gateway": "unreachable", "docker0": "unreachable"}


def test_members_reach_nothing_on_the_labs_private_networks_unless_an_admin_opens_it(
        hub, lab_user, lan, network_allow):
    """A member's code tries the lab's NAS, its printers, another lab's machine, a
    carrier-grade NAT address and a metadata service, on the service port and on DNS's:
    only DNS answers. The same hosts answer a container on Docker's default bridge (the
    control: routed and listening), and the public-range stand-in answers her too. Her
    server has no IPv6 either (Docker takes it off its port), so no fe80:: address opens
    what IPv4 closes; netguard's ip6tables rules would hold the same closures. Then an
    admin opens the NAS on one port in network.allow: within seconds, without a restart,
    that port answers her and its other ports and the lab's other machines do not; taking
    the line out closes it again."""
    user = lab_user("lanprober")
    user.start_server()
    closed = {f"{name}": (host, PORT) for name, host in [
        ("nas", LAB_NAS), ("cgnat", CGNAT), ("printer", PRINTER), ("other_lab", OTHER_LAB),
        ("metadata", METADATA), ("opened", OPENED)]}
    targets = {**closed, "nas_dns": (LAB_NAS, DNS), "public": (PUBLIC, PORT)}
    for name, (host, port) in targets.items():  # controls
        assert probe_from_default_bridge(host, port) == "open", name
    seen = probe(user, {**targets, "ula": ("fd00:99::2", PORT)})
    assert seen == {**dict.fromkeys(closed, "unreachable"), "nas_dns": "open",
                    "public": "open",
                    # no IPv6 address to send from at all
                    "ula": "OSError(99, 'Cannot assign requested address')"}
    assert user.run_code("print(open('/proc/net/if_inet6').read().split())").strip() in (
        "[]", str(["00000000000000000000000000000001", "01", "80", "10", "80", "lo"]))
    rules = subprocess.run(["ip6tables", "-S", "FORWARD"], capture_output=True,
                           text=True).stdout
    assert "-A FORWARD -i gpulab0 -o gpulab0 -m comment --comment gpulab-netguard -j DROP" \
        in rules, rules

    # an admin opens the NAS's one port
    network_allow([f"{OPENED}:{PORT}"])
    wait_for(lambda: probe(user, {"opened": (OPENED, PORT)})["opened"] == "open", 30,
             what=f"netguard to open {OPENED}:{PORT}")
    opened = {"opened": (OPENED, PORT), "other_port": (OPENED, OTHER_PORT),
              "nas": (LAB_NAS, PORT)}
    assert probe(user, opened) == {"opened": "open", "other_port": "unreachable",
                                   "nas": "unreachable"}
    status = docker("exec", "gpulab-netguard", "gpulab-netguard", "status")
    assert f"DNS (port 53) and {OPENED}/32:{PORT}" in status, status
    network_allow([])
    wait_for(lambda: probe(user, {"opened": (OPENED, PORT)})["opened"] == "unreachable",
             30, what=f"netguard to close {OPENED}:{PORT} again")
    logs = container_logs("gpulab-netguard", 40)
    assert f"network.allow opens now: {OPENED}/32:{PORT}" in logs, logs
    assert f"network.allow opens now: nothing (was: {OPENED}/32:{PORT})" in logs, logs


def test_the_hub_still_reaches_the_labs_network(hub, lan):
    """The hub's own connections (the lab's directory, SMTP, an identity provider) leave
    through the users' bridge too: they are not members' and stay open."""
    hub_side = docker("exec", "gpulab-hub", "python3", "-c",
                      TCP + f"print(tcp({LAB_NAS!r}, {PORT}), tcp({PRINTER!r}, {PORT}))")
    assert hub_side == "open open"


def test_the_network_refuses_container_to_container_traffic_at_the_docker_level(hub):
    options = json.loads(docker("network", "inspect", "gpulab"))[0]["Options"]
    assert options["com.docker.network.bridge.enable_icc"] == "false"
    status = docker("exec", "gpulab-netguard", "gpulab-netguard", "status")
    assert status.startswith("users' network isolated"), status


def test_a_lost_rule_is_put_back(hub):
    """A firewall reload that drops one of the rules: netguard restores it, and says so."""
    rule = ["DOCKER-USER", "-i", "gpulab0", "-o", "gpulab0", "-m", "comment", "--comment",
            "gpulab-netguard", "-j", "DROP"]
    subprocess.run(["iptables", "-C", *rule], check=True)
    subprocess.run(["iptables", "-D", *rule], check=True)
    wait_for(lambda: subprocess.run(["iptables", "-C", *rule]).returncode == 0, 30,
             interval=0.5, what="netguard to put the rule back")
    time.sleep(0.5)
    assert "had disappeared" in subprocess.run(
        ["docker", "logs", "--tail", "20", "gpulab-netguard"], capture_output=True,
        text=True).stdout


def test_members_servers_never_get_the_hub_or_proxy_address(hub):
    """gpulab-netguard trusts two addresses on the users' network: the hub's and the
    proxy's. They sit outside the range Docker hands out to containers (GPULAB_IP_RANGE),
    so a member's server can never be given one, even when the proxy is recreated while
    a server starts. dockerd 20.10 here hands out the lowest free address of the range
    (seen: one container connected twice got the same address), so the proof is a range
    filled up: on the real network, servers' addresses are in the range and the two are
    not; on a network made the same way with a range of 6 addresses, filling it gives 6
    containers 6 in-range addresses and the seventh a refusal, never the addresses above
    the range."""
    [ipam] = json.loads(docker("network", "inspect", "gpulab"))[0]["IPAM"]["Config"]
    assert ipam.get("IPRange"), f"the users' network has no ip_range: {ipam}"
    pool = ipaddress.ip_network(ipam["IPRange"])
    trusted = {ip_on("gpulab-hub", "gpulab"), ip_on("gpulab-proxy", "gpulab")}
    assert not any(ipaddress.ip_address(ip) in pool for ip in trusted), (trusted, pool)
    servers = json.loads(docker("network", "inspect", "gpulab"))[0]["Containers"].values()
    for c in servers:
        if c["Name"].startswith("gpulab-user-"):
            assert ipaddress.ip_interface(c["IPv4Address"]).ip in pool, c

    tag = uuid.uuid4().hex[:6]
    net = f"gpulab-test-range-{tag}"
    # as docker-compose.yml makes the users' network, small: .0/28, range .0/29, and two
    # addresses above the range taken the way the hub and the proxy take theirs
    docker("network", "create", "--subnet", "198.18.250.0/28", "--ip-range",
           "198.18.250.0/29", net)
    made, given = [], []
    try:
        for above in ("198.18.250.13", "198.18.250.14"):
            name = f"{net}-fixed-{above.rsplit('.', 1)[1]}"
            docker("run", "-d", "--network", net, "--ip", above, "--name", name, "--init",
                   "gpulab/base:bookworm", "sleep", "600")
            made.append(name)
        for i in range(7):
            name = f"{net}-{i}"
            out = subprocess.run(["docker", "run", "-d", "--network", net, "--name", name,
                                  "--init", "gpulab/base:bookworm", "sleep", "600"],
                                 capture_output=True, text=True, timeout=60)
            made.append(name)
            if out.returncode != 0:
                refusal = out.stderr
                break
            given.append(ip_on(name, net))
        else:
            refusal = ""
    finally:
        docker("rm", "-f", *made, check=False)
        docker("network", "rm", net, check=False)
    range_ = ipaddress.ip_network("198.18.250.0/29")
    print(f"the range's addresses went to {given}; then: {refusal.strip()[:120]}")
    assert all(ipaddress.ip_address(ip) in range_ for ip in given), given
    assert len(given) == 6 and "no available IPv4 addresses" in refusal, (given, refusal)
