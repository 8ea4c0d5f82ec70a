"""What gpulab-ssh takes on at once (gpulab.ssh.limits), tried as a client meets it.

* Connections that say nothing: idle TCP connections (each has read the gateway's
  version line, so the gateway has counted it) hold the places of connections signing
  in; the next client, the real OpenSSH `ssh`, is refused with the reason on its
  terminal, and gets in once they are gone. Per address on the stack's gateway through
  its published port; in all (OpenSSH's MaxStartups) on a gateway process this module
  runs on loopback with a cap of two, from several 127.0.0.x addresses, because every
  connection to the stack's published port comes from one address here.
* Per member on the stack: as many connections, sessions and forwards as the gateway
  allows, held open by a real SSH client library (asyncssh); the next one is refused
  with a message (OpenSSH's own view of it for connections and sessions), another
  member is not affected, and what closes is given back.

The limits are read from the stack's gateway container, so the test holds for whatever
a lab configured.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager

import asyncssh
import pytest

from gpulab.ssh.hostkey import known_hosts_line
from gpulab.ssh.limits import Limits
from tests.ports import free_port

from .stack import docker
from .test_ssh import SSH, ssh  # noqa: F401  (the SSH client fixture)
from .throttle_rows import SSH_CONTAINER


def stack_limits() -> Limits:
    config = json.loads(docker("inspect", SSH_CONTAINER))[0]["Config"]
    return Limits.from_env(dict(e.split("=", 1) for e in config["Env"]))


@contextmanager
def idle_connections(host: str, port: int, count: int, source: str | None = None):
    """*count* TCP connections that read the gateway's version line and say nothing."""
    with ExitStack() as stack:
        for _ in range(count):
            s = stack.enter_context(socket.create_connection(
                (host, port), timeout=10, source_address=(source, 0) if source else None))
            assert s.recv(256).startswith(b"SSH-2.0-")
        yield


def disconnected_because(result: subprocess.CompletedProcess) -> str:
    """What OpenSSH printed of the gateway's disconnect reason ("" if none)."""
    for line in result.stderr.splitlines():
        if line.startswith("Received disconnect from"):
            return line.split(":", 2)[-1].strip()
    return ""


def connecting_again_as_told(connect, seconds: float = 5) -> subprocess.CompletedProcess:
    """*connect*'s result once the gateway no longer refuses it for connections signing
    in. Closed connections are counted back when the gateway reads their close, which
    may come a moment after the client's (across Docker's port proxy, on a loaded
    machine: CI saw it once), so a client connecting that same instant is told to
    connect again; it does, as told, for at most *seconds* (the gateway's login timeout,
    which frees places without any close, is 30 s)."""
    deadline = time.monotonic() + seconds
    while "connect again" in disconnected_because(r := connect()) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    return r


def test_a_members_connections_wait_behind_idle_ones_from_her_address(ssh, lab_user):  # noqa: F811
    per_address = stack_limits().per_address
    alice = lab_user("sshidle")
    alice.start_server()
    with idle_connections(ssh.host, ssh.port, per_address):
        r = ssh.run(alice.name, alice.token, command="true")
    assert r.returncode == 255, r
    assert disconnected_because(r) == (
        f"gpulab-ssh: {per_address} connections from your address are already signing "
        "in; wait until they have, then connect again"), r.stderr
    # They are gone: her place is free again, counted back when the gateway reads their
    # close (well before its 30 s login timeout).
    r = connecting_again_as_told(lambda: ssh.run(alice.name, alice.token, command="echo in"))
    assert (r.returncode, r.stdout) == (0, "in\n"), r


@pytest.fixture
def loopback_gateway(tmp_path):
    """The real gateway process on 127.0.0.1, at most 2 connections signing in (1 per
    address), its hub nowhere (sign-ins end "hub not answering", past every limit)."""
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "gpulab.ssh", "keygen", "--dir", str(keys)],
                   check=True, capture_output=True)
    port = free_port()
    env = {**os.environ, "GPULAB_SSH_MAX_STARTUPS": "2",
           "GPULAB_SSH_MAX_STARTUPS_PER_ADDRESS": "1"}
    log = open(tmp_path / "gateway.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulab.ssh", "serve", "--listen", f"127.0.0.1:{port}",
         "--hub-url", f"http://127.0.0.1:{free_port()}",
         "--host-key", str(keys / "ssh_host_ed25519_key"),
         "--throttle-db", str(tmp_path / "throttle.sqlite")],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "listening on" not in (tmp_path / "gateway.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "gateway.log").read_text()
            time.sleep(0.1)
        known = tmp_path / "known_hosts"
        known.write_text(known_hosts_line(
            (keys / "ssh_host_ed25519_key.pub").read_text(), "127.0.0.1", port))
        yield port, known, tmp_path / "gateway.log"
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_connections_signing_in_are_capped_in_all_and_per_address(loopback_gateway,
                                                                   tmp_path):
    port, known, log = loopback_gateway
    askpass = tmp_path / "askpass.sh"
    askpass.write_text("#!/bin/sh\necho not-a-token\n")
    askpass.chmod(0o700)
    env = {**os.environ, "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force",
           "DISPLAY": ""}

    def ssh_from(source: str) -> subprocess.CompletedProcess:
        args = ["ssh", "-F", "/dev/null", "-p", str(port), "-b", source,
                "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
                "-o", "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password",
                "-o", "NumberOfPasswordPrompts=1", "-o", "ConnectTimeout=10",
                "someone@127.0.0.1", "true"]
        return subprocess.run(args, env=env, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, timeout=60)

    def got_to_sign_in(r: subprocess.CompletedProcess) -> bool:
        return "The hub is not answering" in r.stderr and not disconnected_because(r)

    assert got_to_sign_in(r := ssh_from("127.0.0.2")), r.stderr
    with idle_connections("127.0.0.1", port, 1, source="127.0.0.2"):
        r = ssh_from("127.0.0.2")  # its address has one signing in: its cap
        assert "1 connection from your address is already signing in" in \
            disconnected_because(r), r.stderr
        assert got_to_sign_in(r := ssh_from("127.0.0.3")), r.stderr  # another address
        with idle_connections("127.0.0.1", port, 1, source="127.0.0.3"):
            r = ssh_from("127.0.0.4")  # two signing in, in all: full
            assert disconnected_because(r) == ("gpulab-ssh: too many connections are "
                                               "signing in right now; connect again in a "
                                               "few seconds"), r.stderr
    # both gone: connections are taken again
    assert got_to_sign_in(r := connecting_again_as_told(lambda: ssh_from("127.0.0.4"))), r.stderr
    assert "refused" in log.read_text()  # the gateway's log says so, with the address


def test_a_members_connections_sessions_and_forwards_are_capped(ssh, lab_user):  # noqa: F811
    limits = stack_limits()
    alice, bob = lab_user("sshcap"), lab_user("sshcap")
    alice.start_server()
    bob.start_server()
    known = asyncssh.import_known_hosts(ssh.known_hosts.read_text())

    async def connect(member):
        return await asyncssh.connect(ssh.host, ssh.port, username=member.name,
                                      password=member.token, known_hosts=known,
                                      client_keys=None, agent_path=None)

    async def tried() -> dict:
        seen = {}
        conns = [await connect(alice) for _ in range(limits.connections)]
        try:
            # connections: her next one is refused, with the reason on OpenSSH's screen
            r = await asyncio.to_thread(ssh.run, alice.name, alice.token, command="true")
            seen["connection"] = (r.returncode, disconnected_because(r))
            r = await asyncio.to_thread(ssh.run, bob.name, bob.token, command="echo bob")
            seen["bob"] = (r.returncode, r.stdout)
            last = conns.pop()  # a place for OpenSSH below
            last.close()
            await last.wait_closed()
            # sessions: held open across her connections
            held = [await conns[i % len(conns)].create_process("sleep 300")
                    for i in range(limits.sessions)]
            try:
                await conns[0].create_process("true")
            except asyncssh.ChannelOpenError as e:
                seen["session"] = (e.code, e.reason)
            for _ in range(20):  # until the gateway has counted the closed one back
                r = await asyncio.to_thread(ssh.run, alice.name, alice.token, command="true")
                if not disconnected_because(r):
                    break
                await asyncio.sleep(0.5)
            seen["session, as OpenSSH shows it"] = (r.returncode, [
                line for line in r.stderr.splitlines() if "open failed" in line])
            held[0].terminate()
            held[0].close()
            await held[0].wait_closed()
            ok = await conns[0].run("echo again", check=False)  # given back at close
            seen["session after one ended"] = (ok.exit_status, ok.stdout)
            for p in held[1:]:
                p.close()
            # forwards: to her server's own Jupyter port (it listens on its loopback)
            forwards = [await conns[i % len(conns)].open_connection("localhost", 8888)
                        for i in range(limits.forwards)]
            try:
                await conns[0].open_connection("localhost", 8888)
            except asyncssh.ChannelOpenError as e:
                seen["forward"] = (e.code, e.reason)
            for _, writer in forwards:
                writer.close()
        finally:
            for c in conns:
                c.close()
                await c.wait_closed()
        return seen

    seen = asyncio.run(tried())
    assert seen["connection"] == (255, (
        f"gpulab-ssh: you have {limits.connections} SSH connections open, the lab's "
        "limit; close one (or reuse one with ssh's ControlMaster) and try again")), seen
    assert seen["bob"] == (0, "bob\n"), seen  # per member: bob is not held back
    assert seen["session"] == (asyncssh.OPEN_RESOURCE_SHORTAGE, (
        f"gpulab-ssh: you have {limits.sessions} SSH sessions open, the lab's limit; end "
        "one (exit a shell or command) and try again")), seen
    assert seen["session, as OpenSSH shows it"] == (255, [
        f"channel 0: open failed: resource shortage: {seen['session'][1]}"]), seen
    assert seen["session after one ended"] == (0, "again\n"), seen
    assert seen["forward"] == (asyncssh.OPEN_RESOURCE_SHORTAGE, (
        f"gpulab-ssh: you have {limits.forwards} forwarded connections open, the lab's "
        "limit; close some (the programs using ssh -L or -D) and try again")), seen
    # Everything was given back when it closed: she connects, and runs a command.
    deadline = time.monotonic() + 30
    while (r := ssh.run(alice.name, alice.token, command="echo back")).returncode != 0:
        assert time.monotonic() < deadline, r
        time.sleep(1)
    assert r.stdout == "back\n", r
