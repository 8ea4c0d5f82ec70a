"""Commands with plain pipes and loopback ports in a member's server (I/O only).

The other end is ``gpulab_channels``, a Jupyter server extension in the single-user
image (images/singleuser/gpulab_channels.py, which documents the protocol): two
websockets under ``/user/<name>/gpulab/``, reached through the hub's proxy with the
member's own token, like the terminal (:mod:`gpulab.ssh.terminal`).

:func:`run_command` runs one command there for an SSH session without a terminal
(``ssh host CMD``, ``ssh -T host`` with a script, sftp, scp, VS Code's Remote-SSH
script) and pipes it to the session byte for byte; :func:`open_port` connects to one of
the server's own loopback ports for ``ssh -L``/``-D``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import asyncssh
from tornado.websocket import WebSocketClientConnection

from gpulab.hubapi import HubApiError
from gpulab.ssh.terminal import TIMEOUT, ServerUnreachable, hub_api

STDOUT, STDERR = 1, 2
CHUNK = 32 * 1024
EOF = json.dumps({"eof": True})
OLD_IMAGE = ("Your server was started before gpulab-ssh could run commands without a "
             "terminal. Restart it (hub home page: Stop My Server, then Start) and try "
             "again; `ssh -t` works meanwhile.")


class Unavailable(ServerUnreachable):
    """The member's server has no gpulab_channels (an older image)."""


async def _connect(hub_url: str, server_path: str, token: str, tls_trust: Path | None,
                   endpoint: str) -> WebSocketClientConnection:
    server = hub_api(hub_url, tls_trust, server_path)
    try:
        # no pings: flow control may hold either side back as long as the member's SSH
        # client is slow or paused, and an unanswered ping would end the session
        return await server.websocket(f"gpulab/{endpoint}", token=token,
                                      max_message_size=4 * CHUNK)
    except HubApiError as e:
        if e.status == 404:
            raise Unavailable(OLD_IMAGE) from None
        raise ServerUnreachable(f"could not open gpulab/{endpoint} in {server.url}/: "
                       f"{e.message}") from None


def _control(message: str) -> dict:
    try:
        value = json.loads(message)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def run_command(hub_url: str, server_path: str, token: str, tls_trust: Path | None,
                      argv: list[str], stdin: asyncssh.SSHReader,
                      stdout: asyncssh.SSHWriter, stderr: asyncssh.SSHWriter) -> int:
    """Run *argv* in the member's server with the session's streams (bytes) as its
    stdin, stdout and stderr; its exit status (255 when the server went away)."""
    ws = await _connect(hub_url, server_path, token, tls_trust, "exec")
    try:
        await ws.write_message(json.dumps({"argv": argv}))

        async def from_client() -> None:
            while True:
                try:
                    data = await stdin.read(CHUNK)
                except (asyncssh.TerminalSizeChanged, asyncssh.BreakReceived,
                        asyncssh.SignalReceived):
                    continue  # requests a command with pipes has no use for
                if not data:
                    break
                await ws.write_message(data, binary=True)
            await ws.write_message(EOF)

        async def to_client() -> int:
            while (message := await ws.read_message()) is not None:
                if isinstance(message, bytes):
                    if message[:1] == bytes([STDOUT]):
                        stdout.write(message[1:])
                        await stdout.drain()
                    elif message[:1] == bytes([STDERR]):
                        stderr.write(message[1:])
                        await stderr.drain()
                    continue
                c = _control(message)
                if isinstance(c.get("error"), str):
                    stderr.write(f"{c['error']}\r\n".encode())
                if isinstance(c.get("exit"), int):
                    return c["exit"]
            return 255

        feeding = asyncio.create_task(from_client())
        result = asyncio.create_task(to_client())
        gone = asyncio.create_task(stdin.channel.wait_closed())
        try:
            done, _ = await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
            # the client went away: closing the websocket hangs the command up
            return result.result() if result in done else 255
        finally:
            for task in (feeding, result, gone):
                task.cancel()
    finally:
        ws.close()


class Port(asyncssh.SSHTCPSession):
    """``ssh -L``/``-D`` to a loopback port of the member's server: one forwarded
    connection, carried by a gpulab/tcp websocket already connected there."""

    def __init__(self, ws: WebSocketClientConnection):
        self.ws = ws
        self.chan: asyncssh.SSHTCPChannel | None = None
        self.outbox: asyncio.Queue[bytes | str | None] = asyncio.Queue()
        self.writable = asyncio.Event()  # cleared while the client's window is full
        self.writable.set()
        self.tasks: list[asyncio.Task] = []
        self.closed: Callable[[], None] = lambda: None  # called when the channel closes

    def connection_made(self, chan):
        self.chan = chan
        self.tasks = [asyncio.create_task(self._to_port()),
                      asyncio.create_task(self._to_client())]

    def data_received(self, data, datatype):
        self.outbox.put_nowait(data)
        if self.outbox.qsize() > 16:
            self.chan.pause_reading()  # resumed as the websocket drains

    def eof_received(self):
        self.outbox.put_nowait(EOF)
        return True  # keep the channel open for what the port still sends

    def pause_writing(self):
        self.writable.clear()

    def resume_writing(self):
        self.writable.set()

    def connection_lost(self, exc):
        self.outbox.put_nowait(None)
        for t in self.tasks:
            t.cancel()
        self.ws.close()
        self.closed()

    async def _to_port(self) -> None:
        while (item := await self.outbox.get()) is not None:
            try:
                await self.ws.write_message(item, binary=isinstance(item, bytes))
            except Exception:  # the websocket closed: the port's side ends the channel
                return
            if self.outbox.qsize() <= 4:
                self.chan.resume_reading()

    async def _to_client(self) -> None:
        while (message := await self.ws.read_message()) is not None:
            if isinstance(message, bytes):
                await self.writable.wait()  # the port is read as fast as the client reads
                self.chan.write(message)
            elif _control(message).get("eof"):
                self.chan.write_eof()
        self.chan.close()


async def open_port(hub_url: str, server_path: str, token: str, tls_trust: Path | None,
                    port: int) -> Port:
    """A session for one forwarded connection to *port* on the server's loopback, once
    the server has connected to it; :class:`asyncssh.ChannelOpenError` otherwise (the
    client then reports the reason, as for a refused port on any SSH server)."""
    try:
        ws = await _connect(hub_url, server_path, token, tls_trust, f"tcp/{port}")
    except ServerUnreachable as e:
        raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, str(e)) from None
    try:
        first = await asyncio.wait_for(ws.read_message(), TIMEOUT)
    except TimeoutError:
        first = None
    c = _control(first) if isinstance(first, str) else {}
    if not c.get("connected"):
        ws.close()
        reason = c.get("error") or "the server closed the connection"
        raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, str(reason))
    return Port(ws)
