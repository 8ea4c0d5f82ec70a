"""SSH into one's own server (gpulab-ssh), with the real OpenSSH client.

The password is the member's login token, given to `ssh` through SSH_ASKPASS (forced),
and the gateway's host key is checked strictly against a known_hosts file made from the
key the gateway serves. What a member sees: a shell in her own container as its user,
commands with their exit status, window sizes that follow hers; and what is refused:
her token under another name, a revoked token, too many failures, a stopped server,
file transfer and port forwarding.

Failed sign-ins count in the gateway's throttle; the module puts back the address
counters it changed and forgets its usernames (tests/integration/throttle_rows.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import termios
import time

import pytest

from gpulab.ssh.hostkey import known_hosts_line

from .stack import container_logs, docker
from .throttle_rows import SSH_CONTAINER, SSH_THROTTLE, failures_undone

FAILED_NAMES: list[str] = []  # usernames this module fails to sign in as, forgotten after


@pytest.fixture(scope="module", autouse=True)
def throttle_hygiene(hub):
    with failures_undone(hub, FAILED_NAMES, SSH_CONTAINER, SSH_THROTTLE):
        yield


class SSH:
    """The OpenSSH client, pointed at the gateway, with a strict known_hosts file."""

    def __init__(self, folder):
        self.folder = folder
        self.host, _, port = docker("port", SSH_CONTAINER, "2222/tcp").splitlines()[0] \
            .rpartition(":")
        self.port = int(port)
        key = docker("exec", SSH_CONTAINER, "cat", "/run/secrets/ssh/ssh_host_ed25519_key.pub")
        self.known_hosts = folder / "known_hosts"
        self.known_hosts.write_text(known_hosts_line(key, self.host, self.port))
        self.askpass = folder / "askpass.sh"
        self.askpass.write_text('#!/bin/sh\ncat "$GPULAB_TEST_SSH_PASSWORD"\n')
        self.askpass.chmod(0o700)

    def args(self, user: str, *extra: str) -> list[str]:
        return ["ssh", "-F", "/dev/null", "-p", str(self.port),
                "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
                "-o", "PubkeyAuthentication=no",
                "-o", "PreferredAuthentications=password",
                "-o", "NumberOfPasswordPrompts=1", "-o", "ConnectTimeout=10",
                *extra, f"{user}@{self.host}"]

    def env(self, password: str) -> dict:
        secret = self.folder / f"password-{time.monotonic_ns()}"
        secret.write_text(password + "\n")
        secret.chmod(0o600)
        return {**os.environ, "SSH_ASKPASS": str(self.askpass), "SSH_ASKPASS_REQUIRE": "force",
                "GPULAB_TEST_SSH_PASSWORD": str(secret), "DISPLAY": ""}

    def run(self, user: str, password: str, *extra: str, command: str | None = None,
            stdin: str | None = None, timeout: float = 60,
            netns: str | None = None) -> subprocess.CompletedProcess:
        """`ssh` as *user* with *password*; in network namespace *netns* if given."""
        where = ["ip", "netns", "exec", netns] if netns else []
        args = where + self.args(user, *extra) + ([command] if command is not None else [])
        return subprocess.run(args, input=stdin, stdin=None if stdin is not None else
                              subprocess.DEVNULL, capture_output=True, text=True,
                              env=self.env(password), timeout=timeout)


@pytest.fixture(scope="module")
def ssh(hub, tmp_path_factory):
    if shutil.which("ssh") is None:
        pytest.fail("the OpenSSH client is missing: scripts/test-host.sh (make test) "
                    "installs openssh-client")
    return SSH(tmp_path_factory.mktemp("ssh"))


def hostname_of(container: str) -> str:
    return json.loads(docker("inspect", container))[0]["Config"]["Hostname"]


def refused(result: subprocess.CompletedProcess) -> bool:
    return result.returncode == 255 and "Permission denied" in result.stderr


def test_login_token_opens_a_shell_in_her_own_server(ssh, lab_user):
    alice = lab_user("sshalice")
    alice.start_server()
    r = ssh.run(alice.name, alice.token, command="id -u; whoami; hostname")
    assert (r.returncode, r.stdout.splitlines()) == (0, ["1000", "jovyan",
                                                          hostname_of(alice.container)]), r
    # the username is normalised as on the login page
    r = ssh.run(alice.name.upper(), alice.token, command="whoami")
    assert (r.returncode, r.stdout) == (0, "jovyan\n"), r
    # a command's output and exit status, stderr included (a terminal has one output)
    r = ssh.run(alice.name, alice.token,
                command="python3 -c 'print(1+1)'; echo oops >&2; exit 3")
    assert (r.returncode, r.stdout) == (3, "2\noops\n"), r
    # stdin reaches the command, line by line, and ends at its end
    r = ssh.run(alice.name, alice.token, command="tr a-z A-Z", stdin="hello\nworld\n")
    assert (r.returncode, r.stdout) == (0, "HELLO\nWORLD\n"), r
    # no command and no terminal (`echo ... | ssh host`): stdin is a script for her shell
    r = ssh.run(alice.name, alice.token, stdin="id -u\nhostname\n")
    assert (r.returncode, r.stdout.splitlines()) == (0, ["1000", hostname_of(alice.container)])
    # the token never reaches the gateway's log
    assert alice.token not in container_logs(SSH_CONTAINER, 500)


def set_winsize(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def read_until(fd: int, needle: str, timeout: float = 30) -> str:
    out, deadline = b"", time.monotonic() + timeout
    while needle.encode() not in out:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {needle!r} within {timeout} s in {out[-2000:]!r}")
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            out += chunk
    return out.decode(errors="replace")


def test_interactive_shell_follows_the_window_size(ssh, lab_user):
    """ssh on a real pseudo-terminal (as when a member types): the size at start and a
    resize reach the server's terminal (`stty size` there)."""
    alice = lab_user("sshtty")
    alice.start_server()
    master, slave = pty.openpty()
    set_winsize(slave, 33, 101)

    def controlling_tty():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(ssh.args(alice.name, "-tt"), stdin=slave, stdout=slave,
                            stderr=slave, env=ssh.env(alice.token),
                            preexec_fn=controlling_tty)
    os.close(slave)
    try:
        os.write(master, b"echo size=$(stty size) user=$(whoami)\r")
        seen = read_until(master, "size=33 101 user=jovyan")
        assert "size=33 101 user=jovyan" in seen
        set_winsize(master, 45, 120)  # the kernel sends ssh SIGWINCH; ssh tells the gateway
        time.sleep(0.5)
        os.write(master, b"echo size=$(stty size)\r")
        assert "size=45 120" in read_until(master, "size=45 120")
        os.write(master, b"exit\r")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
        os.close(master)


def test_her_token_under_another_name_is_refused(ssh, lab_user):
    alice, bob = lab_user("sshalice"), lab_user("sshbob")
    bob.start_server()
    FAILED_NAMES.append(bob.name)
    r = ssh.run(bob.name, alice.token, command="whoami")
    assert refused(r), r
    assert r.stdout == ""
    r = ssh.run(bob.name, bob.token, command="whoami")  # control: bob's own token opens it
    assert (r.returncode, r.stdout) == (0, "jovyan\n"), r


def test_a_revoked_token_is_refused(ssh, hub, lab_user):
    carol = lab_user("sshrevoke")
    carol.start_server()
    assert ssh.run(carol.name, carol.token, command="true").returncode == 0  # control
    [token] = hub.request("GET", f"/gpulab/login-tokens/{carol.name}").json()["login_tokens"]
    FAILED_NAMES.append(carol.name)
    r = hub.request("DELETE", f"/gpulab/login-tokens/{carol.name}/{token['id']}")
    assert r.status_code == 200, r.text
    r = ssh.run(carol.name, carol.token, command="true")
    assert refused(r), r


def test_repeated_failures_lock_the_username(ssh, lab_user):
    dave = lab_user("sshlock")
    dave.start_server()
    FAILED_NAMES.append(dave.name)
    for i in range(5):  # gpulab-ssh's default: 5 failures in 15 minutes lock a username
        r = ssh.run(dave.name, f"wrong-{i}", command="true")
        assert refused(r), r
    assert "Too many failed sign-ins" in r.stderr  # the 5th failure locks, and says so
    r = ssh.run(dave.name, dave.token, command="true")  # even the right token, now
    assert refused(r), r
    assert "Too many failed sign-ins" in r.stderr and "Try again after" in r.stderr


def test_a_stopped_server_gets_a_clear_message(ssh, lab_user):
    erin = lab_user("sshstopped")
    r = ssh.run(erin.name, erin.token, command="true")
    assert r.returncode == 1, r
    assert "Your server is not running; start it at " in r.stderr
    assert "/hub/home, then connect again." in r.stderr
    assert erin.token not in r.stderr


def test_file_transfer_and_port_forwarding_are_refused(ssh, lab_user):
    frank = lab_user("sshnofiles")
    frank.start_server()
    r = ssh.run(frank.name, frank.token, "-s", command="sftp")
    assert r.returncode == 255 and "subsystem request failed" in r.stderr, r
    r = ssh.run(frank.name, frank.token, "-s", command="other")
    assert r.returncode == 1 and "'other' subsystem is not available" in r.stderr, r
    r = ssh.run(frank.name, frank.token, "-W", "127.0.0.1:8888")
    assert r.returncode == 255 and "administratively prohibited" in r.stderr, r
    assert "forwards no ports" in r.stderr
