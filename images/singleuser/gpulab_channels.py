"""What SSH needs inside a member's server beyond a terminal: pipes and loopback ports.

The SSH gateway (gpulab-ssh, on the hub's side) gives ``ssh -t`` a Jupyter terminal. A
terminal is one pseudo-terminal, though: it echoes, merges stderr into stdout, turns
newlines into CRLF and has no exit status. What cannot go through one comes here, as
two websockets under this server's URL, behind its sign-in like the rest of it: the
owner's token, in an ``Authorization`` header only. Browsers cannot set that header on a
websocket, so no web page (not even one on the hub's own origin) can use a member's
cookies here: only the SSH gateway, which holds her token, opens these.

``/gpulab/exec``
    One command with stdin, stdout and stderr as pipes, byte for byte, and its exit
    status: ``ssh host CMD`` without a terminal, ``sftp``/``scp`` (sftp-server), and the
    script VS Code's Remote-SSH pipes into ``bash``. The client's first message is
    ``{"argv": [...]}``; then binary frames are stdin, ``{"eof": true}`` closes it. The
    server sends binary frames whose first byte says the stream (1 stdout, 2 stderr),
    then ``{"exit": status}`` once the command has ended and its output is all sent
    (``{"error": text}`` first when it could not be started). Closing the websocket
    hangs the command up, as a vanished SSH client does under sshd: its pipes close (a
    writer then gets SIGPIPE) and its process group gets SIGHUP.

``/gpulab/tcp/PORT``
    A TCP connection to PORT on this server's own loopback (127.0.0.1, else ::1) and
    nowhere else: ``ssh -L``/``-D`` to a member's own ports, which is how Remote-SSH
    reaches the VS Code server its script started. The server sends
    ``{"connected": true}`` or ``{"error": text}`` first; then binary frames are the
    stream both ways and ``{"eof": true}`` ends one direction.

Both count as running code, as a terminal does (Jupyter's "execute" on "terminals").
Neither side sends websocket pings: flow control may hold a side back for as long as
the member's SSH client is slow or paused, and a ping left unanswered meanwhile would
end the session (the SSH connection has its own keepalive). Enabled by
jupyter_server_config.d/gpulab_channels.json in the image.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal

from jupyter_core.utils import ensure_async
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.websocket import WebSocketClosedError, WebSocketHandler

STDOUT, STDERR = 1, 2
CHUNK = 64 * 1024
MAX_ARGV_BYTES = 256 * 1024  # a command line longer than Linux's own limit is refused
LOOPBACK = ("127.0.0.1", "::1")
CONNECT_TIMEOUT = 15.0  # seconds to connect to a loopback port (a full backlog hangs)


def parse_argv(message: str | bytes) -> list[str]:
    """The command of an exec channel's first message; ValueError with the reason."""
    if isinstance(message, bytes):
        raise ValueError("the first message must be text: {\"argv\": [...]}")
    try:
        argv = json.loads(message).get("argv")
    except (ValueError, AttributeError):
        raise ValueError("the first message must be {\"argv\": [...]}") from None
    if (not isinstance(argv, list) or not argv
            or not all(isinstance(a, str) and "\0" not in a for a in argv)):
        raise ValueError("argv must be a non-empty list of strings without NUL")
    if sum(len(a.encode()) + 1 for a in argv) > MAX_ARGV_BYTES:
        raise ValueError(f"the command is longer than {MAX_ARGV_BYTES} bytes")
    return argv


def exit_status(returncode: int) -> int:
    """As a shell reports it: a command killed by signal N ended with 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def control(message: str | bytes) -> dict:
    """A text frame's JSON object ({} for anything else)."""
    if isinstance(message, bytes):
        return {}
    try:
        value = json.loads(message)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _Channel(WebSocketMixin, WebSocketHandler, JupyterHandler):
    """A websocket that runs code as this server's user: signed in, authorized as a
    terminal is, same-origin for browsers (WebSocketMixin.check_origin)."""

    auth_resource = "terminals"
    ping_interval = 0  # no websocket pings (see the module's docstring); 0 for both
    # jupyter_server's WebSocketMixin (ms) and tornado (s)

    def set_default_headers(self):
        """No page headers on a websocket (as Jupyter's kernel websocket)."""

    async def get(self, *args, **kwargs):
        if "Authorization" not in self.request.headers:
            raise web.HTTPError(403, "gpulab channels take a token in an Authorization "
                                     "header only")
        user = self.current_user
        if not user:
            raise web.HTTPError(403)
        if not await ensure_async(
                self.authorizer.is_authorized(self, user, "execute", self.auth_resource)):
            raise web.HTTPError(403)
        await ensure_async(super().get(*args, **kwargs))

    def send(self, message: dict | bytes) -> asyncio.Future | None:
        """Send, or nothing once the client has gone."""
        try:
            if isinstance(message, bytes):
                return self.write_message(message, binary=True)
            return self.write_message(json.dumps(message))
        except WebSocketClosedError:
            return None

    async def sent(self, message: dict | bytes) -> bool:
        """Send and wait until it is written (back-pressure); False once the client has
        gone."""
        future = self.send(message)
        if future is None:
            return False
        try:
            await future
        except WebSocketClosedError:
            return False
        return True

    @property
    def gone(self) -> bool:
        return self.ws_connection is None or self.ws_connection.is_closing()


class ExecChannel(_Channel):
    proc: asyncio.subprocess.Process | None = None
    _pumps: asyncio.Future | None = None

    async def on_message(self, message):
        if self.proc is None:
            try:
                argv = parse_argv(message)
            except ValueError as e:
                self.send({"error": str(e)})
                self.send({"exit": 2})
                self.close()
                return
            await self._start(argv)
            return
        if isinstance(message, bytes):
            if self.proc.stdin is not None and not self.proc.stdin.is_closing():
                self.proc.stdin.write(message)
                try:
                    await self.proc.stdin.drain()  # back-pressure: the next frame waits
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the command stopped reading (head, exit): its stdin is gone
        elif control(message).get("eof") and self.proc.stdin is not None:
            self.proc.stdin.close()

    async def _start(self, argv: list[str]) -> None:
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=os.path.expanduser("~"),
                start_new_session=True)
        except OSError as e:
            self.send({"error": f"{argv[0]}: {e.strerror}"})
            self.send({"exit": 127 if isinstance(e, FileNotFoundError) else 126})
            self.close()
            return
        self.log.info("gpulab exec channel: %s (pid %s)", argv[0], self.proc.pid)
        if self.gone:  # the client left while the command was starting
            _hang_up(self.proc)
            return
        self._pumps = asyncio.ensure_future(self._finish())

    async def _pump(self, stream: asyncio.StreamReader, tag: int) -> None:
        # back-pressure: the command's output is read as fast as it is sent
        while chunk := await stream.read(CHUNK):
            if not await self.sent(bytes([tag]) + chunk):
                return  # the client has gone; on_close closed the pipes

    async def _finish(self) -> None:
        await asyncio.gather(self._pump(self.proc.stdout, STDOUT),
                             self._pump(self.proc.stderr, STDERR))
        status = exit_status(await self.proc.wait())
        self.send({"exit": status})
        self.close()

    def on_close(self):
        if self.proc is not None and self._pumps is not None and not self._pumps.done():
            _hang_up(self.proc)  # (a command still starting is hung up by _start)


def _hang_up(proc: asyncio.subprocess.Process) -> None:
    """As when an SSH client goes away under sshd: the command's pipes close (stdin
    ends; a write to stdout or stderr gets SIGPIPE) and its process group gets SIGHUP,
    whether or not its first process has already exited. What ignores both (``nohup``
    with its output in a file: a server left running on purpose, as VS Code's
    Remote-SSH leaves its own) keeps running, as under sshd."""
    if proc.stdin is not None:
        proc.stdin.close()
    transport = proc._transport  # asyncio's own pipes: no public way to close them
    for fd in (1, 2):
        pipe = transport.get_pipe_transport(fd)
        if pipe is not None:
            pipe.close()
    try:
        os.killpg(proc.pid, signal.SIGHUP)
    except ProcessLookupError:
        pass


class TcpChannel(_Channel):
    writer: asyncio.StreamWriter | None = None
    ended: set[str]  # "client", "port": whose side has sent its end of file

    def initialize(self):
        self.ended = set()

    def _ended(self, side: str) -> None:
        """A direction is over; once both are, the channel closes."""
        self.ended.add(side)
        if self.ended == {"client", "port"}:
            self.close()

    async def open(self, port: str):
        super().open()
        number = int(port)
        if not 0 < number < 65536:
            self.send({"error": f"no port {port}"})
            self.close()
            return
        error = None
        for host in LOOPBACK:
            try:
                reader, self.writer = await asyncio.wait_for(
                    asyncio.open_connection(host, number), CONNECT_TIMEOUT)
                break
            except TimeoutError:
                error = error or TimeoutError(errno.ETIMEDOUT, "timed out")
            except OSError as e:
                error = error or e
        else:
            reason = os.strerror(error.errno) if error.errno else str(error)
            self.send({"error": f"connect to port {number}: {reason}"})
            self.close()
            return
        if self.gone:  # the client left while we connected
            self.writer.close()
            return
        self.send({"connected": True})
        asyncio.ensure_future(self._to_client(reader))

    async def _to_client(self, reader: asyncio.StreamReader) -> None:
        try:
            while chunk := await reader.read(CHUNK):
                if not await self.sent(chunk):
                    return
        except OSError:
            pass
        self.send({"eof": True})
        self._ended("port")

    async def on_message(self, message):
        if self.writer is None or self.writer.is_closing():
            return
        try:
            if isinstance(message, bytes):
                self.writer.write(message)
                await self.writer.drain()
            elif control(message).get("eof"):
                if self.writer.can_write_eof():
                    self.writer.write_eof()
                self._ended("client")
        except OSError:
            self.close()

    def on_close(self):
        if self.writer is not None:
            self.writer.close()


def _jupyter_server_extension_points():
    return [{"module": "gpulab_channels"}]


def _load_jupyter_server_extension(serverapp):
    base = serverapp.web_app.settings["base_url"]
    serverapp.web_app.add_handlers(".*$", [
        (url_path_join(base, "/gpulab/exec"), ExecChannel),
        (url_path_join(base, r"/gpulab/tcp/(\d{1,5})"), TcpChannel),
    ])
