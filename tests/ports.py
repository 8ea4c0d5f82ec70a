"""Loopback ports for the servers tests start, chosen below the kernel's ephemeral range.

``bind(("127.0.0.1", 0))`` hands out a port from the ephemeral range
(``net.ipv4.ip_local_port_range``), the same range ``connect()`` takes its source ports
from. A client that polls such a port before its server has bound it can, now and then,
be given that very port as its source and connect to itself (TCP simultaneous open); it
then reads its own request back as the answer. CI saw exactly that from the readiness
poll of a test hub: ``BadStatusLine: GET /hub/api/ HTTP/1.1``. A port below the range is
never a client's source port, so a poll sees "connection refused" until the server is
up, and a "closed" port stays closed.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(part) for part in PORT_RANGE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A port on *host* that nothing is bound to now and that no client will take."""
    low, high = ephemeral_range()
    if low - 1 > LOWEST:
        candidates = range(LOWEST, low)
    elif high < 65535:
        candidates = range(high + 1, 65536)
    else:
        raise RuntimeError(f"{PORT_RANGE} leaves no ports outside the ephemeral range")
    for port in random.sample(candidates, min(200, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} outside the ephemeral range {low}-{high}")
