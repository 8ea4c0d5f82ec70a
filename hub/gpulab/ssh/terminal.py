"""The hub and a member's Jupyter terminal, reached through the hub's proxy (I/O only).

:func:`hub_api` is the hub's REST API as the gateway reaches it (who a token belongs to,
the connection's server token: a :class:`gpulab.hubapi.HubApi`). :class:`Terminal` opens
a terminal in the member's server with her token (``POST /user/<name>/api/terminals``),
talks terminado's websocket protocol to it
(``/user/<name>/terminals/websocket/<term>``: ``["stdin", text]``,
``["set_size", rows, cols]`` out; ``["stdout", text]``, ``["disconnect", ...]`` in) and
deletes it afterwards. jupyterhub-singleuser checks the token's
``access:servers!server=<name>/`` scope on every request, so a token opens its owner's
server and no other. Tokens travel only in ``Authorization`` headers, never in URLs.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import socket
import ssl
from pathlib import Path
from urllib.parse import quote, urlsplit

import asyncssh
from tornado.netutil import DefaultLoopResolver, Resolver
from tornado.websocket import WebSocketClientConnection

from gpulab.hubapi import HubApi, HubApiError
from gpulab.ssh import execwrap

TIMEOUT = 15.0  # seconds for any one request to the hub or the member's server


def tls_context(trust: Path | None) -> ssl.SSLContext | None:
    """For a hub served over HTTPS: trust exactly the certificate the proxy serves (the
    file itself, leaf first, as a trust anchor), with the host name checked as usual.
    Read at each call, so that a renewed certificate is picked up."""
    if trust is None:
        return None
    ctx = ssl.create_default_context(cafile=str(trust))
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return ctx


class BelowTheHubResolver(Resolver):
    """Names below the hub's (``alice.gpu.lab.example``: members' servers with one origin
    each) resolve as the hub's own name: inside the stack the proxy answers for all of
    them, and Docker's DNS knows it by the hub's name only (a network alias)."""

    def initialize(self, hub_host: str) -> None:
        self.hub_host = hub_host.lower()
        self.resolver = DefaultLoopResolver()

    async def resolve(self, host, port, family=socket.AF_UNSPEC):
        if host.lower().endswith("." + self.hub_host):
            host = self.hub_host
        return await self.resolver.resolve(host, port, family)


def resolve_below_the_hub(hub_url: str) -> None:
    """Every tornado client of this process resolves NAME.<hub host> as <hub host>."""
    host = urlsplit(hub_url).hostname
    if host:
        Resolver.configure(BelowTheHubResolver, hub_host=host)


class ServerUnreachable(Exception):
    """The hub or the member's server did not answer as expected (not a policy refusal)."""


def hub_api(hub_url: str, tls_trust: Path | None = None, path: str = "/hub/api") -> HubApi:
    """The hub's REST API (or, with *path* ``/user/NAME/``, a member's server) through the
    proxy at *hub_url*, trusting *tls_trust* over HTTPS; tokens are given per call."""
    return HubApi(hub_url.rstrip("/") + path, timeout=TIMEOUT,
                  tls=lambda: tls_context(tls_trust))


class Terminal:
    """One terminal in a member's server, used as ``async with Terminal(...) as t``."""

    def __init__(self, hub_url: str, server_path: str, token: str,
                 tls_trust: Path | None = None):
        self.server = hub_api(hub_url, tls_trust, server_path)  # server_path: /user/alice/
        self.token = token
        self.name: str | None = None
        self.ws: WebSocketClientConnection | None = None

    async def __aenter__(self) -> Terminal:
        try:
            _, model = await self.server.request("POST", "api/terminals", {},
                                                 token=self.token)
            self.name = model["name"]
        except (HubApiError, TypeError, KeyError) as e:
            raise ServerUnreachable(
                f"could not open a terminal in {self.server.url}/: {e}") from None
        try:
            self.ws = await self.server.websocket(
                f"terminals/websocket/{quote(self.name)}", token=self.token, ping_interval=30)
        except HubApiError as e:
            await self._delete()
            raise ServerUnreachable(f"could not attach to terminal {self.name}: {e}") from None
        return self

    async def __aexit__(self, *exc) -> None:
        if self.ws is not None:
            self.ws.close()
        await self._delete()

    async def _delete(self) -> None:
        if self.name is None:
            return
        try:  # 404: it ended with its shell
            await self.server.request("DELETE", f"api/terminals/{quote(self.name)}",
                                      token=self.token, ok=(404,))
        except HubApiError:
            pass

    async def send_stdin(self, text: str) -> None:
        await self.ws.write_message(json.dumps(["stdin", text]))

    async def set_size(self, rows: int, cols: int) -> None:
        if rows > 0 and cols > 0:
            await self.ws.write_message(json.dumps(["set_size", rows, cols]))

    async def read(self) -> str | None:
        """The next output of the terminal ("" for messages without any), or None once
        the terminal has ended (its shell exited, or the server went away)."""
        message = await self.ws.read_message()
        if message is None:
            return None
        try:
            kind, *rest = json.loads(message)
        except (ValueError, TypeError):
            return ""
        if kind == "stdout" and rest and isinstance(rest[0], str):
            return rest[0]
        if kind == "disconnect":
            return None
        return ""  # "setup" and anything newer


PROMPT_WAIT = 5.0  # seconds to wait for the shell's first prompt before typing a command


async def pipe(chan, term: Terminal, stdin, stdout, line: str | None, nonce: str) -> int:
    """Terminal output to the client, the client's input (and window size) to the
    terminal, until the shell or the command ends or the client goes; the exit status.
    The session carries bytes and the terminal text: UTF-8 between them."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    parser = execwrap.ExecOutput(nonce) if line is not None else None
    first_output = asyncio.Event()
    command_started = asyncio.Event()
    if parser is None:
        command_started.set()

    async def to_client() -> int:
        while True:
            text = await term.read()
            if text is None:
                return 0 if parser is None else 255  # the shell ended before the command
            if text:
                first_output.set()
            if parser is not None:
                text = parser.feed(text)
                if parser.started:
                    command_started.set()
            if text:
                stdout.write(text.encode())
                await stdout.drain()  # the terminal is read as fast as the client reads
            if parser is not None and parser.done:
                return parser.status

    async def type_command() -> None:
        try:  # after the shell's prompt: it then reads the line in raw mode
            await asyncio.wait_for(first_output.wait(), PROMPT_WAIT)
        except TimeoutError:
            pass
        await term.send_stdin(line)

    async def from_client() -> None:
        last = "\n"
        while True:
            try:
                raw = await stdin.read(4096)
                data = decoder.decode(raw)
            except asyncssh.TerminalSizeChanged as e:
                await term.set_size(e.height, e.width)
                continue
            except asyncssh.BreakReceived:
                raw = data = "\x03"
            except asyncssh.SignalReceived:
                continue
            await command_started.wait()  # input is for the command, never the shell
            if not raw:
                # End of the client's input. A command gets ^D, as from a keyboard (twice
                # after a line without a newline), and the session ends with its output.
                # An interactive shell gets nothing, as from OpenSSH's sshd: what was
                # typed ahead (`printf 'make\nexit\n' | ssh -tt ...`) still runs, and the
                # session ends when the shell does.
                if parser is not None:
                    await term.send_stdin("\x04" if last.endswith(("\n", "\r"))
                                          else "\x04\x04")
                return
            if data:  # "" while a character's UTF-8 bytes are still arriving
                await term.send_stdin(data)
                last = data

    out_task = asyncio.create_task(to_client())
    in_task = asyncio.create_task(from_client())
    closed = asyncio.create_task(chan.wait_closed())
    tasks = [out_task, in_task, closed]
    if line is not None:
        tasks.append(asyncio.create_task(type_command()))
    try:
        waiting = {out_task, in_task, closed}
        while True:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if out_task in done:
                return out_task.result()
            if closed in done:
                return 255  # the client went away
            waiting.discard(in_task)  # the client's input ended (or the terminal went)
            if in_task.exception() is not None:
                return 255
    finally:
        for t in tasks:
            t.cancel()
