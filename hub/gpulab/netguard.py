"""gpulab-netguard: the users' network, closed by default, kept closed while the stack runs.

Users' containers share one Docker bridge (``gpulab0``) with the hub and its proxy.
Docker itself is told not to forward between containers on it (the network is created
with ``enable_icc=false``); on top of that these iptables rules, installed in Docker's
``DOCKER-USER`` chain and in the host's ``INPUT`` chain, let through exactly:

* replies to connections that were allowed (conntrack ESTABLISHED/RELATED);
* anything the hub or its proxy open towards a container (readiness checks, proxied
  browser traffic, the proxy forwarding to the hub);
* a user container's connections to the hub's API port (8081) and nothing else on
  the bridge: not another user's server, not the proxy's REST API;

and drop:

* every other packet between two containers on the bridge;
* every packet from the bridge to the host itself (its gateway address and any other
  address it owns: services a host runs are not the users' business);
* every packet from a member's server to the private, shared and link-local ranges
  (:data:`gpulab.settings.CLOSED_RANGES`: 10/8, 172.16/12, 192.168/16, 100.64/10,
  169.254/16, fc00::/7, fe80::/10), where the lab's own machines are (its NAS, consoles,
  printers, directory) and cloud metadata services answer, except DNS (port 53, for the
  lab's resolvers, which are usually there) and what gpulab.yaml's ``network.allow``
  opens (:func:`openings`; host names there are looked up again at every check).

The hub and the proxy are trusted on the bridge: their own connections (to the lab's
directory, its SMTP server, an identity provider) leave through it as well. The users'
network carries no IPv6 of gpulab's; IPv6 from the bridge is held to the same rules
(:func:`v6_rules`), so that a link-local ``fe80::`` address does not open between members
what IPv4 closes.

Traffic to the internet stays open (``pip install`` works). :func:`rules` is the pure
decision; :func:`status` says whether the kernel filters bridged traffic at all (with
``bridge-nf-call-iptables`` at 0, packets between two ports of one bridge never reach
iptables, and nothing here would hold: then it says "not isolated", never "isolated").

The ``gpulab-netguard`` container runs :func:`main` with the host's network namespace
and only ``CAP_NET_ADMIN``: it installs the rules and checks every few seconds that they
are still there (re-adding what a firewall reload removed, and saying so in its log).
Stopping it leaves them in place; ``gpulab-netguard remove`` (run by ``make down``) takes
them out. Because it is part of the stack, the rules come back with it after a reboot,
before any user container exists.

On a Swarm (``--swarm``) it does the same on every machine for the users' overlay
network: see :func:`overlay_rules`, :func:`gateway_rules` and :class:`Overlays`.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulab.contract import EXPORTER_PORT, HUB_IP, PROXY_IP, USERS_SUBNET
from gpulab.live_config import LastGood
from gpulab.settings import CLOSED_RANGES, Destination, Settings, defaults, settings_from_yaml
from gpulab.yamlfile import ConfigError, parse_yaml

log = logging.getLogger("gpulab.netguard")

TAG = "gpulab-netguard"  # the iptables comment that marks our rules (and only ours)
HUB_API_PORT = 8081
DNS_PORT = 53
BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
GATEWAY_BRIDGE = "docker_gwbridge"
# Swarm management (2377/tcp), gossip (7946), VXLAN (4789/udp); the GPU exporter's port
SWARM_PORTS = (("tcp", (2377, 7946, EXPORTER_PORT)), ("udp", (4789, 7946)))
ACCEPT, DROP = ("-j", "ACCEPT"), ("-j", "DROP")


@dataclass(frozen=True)
class Rule:
    chain: str
    spec: tuple[str, ...]  # everything after the chain, without the comment

    def args(self) -> list[str]:
        return [self.chain, *self.spec, "-m", "comment", "--comment", TAG]


def between_members(bridge: str, hub_ip: str, proxy_ip: str, chain: str,
                    hub_port: int = HUB_API_PORT) -> list[Rule]:
    """Traffic between two ports of *bridge*, in *chain* (the forwarding chain that bridged
    packets traverse): replies, the hub's and the proxy's connections, members' connections
    to the hub's API; everything else dropped."""
    for ip in (hub_ip, proxy_ip):
        ipaddress.ip_address(ip)  # ValueError for anything else
    same_bridge = ("-i", bridge, "-o", bridge)
    return [
        Rule(chain, (*same_bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED",
                     *ACCEPT)),
        Rule(chain, (*same_bridge, "-s", f"{hub_ip}/32", *ACCEPT)),
        Rule(chain, (*same_bridge, "-s", f"{proxy_ip}/32", *ACCEPT)),
        Rule(chain, (*same_bridge, "-d", f"{hub_ip}/32", "-p", "tcp", "-m", "tcp",
                     "--dport", str(hub_port), *ACCEPT)),
        Rule(chain, (*same_bridge, *DROP)),
    ]


def to_host(bridge: str) -> list[Rule]:
    """Nothing from *bridge* to the machine itself (replies aside)."""
    return [
        Rule("INPUT", ("-i", bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED",
                       *ACCEPT)),
        Rule("INPUT", ("-i", bridge, *DROP)),
    ]


Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Opening = tuple[Network, int | None]  # a destination network and port (None: every port)


def _to(network: Network, port: int | None) -> list[tuple[str, ...]]:
    """The match arguments for *network* (and *port*, over TCP and UDP)."""
    if port is None:
        return [("-d", str(network))]
    return [("-d", str(network), "-p", proto, "-m", proto, "--dport", str(port))
            for proto in ("tcp", "udp")]


def to_private(bridge: str, chain: str, version: int, openings: Sequence[Opening] = (),
               trusted: Sequence[str] = ()) -> list[Rule]:
    """Traffic from *bridge* out to the closed ranges of IP *version*, in *chain*: the
    *trusted* sources' (the hub's, the proxy's) and the *openings* accepted, DNS accepted,
    the rest dropped."""
    closed = [n for n in CLOSED_RANGES if n.version == version]
    out = [Rule(chain, ("-i", bridge, "-s", f"{ip}/32", *ACCEPT)) for ip in trusted]
    for network, port in openings:
        if network.version == version:
            out += [Rule(chain, ("-i", bridge, *match, *ACCEPT)) for match in _to(network, port)]
    for network in closed:
        out += [Rule(chain, ("-i", bridge, *match, *ACCEPT)) for match in _to(network, DNS_PORT)]
    return out + [Rule(chain, ("-i", bridge, "-d", str(n), *DROP)) for n in closed]


def rules(bridge: str, hub_ip: str, proxy_ip: str, hub_port: int = HUB_API_PORT,
          openings: Sequence[Opening] = ()) -> list[Rule]:
    """One host: the IPv4 rules for the users' bridge, in the order they must stand at the
    top of their chains."""
    return [*between_members(bridge, hub_ip, proxy_ip, "DOCKER-USER", hub_port),
            *to_private(bridge, "DOCKER-USER", 4, openings, trusted=(hub_ip, proxy_ip)),
            *to_host(bridge)]


def v6_rules(bridge: str, openings: Sequence[Opening] = ()) -> list[Rule]:
    """One host: the IPv6 rules for the users' bridge (``ip6tables``, whose FORWARD chain
    Docker leaves alone). gpulab gives the bridge no IPv6 addresses, but each container
    still has a link-local one: nothing between members, nothing to the host, nothing to
    the closed ranges; the internet stays open should a lab turn IPv6 on."""
    return [Rule("FORWARD", ("-i", bridge, "-o", bridge, *DROP)),
            *to_private(bridge, "FORWARD", 6, openings),
            Rule("INPUT", ("-i", bridge, *DROP))]


def openings(settings: Settings, resolve: Callable[[str], list[str]],
             users_subnet: str = USERS_SUBNET) -> tuple[list[Opening], list[str]]:
    """What ``network.allow`` opens now, and what it asks that cannot be (host names that
    do not resolve, anything on the users' own network) as messages for the log. Names
    are looked up with *resolve* (addresses as text)."""
    subnet = ipaddress.ip_network(users_subnet)
    out: list[Opening] = []
    problems = []
    for entry in settings["network.allow"]:
        entry: Destination
        networks = [entry.network] if entry.network else []
        if not networks:
            try:
                networks = sorted({ipaddress.ip_network(a) for a in resolve(entry.host)},
                                  key=lambda n: (n.version, n))
            except OSError as e:
                problems.append(f"network.allow: {entry} stays closed: {entry.host} does not "
                                f"resolve ({e})")
                continue
        for network in networks:
            if network.overlaps(subnet):
                problems.append(f"network.allow: {entry} stays closed: {network} is on the "
                                f"users' own network ({subnet}), where members never reach "
                                f"each other")
            elif not any(network.version == r.version and network.subnet_of(r)
                         for r in CLOSED_RANGES):
                continue  # a name that resolves outside the closed ranges: open already
            elif (network, entry.port) not in out:
                out.append((network, entry.port))
    return out, problems


def resolve(host: str) -> list[str]:
    return [info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)]


def overlay_rules(hub_ip: str, proxy_ip: str, hub_port: int = HUB_API_PORT) -> list[Rule]:
    """A Swarm: the rules inside one machine's namespace of the users' overlay network.

    Docker gives an overlay, on each machine where it has a container, a network namespace
    of its own, in which a bridge ``br0`` joins the local containers' ports and ``vxlan0``,
    the tunnel to the other machines. A packet between two members' servers crosses the
    sending machine's ``br0`` and the receiving machine's, so each machine's rules alone
    already stop traffic between machines; traffic within one machine needs its own.
    ``br0`` holds the subnet's gateway address, which nothing may reach."""
    return [*between_members("br0", hub_ip, proxy_ip, "FORWARD", hub_port),
            Rule("INPUT", ("-i", "br0", "-m", "conntrack", "--ctstate",
                           "RELATED,ESTABLISHED", *ACCEPT)),
            Rule("INPUT", ("-i", "br0", *DROP))]


def gateway_rules(bridge: str = GATEWAY_BRIDGE, openings: Sequence[Opening] = ()) -> list[Rule]:
    """A Swarm: the rules for ``docker_gwbridge``, which gives every container on an
    overlay its way out (NAT) on each machine. As on one host, nothing from it reaches the
    machine itself or the closed ranges (but *openings* and DNS); and, since the Swarm's
    own machines are just "outside" to a container, nothing from it reaches any machine's
    Swarm ports (the unencrypted VXLAN port would let a container inject packets into the
    overlay as any address) or a GPU exporter (its metrics name every member's GPUs),
    whatever ``network.allow`` opens. The hub is not on it: docker-compose.swarm.yml gives
    the hub a way out of its own."""
    from_gateway = ("-i", bridge)
    return [
        *to_host(bridge),
        # between two containers on it (Docker makes it with inter-container traffic
        # off; an admin who made it by hand may not have)
        Rule("DOCKER-USER", (*from_gateway, "-o", bridge, *DROP)),
        *(Rule("DOCKER-USER", (*from_gateway, "-p", proto, "-m", "multiport", "--dports",
                               ",".join(map(str, ports)), *DROP))
          for proto, ports in SWARM_PORTS),
        *to_private(bridge, "DOCKER-USER", 4, openings),
    ]


@dataclass(frozen=True)
class Status:
    rules_missing: int
    bridge_filtering: bool | None  # None: the kernel has no bridge netfilter at all

    @property
    def isolated(self) -> bool:
        return self.rules_missing == 0 and self.bridge_filtering is True

    def problems(self) -> list[str]:
        why = []
        if self.rules_missing:
            why.append(f"{self.rules_missing} rule(s) missing")
        if self.bridge_filtering is None:
            why.append("the kernel has no bridge netfilter (br_netfilter not loaded), so "
                       "traffic between containers on one bridge bypasses iptables")
        elif not self.bridge_filtering:
            why.append("net.bridge.bridge-nf-call-iptables is 0, so traffic between "
                       "containers on one bridge bypasses iptables (fix: modprobe "
                       "br_netfilter; sysctl -w net.bridge.bridge-nf-call-iptables=1)")
        return why

    def message(self) -> str:
        if self.isolated:
            return "users' network isolated (rules in place, bridged traffic filtered)"
        return "users' network NOT isolated: " + "; ".join(self.problems())


@dataclass(frozen=True)
class SwarmStatus:
    """One machine of a Swarm: its ``docker_gwbridge`` rules, and each namespace of the
    users' overlay on it (none while no member's server runs here)."""

    gateway_missing: int
    overlays: tuple[tuple[str, Status], ...]
    subnet: str = USERS_SUBNET
    others: tuple[str, ...] = ()  # the subnets of the other overlays' namespaces here

    @property
    def isolated(self) -> bool:
        return self.gateway_missing == 0 and all(s.isolated for _, s in self.overlays)

    def message(self) -> str:
        where = (f"{len(self.overlays)} namespace(s) of the overlay {self.subnet} here"
                 if self.overlays else
                 f"no member's server on this machine yet: the rules of the overlay "
                 f"{self.subnet} go in as the first one starts")
        if self.others:
            where += f"; other overlays here: {'; '.join(self.others)}"
        if self.isolated:
            return (f"users' network isolated on this machine (rules in place, bridged "
                    f"traffic filtered; {where})")
        why = []
        if self.gateway_missing:
            why.append(f"{self.gateway_missing} {GATEWAY_BRIDGE} rule(s) missing")
        why += [f"overlay namespace {name}: {'; '.join(s.problems())}"
                for name, s in self.overlays if not s.isolated]
        return "users' network NOT isolated on this machine: " + "; ".join(why)


def route_subnets(proc_net_route: str, iface: str) -> set[ipaddress.IPv4Network]:
    """The IPv4 networks routed directly on *iface*, from a ``/proc/net/route`` text."""
    found = set()
    for line in proc_net_route.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8 or fields[0] != iface:
            continue
        dest, mask = (ipaddress.IPv4Address(int(h, 16).to_bytes(4, "little"))
                      for h in (fields[1], fields[7]))
        if int(mask):
            found.add(ipaddress.IPv4Network(f"{dest}/{mask}", strict=False))
    return found


def is_users_overlay(proc_net_route: str | None, subnet: str) -> bool | None:
    """Whether a namespace whose routes are *proc_net_route* is the users' overlay's
    (its ``br0`` carries *subnet*): None while that cannot be told yet (no ``br0`` route:
    Docker is still setting the namespace up, or it is gone)."""
    if proc_net_route is None:
        return None
    routed = route_subnets(proc_net_route, "br0")
    if not routed:
        return None
    return ipaddress.IPv4Network(subnet) in routed


def bridge_filtering(path: Path = BRIDGE_NF) -> bool | None:
    try:
        return path.read_text().strip() == "1"
    except OSError:
        return None


# ---------------------------------------------------------------- the I/O shell

Run = Callable[[Sequence[str]], int]


def _iptables() -> str:
    """The iptables that sees Docker's chains (nft or legacy backend, as the host uses)."""
    for name in ("iptables", "iptables-nft", "iptables-legacy"):
        exe = shutil.which(name)
        if exe and subprocess.run([exe, "-S", "DOCKER-USER"], capture_output=True).returncode == 0:
            return exe
    raise SystemExit("gpulab-netguard: no iptables here sees Docker's DOCKER-USER chain: is "
                     "dockerd running with its iptables integration (the default)?")


def _ip6tables(iptables: str) -> str | None:
    """The ip6tables of the same backend as *iptables*, if there is one."""
    name = Path(iptables).name.replace("iptables", "ip6tables", 1)
    return shutil.which(name)


def _run(argv: Sequence[str]) -> int:
    out = subprocess.run(list(argv), capture_output=True, text=True)
    if out.returncode not in (0, 1):
        log.warning("%s: %s", " ".join(argv), out.stderr.strip())
    return out.returncode


def _output(argv: Sequence[str]) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True).stdout


class Guard:
    def __init__(self, wanted: list[Rule], iptables: str, run: Run = _run,
                 output: Callable[[Sequence[str]], str] = _output):
        self.wanted = wanted
        self.iptables = iptables
        self.run = run
        self.output = output

    def renew(self, wanted: list[Rule] | None = None) -> int:
        """Put *wanted* (by default the rules it has) in place at the top of each of its
        chains, in order, then delete every other rule of gpulab-netguard's below them in
        those chains (an earlier version's, an opening taken out of ``network.allow``): at
        no moment is a rule of either set missing, so nothing opens in between. Returns
        how many stale rules were deleted."""
        self.wanted = list(self.wanted if wanted is None else wanted)
        deleted = 0
        for chain in dict.fromkeys(r.chain for r in self.wanted):
            ours = [r for r in self.wanted if r.chain == chain]
            for rule in reversed(ours):
                self.run([self.iptables, "-I", chain, "1", *rule.args()[1:]])
            listed = [ln for ln in self.output([self.iptables, "-S", chain]).splitlines()
                      if ln.startswith("-A ")]
            stale = [i + 1 for i, ln in enumerate(listed) if i >= len(ours) and TAG in ln]
            for number in reversed(stale):
                self.run([self.iptables, "-D", chain, str(number)])
            deleted += len(stale)
        return deleted

    def missing(self) -> list[Rule]:
        """The wanted rules that are not in place, from one listing of each chain (not
        one ``iptables -C`` process per rule: with the private ranges' rules that was
        about 60 processes every few seconds in each netguard, a tenth of a core)."""
        present: dict[str, Counter] = {}
        for chain in dict.fromkeys(r.chain for r in self.wanted):
            listed = self.output([self.iptables, "-S", chain]).splitlines()
            present[chain] = Counter(canonical(ln.split()[2:]) for ln in listed
                                     if ln.startswith(f"-A {chain} "))
        return [r for r in self.wanted if not present[r.chain][canonical(r.args()[1:])]]

    def apply(self) -> int:
        """Put every missing rule in place, at the top of its chain and in order; returns
        how many were added. A chain's rules are re-inserted together when one is missing,
        so that their order (accepts before the drop) always holds."""
        missing = self.missing()
        chains = {r.chain for r in missing}
        for chain in chains:
            self.remove(chain)
            for rule in reversed([r for r in self.wanted if r.chain == chain]):
                self.run([self.iptables, "-I", rule.chain, "1", *rule.args()[1:]])
        return len(missing)

    def remove(self, chain: str | None = None) -> None:
        """Delete our rules (found by their comment) from *chain*, or from every chain."""
        for rule in self.wanted:
            if chain is None or rule.chain == chain:
                while self.run([self.iptables, "-D", *rule.args()]) == 0:
                    pass

    def status(self) -> Status:
        return Status(len(self.missing()), bridge_filtering())


def canonical(spec: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """A rule's matches and target, as ``iptables -S`` lists them or as they are given
    to ``-I``: a sorted multiset of (option, value) pairs, since iptables lists the
    options in an order of its own (``-d X -i Y`` for ``-i Y -d X``). Every option gpulab
    uses takes one value."""
    pairs, tokens = [], iter(spec)
    for token in tokens:
        if token.startswith("-"):
            pairs.append((token, next(tokens, "").strip('"')))
    return tuple(sorted(pairs))


def in_netns(path: str, run: Run = _run) -> Run:
    """*run*, with every command run inside the network namespace bound at *path*."""
    return lambda argv: run(["nsenter", f"--net={path}", *argv])


def read_in_netns(path: str, file: str) -> str | None:
    """*file* as read from inside the network namespace at *path* (``/proc/net/...`` and
    ``/proc/sys/net/...`` answer for the reader's namespace); None if it cannot be read."""
    try:
        out = subprocess.run(["nsenter", f"--net={path}", "cat", file], capture_output=True,
                             text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return None
    return out.stdout if out.returncode == 0 else None


# libnetwork names an overlay's namespace <epoch>-<network id[:10]> (the epoch counts the
# times it was set up again; 1 so far).
_OVERLAY_NETNS = re.compile(r"[0-9]+-[0-9a-z]+")


class Overlays:
    """The users' overlay's namespaces on this machine (Docker's ``<exec-root>/netns/
    1-<network id>``, which exists while one of the overlay's containers runs here), each
    with its own :class:`Guard`. A namespace is known by its name and inode: Docker
    creates a new one, under the same name, when the first container returns."""

    def __init__(self, directory: Path, subnet: str, wanted: list[Rule], iptables: str,
                 run: Run = _run, read: Callable[[str, str], str | None] = read_in_netns,
                 output: Callable[[Sequence[str]], str] = _output):
        self.directory = directory
        self.subnet = subnet
        self.wanted = wanted
        self.iptables = iptables
        self.run = run
        self.read = read
        self.output = output
        self.guards: dict[tuple[str, int], tuple[str, Guard]] = {}  # key: (path, guard)
        self.others: dict[tuple[str, int], str] = {}  # other overlays: their subnets

    def _present(self) -> dict[tuple[str, int], str]:
        found = {}
        try:
            entries = list(self.directory.iterdir())
        except FileNotFoundError:
            return found
        for entry in entries:
            if not _OVERLAY_NETNS.fullmatch(entry.name):  # overlay namespaces only
                continue
            try:
                found[(entry.name, entry.stat().st_ino)] = str(entry)
            except FileNotFoundError:
                continue
        return found

    def scan(self, apply: bool = True) -> list[str]:
        """Find namespaces that appeared (putting the rules in at once, unless *apply* is
        false: ``status`` only looks) and forget those that went; returns the names of the
        namespaces newly found."""
        present = self._present()
        for key in [k for k in self.guards if k not in present]:
            del self.guards[key]
        self.others = {k: v for k, v in self.others.items() if k in present}
        closed = []
        for key, path in present.items():
            if key in self.guards or key in self.others:
                continue
            routes = self.read(path, "/proc/net/route")
            ours = is_users_overlay(routes, self.subnet)
            if ours is None:
                continue  # not set up yet: look again at the next scan
            if not ours:
                self.others[key] = ", ".join(sorted(map(str, route_subnets(routes, "br0"))))
                continue
            guard = Guard(self.wanted, self.iptables, run=in_netns(path, self.run),
                          output=in_netns(path, self.output))
            if apply:
                guard.apply()
            self.guards[key] = (path, guard)
            closed.append(key[0])
        return closed

    def apply(self) -> int:
        return sum(guard.apply() for _, guard in self.guards.values())

    def status(self) -> tuple[tuple[str, Status], ...]:
        out = []
        for (name, _), (path, guard) in sorted(self.guards.items()):
            sysctl = self.read(path, str(BRIDGE_NF))
            filtering = None if sysctl is None else sysctl.strip() == "1"
            out.append((name, Status(len(guard.missing()), filtering)))
        return tuple(out)

    def remove(self) -> None:
        for _, guard in self.guards.values():
            guard.remove()


class OneHost:
    """The users' bridge on a single host: its IPv4 rules and, where this host has
    ip6tables, its IPv6 ones."""

    def __init__(self, bridge: str, hub_ip: str, proxy_ip: str, iptables: str,
                 ip6tables: str | None = None, run: Run = _run,
                 output: Callable[[Sequence[str]], str] = _output):
        self.what = bridge
        exes = [exe for exe in (iptables, ip6tables) if exe]
        self._rules = lambda opened: [rules(bridge, hub_ip, proxy_ip, openings=opened),
                                      v6_rules(bridge, opened)][:len(exes)]
        self.guards = [Guard(wanted, exe, run, output)
                       for wanted, exe in zip(self._rules(()), exes, strict=True)]

    def open(self, opened: Sequence[Opening]) -> bool:
        """Hold the rules for *opened* (``network.allow``) from now on, renewing those
        that change; whether any did."""
        changed = False
        for guard, wanted in zip(self.guards, self._rules(opened), strict=True):
            if wanted != guard.wanted:
                guard.renew(wanted)
                changed = True
        return changed

    def scan(self, apply: bool = True) -> list[str]:
        return []

    def renew(self) -> int:
        return sum(guard.renew() for guard in self.guards)

    def apply(self) -> int:
        return sum(guard.apply() for guard in self.guards)

    def status(self) -> Status:
        return Status(sum(len(guard.missing()) for guard in self.guards), bridge_filtering())

    def remove(self) -> None:
        for guard in self.guards:
            guard.remove()


class SwarmMachine:
    """One machine of a Swarm: ``docker_gwbridge`` in the machine's own namespace, and the
    users' overlay's namespaces as they come and go."""

    def __init__(self, gateway: Guard, overlays: Overlays):
        self.gateway = gateway
        self.overlays = overlays
        self.what = f"{GATEWAY_BRIDGE} and the overlay {overlays.subnet}"

    def open(self, opened: Sequence[Opening]) -> bool:
        wanted = gateway_rules(openings=opened)
        if wanted == self.gateway.wanted:
            return False
        self.gateway.renew(wanted)
        return True

    def scan(self, apply: bool = True) -> list[str]:
        return self.overlays.scan(apply)

    def renew(self) -> int:
        return self.gateway.renew() + self.overlays.apply()

    def apply(self) -> int:
        return self.gateway.apply() + self.overlays.apply()

    def status(self) -> SwarmStatus:
        return SwarmStatus(len(self.gateway.missing()), self.overlays.status(),
                           self.overlays.subnet, tuple(sorted(self.overlays.others.values())))

    def remove(self) -> None:
        self.gateway.remove()
        self.overlays.remove()


class Allowed:
    """What gpulab.yaml's ``network.allow`` opens, read again at every :meth:`now`. An
    absent file opens nothing; an invalid edit keeps the last good version (and with none,
    nothing is opened); what cannot be opened is logged when it changes."""

    def __init__(self, path: str | None, subnet: str,
                 resolve: Callable[[str], list[str]] = resolve):
        self.path = path
        self.subnet = subnet
        self.resolve = resolve
        self.reader = LastGood(lambda text, where: settings_from_yaml(parse_yaml(text, where)),
                               missing=lambda _: defaults())
        self._said: tuple[str, ...] = ()

    def now(self) -> list[Opening]:
        if not self.path:
            return []
        try:
            settings = self.reader.load(self.path)
        except ConfigError as e:
            self._say((f"nothing of network.allow is open until {self.path} is valid: {e}",))
            return []
        opened, problems = openings(settings, self.resolve, self.subnet)
        self._say(tuple(problems))
        return opened

    def _say(self, problems: tuple[str, ...]) -> None:
        if problems != self._said:
            for problem in problems:
                log.error("%s", problem)
            self._said = problems


def describe(opened: Sequence[Opening]) -> str:
    return ", ".join(f"{n}:{p}" if p else str(n) for n, p in opened) or "nothing"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpulab-netguard", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", nargs="?", default="run", choices=["run", "status", "remove"],
                    help="run: install and keep the rules until stopped (default); status: "
                         "say whether the users' network is isolated (exit 1 if not); "
                         "remove: delete the rules")
    ap.add_argument("--bridge", default="gpulab0", help="the users' bridge interface "
                    "(one host)")
    # Defaults from the container's environment (docker-compose*.yml), so that
    # `docker exec gpulab-netguard gpulab-netguard status` checks what the guard keeps.
    env = os.environ.get
    ap.add_argument("--hub-ip", default=env("GPULAB_HUB_IP", HUB_IP),
                    help="the hub's address on the users' network ($GPULAB_HUB_IP)")
    ap.add_argument("--proxy-ip", default=env("GPULAB_PROXY_IP", PROXY_IP),
                    help="the proxy's address on the users' network ($GPULAB_PROXY_IP)")
    ap.add_argument("--swarm", action="store_true", default=env("GPULAB_SWARM") == "yes",
                    help="this machine is part of a Swarm: guard docker_gwbridge and the "
                         "namespaces of the users' overlay network (--subnet) found in "
                         "--netns-dir ($GPULAB_SWARM=yes)")
    ap.add_argument("--subnet", default=env("GPULAB_SUBNET", USERS_SUBNET),
                    help="the users' overlay network's subnet (--swarm; $GPULAB_SUBNET)")
    ap.add_argument("--netns-dir", type=Path, default=Path("/run/docker-netns"),
                    help="Docker's <exec-root>/netns, mounted with rslave propagation "
                         "(--swarm)")
    ap.add_argument("--check-every", type=float, default=5.0, metavar="SECONDS",
                    help="how often every rule is checked (and put back if gone)")
    ap.add_argument("--scan-every", type=float, default=0.5, metavar="SECONDS",
                    help="how often --netns-dir is looked at for a new overlay namespace")
    ap.add_argument("--settings", default=env("GPULAB_SETTINGS"), metavar="GPULAB_YAML",
                    help="gpulab.yaml, for network.allow: read again at every check "
                         "($GPULAB_SETTINGS; none: nothing private is opened)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    iptables = _iptables()
    allowed = Allowed(args.settings, args.subnet)
    if args.swarm:
        ipaddress.IPv4Network(args.subnet)  # ValueError for anything else
        overlay = overlay_rules(args.hub_ip, args.proxy_ip)
        machine = SwarmMachine(Guard(gateway_rules(), iptables),
                               Overlays(args.netns_dir, args.subnet, overlay, iptables))
    else:
        machine = OneHost(args.bridge, args.hub_ip, args.proxy_ip, iptables,
                          _ip6tables(iptables))
    opened = allowed.now()
    machine.open(opened) if args.action == "run" else _want(machine, opened)

    if args.action == "remove":
        machine.scan()
        machine.remove()
        print(f"removed gpulab's rules for {machine.what}")
        return 0
    if args.action == "status":
        machine.scan(apply=False)  # look only: a missing rule must show
        status = machine.status()
        print(status.message())
        print(f"open on the lab's private networks: DNS (port 53) and {describe(opened)}")
        return 0 if status.isolated else 1

    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    stale = machine.renew()  # in place whole, an earlier run's leftovers swept
    for name in machine.scan():
        log.info("closed the users' overlay namespace %s", name)
    log.info("rules in place for %s (hub %s, proxy %s; %d stale rule(s) removed); the lab's "
             "private networks are closed but DNS and network.allow: %s; %s", machine.what,
             args.hub_ip, args.proxy_ip, stale, describe(opened), machine.status().message())
    last = None
    next_check = time.monotonic() + args.check_every
    while not stop:
        time.sleep(min(args.scan_every, args.check_every))
        if stop:
            break
        for name in machine.scan():
            log.info("closed the users' overlay namespace %s", name)
        if time.monotonic() < next_check:
            continue
        next_check = time.monotonic() + args.check_every
        now_open = allowed.now()
        if machine.open(now_open):
            log.info("network.allow opens now: %s (was: %s)", describe(now_open),
                     describe(opened))
            opened = now_open
        added = machine.apply()
        status = machine.status()
        if added:
            log.warning("%d rule(s) had disappeared (a firewall reload?) and were put back",
                        added)
        if status.message() != last:
            (log.info if status.isolated else log.error)("%s", status.message())
            last = status.message()
    # The rules stay: stopping (docker restart, make up after an upgrade) must not open
    # the users' network while their servers run, which on a Swarm they do, as services,
    # whatever happens to this stack. `gpulab-netguard remove` and `make down` take them
    # out; a namespace's go with it.
    log.info("stopped; the rules for %s stay in place (gpulab-netguard remove takes them "
             "out)", machine.what)
    return 0


def _want(machine: OneHost | SwarmMachine, opened: Sequence[Opening]) -> None:
    """Set what *machine* checks for (``status``, ``remove``) without touching a rule."""
    if isinstance(machine, OneHost):
        for guard, wanted in zip(machine.guards, machine._rules(opened), strict=True):
            guard.wanted = wanted
    else:
        machine.gateway.wanted = gateway_rules(openings=opened)


if __name__ == "__main__":
    raise SystemExit(main())
