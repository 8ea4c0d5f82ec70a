"""A stand-in for the lab's own network, made by a test: machines at private, shared,
link-local and public-range addresses in one network namespace of the test's, routed from
the namespace the test runs in through a veth pair, as a lab's LAN is routed from a GPU
server. A member's container then reaches them through the users' bridge and the host's
NAT exactly as it would reach the lab's NAS or a printer. Nothing outside the namespace
is ever sent a packet: the addresses are the namespace's own.

Every address answers TCP on every port listed (one listener bound to all of them).
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import uuid
from collections.abc import Sequence

from .stack import wait_for


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def connects(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def _connects_in(netns: str, host: str, port: int) -> bool:
    code = (f"import socket; socket.create_connection(({host!r}, {port}), timeout=2).close()")
    return subprocess.run(["ip", "netns", "exec", netns, "python3", "-c", code],
                          capture_output=True, timeout=30).returncode == 0


class StandInLan:
    """Hosts at *hosts* (addresses, each the .2 of its /30: this side takes the .1),
    answering TCP on *ports*."""

    def __init__(self, hosts: Sequence[str], ports: Sequence[int], netns: str | None = None):
        tag = uuid.uuid4().hex[:6]
        self.ns, self.veth, self.peer = f"gpulab-lan-{tag}", f"gl{tag}h", f"gl{tag}n"
        self.hosts = list(hosts)
        self.ports = list(ports)
        self.server: subprocess.Popen | None = None
        # where the LAN is routed from: the namespace the test runs in, or another (a
        # simulated Swarm's machine: tests/swarm)
        self.ip = ["ip", "-n", netns] if netns else ["ip"]
        self.connects = ((lambda h, p: _connects_in(netns, h, p)) if netns else connects)

    def _networks(self, host: str) -> tuple[str, str]:
        """(this side's address/30, the host's address/30): as small as a route can be,
        so that it takes nothing else's addresses while the test runs."""
        net = ipaddress.ip_network(f"{host}/30", strict=False)
        return f"{next(net.hosts())}/30", f"{host}/30"

    def __enter__(self) -> StandInLan:
        for host in self.hosts:  # never shadow a network this machine already routes
            route = subprocess.run([*self.ip, "-o", "route", "get", host],
                                   capture_output=True, text=True).stdout
            if route and " via " not in route:
                raise RuntimeError(f"the stand-in LAN's {host} is on a network this machine "
                                   f"reaches directly ({route.strip()}): pick another")
        _sh("ip", "netns", "add", self.ns)
        try:
            _sh(*self.ip, "link", "add", self.veth, "type", "veth", "peer", "name", self.peer)
            _sh(*self.ip, "link", "set", self.peer, "netns", self.ns)
            inside = ["ip", "netns", "exec", self.ns]
            for host in self.hosts:
                ours, theirs = self._networks(host)
                _sh(*self.ip, "addr", "add", ours, "dev", self.veth)
                _sh(*inside, "ip", "addr", "add", theirs, "dev", self.peer)
            _sh(*self.ip, "link", "set", self.veth, "up")
            _sh(*inside, "ip", "link", "set", self.peer, "up")
            _sh(*inside, "ip", "link", "set", "lo", "up")
            first_ours = self._networks(self.hosts[0])[0].split("/")[0]
            _sh(*inside, "ip", "route", "add", "default", "via", first_ours)
            self.server = subprocess.Popen(
                [*inside, "python3", "-c",
                 "import selectors, socket\n"
                 "sel = selectors.DefaultSelector()\n"
                 f"for port in {self.ports!r}:\n"
                 "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
                 "socket.SO_REUSEADDR, 1)\n"
                 "    s.bind(('0.0.0.0', port)); s.listen(64); sel.register(s, 1)\n"
                 "while True:\n"
                 "    for key, _ in sel.select():\n"
                 "        key.fileobj.accept()[0].close()\n"])
            for host in self.hosts:
                for port in self.ports:
                    wait_for(lambda h=host, p=port: self.connects(h, p), 10,
                             what=f"the stand-in LAN's listener at {host}:{port}")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.server:
            self.server.kill()
            self.server.wait()
            self.server = None
        subprocess.run([*self.ip, "link", "del", self.veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
