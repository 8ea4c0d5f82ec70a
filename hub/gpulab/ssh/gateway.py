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

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh
from tornado.websocket import WebSocketClosedError

from gpulab.hubapi import HubApiError
from gpulab.login.throttle import Throttle
from gpulab.ssh import channels, execwrap, limits, policy
from gpulab.ssh.terminal import ServerUnreachable, Terminal, hub_api, pipe

log = logging.getLogger("gpulab.ssh")

MAX_TOKEN_LENGTH = 256  # as gpulab.login.auth: longer is no JupyterHub token
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
    server: str = ""  # the server she named (``alice+train``); "" her default one

    def __repr__(self) -> str:  # never a token, whatever logs it
        return f"Member({self.name!r})"


def _shown(name: str, server: str) -> str:
    """alice, or alice+train, in the gateway's log."""
    return f"{name}{policy.SERVER_SEPARATOR}{server}" if server else name


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

    async def server_token(self, name: str, token: str, server: str = "") -> tuple[str, str]:
        """A new token of *name*'s, made with her *token*, that may only reach her own
        *server* (``access:servers!server=NAME/SERVER``): what the gateway hands her
        server instead of her login token, which may carry an admin's scopes. Made by
        her, it ends with her login token. ``(token, id)``; ServerUnreachable if refused."""
        try:
            model = await self.hub.new_token(
                name, [f"access:servers!server={name}/{server}"],
                "gpulab-ssh: this SSH connection's way into your server", token=token)
        except HubApiError as e:
            if e.status:
                raise ServerUnreachable(f"the hub answered {e.status} to making a server token") \
                    from None
            raise ServerUnreachable(f"could not make a server token: {e.message}") from None
        return model["token"], model["id"]

    async def sign_in(self, conn: asyncssh.SSHServerConnection, address: str,
                      raw_username: str, token: str) -> Member | None:
        name, server = policy.ssh_login(raw_username) or (None, "")
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
            verdict = policy.judge(name, status, model, server)
        if verdict.outcome == policy.OK:
            self.throttle.record_success(name)
            why = self.counts.take(name, limits.CONNECTIONS)
            if why is not None:
                log.warning("ssh sign-in of %s from %s refused: %s", name, address, why)
                conn.disconnect(asyncssh.DISC_TOO_MANY_CONNECTIONS, why)
                return None
            try:
                scoped, scoped_id = await self.server_token(name, token, server)
            except BaseException as e:  # a cancelled sign-in too (timeout, client gone)
                self.counts.give_back(name, limits.CONNECTIONS)
                if not isinstance(e, ServerUnreachable):
                    raise
                log.warning("ssh sign-in of %s from %s: %s", name, address, e)
                _banner(conn, "The hub is not answering; try again in a minute.")
                return None
            log.info("ssh sign-in: %s from %s", _shown(name, server), address)
            return Member(name, token, scoped, scoped_id, server=server)
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
                          name: str, key: asyncssh.SSHKey, server: str = "") -> Member | None:
        """After the client proved it holds the private key: a token of hers from the hub
        that may only reach and see her own *server*, for this connection."""
        why = self.counts.take(name, limits.CONNECTIONS)
        if why is not None:
            log.warning("ssh sign-in of %s from %s refused: %s", name, address, why)
            conn.disconnect(asyncssh.DISC_TOO_MANY_CONNECTIONS, why)
            return None
        line = " ".join(key.export_public_key("openssh").decode().split()[:2])
        try:
            given = await self.hub.ssh_key_sign_in(name, line, check=False, server=server,
                                                   token=self.settings.service_token)
        except BaseException as e:  # a cancelled sign-in too
            self.counts.give_back(name, limits.CONNECTIONS)
            if not isinstance(e, HubApiError):
                raise
            log.warning("ssh key sign-in of %s from %s: %s", name, address, e)
            conn.disconnect(asyncssh.DISC_BY_APPLICATION,
                            "The hub did not let this key sign in; try again in a minute.")
            return None
        log.info("ssh sign-in: %s from %s with key %s", _shown(name, server), address,
                 key.get_fingerprint("sha256"))
        return Member(name, given["token"], given["token"], given["id"], by_key=True,
                      server=server)

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
        return policy.judge(member.name, code, model, member.server).outcome == policy.OK

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
        if code != 200 or policy.judge(member.name, code, model,
                                       member.server).outcome != policy.OK:
            say("Your token no longer works here (revoked or expired?); ask the lab admin "
                "for a new one.\r\n" if code in (401, 403) else
                "The hub is not answering; try again in a minute.\r\n")
            return None
        where = policy.server_location(self.settings.hub_url, model, member.server)
        if where is None:
            say(policy.not_running_message(
                self.settings.public_url, policy.pending_of(model, member.server),
                member.server, policy.running_servers(model), member.name))
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
            return await pipe(chan, term, stdin, stdout, line, nonce)

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


def _banner(conn: asyncssh.SSHServerConnection, message: str) -> None:
    if message:
        try:
            conn.send_auth_banner(message.rstrip() + "\r\n")
        except OSError:
            pass  # authentication already over
