"""The gateway's SSH side (asyncssh): one :class:`_Connection` per client, which applies the
limits, hands sign-ins, sessions and forwards to the :class:`gpulab.ssh.gateway.Gateway`,
and :func:`serve`, which listens until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import random
import signal
from collections.abc import Callable
from pathlib import Path

import asyncssh
from asyncssh.stream import SSHServerStreamSession

from gpulab import compat
from gpulab.login.throttle import address_key
from gpulab.ssh import channels, limits, policy
from gpulab.ssh.gateway import (
    MAX_KEY_CHECKS,
    REFUSED_GRACE,
    Gateway,
    Member,
)

log = logging.getLogger("gpulab.ssh")


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
        self.server = ""  # the server her username names (alice+train), for a key sign-in
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
                                                    self.key, self.server)
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
            self.server = (policy.ssh_login(username) or ("", ""))[1]
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
