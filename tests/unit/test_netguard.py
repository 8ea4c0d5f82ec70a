"""The users' network rules (gpulab.netguard): the pure rule list, the status that never
says "isolated" when the kernel does not filter bridged traffic, and the guard's
bookkeeping against a small in-memory iptables (the real one is exercised from inside
users' containers by tests/integration/test_isolation.py)."""

from __future__ import annotations

import pytest

from gpulab.netguard import LEGACY_TAG, TAG, Guard, Status, bridge_filtering, rules, tagged


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
        self.chains = {"DOCKER-USER": [("-j", "RETURN")], "INPUT": [("-j", "OTHER")]}

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
    assert fake.chains == {"DOCKER-USER": [("-j", "RETURN")], "INPUT": [("-j", "OTHER")]}


def test_rules_of_the_old_isolation_script_are_found_for_removal():
    listing = (
        "-N DOCKER-USER\n"
        "-A DOCKER-USER -s 172.30.0.2/32 -i gpulab0 -o gpulab0 -m comment --comment "
        "gpulab-isolate-users -j RETURN\n"
        "-A DOCKER-USER -i eth0 -j DROP\n"
        "-A DOCKER-USER -j RETURN\n"
    )
    assert tagged(listing, LEGACY_TAG) == [[
        "-D", "DOCKER-USER", "-s", "172.30.0.2/32", "-i", "gpulab0", "-o", "gpulab0", "-m",
        "comment", "--comment", "gpulab-isolate-users", "-j", "RETURN"]]
