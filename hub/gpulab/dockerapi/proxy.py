"""The hub's only way to Docker: a filtering proxy in front of the Docker socket.

Whoever holds the Docker socket is root on the host. The hub needs only a handful of
Docker API calls (create, start, inspect, stop, remove and list its user containers;
inspect images and volumes; read a crashed container's log), so it talks to this proxy
instead (``DOCKER_HOST=tcp://docker-proxy:2375`` on an internal network) and the proxy
alone mounts the socket. What may pass is decided by :mod:`gpulab.dockerapi.policy` (a
hardened user container of this lab, and nothing else); this module is the I/O around
it, and refuses on its own account:

* a request head that two HTTP parsers could read differently (400): a bare LF or CR,
  an obs-fold line, a duplicate or non-numeric Content-Length, a request line that is
  not ``METHOD SP /path SP HTTP/1.x``; and any Transfer-Encoding (411);
* a per-container call (start, stop, kill, remove, inspect, logs) on a container that
  is not gpulab's. The reference is resolved to the full container ID once, the managed
  label of *that* container is checked, and the call is forwarded with the full ID, so
  no other container can take the name in between. A reference Docker does not know is
  answered with Docker's 404 (DockerSpawner reads 404 as "gone");
* with ``--swarm`` (in front of a Swarm manager), likewise a per-service call (inspect,
  remove) or a task list on a service that is not gpulab's: the service is resolved to
  its full ID, its managed label checked, and the call forwarded with that ID.

Forwarded requests carry the checked body re-serialized and fresh headers (Host,
Content-Type, Content-Length, Connection: close), never the client's bytes.

With ``--exit-when-socket-gone`` the proxy exits (status 1) when the socket has refused
connections for 3 s: a restarted dockerd makes a new socket, and a socket file mounted
into this container stays the old, dead one until Docker's restart policy restarts it.
With ``--read-only`` only ping, version and the container list pass (the exporter). With
``--swarm`` the service, task and node calls of :mod:`gpulab.dockerapi.swarm_policy` pass too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from gpulab.contract import LABEL_MANAGED
from gpulab.dockerapi import policy as docker_policy
from gpulab.dockerapi.policy import ProxyVerdict
from gpulab.dockerapi.schema import IMAGE_ID
from gpulab.environments import lab_images
from gpulab.refusal import Refusal

log = logging.getLogger("gpulab.dockerapi.proxy")

MAX_HEAD = 64 * 1024
MAX_BODY = 4 * 1024 * 1024
MAX_INSPECT = 16 * 1024 * 1024
HEAD_TIMEOUT = 30.0  # seconds for a client to send its request

_REQUEST_LINE = re.compile(r"([A-Z]{1,16}) (/[!-~]*) HTTP/1\.[01]")
_HEADER = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*)")
_FULL_ID = re.compile(r"[0-9a-f]{64}")
_SERVICE_ID = re.compile(r"[0-9a-z]{25}")  # swarmkit's identity.NewID()
_REASONS = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 411: "Length Required",
            413: "Payload Too Large", 502: "Bad Gateway", 503: "Service Unavailable"}


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    content_length: int


def parse_head(head: bytes) -> RequestHead:
    """The request line and Content-Length of a head ending in CRLF CRLF, read strictly;
    raises :class:`Refusal` for anything two parsers could read differently."""
    lines = head.removesuffix(b"\r\n\r\n").split(b"\r\n")
    for line in lines:
        if b"\n" in line or b"\r" in line:
            raise Refusal(400, "bare LF or CR in the request head (lines end with CRLF)")
    text = [line.decode("latin-1") for line in lines]
    request_line = _REQUEST_LINE.fullmatch(text[0])
    if not request_line:
        raise Refusal(400, f"request line {text[0][:200]!r} is not 'METHOD /path HTTP/1.1'")
    lengths = []
    for line in text[1:]:
        if line[:1] in (" ", "\t"):
            raise Refusal(400, "folded header line (obs-fold) in the request head")
        header = _HEADER.fullmatch(line.rstrip(" \t"))
        if not header:
            raise Refusal(400, f"malformed header line {line[:200]!r}")
        name, value = header.group(1).lower(), header.group(2).rstrip(" \t")
        if name == "transfer-encoding":
            raise Refusal(411, "send a Content-Length, not a Transfer-Encoding")
        if name == "content-length":
            lengths.append(value)
    if len(lengths) > 1:
        raise Refusal(400, "more than one Content-Length")
    if lengths and not re.fullmatch(r"[0-9]{1,12}", lengths[0]):
        raise Refusal(400, f"Content-Length {lengths[0][:50]!r} is not a number")
    length = int(lengths[0]) if lengths else 0
    if length > MAX_BODY:
        raise Refusal(413, "request body too large")
    return RequestHead(request_line.group(1), request_line.group(2), length)


def parse_response(raw: bytes) -> tuple[int, bytes]:
    """(status, body) of a whole HTTP/1.1 response (read until the server closed)."""
    head, _, payload = raw.partition(b"\r\n\r\n")
    status_line, *headers = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {status_line[:100]!r}")
    fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in headers)}
    if "chunked" in fields.get("transfer-encoding", "").lower():
        payload = _unchunk(payload)
    elif fields.get("content-length", "").isdigit():
        payload = payload[:int(fields["content-length"])]
    return int(parts[1]), payload


def _unchunk(data: bytes) -> bytes:
    out = []
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            break
        out.append(rest[:size])
        data = rest[size + 2:]
    return b"".join(out)


class Proxy:
    def __init__(self, socket_path: str = "/var/run/docker.sock", read_only: bool = False,
                 settings_path: str | None = None, swarm: bool = False):
        self.socket_path = socket_path
        self.read_only = read_only
        self.settings_path = settings_path
        self.swarm = swarm
        # Python 3.11's start_server keeps no reference to a connection's task; one whose
        # client half-closed could be garbage-collected mid-request without this.
        self._tasks: set[asyncio.Task] = set()
        # Set when a connection to Docker is refused: serve() then exits at once (with
        # --exit-when-socket-gone) instead of waiting for the watchdog's next look.
        self.socket_dead = asyncio.Event()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_unix_connection(self.socket_path)
        except (ConnectionRefusedError, FileNotFoundError):
            self.socket_dead.set()
            raise

    def settings(self) -> Mapping[str, Any]:
        """The lab's settings, read again at every create (an admin's edit applies; an
        invalid edit keeps the last good version, see :mod:`gpulab.live_config`)."""
        if not self.settings_path:
            from gpulab.settings import defaults
            return defaults()
        from gpulab.live_config import settings_file
        return settings_file.load(self.settings_path)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        task = asyncio.current_task()
        self._tasks.add(task)
        request = None
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
                request = parse_head(head)
                body = await asyncio.wait_for(reader.readexactly(request.content_length),
                                              HEAD_TIMEOUT)
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
                raise Refusal(400, f"incomplete or oversized request ({type(e).__name__})"
                              ) from None
            await self._answer(request, body, writer)
        except Refusal as e:
            call = (f"{request.method} {request.target.split('?')[0][:200]}" if request
                    else "a request")
            if e.status == 404:  # not a refusal: Docker does not know the container
                log.info("%s: %s", call, e)
            else:
                log.warning("refused %s (%d): %s", call, e.status, e)
            await self._reply(writer, e.status, str(e))
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            log.info("client went away: %s", e)
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _answer(self, request: RequestHead, body: bytes, writer: asyncio.StreamWriter):
        method, target = request.method, request.target
        settings = None
        if docker_policy.is_create(method, target):
            try:
                settings = self.settings()
            except Exception as e:  # ConfigError, and the file never validated
                raise Refusal(503, f"the lab's settings cannot be read: {e}") from None
        image_ids = None
        if self.swarm and settings is not None and docker_policy.is_service_create(
                method, target):
            images = lab_images(settings)
            image_ids = dict(zip(images, await asyncio.gather(
                *(self._image_id(image) for image in images)), strict=True))
        decision: ProxyVerdict = docker_policy.proxy_verdict(
            method, target, body, settings=settings, read_only=self.read_only,
            swarm=self.swarm, image_ids=image_ids)
        if not decision.allowed:
            raise Refusal(decision.status, decision.reason)
        if decision.container:
            object_id = await self._resolve(decision.container)
        elif decision.service:
            object_id = await self._resolve_service(decision.service)
        else:
            object_id = ""
        await self._forward(method, decision.target(object_id), decision.body, writer)

    async def _call(self, method: str, target: str) -> tuple[int, bytes]:
        """One whole request to Docker, for the proxy itself."""
        reader, writer = await self._connect()
        try:
            writer.write(f"{method} {target} HTTP/1.1\r\nHost: docker\r\n"
                         f"Connection: close\r\n\r\n".encode("latin-1"))
            await writer.drain()
            raw = b""
            while len(raw) <= MAX_INSPECT and (chunk := await reader.read(65536)):
                raw += chunk
        finally:
            writer.close()
        return parse_response(raw)

    async def _image_id(self, image: str) -> str | None:
        """The ID of *image* on this engine (a Swarm's manager), None when it has none:
        a member's service must name exactly that ID (gpulab.dockerapi.swarm_policy)."""
        try:
            status, payload = await self._call("GET", f"/images/{quote(image, safe='/:@')}/json")
        except (OSError, ValueError) as e:
            raise Refusal(502, f"Docker engine unreachable: {e}") from None
        if status != 200:  # 404: not there; 400: a name Docker does not take
            if status != 404:
                log.warning("Docker answered %s to inspecting image %s: taken as not there",
                            status, image)
            return None
        try:
            image_id = json.loads(payload).get("Id")
        except (ValueError, AttributeError):
            image_id = None
        if not isinstance(image_id, str) or not IMAGE_ID.fullmatch(image_id):
            raise Refusal(502, f"Docker answered {status} without an image ID to "
                               f"inspecting image {image}")
        return image_id

    async def _resolve(self, ref: str) -> str:
        """The full ID of the container *ref* names, when it is gpulab's."""
        return await self._inspect_ours("container", f"/containers/{ref}/json", ref,
                                        "Id", "Config", _FULL_ID, f"No such container: {ref}")

    async def _resolve_service(self, ref: str) -> str:
        """The full ID of the Swarm service *ref* names (ID, name or unique ID prefix, as
        dockerd resolves it), when it is gpulab's."""
        return await self._inspect_ours("service", f"/services/{ref}", ref, "ID", "Spec",
                                        _SERVICE_ID, f"service {ref} not found")

    async def _inspect_ours(self, kind: str, path: str, ref: str, id_key: str,
                            labels_key: str, id_pattern, not_found: str) -> str:
        """Inspect one object at *path*: its full ID (*id_key*, matching *id_pattern*)
        when its labels (under *labels_key*) say it is gpulab's; else the Refusal Docker's
        answer calls for (404 as Docker says it, 502, or 403 for anything not ours)."""
        try:
            status, payload = await self._call("GET", path)
        except (OSError, ValueError) as e:
            raise Refusal(502, f"Docker engine unreachable: {e}") from None
        try:
            info = json.loads(payload)
        except ValueError:
            info = {}
        if status == 404:
            message = info.get("message") if isinstance(info, dict) else None
            raise Refusal(404, message or not_found)
        if status != 200 or not isinstance(info, dict):
            raise Refusal(502, f"Docker answered {status} to inspecting {kind} {ref}")
        full_id = info.get(id_key)
        labels = (info.get(labels_key) or {}).get("Labels") or {}
        if not isinstance(full_id, str) or not id_pattern.fullmatch(full_id):
            raise Refusal(502, f"Docker gave no {kind} ID for {ref}")
        if labels.get(LABEL_MANAGED) != "true":
            raise Refusal(403, f"{kind} {ref} is not gpulab's")
        return full_id

    async def _forward(self, method: str, target: str, body: bytes,
                       writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await self._connect()
        except OSError as e:
            raise Refusal(502, f"Docker engine unreachable: {e}") from None
        head = [f"{method} {target} HTTP/1.1", "Host: docker"]
        if body:
            head.append("Content-Type: application/json")
        if body or method in ("POST", "PUT"):
            head.append(f"Content-Length: {len(body)}")
        head.append("Connection: close")
        try:
            up_writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
            await up_writer.drain()
            while chunk := await up_reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        finally:
            up_writer.close()

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, status: int, message: str) -> None:
        prefix = "" if status == 404 else "gpulab docker-proxy: "
        payload = json.dumps({"message": f"{prefix}{message}"}).encode()
        writer.write(f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/json"
                     f"\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
                     .encode() + payload)
        try:
            await writer.drain()
        except ConnectionError:
            pass


async def watch_socket(socket_path: str, interval: float = 0.5, failures: int = 3,
                       dead: asyncio.Event | None = None) -> str:
    """Return why, once the socket at *socket_path* is dead: at once when a connection is
    refused or the file is gone (nobody listens on it: a restarted dockerd made a new
    socket that this file mount never sees), or after *failures* other failures in a row
    (timeouts: a busy engine is not a dead one), one connection every *interval* seconds;
    or at once when *dead* is set (a request found it refused first)."""
    failed = 0
    while True:
        if dead is not None:
            try:
                await asyncio.wait_for(dead.wait(), interval)
                return "a request found the socket refusing connections"
            except TimeoutError:
                pass
        else:
            await asyncio.sleep(interval)
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(socket_path), interval)
            writer.close()
            failed = 0
        except (ConnectionRefusedError, FileNotFoundError) as e:
            return f"a connection was refused ({e!r}): nobody listens on this socket"
        except (TimeoutError, OSError) as e:
            failed += 1
            if failed >= failures:
                return f"{failed} connections in a row failed, the last with: {e!r}"


async def serve(host: str, port: int, socket_path: str, read_only: bool = False,
                settings_path: str | None = None, exit_when_socket_gone: bool = False,
                watch_interval: float = 0.5, swarm: bool = False) -> int:
    """Serve until cancelled, or (with *exit_when_socket_gone*) until the socket is dead;
    returns the exit status."""
    proxy = Proxy(socket_path, read_only, settings_path, swarm)
    if settings_path:
        # Read the settings now, not at the first create: a proxy restarted (by a dockerd
        # restart, say) after an admin's invalid edit then still has the last good
        # version, as the hub has, instead of refusing every spawn.
        try:
            proxy.settings()
        except Exception as e:  # ConfigError: creates are refused until it is fixed
            log.error("the lab's settings cannot be read; container creates are refused "
                      "until they can: %s", e)
    server = await asyncio.start_server(proxy.handle, host, port, limit=MAX_HEAD)
    log.info("gpulab docker-proxy on %s:%d -> %s%s", host, port, socket_path,
             " (read-only: ping, version, container list)" if read_only
             else " (with Swarm services, tasks and nodes)" if swarm else "")
    async with server:
        if not exit_when_socket_gone:
            await server.serve_forever()
            return 0
        why = await watch_socket(socket_path, watch_interval, dead=proxy.socket_dead)
        log.error("Docker socket %s is gone (%s); exiting so that the restart policy starts "
                  "the proxy again with the new socket", socket_path, why)
        return 1


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="gpulab-docker-proxy",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default="0.0.0.0:2375", help="host:port (default 0.0.0.0:2375)")
    ap.add_argument("--docker-socket", default="/var/run/docker.sock",
                    help="Docker's socket (default /var/run/docker.sock)")
    ap.add_argument("--settings", metavar="PATH",
                    help="the lab's settings file (config/gpulab.yaml), read again at every "
                         "create for spawn.image, spawn.network and spawn.datasets_volume; "
                         "default: the built-in defaults. "
                         "Example: --settings /srv/gpulab/config/gpulab.yaml")
    ap.add_argument("--read-only", action="store_true",
                    help="allow only ping, version and the container list (the exporter)")
    ap.add_argument("--swarm", action="store_true",
                    help="also allow the Swarm calls of a multi-node hub (service create, "
                         "inspect, list and remove of members' servers, their tasks, node "
                         "list and inspect); for a proxy in front of a Swarm manager")
    ap.add_argument("--exit-when-socket-gone", action="store_true",
                    help="exit with status 1 as soon as the socket refuses a connection "
                         "(looked at every 0.5 s, and at every request): a restarted "
                         "dockerd made a new socket, which a file mount never sees; the "
                         "restart policy brings the proxy back on the new one")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, _, port = args.listen.rpartition(":")
    sys.exit(asyncio.run(serve(host or "0.0.0.0", int(port), args.docker_socket,
                               args.read_only, args.settings, args.exit_when_socket_gone,
                               swarm=args.swarm)))


if __name__ == "__main__":
    main()
