"""The users' network rules (gpulab.netguard): the pure rule list, the status that never
says "isolated" when the kernel does not filter bridged traffic, and the guard's
bookkeeping against a small in-memory iptables (the real one is exercised from inside
users' containers by tests/integration/test_isolation.py)."""

from __future__ import annotations

import ipaddress

import pytest

from gpulab.netguard import (
    TAG,
    Allowed,
    Guard,
    OneHost,
    Overlays,
    Status,
    SwarmStatus,
    bridge_filtering,
    gateway_rules,
    is_users_overlay,
    openings,
    overlay_rules,
    route_subnets,
    rules,
    v6_rules,
)

PRIVATE_DROPS = ["-i gpulab0 -d 10.0.0.0/8 -j DROP", "-i gpulab0 -d 172.16.0.0/12 -j DROP",
                 "-i gpulab0 -d 192.168.0.0/16 -j DROP", "-i gpulab0 -d 100.64.0.0/10 -j DROP",
                 "-i gpulab0 -d 169.254.0.0/16 -j DROP"]


def dns(bridge: str, *networks: str) -> list[str]:
    return [f"-i {bridge} -d {n} -p {p} -m {p} --dport 53 -j ACCEPT"
            for n in networks for p in ("tcp", "udp")]


def test_rules_accept_only_hub_and_proxy_traffic_then_drop():
    rs = rules("gpulab0", "172.30.0.2", "172.30.0.3")
    forward = [" ".join(r.spec) for r in rs if r.chain == "DOCKER-USER"]
    assert forward == [
        "-i gpulab0 -o gpulab0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        "-i gpulab0 -o gpulab0 -s 172.30.0.2/32 -j ACCEPT",
        "-i gpulab0 -o gpulab0 -s 172.30.0.3/32 -j ACCEPT",
        "-i gpulab0 -o gpulab0 -d 172.30.0.2/32 -p tcp -m tcp --dport 8081 -j ACCEPT",
        "-i gpulab0 -o gpulab0 -j DROP",
        # the lab's private networks: the hub's and the proxy's own connections, DNS, the
        # rest dropped
        "-i gpulab0 -s 172.30.0.2/32 -j ACCEPT",
        "-i gpulab0 -s 172.30.0.3/32 -j ACCEPT",
        *dns("gpulab0", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
             "169.254.0.0/16"),
        *PRIVATE_DROPS,
    ]
    host = [" ".join(r.spec) for r in rs if r.chain == "INPUT"]
    assert host == ["-i gpulab0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                    "-i gpulab0 -j DROP"]
    assert all(r.args()[-2:] == ["--comment", TAG] for r in rs)


def test_openings_come_before_the_drops_by_port_or_whole():
    nas, ldap = ipaddress.ip_network("10.0.5.20/32"), ipaddress.ip_network("10.0.6.0/24")
    rs = rules("gpulab0", "172.30.0.2", "172.30.0.3", openings=[(nas, 2049), (ldap, None)])
    forward = [" ".join(r.spec) for r in rs if r.chain == "DOCKER-USER"]
    first_drop = forward.index(PRIVATE_DROPS[0])
    assert forward[7:10] == ["-i gpulab0 -d 10.0.5.20/32 -p tcp -m tcp --dport 2049 -j ACCEPT",
                             "-i gpulab0 -d 10.0.5.20/32 -p udp -m udp --dport 2049 -j ACCEPT",
                             "-i gpulab0 -d 10.0.6.0/24 -j ACCEPT"]
    assert forward[first_drop:] == PRIVATE_DROPS


def test_ipv6_is_held_to_the_same_closures():
    ula = ipaddress.ip_network("fd00:5::/64")
    assert [(r.chain, " ".join(r.spec)) for r in v6_rules("gpulab0", [(ula, 22)])] == [
        ("FORWARD", "-i gpulab0 -o gpulab0 -j DROP"),
        ("FORWARD", "-i gpulab0 -d fd00:5::/64 -p tcp -m tcp --dport 22 -j ACCEPT"),
        ("FORWARD", "-i gpulab0 -d fd00:5::/64 -p udp -m udp --dport 22 -j ACCEPT"),
        *[("FORWARD", r) for r in dns("gpulab0", "fc00::/7", "fe80::/10")],
        ("FORWARD", "-i gpulab0 -d fc00::/7 -j DROP"),
        ("FORWARD", "-i gpulab0 -d fe80::/10 -j DROP"),
        ("INPUT", "-i gpulab0 -j DROP"),
    ]


def allow(*entries: str):
    from gpulab.settings import defaults, parse_destination
    return defaults().with_values({"network.allow": tuple(map(parse_destination, entries))})


def test_openings_resolve_names_and_refuse_the_users_own_network():
    names = {"nas.lab.example": ["10.0.5.20", "fd00::20"], "public.example": ["203.0.113.9"],
             "users.lab.example": ["172.30.0.7"]}

    def resolve(host):
        if host not in names:
            raise OSError("Name or service not known")
        return names[host]

    opened, problems = openings(allow("nas.lab.example:2049", "10.9.0.0/16",
                                      "public.example:443", "users.lab.example:22",
                                      "gone.lab.example:636", "172.30.0.0/28"), resolve)
    assert opened == [(ipaddress.ip_network("10.0.5.20/32"), 2049),
                      (ipaddress.ip_network("fd00::20/128"), 2049),
                      (ipaddress.ip_network("10.9.0.0/16"), None)]
    assert problems == [
        "network.allow: users.lab.example:22 stays closed: 172.30.0.7/32 is on the users' "
        "own network (172.30.0.0/24), where members never reach each other",
        "network.allow: gone.lab.example:636 stays closed: gone.lab.example does not "
        "resolve (Name or service not known)",
        "network.allow: 172.30.0.0/28 stays closed: 172.30.0.0/28 is on the users' own "
        "network (172.30.0.0/24), where members never reach each other",
    ]


def test_allowed_reads_the_file_again_and_keeps_the_last_good_edit(tmp_path, caplog):
    f = tmp_path / "gpulab.yaml"
    allowed = Allowed(str(f), "172.30.0.0/24", resolve=lambda host: [])
    assert allowed.now() == []  # no file: nothing opened
    f.write_text("network:\n  allow: [10.0.5.20:2049]\n")
    assert allowed.now() == [(ipaddress.ip_network("10.0.5.20/32"), 2049)]
    f.write_text("network:\n  allow: [10.0.5.20:99999]\n")  # a typo: the last good stays
    assert allowed.now() == [(ipaddress.ip_network("10.0.5.20/32"), 2049)]
    assert "gpulab.yaml:2: network.allow: '10.0.5.20:99999': the port must be a number " \
           "from 1 to 65535" in caplog.text
    f.write_text("network:\n  allow: []\n")
    assert allowed.now() == []
    assert Allowed(None, "172.30.0.0/24").now() == []


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
            if len(rest) == 1 and rest[0].isdigit():  # by number
                del table[int(rest[0]) - 1]
                return 0
            if tuple(rest) in table:
                table.remove(tuple(rest))
                return 0
            return 1
        raise AssertionError(argv)

    def output(self, argv):
        """``-S CHAIN``, each rule's options in an order of iptables' own (as the real
        one lists ``-d X -i Y`` for ``-i Y -d X``): here, the pairs reversed."""
        _, op, chain = argv
        assert op == "-S"
        return "\n".join([f"-P {chain} ACCEPT", *(f"-A {chain} " + " ".join(reordered(spec))
                                                  for spec in self.chains[chain])])


def reordered(spec):
    pairs = [spec[i:i + 2] for i in range(0, len(spec), 2)]
    return [token for pair in reversed(pairs) for token in pair]


def test_guard_installs_in_order_repairs_and_removes_only_its_own():
    fake = FakeIptables()
    wanted = rules("gpulab0", "172.30.0.2", "172.30.0.3")
    guard = Guard(wanted, "iptables", run=fake, output=fake.output)
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



class Recording(FakeIptables):
    """Keeps each chain as it stood after every command."""

    def __init__(self):
        super().__init__()
        self.states = []

    def __call__(self, argv):
        code = super().__call__(argv)
        self.states.append({k: list(v) for k, v in self.chains.items()})
        return code


def test_a_listed_rule_is_known_whatever_order_iptables_lists_its_options_in():
    from gpulab.netguard import canonical

    ours = ["-i", "gpulab0", "-d", "10.0.0.0/8", "-p", "tcp", "-m", "tcp", "--dport", "53",
            "-m", "comment", "--comment", "gpulab-netguard", "-j", "ACCEPT"]
    listed = ("-d 10.0.0.0/8 -i gpulab0 -p tcp -m tcp --dport 53 -m comment --comment "
              "gpulab-netguard -j ACCEPT").split()
    assert canonical(ours) == canonical(listed)
    assert canonical(ours) != canonical([*listed[:-1], "DROP"])
    assert canonical(ours) != canonical(listed[2:])  # -d missing


def test_an_edit_of_network_allow_changes_the_openings_and_nothing_opens_meanwhile():
    fake = Recording()
    host = OneHost("gpulab0", "172.30.0.2", "172.30.0.3", "iptables", "ip6tables",
                   run=fake, output=fake.output)
    nas = (ipaddress.ip_network("10.0.5.20/32"), 2049)
    ldap = (ipaddress.ip_network("10.0.6.0/24"), None)
    assert host.open([nas]) is True
    assert host.open([nas]) is False  # unchanged: nothing done
    v4 = [tuple(r.args()[1:]) for r in host.guards[0].wanted if r.chain == "DOCKER-USER"]
    assert fake.chains["DOCKER-USER"] == [*v4, ("-j", "RETURN")]
    fake.states.clear()

    assert host.open([ldap]) is True
    after = [tuple(r.args()[1:]) for r in host.guards[0].wanted if r.chain == "DOCKER-USER"]
    assert fake.chains["DOCKER-USER"] == [*after, ("-j", "RETURN")]  # the NAS's swept
    drops = [spec for spec in after if spec[-1] == "DROP"]
    assert fake.states and all(set(drops) <= set(state["DOCKER-USER"])
                               for state in fake.states)


def test_a_start_sweeps_what_an_earlier_run_left_and_keeps_others_rules():
    fake = FakeIptables()
    old = OneHost("gpulab0", "172.30.0.2", "172.30.0.3", "iptables", run=fake,
                  output=fake.output)
    old.open([(ipaddress.ip_network("10.0.5.20/32"), None)])
    fake.chains["DOCKER-USER"].insert(0, ("-s", "192.0.2.1", "-j", "ACCEPT"))  # an admin's
    new = OneHost("gpulab0", "172.30.0.2", "172.30.0.3", "iptables", run=fake,
                  output=fake.output)
    before = len(fake.chains["DOCKER-USER"]) - 2 + len(fake.chains["INPUT"]) - 1
    assert new.renew() == before  # each of the earlier run's, once the new ones stand
    wanted = [tuple(r.args()[1:]) for r in new.guards[0].wanted if r.chain == "DOCKER-USER"]
    assert fake.chains["DOCKER-USER"] == [*wanted, ("-s", "192.0.2.1", "-j", "ACCEPT"),
                                          ("-j", "RETURN")]


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
        ("INPUT", "-i docker_gwbridge -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
        ("INPUT", "-i docker_gwbridge -j DROP"),
        ("DOCKER-USER", "-i docker_gwbridge -o docker_gwbridge -j DROP"),
        ("DOCKER-USER", "-i docker_gwbridge -p tcp -m multiport --dports 2377,7946,9445 "
                        "-j DROP"),
        ("DOCKER-USER", "-i docker_gwbridge -p udp -m multiport --dports 4789,7946 -j DROP"),
        *[("DOCKER-USER", r) for r in dns("docker_gwbridge", "10.0.0.0/8", "172.16.0.0/12",
                                          "192.168.0.0/16", "100.64.0.0/10",
                                          "169.254.0.0/16")],
        *[("DOCKER-USER", r.replace("gpulab0", "docker_gwbridge")) for r in PRIVATE_DROPS],
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

    def output(self, argv):
        nsenter, net, *rest = argv
        assert nsenter == "nsenter" and net.startswith("--net=")
        return self.tables.setdefault(net[len("--net="):], FakeIptables()).output(rest)

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
                        read=spaces.read, output=spaces.output)
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
                        "172.30.0.251"), "iptables", run=spaces.run, read=spaces.read,
                        output=spaces.output)
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
