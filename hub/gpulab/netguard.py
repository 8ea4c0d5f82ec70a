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
and only ``CAP_NET_ADMIN``: it installs the rules, checks every few seconds that they
are still there (re-adding what a firewall reload removed, and saying so in its log),
and removes them when it is stopped (``make down``). Because it is part of the stack,
the rules come back with it after a reboot, before any user container exists.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gpulab.netguard")

TAG = "gpulab-netguard"  # the iptables comment that marks our rules (and only ours)
LEGACY_TAG = "gpulab-isolate-users"  # rules of scripts/isolate-users.sh (gpulab <= 0.1)
HUB_API_PORT = 8081
LINK_LOCAL = "169.254.0.0/16"
BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


@dataclass(frozen=True)
class Rule:
    chain: str
    spec: tuple[str, ...]  # everything after the chain, without the comment

    def args(self) -> list[str]:
        return [self.chain, *self.spec, "-m", "comment", "--comment", TAG]


def rules(bridge: str, hub_ip: str, proxy_ip: str, hub_port: int = HUB_API_PORT) -> list[Rule]:
    """The rules, in the order they must stand at the top of their chains."""
    for ip in (hub_ip, proxy_ip):
        ipaddress.ip_address(ip)  # ValueError for anything else
    same_bridge = ("-i", bridge, "-o", bridge)
    accept, drop = ("-j", "ACCEPT"), ("-j", "DROP")
    return [
        Rule("DOCKER-USER", (*same_bridge, "-m", "conntrack", "--ctstate",
                             "RELATED,ESTABLISHED", *accept)),
        Rule("DOCKER-USER", (*same_bridge, "-s", f"{hub_ip}/32", *accept)),
        Rule("DOCKER-USER", (*same_bridge, "-s", f"{proxy_ip}/32", *accept)),
        Rule("DOCKER-USER", (*same_bridge, "-d", f"{hub_ip}/32", "-p", "tcp", "-m", "tcp",
                             "--dport", str(hub_port), *accept)),
        Rule("DOCKER-USER", (*same_bridge, *drop)),
        Rule("DOCKER-USER", ("-i", bridge, "-d", LINK_LOCAL, *drop)),
        Rule("INPUT", ("-i", bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED",
                       *accept)),
        Rule("INPUT", ("-i", bridge, *drop)),
    ]


@dataclass(frozen=True)
class Status:
    rules_missing: int
    bridge_filtering: bool | None  # None: the kernel has no bridge netfilter at all

    @property
    def isolated(self) -> bool:
        return self.rules_missing == 0 and self.bridge_filtering is True

    def message(self) -> str:
        if self.isolated:
            return "users' network isolated (rules in place, bridged traffic filtered)"
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
        return "users' network NOT isolated: " + "; ".join(why)


def bridge_filtering(path: Path = BRIDGE_NF) -> bool | None:
    try:
        return path.read_text().strip() == "1"
    except OSError:
        return None


def tagged(listing: str, tag: str) -> list[list[str]]:
    """The ``-D`` arguments that delete every rule of an ``iptables -S`` listing that
    carries the comment *tag*."""
    return [["-D", *line.split()[1:]] for line in listing.splitlines()
            if line.startswith("-A ") and f"--comment {tag}" in line]


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpulab-netguard", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", nargs="?", default="run", choices=["run", "status", "remove"],
                    help="run: install and keep the rules until stopped (default); status: "
                         "say whether the users' network is isolated (exit 1 if not); "
                         "remove: delete the rules")
    ap.add_argument("--bridge", default="gpulab0", help="the users' bridge interface")
    ap.add_argument("--hub-ip", default="172.30.0.2")
    ap.add_argument("--proxy-ip", default="172.30.0.3")
    ap.add_argument("--check-every", type=float, default=5.0, metavar="SECONDS")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    guard = Guard(rules(args.bridge, args.hub_ip, args.proxy_ip), _iptables())

    if args.action == "remove":
        guard.remove()
        print(f"removed gpulab's rules for {args.bridge}")
        return 0
    if args.action == "status":
        status = guard.status()
        print(status.message())
        return 0 if status.isolated else 1

    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    listing = subprocess.run([guard.iptables, "-S"], capture_output=True, text=True).stdout
    for delete in tagged(listing, LEGACY_TAG):
        _run([guard.iptables, *delete])
    added = guard.apply()
    log.info("installed %d rule(s) for %s (hub %s, proxy %s); %s", added, args.bridge,
             args.hub_ip, args.proxy_ip, guard.status().message())
    last = None
    while not stop:
        time.sleep(args.check_every)
        if stop:
            break
        added = guard.apply()
        status = guard.status()
        if added:
            log.warning("%d rule(s) had disappeared (a firewall reload?) and were put back",
                        added)
        if status.message() != last:
            (log.info if status.isolated else log.error)("%s", status.message())
            last = status.message()
    guard.remove()
    log.info("stopped: rules for %s removed", args.bridge)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
