"""The users' network rules (gpulab.netguard): the pure rule list, the status that never
says "isolated" when the kernel does not filter bridged traffic, and the guard's
bookkeeping against a small in-memory iptables (the real one is exercised from inside
users' containers by tests/integration/test_isolation.py)."""

from __future__ import annotations

import ipaddress

import pytest

from gpulab.netguard import (
    TAG,
    Guard,
    Overlays,
    Status,
    SwarmStatus,
    bridge_filtering,
    gateway_rules,
    is_users_overlay,
    overlay_rules,
    route_subnets,
    rules,
)


def test_rules_accept_only_hub_and_proxy_traffic_then_drop():
    rs = rules("gpulab0", "172.30.0.2", "172.30.0.3")
    forward = [" ".join(r.spec) for r in rs if r.chain == "DOCKER-USER"]
    assert forward == [
        "-i gpulab0 -o gpulab0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        "-i gpulab0 -o gpulab0 -s 172.30.0.2/32 -j ACCEPT",
        "-i gpulab0 -o gpulab0 -s 172.30.0.3/32 -j ACCEPT",
        "-i gpulab0 -o gpulab0 -d 172.30.0.2/32 -p tcp -m tcp --dport 8081 -j ACCEPT",
        "-i gpulab0 -o gpulab0 -j DROP",
        "-i gpulab0 -d 169.254.0.0/16 -j DROP",
    ]
    host = [" ".join(r.spec) for r in rs if r.chain == "INPUT"]
    assert host == ["-i gpulab0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                    "-i gpulab0 -j DROP"]
    assert all(r.args()[-2:] == ["--comment", TAG] for r in rs)


@pytest.mark.parametrize("bad", ["", "hub", "172.30.0.300", "172.30.0.2; rm -rf /"])
def test_addresses_must_be_addresses(bad):
    with pytest.raises(ValueError):
        rules("gpulab0", bad, "172.30.0.3")


@pytest.mark.parametrize("missing, filtering, isolated, words", [
    (0, True, True, "isolated (rules in place"),
    (1, True, False, "NOT isolated: 1 rule(s) missing"),
    (0, False, False, "bridge-nf-call-iptables is 0"),
    (0, None, False, "br_netfilter not loaded"),
])
def test_status_never_claims_isolation_the_kernel_does_not_give(missing, filtering, isolated,
                                                                words):
    status = Status(missing, filtering)
    assert status.isolated is isolated
    assert words in status.message()


def test_bridge_filtering_reads_the_sysctl(tmp_path):
    f = tmp_path / "bridge-nf-call-iptables"
    f.write_text("1\n")
    assert bridge_filtering(f) is True
    f.write_text("0\n")
    assert bridge_filtering(f) is False
    assert bridge_filtering(tmp_path / "absent") is None


class FakeIptables:
    """Chains as lists of rule argument tuples; answers -C/-I/-D like iptables does."""

    def __init__(self):
        self.chains = {"DOCKER-USER": [("-j", "RETURN")], "INPUT": [("-j", "OTHER")],
                       "FORWARD": [("-j", "ACCEPT-ALL")]}

    def __call__(self, argv):
        _, op, chain, *rest = argv
        table = self.chains[chain]
        if op == "-C":
            return 0 if tuple(rest) in table else 1
        if op == "-I":
            pos, *spec = rest
            table.insert(int(pos) - 1, tuple(spec))
            return 0
        if op == "-D":
            if tuple(rest) in table:
                table.remove(tuple(rest))
                return 0
            return 1
        raise AssertionError(argv)


def test_guard_installs_in_order_repairs_and_removes_only_its_own():
    fake = FakeIptables()
    wanted = rules("gpulab0", "172.30.0.2", "172.30.0.3")
    guard = Guard(wanted, "iptables", run=fake)
    assert guard.apply() == len(wanted)
    ours = [tuple(r.args()[1:]) for r in wanted if r.chain == "DOCKER-USER"]
    assert fake.chains["DOCKER-USER"] == [*ours, ("-j", "RETURN")]
    assert guard.apply() == 0  # idempotent

    fake.chains["DOCKER-USER"].remove(ours[2])  # a firewall reload loses one
    assert guard.apply() == 1
    assert fake.chains["DOCKER-USER"] == [*ours, ("-j", "RETURN")]  # order restored

    guard.remove()
    assert fake.chains == {"DOCKER-USER": [("-j", "RETURN")], "INPUT": [("-j", "OTHER")],
                           "FORWARD": [("-j", "ACCEPT-ALL")]}



# ------------------------------------------------------------------ a Swarm machine

def test_overlay_rules_close_br0_inside_the_overlay_namespace():
    rs = overlay_rules("172.30.0.250", "172.30.0.251")
    assert [(r.chain, " ".join(r.spec)) for r in rs] == [
        ("FORWARD", "-i br0 -o br0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
        ("FORWARD", "-i br0 -o br0 -s 172.30.0.250/32 -j ACCEPT"),
        ("FORWARD", "-i br0 -o br0 -s 172.30.0.251/32 -j ACCEPT"),
        ("FORWARD", "-i br0 -o br0 -d 172.30.0.250/32 -p tcp -m tcp --dport 8081 -j ACCEPT"),
        ("FORWARD", "-i br0 -o br0 -j DROP"),
        ("INPUT", "-i br0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
        ("INPUT", "-i br0 -j DROP"),
    ]


def test_gateway_rules_keep_overlay_containers_off_the_machines_and_swarm_ports():
    rs = gateway_rules()
    assert [(r.chain, " ".join(r.spec)) for r in rs] == [
        ("DOCKER-USER", "-i docker_gwbridge -d 169.254.0.0/16 -j DROP"),
        ("INPUT", "-i docker_gwbridge -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
        ("INPUT", "-i docker_gwbridge -j DROP"),
        ("DOCKER-USER", "-i docker_gwbridge -o docker_gwbridge -j DROP"),
        ("DOCKER-USER", "-i docker_gwbridge -p tcp -m multiport --dports 2377,7946,9445 "
                        "-j DROP"),
        ("DOCKER-USER", "-i docker_gwbridge -p udp -m multiport --dports 4789,7946 -j DROP"),
    ]


ROUTES = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
br0\t00001EAC\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
"""
INGRESS_ROUTES = ROUTES.replace("00001EAC", "0000000A")  # 10.0.0.0/24


def test_the_users_overlay_is_told_by_its_br0_subnet():
    assert route_subnets(ROUTES, "br0") == {ipaddress.IPv4Network("172.30.0.0/24")}
    assert is_users_overlay(ROUTES, "172.30.0.0/24") is True
    assert is_users_overlay(INGRESS_ROUTES, "172.30.0.0/24") is False
    assert is_users_overlay(ROUTES.splitlines()[0], "172.30.0.0/24") is None  # no br0 yet
    assert is_users_overlay(None, "172.30.0.0/24") is None  # unreadable (gone)


class FakeNamespaces:
    """Several network namespaces, each with its FakeIptables, entered through nsenter."""

    def __init__(self, routes: dict[str, str | None], filtering: str = "1\n"):
        self.routes = routes
        self.filtering = filtering
        self.tables: dict[str, FakeIptables] = {}

    def run(self, argv):
        nsenter, net, *rest = argv
        assert nsenter == "nsenter" and net.startswith("--net=")
        table = self.tables.setdefault(net[len("--net="):], FakeIptables())
        return table(rest)

    def read(self, path, file):
        if file == "/proc/net/route":
            return self.routes.get(path.rsplit("/", 1)[1])
        return self.filtering


def test_overlays_close_each_namespace_of_the_users_overlay_as_it_appears(tmp_path):
    (tmp_path / "1-users00000").touch()
    (tmp_path / "1-ingress000").touch()
    (tmp_path / "ingress_sbox").touch()  # not an overlay's namespace: never entered
    (tmp_path / "1-settingup0").touch()
    spaces = FakeNamespaces({"1-users00000": ROUTES, "1-ingress000": INGRESS_ROUTES,
                             "1-settingup0": ROUTES.splitlines()[0]})
    wanted = overlay_rules("172.30.0.250", "172.30.0.251")
    overlays = Overlays(tmp_path, "172.30.0.0/24", wanted, "iptables", run=spaces.run,
                        read=spaces.read)
    assert overlays.scan(apply=False) == ["1-users00000"]  # `status` only looks
    assert overlays.status()[0][1].rules_missing == len(wanted)
    overlays.guards.clear()
    assert overlays.scan() == ["1-users00000"]
    assert set(spaces.tables) == {str(tmp_path / "1-users00000")}
    forward = spaces.tables[str(tmp_path / "1-users00000")].chains["FORWARD"]
    assert forward[:5] == [tuple(r.args()[1:]) for r in wanted if r.chain == "FORWARD"]
    assert overlays.scan() == []  # known

    # the namespace Docker was still setting up gets its br0: the users' overlay, a later
    # epoch of it (libnetwork counts set-ups in the name)
    (tmp_path / "2-settingup0").touch()
    spaces.routes["2-settingup0"] = ROUTES
    assert overlays.scan() == ["2-settingup0"]
    spaces.routes["1-settingup0"] = ROUTES.replace("00001EAC", "00001FAC")  # another overlay
    assert overlays.scan() == []
    assert list(overlays.others.values()) == ["10.0.0.0/24", "172.31.0.0/24"]
    (tmp_path / "2-settingup0").unlink()
    assert overlays.scan() == []
    assert [name for name, _ in overlays.status()] == ["1-users00000"]
    assert all(s.isolated for _, s in overlays.status())

    # the last member's server here stops (the namespace goes), then one starts again:
    # Docker makes a new namespace under the same name
    (tmp_path / "1-users00000").unlink()
    assert overlays.scan() == [] and overlays.status() == ()
    (tmp_path / "1-users00000").touch()
    del spaces.tables[str(tmp_path / "1-users00000")]
    assert overlays.scan() == ["1-users00000"]
    assert overlays.apply() == 0

    overlays.remove()
    assert spaces.tables[str(tmp_path / "1-users00000")].chains["FORWARD"] == [
        ("-j", "ACCEPT-ALL")]


def test_a_swarm_machine_is_isolated_only_when_every_namespace_filters_bridged_traffic(
        tmp_path):
    (tmp_path / "1-users00000").touch()
    spaces = FakeNamespaces({"1-users00000": ROUTES}, filtering="0\n")
    overlays = Overlays(tmp_path, "172.30.0.0/24", overlay_rules("172.30.0.250",
                        "172.30.0.251"), "iptables", run=spaces.run, read=spaces.read)
    overlays.scan()
    status = SwarmStatus(0, overlays.status())
    assert not status.isolated
    assert "overlay namespace 1-users00000: net.bridge.bridge-nf-call-iptables is 0" in \
        status.message()
    spaces.filtering = "1\n"
    assert SwarmStatus(0, overlays.status()).isolated
    assert "1 namespace(s) of the overlay 172.30.0.0/24 here" in SwarmStatus(
        0, overlays.status()).message()
    # another overlay's namespace (Swarm's ingress, or a subnet that does not match the
    # manager's) is named, so that a mismatch shows
    assert "other overlays here: 10.0.0.0/24" in SwarmStatus(
        0, (), others=("10.0.0.0/24",)).message()
    assert "docker_gwbridge rule(s) missing" in SwarmStatus(2, overlays.status()).message()
    idle = SwarmStatus(0, ())
    assert idle.isolated and "no member's server on this machine yet" in idle.message()
