"""The only "internet" a simulated machine has: an HTTP proxy on its own loopback that
records what its dockerd tried to reach, and reaches nothing.

Each node's dockerd runs with ``HTTP_PROXY``/``HTTPS_PROXY`` pointing here (the harness
sets it: :func:`proxy_env`), so that a registry lookup (a service naming its image: moby
asks the registry before every start) never leaves the machine, not even as a DNS query:
with a proxy set, Go's HTTP client hands the host name to the proxy instead of resolving
it. The request line (``CONNECT registry-1.docker.io:443 HTTP/1.1``) is appended to the
record file and answered 403. Run as a script in the node's network namespace::

    python3 outbound.py --listen 127.0.0.1:3128 --record PATH
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

PORT = 3128
REFUSAL = (b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def proxy_env(no_proxy: list[str]) -> dict[str, str]:
    """The variables that send a dockerd's registry traffic to this node's recorder;
    *no_proxy*: the machines' own addresses (Swarm's gRPC between them honours them)."""
    proxy = f"http://127.0.0.1:{PORT}"
    excluded = ",".join(["localhost", "127.0.0.1", *no_proxy])
    return {"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "http_proxy": proxy,
            "https_proxy": proxy, "NO_PROXY": excluded, "no_proxy": excluded}


def requests_seen(record: Path) -> list[str]:
    """The request lines a node's dockerd sent out, oldest first."""
    try:
        return [line.split(" ", 1)[1] for line in record.read_text().splitlines() if line]
    except FileNotFoundError:
        return []


async def serve(host: str, port: int, record: Path) -> None:
    async def handle(reader, writer):
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            with record.open("a") as f:
                f.write(f"{time.time():.3f} {line.decode('latin-1').strip()}\n")
            writer.write(REFUSAL)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port)
    record.touch()  # ready: the harness waits for the file
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default=f"127.0.0.1:{PORT}")
    ap.add_argument("--record", type=Path, required=True)
    args = ap.parse_args()
    host, _, port = args.listen.rpartition(":")
    asyncio.run(serve(host, int(port), args.record))


if __name__ == "__main__":
    main()
