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
* link-local destinations (169.254.0.0/16: cloud metadata services) from the bridge.

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
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulab.contract import EXPORTER_PORT, HUB_IP, PROXY_IP, USERS_SUBNET

log = logging.getLogger("gpulab.netguard")

TAG = "gpulab-netguard"  # the iptables comment that marks our rules (and only ours)
HUB_API_PORT = 8081
LINK_LOCAL = "169.254.0.0/16"
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
    """Nothing from *bridge* to the machine itself (replies aside), nor to link-local
    addresses through it."""
    return [
        Rule("DOCKER-USER", ("-i", bridge, "-d", LINK_LOCAL, *DROP)),
        Rule("INPUT", ("-i", bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED",
                       *ACCEPT)),
        Rule("INPUT", ("-i", bridge, *DROP)),
    ]


def rules(bridge: str, hub_ip: str, proxy_ip: str, hub_port: int = HUB_API_PORT) -> list[Rule]:
    """One host: the rules for the users' bridge, in the order they must stand at the top
    of their chains."""
    return [*between_members(bridge, hub_ip, proxy_ip, "DOCKER-USER", hub_port),
            *to_host(bridge)]


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


def gateway_rules(bridge: str = GATEWAY_BRIDGE) -> list[Rule]:
    """A Swarm: the rules for ``docker_gwbridge``, which gives every container on an
    overlay its way out (NAT) on each machine. As on one host, nothing from it reaches the
    machine itself or a link-local address; and, since the Swarm's own machines are just
    "outside" to a container, nothing from it reaches any machine's Swarm ports (the
    unencrypted VXLAN port would let a container inject packets into the overlay as any
    address) or a GPU exporter (its metrics name every member's GPUs)."""
    from_gateway = ("-i", bridge)
    return [
        *to_host(bridge),
        # between two containers on it (Docker makes it with inter-container traffic
        # off; an admin who made it by hand may not have)
        Rule("DOCKER-USER", (*from_gateway, "-o", bridge, *DROP)),
        *(Rule("DOCKER-USER", (*from_gateway, "-p", proto, "-m", "multiport", "--dports",
                               ",".join(map(str, ports)), *DROP))
          for proto, ports in SWARM_PORTS),
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


def _run(argv: Sequence[str]) -> int:
    out = subprocess.run(list(argv), capture_output=True, text=True)
    if out.returncode not in (0, 1):
        log.warning("%s: %s", " ".join(argv), out.stderr.strip())
    return out.returncode


class Guard:
    def __init__(self, wanted: list[Rule], iptables: str, run: Run = _run):
        self.wanted = wanted
        self.iptables = iptables
        self.run = run

    def missing(self) -> list[Rule]:
        return [r for r in self.wanted if self.run([self.iptables, "-C", *r.args()]) != 0]

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
                 run: Run = _run, read: Callable[[str, str], str | None] = read_in_netns):
        self.directory = directory
        self.subnet = subnet
        self.wanted = wanted
        self.iptables = iptables
        self.run = run
        self.read = read
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
            guard = Guard(self.wanted, self.iptables, run=in_netns(path, self.run))
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
    """The users' bridge on a single host."""

    def __init__(self, guard: Guard, bridge: str):
        self.guard = guard
        self.what = bridge

    def scan(self, apply: bool = True) -> list[str]:
        return []

    def apply(self) -> int:
        return self.guard.apply()

    def status(self) -> Status:
        return self.guard.status()

    def remove(self) -> None:
        self.guard.remove()


class SwarmMachine:
    """One machine of a Swarm: ``docker_gwbridge`` in the machine's own namespace, and the
    users' overlay's namespaces as they come and go."""

    def __init__(self, gateway: Guard, overlays: Overlays):
        self.gateway = gateway
        self.overlays = overlays
        self.what = f"{GATEWAY_BRIDGE} and the overlay {overlays.subnet}"

    def scan(self, apply: bool = True) -> list[str]:
        return self.overlays.scan(apply)

    def apply(self) -> int:
        return self.gateway.apply() + self.overlays.apply()

    def status(self) -> SwarmStatus:
        return SwarmStatus(len(self.gateway.missing()), self.overlays.status(),
                           self.overlays.subnet, tuple(sorted(self.overlays.others.values())))

    def remove(self) -> None:
        self.gateway.remove()
        self.overlays.remove()


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
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    iptables = _iptables()
    if args.swarm:
        ipaddress.IPv4Network(args.subnet)  # ValueError for anything else
        overlay = overlay_rules(args.hub_ip, args.proxy_ip)
        machine = SwarmMachine(Guard(gateway_rules(), iptables),
                               Overlays(args.netns_dir, args.subnet, overlay, iptables))
    else:
        machine = OneHost(Guard(rules(args.bridge, args.hub_ip, args.proxy_ip), iptables),
                          args.bridge)

    if args.action == "remove":
        machine.scan()
        machine.remove()
        print(f"removed gpulab's rules for {machine.what}")
        return 0
    if args.action == "status":
        machine.scan(apply=False)  # look only: a missing rule must show
        status = machine.status()
        print(status.message())
        return 0 if status.isolated else 1

    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    added = machine.apply()
    for name in machine.scan():
        log.info("closed the users' overlay namespace %s", name)
    log.info("installed %d rule(s) for %s (hub %s, proxy %s); %s", added, machine.what,
             args.hub_ip, args.proxy_ip, machine.status().message())
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


if __name__ == "__main__":
    raise SystemExit(main())
