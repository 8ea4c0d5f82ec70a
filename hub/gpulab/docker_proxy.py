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
_VERSION_PREFIX = re.compile(r"^/v(\d+)\.(\d+)(?=/)")
# API versions below 1.24 let a start request carry a HostConfig that replaces the
# checked one; DeviceRequests need 1.40. Older clients are refused.
MIN_API_VERSION = (1, 40)
# A per-container call (start, stop, kill, remove, inspect, logs) names its container.
_PER_CONTAINER = re.compile(rf"/containers/(?!json$|create$)({_ID})(/.*)?")
MANAGED_LABEL = "org.gpulab.managed"

# Exactly what DockerSpawner sends for a gpulab user container (docker-py's spelling).
# Any other key with a non-empty value is refused: an allow-list, so that keys this
# module never heard of (VolumesFrom, GroupAdd, Sysctls, Runtime, ...) cannot slip by.
_CREATE_KEYS = {
    "Hostname", "Domainname", "ExposedPorts", "User", "Tty", "OpenStdin", "StdinOnce",
    "AttachStdin", "AttachStdout", "AttachStderr", "Env", "Cmd", "Image", "Volumes",
    "NetworkDisabled", "Entrypoint", "WorkingDir", "NetworkingConfig", "MacAddress",
    "Labels", "StopSignal", "Healthcheck", "StopTimeout", "HostConfig",
}
_HOST_CONFIG_KEYS = {
    "Binds", "CapDrop", "CpuPeriod", "CpuQuota", "NanoCpus", "DeviceRequests", "Init",
    "Memory", "MemorySwap", "Mounts", "NetworkMode", "PidsLimit", "SecurityOpt", "ShmSize",
    "AutoRemove", "PortBindings", "Links",
}
_NO_NEW_PRIVILEGES = {"no-new-privileges", "no-new-privileges:true", "no-new-privileges=true"}
_USER = re.compile(r"[1-9][0-9]*(:[1-9][0-9]*)?")


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""
    container: str = ""  # a per-container call: the container it names


def _bad_create(body: dict[str, Any]) -> str:
    """Why a container create is not a hardened user container ('' when it is)."""
    extra = sorted(k for k, v in body.items() if k not in _CREATE_KEYS and v)
    if extra:
        return f"container settings the hub never uses: {', '.join(extra)}"
    if not _USER.fullmatch(str(body.get("User") or "")):
        return "containers must run as a non-root numeric user (uid[:gid], not 0)"
    hc = body.get("HostConfig") or {}
    extra = sorted(k for k, v in hc.items() if k not in _HOST_CONFIG_KEYS and v)
    if extra:
        return f"host settings the hub never uses: {', '.join(extra)}"
    if hc.get("CapDrop") != ["ALL"]:
        return "containers must drop all capabilities"
    security = hc.get("SecurityOpt") or []
    if not security or any(opt not in _NO_NEW_PRIVILEGES for opt in security):
        return "containers must run with no-new-privileges and no other security option"
    network = str(hc.get("NetworkMode") or "")
    if network == "host" or network.startswith("container:"):
        return f"NetworkMode={network} is not allowed"
    if hc.get("Links"):
        return "links are not allowed"
    for bind in hc.get("Binds") or []:
        if bind.split(":")[0].startswith("/"):
            return f"bind mounts of host paths are not allowed ({bind.split(':')[0]})"
    for mount in hc.get("Mounts") or []:
        if mount.get("Type", "volume") != "volume" or set(mount) - {
                "Type", "Source", "Target", "ReadOnly"}:
            return "only plain named volumes may be mounted"
    for req in hc.get("DeviceRequests") or []:
        if req.get("Driver") not in ("nvidia", "") or req.get("Count") not in (None, 0):
            return "GPU requests must name their devices (DeviceIDs), not a count"
    return ""


# The exporter only lists containers (their labels name the GPU holders).
READ_ONLY: tuple[tuple[str, re.Pattern], ...] = tuple(
    (m, p) for m, p in ALLOWED if m in ("GET", "HEAD") and p.pattern in (
        r"/_ping", r"/version", r"/containers/json"))


def decide(method: str, target: str, body: bytes = b"", read_only: bool = False) -> Decision:
    """May the hub make this Docker API call? (method, request target, body).

    Per-container calls are allowed here only provisionally: the caller must also check
    that the named container is one of gpulab's (:data:`MANAGED_LABEL`).
    """
    raw_path = target.split("?", 1)[0]
    version = _VERSION_PREFIX.match(raw_path)
    if version and (int(version.group(1)), int(version.group(2))) < MIN_API_VERSION:
        return Decision(False, f"Docker API versions below {'.'.join(map(str, MIN_API_VERSION))}"
                               f" are refused")
    path = _VERSION_PREFIX.sub("", raw_path)
    if not any(m == method and p.fullmatch(path) for m, p in (READ_ONLY if read_only else ALLOWED)):
        who = "a read-only client" if read_only else "the hub"
        return Decision(False, f"{method} {path} is not among the calls {who} needs")
    if path == "/containers/create":
        try:
            spec = json.loads(body or b"{}")
        except ValueError:
            return Decision(False, "container create body is not JSON")
        why = _bad_create(spec if isinstance(spec, dict) else {})
        return Decision(not why, why)
    if body:
        return Decision(False, f"{method} {path} takes no request body")
    per_container = _PER_CONTAINER.fullmatch(path)
    return Decision(True, container=per_container.group(1) if per_container else "")


# ---------------------------------------------------------------- the I/O shell

MAX_HEAD = 64 * 1024
MAX_BODY = 4 * 1024 * 1024


class Proxy:
    def __init__(self, socket_path: str = "/var/run/docker.sock", read_only: bool = False):
        self.socket_path = socket_path
        self.read_only = read_only

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

        decision = decide(method, target, body, self.read_only)
        if decision.allowed and decision.container and not await self._managed(
                decision.container):
            decision = Decision(False, f"container {decision.container} is not gpulab's")
        if not decision.allowed:
            log.warning("refused %s %s: %s", method, target.split("?")[0], decision.reason)
            await self._refuse(writer, 403, decision.reason)
            return
        await self._forward(method, target, headers, body, writer)

    async def _managed(self, container: str) -> bool:
        """Is *container* one of gpulab's user containers (or absent: Docker says 404)?"""
        try:
            reader, writer = await asyncio.open_unix_connection(self.socket_path)
        except OSError:
            return True  # _forward answers 502 with the reason
        try:
            writer.write(f"GET /containers/{container}/json HTTP/1.1\r\nHost: docker\r\n"
                         f"Connection: close\r\n\r\n".encode("latin-1"))
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
        head, _, payload = raw.partition(b"\r\n\r\n")
        status = head.split(b" ", 2)[1] if b" " in head else b""
        if status == b"404":
            return True
        if b"chunked" in head.lower():
            payload = _unchunk(payload)
        try:
            labels = json.loads(payload)["Config"]["Labels"] or {}
        except (ValueError, KeyError, TypeError):
            return False
        return labels.get(MANAGED_LABEL) == "true"

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


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2:]
    return out


async def serve(host: str, port: int, socket_path: str, read_only: bool = False) -> None:
    proxy = Proxy(socket_path, read_only)
    server = await asyncio.start_server(proxy.handle, host, port, limit=MAX_HEAD)
    log.info("gpulab docker-proxy on %s:%d -> %s%s", host, port, socket_path,
             " (read-only: ping, version, container list)" if read_only else "")
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="gpulab-docker-proxy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default="0.0.0.0:2375", help="host:port (default 0.0.0.0:2375)")
    ap.add_argument("--docker-socket", default="/var/run/docker.sock")
    ap.add_argument("--read-only", action="store_true",
                    help="allow only ping, version and the container list (the exporter)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, _, port = args.listen.rpartition(":")
    asyncio.run(serve(host or "0.0.0.0", int(port), args.docker_socket, args.read_only))


if __name__ == "__main__":
    main()
