"""Who is the client: the TCP peer, or what trusted proxies say in X-Forwarded-For.

The hub runs tornado with ``xheaders=True``, and tornado believes ``X-Forwarded-For``
and ``X-Real-Ip`` from any peer (``_apply_xheaders`` never looks at who sent them), so
``request.remote_ip`` is whatever a client claims. The login throttle counts failures
per address, so it works the address out here from the original TCP peer.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from tornado.netutil import is_valid_ip


class TrustedProxies:
    """Proxies whose ``X-Forwarded-For`` entries are believed: addresses or networks.

    ``"10.0.0.5" in TrustedProxies(["10.0.0.0/24"])`` is True; IPv4-mapped IPv6
    addresses count as their IPv4 address; anything that is not an address is not
    trusted.
    """

    def __init__(self, entries: Iterable[str] = ()):
        self.networks = []
        for entry in entries:
            try:
                self.networks.append(ipaddress.ip_network(str(entry).strip(), strict=False))
            except ValueError:
                raise ValueError(f"trusted proxy {entry!r} is not an IP address or network "
                                 f"(e.g. 10.0.0.5 or 10.0.0.0/24)") from None

    @staticmethod
    def _ip(address: str):
        try:
            ip = ipaddress.ip_address(address.strip())
        except ValueError:
            return None
        return ip.ipv4_mapped if ip.version == 6 and ip.ipv4_mapped else ip

    def __contains__(self, address: object) -> bool:
        ip = self._ip(address) if isinstance(address, str) else None
        return ip is not None and any(ip in net for net in self.networks)

    def addresses(self) -> list[str]:
        """The single-host entries as plain addresses: tornado's ``trusted_downstream``
        (``c.JupyterHub.trusted_downstream_ips``) compares strings, not networks."""
        return [str(n.network_address) for n in self.networks if n.num_addresses == 1]

    def __repr__(self) -> str:
        return f"TrustedProxies({[str(n) for n in self.networks]!r})"


def peer_address(request) -> str:
    """The TCP peer of *request*, before tornado's ``xheaders`` rewrote ``remote_ip``."""
    context = getattr(getattr(request, "connection", None), "context", None)
    return getattr(context, "_orig_remote_ip", None) or request.remote_ip


def client_address(request, trusted: TrustedProxies) -> str:
    """The client's address for throttling.

    The TCP peer, unless the peer is a trusted proxy: then ``X-Forwarded-For`` is
    walked from the right (each proxy appends the address it was contacted from, as
    configurable-http-proxy does), skipping trusted hops; the first untrusted hop is
    the client. ``X-Real-Ip`` is never used: configurable-http-proxy passes a client's
    own ``X-Real-Ip`` through unchanged. Tornado's ``remote_ip`` is not used either:
    with ``xheaders`` it believes these headers from any peer.
    """
    peer = peer_address(request)
    if peer not in trusted:
        return peer
    address = peer
    hops = [h.strip() for h in request.headers.get("X-Forwarded-For", "").split(",")]
    for hop in reversed([h for h in hops if h]):
        if not is_valid_ip(hop):
            break  # a trusted proxy vouched for garbage: keep the last address it gave
        address = hop
        if hop not in trusted:
            break
    return address
