"""The hub's only way to Docker: a filtering proxy in front of the Docker socket.

Whoever holds the Docker socket is root on the host. The hub needs only a handful of
Docker API calls (create, start, inspect, stop, remove and list its user containers;
inspect images and volumes; read a crashed container's log), so it talks to this proxy
instead (``DOCKER_HOST=tcp://docker-proxy:2375`` on an internal network) and the proxy
alone mounts the socket. Anything else is refused with 403, and a container create is
refused unless it is a hardened user container: non-root, no added capabilities,
``no-new-privileges``, not privileged, no host namespaces, no host devices, and named
volumes only (no bind mounts, so no Docker socket or host path inside). A compromised
hub can start user containers; it cannot start a root shell on the host.

:func:`decide` is the policy, a pure function; :class:`Proxy` is the thin I/O shell.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("gpulab.docker_proxy")

_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
ALLOWED: tuple[tuple[str, re.Pattern], ...] = tuple(
    (method, re.compile(path))
    for method, path in (
        ("GET", r"/_ping"), ("HEAD", r"/_ping"), ("GET", r"/version"),
        ("GET", r"/containers/json"),
        ("POST", r"/containers/create"),
        ("GET", rf"/containers/{_ID}/json"),
        ("GET", rf"/containers/{_ID}/logs"),
        ("POST", rf"/containers/{_ID}/(start|stop|kill)"),
        ("DELETE", rf"/containers/{_ID}"),
        ("GET", r"/images/[^?]+/json"),
        ("GET", rf"/volumes/{_ID}"),
    )
)
_VERSION_PREFIX = re.compile(r"^/v\d+\.\d+(?=/)")
_HOST_MODES = ("host",)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


def _bad_create(body: dict[str, Any]) -> str:
    """Why a container create is not a hardened user container ('' when it is)."""
    user = str(body.get("User") or "")
    if user.split(":")[0] in ("", "0", "root"):
        return "containers must run as a non-root user"
    hc = body.get("HostConfig") or {}
    if hc.get("Privileged"):
        return "privileged containers are not allowed"
    if hc.get("CapAdd"):
        return f"adding capabilities is not allowed ({hc['CapAdd']})"
    if "ALL" not in (hc.get("CapDrop") or []):
        return "containers must drop all capabilities"
    options = [opt.split(":")[0].split("=")[0] for opt in hc.get("SecurityOpt") or []]
    if "no-new-privileges" not in options:
        return "containers must run with no-new-privileges"
    for key in ("NetworkMode", "PidMode", "IpcMode", "UTSMode", "UsernsMode", "CgroupnsMode"):
        if str(hc.get(key) or "") in _HOST_MODES:
            return f"{key}=host is not allowed"
    if hc.get("Devices") or hc.get("DeviceCgroupRules"):
        return "host devices are not allowed (GPUs go through DeviceRequests)"
    for bind in hc.get("Binds") or []:
        if bind.split(":")[0].startswith("/"):
            return f"bind mounts of host paths are not allowed ({bind.split(':')[0]})"
    for mount in hc.get("Mounts") or []:
        if mount.get("Type", "volume") != "volume":
            return f"only named volumes may be mounted, not {mount.get('Type')}"
    for req in hc.get("DeviceRequests") or []:
        if req.get("Driver") not in ("nvidia", "") or req.get("Count") not in (None, 0):
            return "GPU requests must name their devices (DeviceIDs), not a count"
    return ""


def decide(method: str, target: str, body: bytes = b"") -> Decision:
    """May the hub make this Docker API call? (method, request target, body)."""
    path = _VERSION_PREFIX.sub("", target.split("?", 1)[0])
    if not any(m == method and p.fullmatch(path) for m, p in ALLOWED):
        return Decision(False, f"{method} {path} is not among the calls the hub needs")
    if method == "POST" and path == "/containers/create":
        try:
            spec = json.loads(body or b"{}")
        except ValueError:
            return Decision(False, "container create body is not JSON")
        why = _bad_create(spec if isinstance(spec, dict) else {})
        if why:
            return Decision(False, why)
    return Decision(True)


# ---------------------------------------------------------------- the I/O shell

MAX_HEAD = 64 * 1024
MAX_BODY = 4 * 1024 * 1024


class Proxy:
    def __init__(self, socket_path: str = "/var/run/docker.sock"):
        self.socket_path = socket_path

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > MAX_HEAD:
                raise ValueError("request head too large")
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, target, _version = request_line.split(" ", 2)
            headers = [h for h in header_lines if h]
            length = next((int(h.split(":", 1)[1]) for h in headers
                           if h.lower().startswith("content-length:")), 0)
            if any(h.lower().startswith("transfer-encoding:") for h in headers):
                await self._refuse(writer, 411, "send a Content-Length, not a chunked body")
                return
            if length > MAX_BODY:
                await self._refuse(writer, 413, "request body too large")
                return
            body = await reader.readexactly(length) if length else b""
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            await self._refuse(writer, 400, f"bad request: {e}")
            return

        decision = decide(method, target, body)
        if not decision.allowed:
            log.warning("refused %s %s: %s", method, target.split("?")[0], decision.reason)
            await self._refuse(writer, 403, decision.reason)
            return
        await self._forward(method, target, headers, body, writer)

    async def _forward(self, method, target, headers, body, writer):
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.socket_path)
        except OSError as e:
            await self._refuse(writer, 502, f"Docker engine unreachable: {e}")
            return
        kept = [h for h in headers if not h.lower().startswith(("connection:", "keep-alive:"))]
        up_writer.write(("\r\n".join([f"{method} {target} HTTP/1.1", *kept,
                                      "Connection: close"]) + "\r\n\r\n").encode("latin-1"))
        up_writer.write(body)
        await up_writer.drain()
        try:
            while chunk := await up_reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        finally:
            up_writer.close()
            writer.close()

    @staticmethod
    async def _refuse(writer, status: int, message: str) -> None:
        payload = json.dumps({"message": f"gpulab docker-proxy: {message}"}).encode()
        reason = {400: "Bad Request", 403: "Forbidden", 411: "Length Required",
                  413: "Payload Too Large", 502: "Bad Gateway"}[status]
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode())
        writer.write(payload)
        try:
            await writer.drain()
        finally:
            writer.close()


async def serve(host: str, port: int, socket_path: str) -> None:
    proxy = Proxy(socket_path)
    server = await asyncio.start_server(proxy.handle, host, port, limit=MAX_HEAD)
    log.info("gpulab docker-proxy on %s:%d -> %s", host, port, socket_path)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="gpulab-docker-proxy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default="0.0.0.0:2375", help="host:port (default 0.0.0.0:2375)")
    ap.add_argument("--docker-socket", default="/var/run/docker.sock")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, _, port = args.listen.rpartition(":")
    asyncio.run(serve(host or "0.0.0.0", int(port), args.docker_socket))


if __name__ == "__main__":
    main()
