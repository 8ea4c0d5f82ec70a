"""gpulab-ssh: the SSH gateway process (asyncssh), and the ``gpulab-ssh`` command.

One connection, step by step:

0. Limits (:mod:`gpulab.ssh.limits`): connections still signing in are capped as
   OpenSSH's MaxStartups caps them (in all, and per client address), and each member's
   connections, sessions and forwards are capped; a refusal says so to her SSH client.
1. Password authentication (keyboard-interactive asks for the same password). The
   throttle (:mod:`gpulab.login.throttle`, its own sqlite file on the gateway's volume) is
   asked first: a locked username or client address is refused without asking the hub,
   with an SSH banner saying when to try again. Agent, X11 and remote (-R) forwarding
   are refused. Or a public key the member registered at the hub
   (:mod:`gpulab.login.sshkeys`): the hub (asked as the service gpulab-ssh) says whether
   the key is hers and she has access, asyncssh checks the client's signature, and the
   hub then gives the connection a token that may only reach and see her own server.
   Her username's lockout does not apply (keys cannot be guessed); a locked address's
   does.
2. The password goes to the hub as a token (``GET /hub/api/user``) and
   :func:`gpulab.ssh.policy.judge` decides. A wrong, revoked or expired token, or one
   that names someone else, counts one failure against the username and the address.
   The token is kept in memory for this connection only and never logged, and never
   reaches her server: the gateway makes her a token that may only reach her own
   server (``access:servers!server=NAME/``) for this connection, uses it there, and
   deletes it when the connection ends.
3. The connection asks the hub again every few seconds (:meth:`Gateway.watch`): once
   the token stops working (revoked, expired, her access ended) the connection closes,
   with every session and forward in it. Each session also asks the hub again and
   finds the member's running server or says how to start it. Everything then goes
   through the hub's proxy with the connection's server token:

   * with a terminal (``ssh``, ``ssh -t host CMD``): a Jupyter terminal there
     (:mod:`gpulab.ssh.terminal`), window-size changes forwarded; a command is typed
     into it (:mod:`gpulab.ssh.execwrap`) and its exit status becomes the session's;
   * without one (``ssh host CMD``, ``ssh -T host`` with a script, sftp, scp, VS Code's
     Remote-SSH): the command with plain pipes and its exit status
     (:mod:`gpulab.ssh.channels`, the image's gpulab_channels extension).
4. ``ssh -L``/``-D`` connect to a port on the server's own loopback and nowhere else
   (:func:`gpulab.ssh.policy.forward_port`).

``gpulab-ssh serve`` runs the gateway; ``gpulab-ssh keygen`` makes the host key once
and ``gpulab-ssh fingerprint`` shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import logging
import os
import random
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh
from asyncssh.stream import SSHServerStreamSession
from tornado.websocket import WebSocketClosedError

from gpulab import compat
from gpulab.hubapi import HubApiError
from gpulab.login.throttle import LockoutPolicy, Throttle, address_key
from gpulab.ssh import channels, execwrap, hostkey, limits, policy
from gpulab.ssh.terminal import ServerUnreachable, Terminal, hub_api, resolve_below_the_hub

log = logging.getLogger("gpulab.ssh")

MAX_TOKEN_LENGTH = 256  # as gpulab.login.auth: longer is no JupyterHub token
PROMPT_WAIT = 5.0  # seconds to wait for the shell's first prompt before typing a command
# Seconds between the hub's checks of a signed-in connection's token: a revoked token (an
# admin ended the member's access) closes her connection, sessions and forwards within it.
RECHECK_EVERY = 5.0
# Seconds a connection refused by the limits may stay open to read why (gpulab.ssh.limits).
REFUSED_GRACE = 2.0
# Public keys (with usernames) one connection may have the hub check: OpenSSH's client
# offers each key of an agent in turn; a client offering hundreds only loads the hub.
MAX_KEY_CHECKS = 6
ACCESS_ENDED = ("Your access has ended (your token was revoked or expired); ask the lab "
                "admin for a new one.")


@dataclass(frozen=True)
class GatewaySettings:
    hub_url: str  # where the gateway reaches the hub's proxy (http://proxy:8000)
    public_url: str  # what members are told to open ("" when unknown)
    tls_trust: Path | None = None  # HTTPS: the proxy's certificate file, trusted as is
    # The hub service gpulab-ssh's token: key sign-ins only ("": keys are not offered).
    service_token: str = field(default="", repr=False)


@dataclass(frozen=True)
class Member:
    name: str
    token: str  # her login token: asks the hub, never travels into her server
    server_token: str = ""  # reaches her own server only (Gateway.server_token)
    server_token_id: str = ""
    by_key: bool = False  # signed in with an SSH key: *token* is the server token

    def __repr__(self) -> str:  # never a token, whatever logs it
        return f"Member({self.name!r})"


class Gateway:
    """What all connections share: the settings, the throttle and the hub client."""

    def __init__(self, settings: GatewaySettings, throttle: Throttle,
                 limits_: limits.Limits | None = None):
        self.settings = settings
        self.throttle = throttle
        self.counts = limits.Counts(limits_ or limits.Limits())
        self.hub = hub_api(settings.hub_url, settings.tls_trust)
        self.cleanups: set[asyncio.Task] = set()

    async def whoami(self, token: str) -> tuple[int, dict | None]:
        """``(HTTP status, model)`` of ``GET /hub/api/user`` with *token*; status 0
        when the hub could not be reached."""
        try:
            return 200, await self.hub.whoami(token)
        except HubApiError as e:
            return e.status, None

    async def server_token(self, name: str, token: str) -> tuple[str, str]:
        """A new token of *name*'s, made with her *token*, that may only reach her own
        default server (``access:servers!server=NAME/``): what the gateway hands her
        server instead of her login token, which may carry an admin's scopes. Made by
        her, it ends with her login token. ``(token, id)``; ServerUnreachable if refused."""
        try:
            model = await self.hub.new_token(
                name, [f"access:servers!server={name}/"],
                "gpulab-ssh: this SSH connection's way into your server", token=token)
        except HubApiError as e:
            if e.status:
                raise ServerUnreachable(f"the hub answered {e.status} to making a server token") \
                    from None
            raise ServerUnreachable(f"could not make a server token: {e.message}") from None
        return model["token"], model["id"]

    async def sign_in(self, conn: asyncssh.SSHServerConnection, address: str,
                      raw_username: str, token: str) -> Member | None:
        name = policy.ssh_username(raw_username)
        shown = name or f"{raw_username[:32]!r} (invalid)"
        decision = self.throttle.check(name, address)
        if decision.locked:
            log.warning("ssh sign-in refused for %s from %s: locked for %ss",
                        shown, address, decision.retry_after)
            _banner(conn, decision.message())
            return None
        if name is None:
            self.throttle.record_failure(None, address)
            log.warning("ssh sign-in with invalid username %s from %s", shown, address)
            return None
        token = token.strip()
        if not token or len(token) > MAX_TOKEN_LENGTH or not token.isprintable():
            verdict = policy.Verdict(policy.FAILED, "malformed token")
        else:
            status, model = await self.whoami(token)
            verdict = policy.judge(name, status, model)
        if verdict.outcome == policy.OK:
            self.throttle.record_success(name)
            why = self.counts.take(name, limits.CONNECTIONS)
            if why is not None:
                log.warning("ssh sign-in of %s from %s refused: %s", name, address, why)
                conn.disconnect(asyncssh.DISC_TOO_MANY_CONNECTIONS, why)
                return None
            try:
                scoped, scoped_id = await self.server_token(name, token)
            except BaseException as e:  # a cancelled sign-in too (timeout, client gone)
                self.counts.give_back(name, limits.CONNECTIONS)
                if not isinstance(e, ServerUnreachable):
                    raise
                log.warning("ssh sign-in of %s from %s: %s", name, address, e)
                _banner(conn, "The hub is not answering; try again in a minute.")
                return None
            log.info("ssh sign-in: %s from %s", name, address)
            return Member(name, token, scoped, scoped_id)
        if verdict.outcome == policy.FAILED:
            decision = self.throttle.record_failure(name, address)
            log.warning("failed ssh sign-in for %s from %s: %s", name, address, verdict.reason)
            if decision.locked:
                _banner(conn, decision.message())
        else:
            log.warning("ssh sign-in refused for %s from %s: %s", name, address, verdict.reason)
            _banner(conn, verdict.message)
        return None

    async def key_is_hers(self, conn: asyncssh.SSHServerConnection, address: str,
                          raw_username: str, key: asyncssh.SSHKey) -> str | None:
        """The member *key* signs in (her name), asking the hub; None if it does not. The
        password throttle is not asked: a key cannot be guessed, so a member whose
        username others locked with wrong passwords still gets in with her key."""
        name = policy.ssh_username(raw_username)
        if name is None or not self.settings.service_token:
            return None
        if self.throttle.check(None, address).locked:
            return None  # an address locked for guessing passwords asks the hub nothing
        line = " ".join(key.export_public_key("openssh").decode().split()[:2])
        try:
            await self.hub.ssh_key_sign_in(name, line, check=True,
                                           token=self.settings.service_token)
        except HubApiError as e:
            # (no banner: whoever offers a public key, which is public, learns nothing)
            if e.status != 403:
                log.warning("ssh key sign-in of %s from %s: %s", name, address, e)
            else:
                log.info("ssh key refused for %s from %s: %s", name, address, e.message)
            return None
        return name

    async def key_sign_in(self, conn: asyncssh.SSHServerConnection, address: str,
                          name: str, key: asyncssh.SSHKey) -> Member | None:
        """After the client proved it holds the private key: a token of hers from the hub
        that may only reach and see her own server, for this connection."""
        why = self.counts.take(name, limits.CONNECTIONS)
        if why is not None:
            log.warning("ssh sign-in of %s from %s refused: %s", name, address, why)
            conn.disconnect(asyncssh.DISC_TOO_MANY_CONNECTIONS, why)
            return None
        line = " ".join(key.export_public_key("openssh").decode().split()[:2])
        try:
            given = await self.hub.ssh_key_sign_in(name, line, check=False,
                                                   token=self.settings.service_token)
        except BaseException as e:  # a cancelled sign-in too
            self.counts.give_back(name, limits.CONNECTIONS)
            if not isinstance(e, HubApiError):
                raise
            log.warning("ssh key sign-in of %s from %s: %s", name, address, e)
            conn.disconnect(asyncssh.DISC_BY_APPLICATION,
                            "The hub did not let this key sign in; try again in a minute.")
            return None
        log.info("ssh sign-in: %s from %s with key %s", name, address,
                 key.get_fingerprint("sha256"))
        return Member(name, given["token"], given["token"], given["id"], by_key=True)

    async def session(self, member: Member, stdin: asyncssh.SSHReader,
                      stdout: asyncssh.SSHWriter, stderr: asyncssh.SSHWriter) -> None:
        """One SSH session (its streams carry bytes), to its exit status."""
        chan = stdin.channel
        try:
            status = await self._session(member, chan, stdin, stdout, stderr)
        except channels.Unavailable as e:
            stderr.write(f"{e}\r\n".encode())
            status = 1
        except ServerUnreachable as e:
            log.warning("ssh session of %s: %s", member.name, e)
            stderr.write(b"Could not reach your server; try again, or open it in "
                         b"JupyterLab.\r\n")
            status = 1
        except (asyncssh.Error, BrokenPipeError, ConnectionError, WebSocketClosedError):
            status = 255  # the client, or the member's server, went away
        except Exception:  # never let one session take down the member's connection
            log.exception("ssh session of %s failed", member.name)
            status = 255
        if status == 255 and not chan.is_closing() and not await self.still_valid(member):
            # Her server closed the session because her access ended (its access guard
            # closes websockets whose token the hub refuses): say so, not just exit.
            stderr.write(ACCESS_ENDED.encode() + b"\r\n")
        if not chan.is_closing():
            chan.exit(status)

    async def signed_out(self, member: Member) -> None:
        """The connection ended: its server token goes (it would end with her login
        token anyway)."""
        if not member.server_token_id:
            return
        try:  # ignored: the token ends with her login token (or expires) anyway
            if member.by_key:
                await self.hub.ssh_key_signed_out(member.name, member.server_token_id,
                                                  token=self.settings.service_token)
            else:
                await self.hub.delete_token(member.name, member.server_token_id,
                                            token=member.token)
        except HubApiError as e:
            if e.status not in (403, 404):  # gone already: her access ended
                log.warning("ssh: could not delete %s's connection token: %s",
                            member.name, e)

    async def still_valid(self, member: Member) -> bool:
        """Does the hub still accept the member's token? True when the hub does not
        answer (a hub restart must not cut every SSH session)."""
        try:
            code, model = await self.whoami(member.token)
        except ServerUnreachable as e:
            log.warning("ssh: could not recheck %s's token with the hub: %s", member.name, e)
            return True
        if code in (401, 403):
            return False
        if code != 200:
            return True
        return policy.judge(member.name, code, model).outcome == policy.OK

    async def watch(self, member: Member, conn: asyncssh.SSHServerConnection,
                    every: float = RECHECK_EVERY) -> None:
        """Close *conn* once the member's token stops working (revoked, expired, her
        access ended), rechecking every *every* seconds while it is open."""
        while not conn.is_closed():
            await asyncio.sleep(every)
            if not await self.still_valid(member):
                log.warning("ssh: %s's token no longer works; closing their connection",
                            member.name)
                conn.disconnect(asyncssh.DISC_BY_APPLICATION, ACCESS_ENDED)
                return

    async def server_location(self, member: Member, say) -> tuple[str, str] | None:
        """Where the member's running server is, ``(origin, path)``, asking the hub again
        (a token revoked meanwhile stops new sessions and forwards); None, with *say*
        told why, if none."""
        code, model = await self.whoami(member.token)
        if code != 200 or policy.judge(member.name, code, model).outcome != policy.OK:
            say("Your token no longer works here (revoked or expired?); ask the lab admin "
                "for a new one.\r\n" if code in (401, 403) else
                "The hub is not answering; try again in a minute.\r\n")
            return None
        where = policy.server_location(self.settings.hub_url, model)
        if where is None:
            say(policy.not_running_message(self.settings.public_url,
                                           policy.pending_of(model)))
        return where

    async def _session(self, member: Member, chan, stdin, stdout, stderr) -> int:
        pty = chan.get_terminal_type() is not None
        command, subsystem = chan.get_command(), chan.get_subsystem()
        try:
            argv = None if pty and not subsystem else policy.command_argv(command, subsystem)
        except policy.Unsupported as e:
            stderr.write(str(e).encode())
            return 1
        where = await self.server_location(member, lambda text: stderr.write(text.encode()))
        if where is None:
            return 1
        origin, path = where
        log.info("ssh session of %s: %s", member.name,
                 f"subsystem {subsystem}" if subsystem else
                 ("shell" if command is None else "command") +
                 (" with a terminal" if pty else ""))
        if argv is not None:
            return await channels.run_command(
                origin, path, member.server_token, self.settings.tls_trust, argv,
                stdin, stdout, stderr)
        nonce = execwrap.new_nonce()
        try:
            line = None if command is None else execwrap.command_line(command, nonce)
        except execwrap.CommandTooLong as e:
            stderr.write(f"{e}\r\n".encode())
            return 1
        async with Terminal(origin, path, member.server_token,
                            self.settings.tls_trust) as term:
            width, height = chan.get_terminal_size()[:2]
            await term.set_size(height, width)
            return await _pipe(chan, term, stdin, stdout, line, nonce)

    async def forward(self, member: Member, port: int) -> channels.Port:
        """``ssh -L``/``-D``: one connection to *port* on the member's server's loopback."""
        refused: list[str] = []
        where = await self.server_location(member, refused.append)
        if where is None:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED,
                                            refused[0].strip() if refused else "no server")
        log.info("ssh forward of %s: to port %s of their server", member.name, port)
        try:
            return await channels.open_port(where[0], where[1], member.server_token,
                                            self.settings.tls_trust, port)
        except asyncssh.ChannelOpenError:
            raise
        except Exception as e:
            log.warning("ssh forward of %s to port %s: %s", member.name, port, e)
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED,
                                            "could not reach your server") from None


async def _pipe(chan, term: Terminal, stdin, stdout, line: str | None, nonce: str) -> int:
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


def _banner(conn: asyncssh.SSHServerConnection, message: str) -> None:
    if message:
        try:
            conn.send_auth_banner(message.rstrip() + "\r\n")
        except OSError:
            pass  # authentication already over


class _StreamSession(SSHServerStreamSession):
    """asyncssh's stream session, except that every subsystem, sftp included, goes to
    the gateway's handler (which runs the member's own sftp-server in her server)
    instead of asyncssh's built-in SFTP server, which would serve the gateway's files.
    Its session_started without that built-in branch (asyncssh's internals: gpulab.compat)."""

    def __init__(self, handler, closed: Callable[[], None]):
        super().__init__(handler)
        self.closed = closed  # called once, when the session's channel has closed

    def subsystem_requested(self, subsystem: str) -> bool:
        return True  # the handler refuses, with a message, what it does not offer

    def session_started(self) -> None:
        compat.start_stream_session(self)

    def connection_lost(self, exc) -> None:
        try:
            super().connection_lost(exc)
        finally:
            self.closed()


class _Connection(asyncssh.SSHServer):
    """One client connection: its address and, once signed in, its member; what it
    holds of the gateway's limits (:mod:`gpulab.ssh.limits`) goes back when it ends."""

    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self.conn: asyncssh.SSHServerConnection | None = None
        self.address = ""
        self.signing_in: str | None = None  # the address key counted as signing in
        self.refusal = ""  # why this connection is refused ("" if it is not)
        self.refusal_timer: asyncio.TimerHandle | None = None
        self.name = ""  # the member, once a password or key was accepted
        self.key: asyncssh.SSHKey | None = None  # the key accepted, for a key sign-in
        # Her Member, once signed in: at once after a password; after a key, once the
        # hub gave the connection its token (sessions and forwards wait for it).
        self.ready: asyncio.Future[Member | None] = \
            asyncio.get_event_loop().create_future()
        self.member: Member | None = None
        self.watcher: asyncio.Task | None = None
        # what this connection holds of its member's sessions and forwards, given back
        # when it ends at the latest (a channel that never opened, seen in review)
        self.held: set[Callable[[], None]] = set()
        self.key_checks: dict[tuple[str, bytes], str | None] = {}  # asked of the hub

    def connection_made(self, conn):
        self.conn = conn
        peer = conn.get_extra_info("peername") or ("",)
        self.address = str(peer[0])
        key = address_key(self.address)
        why = self.gateway.counts.startup(key, random.random)
        if why is not None:
            log.warning("ssh connection from %s refused: %s", self.address, why)
            # Said when the client asks to authenticate (milliseconds for a real client):
            # by then the gateway has read all it sent, so closing does not reset the
            # connection under the message and OpenSSH shows it ("Received disconnect
            # ...: <why>"). A client that says nothing is closed after REFUSED_GRACE.
            self.refusal = why
            self.refusal_timer = asyncio.get_running_loop().call_later(
                REFUSED_GRACE, self._refuse)
            return
        self.signing_in = key

    def _refuse(self) -> None:
        if self.refusal_timer is not None:
            self.refusal_timer.cancel()
            self.refusal_timer = None
            self.conn.disconnect(asyncssh.DISC_TOO_MANY_CONNECTIONS, self.refusal)

    def _done_signing_in(self) -> None:
        if self.signing_in is not None:
            self.gateway.counts.signed_in(self.signing_in)
            self.signing_in = None

    def auth_completed(self):
        self._done_signing_in()
        if self.member is None and self.key is not None:
            task = asyncio.get_event_loop().create_task(self._key_signed_in())
            self.gateway.cleanups.add(task)
            task.add_done_callback(self.gateway.cleanups.discard)

    def _signed_in(self, member: Member | None) -> None:
        self.member = member
        if member is not None and self.watcher is None:
            self.watcher = asyncio.create_task(self.gateway.watch(member, self.conn))
        if not self.ready.done():
            self.ready.set_result(member)

    async def _key_signed_in(self) -> None:
        member = None
        try:
            member = await self.gateway.key_sign_in(self.conn, self.address, self.name,
                                                    self.key)
        finally:
            if self.conn.is_closed() and member is not None:
                # the client left meanwhile: its token goes at once
                self.gateway.counts.give_back(member.name, limits.CONNECTIONS)
                self._signed_in(None)
                await self.gateway.signed_out(member)
            else:
                self._signed_in(member)

    def begin_auth(self, username):
        if self.refusal:
            self._refuse()
        return True  # every username must authenticate

    def password_auth_supported(self):
        return True

    def public_key_auth_supported(self):
        return bool(self.gateway.settings.service_token)

    async def validate_password(self, username, password):
        if self.refusal:
            return False
        member = await self.gateway.sign_in(self.conn, self.address, username, password)
        if member is not None:
            self.name = member.name
            self._signed_in(member)
        return member is not None

    async def validate_public_key(self, username, key):
        """Is *key* one the member registered? Asked before the client signs with it and
        again with its signature (which asyncssh checks after this); the hub is asked
        once per username and key, for at most MAX_KEY_CHECKS of them per connection."""
        if self.refusal:
            return False
        asked = (username, key.public_data)
        if asked not in self.key_checks:
            if len(self.key_checks) >= MAX_KEY_CHECKS:
                return False
            self.key_checks[asked] = await self.gateway.key_is_hers(
                self.conn, self.address, username, key)
        name = self.key_checks[asked]
        if name is not None:
            self.name, self.key = name, key
        return name is not None

    def connection_lost(self, exc):
        self._done_signing_in()
        if self.refusal_timer is not None:
            self.refusal_timer.cancel()
        for give_back in list(self.held):
            give_back()
        if self.watcher is not None:
            self.watcher.cancel()
        if not self.ready.done() and (self.key is None or self.member is not None):
            self.ready.set_result(None)  # a key sign-in still asking the hub sets it
        if self.member is not None:
            self.gateway.counts.give_back(self.member.name, limits.CONNECTIONS)
            task = asyncio.get_event_loop().create_task(self.gateway.signed_out(self.member))
            self.gateway.cleanups.add(task)  # kept until done (asyncio holds it weakly)
            task.add_done_callback(self.gateway.cleanups.discard)

    def _take(self, kind: str) -> Callable[[], None]:
        """One more session or forward for this connection's member, or
        ChannelOpenError saying why not (OpenSSH: "open failed: resource shortage:
        ..."); what gives it back, once."""
        name = self.name
        why = self.gateway.counts.take(name, kind)
        if why is not None:
            log.warning("ssh %s of %s refused: %s", kind, name, why)
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_RESOURCE_SHORTAGE, why)
        given = False

        def give_back() -> None:
            nonlocal given
            if not given:
                given = True
                self.held.discard(give_back)
                self.gateway.counts.give_back(name, kind)
        self.held.add(give_back)
        return give_back

    def connection_requested(self, dest_host, dest_port, orig_host, orig_port):
        """ssh -L/-D: to the member's own server's loopback only (policy.forward_port)."""
        try:
            port = policy.forward_port(dest_host, dest_port)
        except policy.Unsupported as e:
            log.warning("ssh forward of %s to %r:%s refused", self.member, dest_host,
                        dest_port)
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                                            str(e)) from None
        return self._forward(port, self._take(limits.FORWARDS))

    async def _forward(self, port: int, give_back: Callable[[], None]) -> channels.Port:
        try:
            member = await self.ready
            if member is None:
                raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED,
                                                "not signed in")
            forwarded = await self.gateway.forward(member, port)
            if self.conn is None or self.conn.is_closed():  # the client left meanwhile
                forwarded.ws.close()
                raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED,
                                                "connection closed")
        except BaseException:
            give_back()
            raise
        forwarded.closed = give_back
        return forwarded

    def unix_connection_requested(self, dest_path):
        raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                                        policy.NO_FORWARDING_ELSEWHERE)

    def server_requested(self, listen_host, listen_port):
        return False  # remote forwarding (ssh -R)

    def session_requested(self):
        give_back = self._take(limits.SESSIONS)

        async def handler(stdin, stdout, stderr):
            member = await self.ready
            if member is None:
                stderr.write(b"Could not sign in with this key; try again in a minute.\r\n")
                stdin.channel.exit(1)
                return
            await self.gateway.session(member, stdin, stdout, stderr)

        # bytes, not text: sftp, scp and piped data pass unchanged
        return (self.conn.create_server_channel(encoding=None),
                _StreamSession(handler, give_back))


async def serve(listen: str, host_key: Path, gateway: Gateway) -> None:
    host, _, port = listen.rpartition(":")
    server = await asyncssh.listen(
        host or "0.0.0.0", int(port),
        server_factory=lambda: _Connection(gateway),
        server_host_keys=[str(host_key)],
        line_editor=False,  # the terminal's own shell edits lines
        agent_forwarding=False, x11_forwarding=False, allow_scp=False,
        login_timeout=30, keepalive_interval=30, errors="replace",
    )
    log.info("gpulab-ssh listening on %s (host key %s), hub at %s", listen,
             asyncssh.read_private_key(str(host_key)).get_fingerprint("sha256"),
             gateway.settings.hub_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    await server.wait_closed()


def _owner(value: str) -> tuple[int, int]:
    uid, _, gid = value.partition(":")
    return int(uid), int(gid or uid)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="gpulab-ssh", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    s = sub.add_parser("serve", help="run the gateway (the default)")
    s.add_argument("--listen", default="0.0.0.0:2222", help="host:port (default 0.0.0.0:2222)")
    s.add_argument("--hub-url", default=os.environ.get("GPULAB_SSH_HUB_URL",
                                                       "http://proxy:8000"),
                   help="the hub's proxy as the gateway reaches it (env GPULAB_SSH_HUB_URL, "
                        "default http://proxy:8000)")
    s.add_argument("--public-url", default=os.environ.get("GPULAB_SSH_PUBLIC_URL", ""),
                   help="the hub's address as members know it, for messages "
                        "(env GPULAB_SSH_PUBLIC_URL; example https://gpu.lab.example)")
    s.add_argument("--tls-trust", type=Path,
                   default=Path(os.environ["GPULAB_SSH_TLS_TRUST"])
                   if os.environ.get("GPULAB_SSH_TLS_TRUST") else None,
                   help="with an https:// hub URL: the certificate file the proxy serves, "
                        "trusted as it is (env GPULAB_SSH_TLS_TRUST)")
    s.add_argument("--host-key", type=Path,
                   default=Path("/run/secrets/ssh") / hostkey.KEY_FILE,
                   help="the private host key (made by `gpulab-ssh keygen`)")
    s.add_argument("--service-token-file", type=Path,
                   default=Path("/run/secrets/ssh-gateway-token"),
                   help="the hub service gpulab-ssh's token, for members' SSH keys "
                        "(`make up` makes secrets/ssh-gateway-token); without it, keys are "
                        "not offered and only login tokens sign in")
    s.add_argument("--throttle-db", type=Path,
                   default=Path("/var/lib/gpulab-ssh/throttle.sqlite"),
                   help="failed sign-ins and lockouts, kept across restarts")
    s.add_argument("--max-failures", type=int, default=5,
                   help="failures per username within --window that lock it (default 5)")
    s.add_argument("--max-failures-per-address", type=int, default=20,
                   help="failures per client address (IPv6: per /64) within --window "
                        "that lock it (default 20)")
    s.add_argument("--window", type=float, default=900, help="seconds (default 900)")
    s.add_argument("--lockout", type=float, default=900,
                   help="seconds of the first lockout, doubled for each next one (default 900)")
    s.add_argument("--max-lockout", type=float, default=86400,
                   help="longest lockout in seconds (default 86400)")
    k = sub.add_parser("keygen", help="make the host key once (kept afterwards); print its "
                                      "fingerprint")
    k.add_argument("--dir", type=Path, required=True)
    k.add_argument("--owner", type=_owner, help="uid[:gid] that will run the gateway")
    f = sub.add_parser("fingerprint", help="print the host key's type and SHA-256 fingerprint")
    f.add_argument("--host-key", type=Path, default=Path("/run/secrets/ssh") / hostkey.KEY_FILE)
    args = ap.parse_args(argv if argv is not None else (sys.argv[1:] or ["serve"]))
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("asyncssh").setLevel(logging.WARNING)  # its INFO lines are per packet
    if args.cmd == "keygen":
        done, fingerprint = hostkey.ensure(args.dir, args.owner)
        print(f"SSH host key {done}: {args.dir / hostkey.KEY_FILE} (ED25519 {fingerprint})")
        return
    if args.cmd == "fingerprint":
        key = asyncssh.read_private_key(str(args.host_key))
        print(f"ED25519 {key.get_fingerprint('sha256')}")
        return
    if not args.host_key.exists():
        sys.exit(f"gpulab-ssh: no host key at {args.host_key}; make one with "
                 f"`gpulab-ssh keygen --dir {args.host_key.parent}` (`make up` does)")
    user_policy = LockoutPolicy(max_failures=args.max_failures, window=args.window,
                                lockout=args.lockout, max_lockout=args.max_lockout,
                                forget_after=args.max_lockout)
    address_policy = LockoutPolicy(max_failures=args.max_failures_per_address,
                                   window=args.window, lockout=args.lockout,
                                   max_lockout=args.max_lockout, forget_after=args.max_lockout)
    throttle = Throttle(args.throttle_db, user_policy=user_policy,
                        address_policy=address_policy)
    try:
        how_much = limits.Limits.from_env()
    except ValueError as e:
        sys.exit(f"gpulab-ssh: {e} (see docs/security.md#ssh-gateway-limits)")
    log.info("limits: %s", how_much.describe())
    # Members' servers on names of their own (alice.gpu.lab.example) are all behind the
    # proxy, which Docker's DNS knows by the hub's name only.
    resolve_below_the_hub(args.hub_url)
    try:
        service_token = args.service_token_file.read_text().strip()
    except OSError as e:
        service_token = ""
        log.warning("SSH keys are off: cannot read the gateway's hub token (%s)", e)
    gateway = Gateway(GatewaySettings(args.hub_url, args.public_url, args.tls_trust,
                               service_token), throttle, how_much)
    asyncio.run(serve(args.listen, args.host_key, gateway))


if __name__ == "__main__":
    main()
