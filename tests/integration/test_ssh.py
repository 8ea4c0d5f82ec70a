"""SSH into one's own server (gpulab-ssh), with the real OpenSSH client.

The password is the member's login token, given to `ssh` through SSH_ASKPASS (forced),
and the gateway's host key is checked strictly against a known_hosts file made from the
key the gateway serves. What a member sees: a shell in her own container as its user,
commands with their exit status and separate, byte-exact streams, window sizes that
follow hers, sftp, scp and rsync into her home, ports of her own server forwarded the way VS
Code's Remote-SSH uses them; and what is refused: her token under another name, a
revoked token, too many failures, a stopped server, forwarding anywhere but her own
server's loopback, and the server's channels with another member's token or from a
browser (her cookies, on her own page or another site's).

Failed sign-ins count in the gateway's throttle; the module puts back the address
counters it changed and forgets its usernames (tests/integration/throttle_rows.py).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import pty
import re
import select
import shlex
import shutil
import signal
import struct
import subprocess
import tempfile
import termios
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from gpulab.ssh.hostkey import known_hosts_line
from tests.ports import free_port

from .browser import submit_login
from .stack import HUB_URL, container_logs, docker, wait_for
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

    def _ssh(self) -> list[str]:
        return ["ssh", "-F", "/dev/null", "-p", str(self.port),
                "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
                "-o", "ConnectTimeout=10"]

    def args(self, user: str, *extra: str) -> list[str]:
        """Signing in with a password (her login token, from SSH_ASKPASS: :meth:`env`)."""
        return [*self._ssh(), "-o", "PubkeyAuthentication=no",
                "-o", "PreferredAuthentications=password",
                "-o", "NumberOfPasswordPrompts=1", *extra, f"{user}@{self.host}"]

    def key_args(self, user: str, key: Path, *extra: str) -> list[str]:
        """Signing in with the private key *key* alone: no agent, never a password."""
        return [*self._ssh(), "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no",
                "-o", "KbdInteractiveAuthentication=no", "-o", "IdentitiesOnly=yes",
                "-o", "IdentityAgent=none", "-i", str(key), *extra, f"{user}@{self.host}"]

    def run_with_key(self, user: str, key: Path, *extra: str, command: str | None = None,
                     timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self.key_args(user, key, *extra) +
                              ([command] if command is not None else []),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)

    @contextmanager
    def terminal(self, user: str, password: str, rows: int = 24, cols: int = 80):
        """`ssh -tt` on a real pseudo-terminal of *rows* x *cols* (as when a member types):
        yields the terminal's master side (:func:`read_until`, os.write); the session must
        end (``exit``) inside the block, else it is hung up."""
        master, slave = pty.openpty()
        set_winsize(slave, rows, cols)

        def controlling_tty():
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        proc = subprocess.Popen(self.args(user, "-tt"), stdin=slave, stdout=slave,
                                stderr=slave, env=self.env(password),
                                preexec_fn=controlling_tty)
        os.close(slave)
        try:
            yield master
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=10)
            os.close(master)

    def env(self, password: str) -> dict:
        secret = self.folder / f"password-{time.monotonic_ns()}"
        secret.write_text(password + "\n")
        secret.chmod(0o600)
        return {**os.environ, "SSH_ASKPASS": str(self.askpass), "SSH_ASKPASS_REQUIRE": "force",
                "GPULAB_TEST_SSH_PASSWORD": str(secret), "DISPLAY": ""}

    def run(self, user: str, password: str, *extra: str, command: str | None = None,
            stdin: str | bytes | None = None, timeout: float = 60,
            netns: str | None = None) -> subprocess.CompletedProcess:
        """`ssh` as *user* with *password*; in network namespace *netns* if given."""
        where = ["ip", "netns", "exec", netns] if netns else []
        args = where + self.args(user, *extra) + ([command] if command is not None else [])
        return subprocess.run(args, input=stdin, stdin=None if stdin is not None else
                              subprocess.DEVNULL, capture_output=True,
                              text=not isinstance(stdin, bytes), env=self.env(password),
                              timeout=timeout)


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
    # a command's output, its stderr apart, and its exit status
    r = ssh.run(alice.name, alice.token,
                command="python3 -c 'print(1+1)'; echo oops >&2; exit 3")
    assert (r.returncode, r.stdout, r.stderr) == (3, "2\n", "oops\n"), r
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
    with ssh.terminal(alice.name, alice.token, 33, 101) as master:
        os.write(master, b"echo size=$(stty size) user=$(whoami)\r")
        seen = read_until(master, "size=33 101 user=jovyan")
        assert "size=33 101 user=jovyan" in seen
        set_winsize(master, 45, 120)  # the kernel sends ssh SIGWINCH; ssh tells the gateway
        time.sleep(0.5)
        os.write(master, b"echo size=$(stty size)\r")
        assert "size=45 120" in read_until(master, "size=45 120")
        os.write(master, b"exit\r")


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


def test_name_plus_server_reaches_one_of_her_named_servers(ssh, lab_user, tmp_path):
    """``ssh alice+train@`` opens her named server train, by token or by key, and her
    plain name her default one; a server of hers that is not running is named, with
    those that are."""
    fay = lab_user("sshnamed")
    fay.start_server({"gpus": 0})
    fay.start_server({"gpus": 0}, server="train")
    train = hostname_of(fay.container_of("train"))
    assert train != hostname_of(fay.container)
    r = ssh.run(f"{fay.name}+train", fay.token, command="hostname")
    assert (r.returncode, r.stdout) == (0, f"{train}\n"), r
    r = ssh.run(fay.name, fay.token, command="hostname")
    assert (r.returncode, r.stdout) == (0, f"{hostname_of(fay.container)}\n"), r
    key = registered_key(fay, tmp_path)
    r = ssh.run_with_key(f"{fay.name}+train", key, command="hostname")
    assert (r.returncode, r.stdout) == (0, f"{train}\n"), r
    fay.stop_server()
    r = ssh.run(fay.name, fay.token, command="true")
    assert r.returncode == 1, r
    assert "Your server is not running; start it at " in r.stderr, r
    assert f"Running: your server train (ssh {fay.name}+train@...)." in r.stderr, r
    r = ssh.run(f"{fay.name}+notes", fay.token, command="true")
    assert r.returncode == 1 and "Your server notes is not running" in r.stderr, r
    # a name that no server of hers can have is not hers to sign in with
    r = ssh.run(f"{fay.name}+Bad/Name", fay.token, command="true")
    assert refused(r), r


def test_commands_without_a_terminal_get_plain_pipes_byte_for_byte(ssh, lab_user):
    """`ssh host CMD` as scripts and tools use it: binary stdin and stdout unchanged (no
    CRLF, no echo), stderr apart, a signal's exit status as a shell reports it."""
    gina = lab_user("sshpipes")
    gina.start_server()
    blob = os.urandom(3 * 1024 * 1024) + b"\r\n\x04\x03\x00 end"
    r = ssh.run(gina.name, gina.token, command="cat > blob.bin; sha256sum blob.bin; cat blob.bin",
                stdin=blob, timeout=120)
    digest = hashlib.sha256(blob).hexdigest()
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{digest}  blob.bin\n".encode() + blob
    r = ssh.run(gina.name, gina.token, command="echo out; echo err >&2; kill -TERM $$")
    assert (r.returncode, r.stdout, r.stderr) == (143, "out\n", "err\n"), r
    r = ssh.run(gina.name, gina.token, command="no-such-command-here")
    assert r.returncode == 127 and "no-such-command-here" in r.stderr, r


@pytest.mark.parametrize("command, marker", [
    ("sleep 4242", "sleep 4242"),  # SIGHUP ends it
    # ignores SIGHUP and writes on: the closed pipe (SIGPIPE) ends it, as under sshd
    ("sh -c 'trap \"\" HUP; while :; do echo spin4242; done'", "spin4242"),
])
def test_a_vanished_client_hangs_up_its_command(ssh, lab_user, command, marker):
    """The SSH client killed (no EOF, no exit): the command in her server is hung up,
    not left running."""
    lee = lab_user("sshhangup")
    lee.start_server()

    def running() -> bool:
        return marker in docker("exec", lee.container, "ps", "-eo", "args")

    proc = subprocess.Popen(ssh.args(lee.name) + [command], env=ssh.env(lee.token),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for(running, 60, what="the command to run in her server")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    wait_for(lambda: not running(), 30, what="the command to be hung up")


def test_sftp_scp_and_rsync_reach_her_home(ssh, lab_user, tmp_path):
    harry = lab_user("sshfiles")
    harry.start_server()
    local = tmp_path / "data.bin"
    local.write_bytes(os.urandom(200_000))
    # commands on stdin (sftp -b would turn on BatchMode, which allows no password)
    batch = f"mkdir up\nput {local} up/data.bin\nget up/data.bin {tmp_path}/back.bin\n"
    sftp = [*ssh.args(harry.name)][:-1]
    sftp[0] = "sftp"
    sftp[sftp.index("-p")] = "-P"
    r = subprocess.run([*sftp, f"{harry.name}@{ssh.host}"], input=batch,
                       capture_output=True, text=True, env=ssh.env(harry.token), timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "back.bin").read_bytes() == local.read_bytes()
    inside = docker("exec", harry.container, "stat", "-c", "%U %s", "/home/jovyan/up/data.bin")
    assert inside.split() == ["jovyan", "200000"]
    scp = ["scp", *sftp[1:]]
    for mode in ([], ["-O"]):  # scp speaks sftp; -O: the old protocol, `scp -t` over exec
        r = subprocess.run([*scp, *mode, str(local), f"{harry.name}@{ssh.host}:scp{len(mode)}.bin"],
                           capture_output=True, text=True, env=ssh.env(harry.token), timeout=120)
        assert r.returncode == 0, (mode, r.stderr)
        assert docker("exec", harry.container, "sha256sum", f"/home/jovyan/scp{len(mode)}.bin") \
            .split()[0] == hashlib.sha256(local.read_bytes()).hexdigest()
    # rsync over ssh (its own protocol on plain pipes, both ends): a folder up, then again
    # with nothing changed (nothing sent), then back
    tree = tmp_path / "project"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "train.py").write_text("print('hi')\n")
    (tree / "weights.bin").write_bytes(os.urandom(100_000))
    rsh = " ".join(shlex.quote(a) for a in ssh.args(harry.name)[:-1])
    target = f"{harry.name}@{ssh.host}:project/"

    def rsync(*args: str) -> subprocess.CompletedProcess:
        r = subprocess.run(["rsync", "-a", "--stats", "-e", rsh, *args], capture_output=True,
                           text=True, env=ssh.env(harry.token), timeout=120)
        assert r.returncode == 0, r.stderr
        return r

    assert "Number of regular files transferred: 2" in rsync(f"{tree}/", target).stdout
    assert "Number of regular files transferred: 0" in rsync(f"{tree}/", target).stdout
    rsync(target, f"{tmp_path}/back/")
    assert (tmp_path / "back" / "weights.bin").read_bytes() == (tree / "weights.bin").read_bytes()


# What VS Code's Remote-SSH does on a Linux host: `ssh -T -D <port> host bash`, a script on
# stdin that starts its server on a loopback port in the background and prints
# `listeningOn==PORT==`, then connections to 127.0.0.1:PORT through ssh's SOCKS proxy
# while the bash session stays open. Here the "server" is Python's http.server.
REMOTE_SSH_SCRIPT = """
echo "platform==$(uname -s)=="; echo "arch==$(uname -m)=="
mkdir -p ~/.fake-vscode-server && cd ~/.fake-vscode-server
echo "served from $(hostname)" > index.html
nohup python3 -u -m http.server --bind 127.0.0.1 0 > log 2>&1 &
echo $! > pid
for i in $(seq 200); do
  port=$(sed -n 's/.* port \\([0-9]*\\) .*/\\1/p' log)
  [ -n "$port" ] && break; sleep 0.1
done
echo "listeningOn==$port=="
"""



def registered_key(member, folder: Path) -> Path:
    """A key pair made with ssh-keygen, its public half registered as the member does it:
    the REST API through the published port, with her login token. The private key."""
    key = folder / f"id_ed25519_{member.name}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                    f"{member.name}@laptop", "-f", str(key)], check=True)
    r = requests.post(f"{HUB_URL}/hub/api/gpulab/ssh-keys/{member.name}",
                      json={"key": key.with_suffix(".pub").read_text()}, timeout=30,
                      headers={"Authorization": f"token {member.token}"})
    assert r.status_code == 201, r.text
    return key


@pytest.mark.parametrize("credential", ["login token", "ssh key"])
def test_vs_code_remote_ssh_flow_reaches_her_servers_loopback(ssh, lab_user, tmp_path,
                                                               credential):
    """VS Code's Remote-SSH, with her login token typed as the password or, without
    typing anything, with her registered SSH key."""
    ivy, bob = lab_user("sshvscode"), lab_user("sshvsbob")
    ivy.start_server()
    bob.start_server()
    if credential == "ssh key":
        key = registered_key(ivy, tmp_path)

        def login(*extra):
            return ssh.key_args(ivy.name, key, *extra), None
    else:
        def login(*extra):
            return ssh.args(ivy.name, *extra), ssh.env(ivy.token)
    socks = free_port()
    args, env = login("-T", "-D", f"127.0.0.1:{socks}")
    proc = subprocess.Popen(args + ["bash"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    try:
        proc.stdin.write(REMOTE_SSH_SCRIPT)
        proc.stdin.flush()
        lines = []
        while not (lines and lines[-1].startswith("listeningOn==")):
            line = proc.stdout.readline()
            assert line, f"bash ended early: {lines} {proc.stderr.read()}"
            lines.append(line.strip())
        assert lines[:2] == ["platform==Linux==", f"arch=={os.uname().machine}=="], lines
        port = int(lines[-1].split("==")[1])
        for host in ("127.0.0.1", "localhost"):
            got = subprocess.run(["curl", "-sS", "--max-time", "20", "--socks5-hostname",
                                  f"127.0.0.1:{socks}", f"http://{host}:{port}/index.html"],
                                 capture_output=True, text=True, timeout=60)
            assert got.stdout == f"served from {hostname_of(ivy.container)}\n", got
        # -L to the same port, as a member opens a notebook's web app
        local = free_port()
        args, env = login("-N", "-L", f"{local}:localhost:{port}")
        fwd = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
        try:
            wait_for(lambda: subprocess.run(
                ["curl", "-sf", "--max-time", "5", f"http://127.0.0.1:{local}/index.html"],
                capture_output=True).returncode == 0, 60, what="ssh -L to her port")
        finally:
            fwd.terminate()
            fwd.wait(timeout=30)
        # bob's forward to the same port number lands in bob's own server: nothing there
        r = ssh.run(bob.name, bob.token, "-W", f"127.0.0.1:{port}")
        assert r.returncode == 255 and "open failed" in r.stderr, r
        assert "Connection refused" in r.stderr, r
        proc.stdin.close()  # as VS Code closing the window
        assert proc.wait(timeout=60) == 0
        # its server, started with nohup, lives on for the next connection, as under sshd
        alive = subprocess.run(["docker", "exec", ivy.container, "sh", "-c",
                                "kill -0 $(cat ~/.fake-vscode-server/pid)"], capture_output=True)
        assert alive.returncode == 0, alive
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["docker", "exec", ivy.container, "sh", "-c",
                        "kill $(cat ~/.fake-vscode-server/pid)"], capture_output=True)


def test_forwarding_anywhere_but_her_own_loopback_is_refused(ssh, lab_user):
    judy, bob = lab_user("sshnofwd"), lab_user("sshfwdbob")
    judy.start_server()
    bob.start_server()
    bob_ip = next(iter(json.loads(docker("inspect", bob.container))[0]["NetworkSettings"]
                       ["Networks"].values()))["IPAddress"]
    for target in (f"{bob_ip}:8888", "hub:8081", "proxy:8001", "169.254.169.254:80"):
        r = ssh.run(judy.name, judy.token, "-W", target)
        assert r.returncode == 255 and "administratively prohibited" in r.stderr, (target, r)
        assert "only to your own server's ports on localhost" in r.stderr
    r = ssh.run(judy.name, judy.token, "-o", "ExitOnForwardFailure=yes",
                "-R", "8022:localhost:22", command="true")
    assert r.returncode == 255 and "remote port forwarding failed" in r.stderr, r
    r = ssh.run(judy.name, judy.token, "-s", command="netconf")
    assert r.returncode == 1 and "'netconf' subsystem is not available" in r.stderr, r


def channel(path: str, token: str) -> int | str:
    """Open one of a server's gpulab channels through the hub's proxy with *token*; the
    refusal's HTTP status, or "open"."""
    from tornado.httpclient import HTTPClientError, HTTPRequest
    from tornado.websocket import websocket_connect

    async def attempt():
        url = "ws" + HUB_URL[len("http"):] + path
        try:
            ws = await websocket_connect(HTTPRequest(
                url, headers={"Authorization": f"token {token}"}))
        except HTTPClientError as e:
            return e.code
        ws.close()
        return "open"

    # in a thread of its own: Playwright's sync API keeps an event loop in this one
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, attempt()).result()


# In a browser: run `id -u` through a server's exec channel, with the browser's cookies.
EXEC_IN_BROWSER = """async (url) => await new Promise((resolve) => {
  const ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  let out = "";
  ws.onopen = () => ws.send(JSON.stringify({argv: ["id", "-u"]}));
  ws.onmessage = (e) => {
    if (typeof e.data !== "string") out += new TextDecoder().decode(e.data.slice(1));
    else if (JSON.parse(e.data).exit !== undefined) resolve("ran: " + out.trim());
  };
  ws.onclose = (e) => resolve("closed: " + e.code);
  setTimeout(() => resolve("no answer in 30 s: " + out), 30000);
})"""


def test_the_servers_channels_open_only_with_her_token_never_from_a_browser(lab_user,
                                                                           new_page):
    """The extension itself, attacked past the gateway: through the hub's proxy with
    another member's token or none; and from her own signed-in browser, on her own
    JupyterLab page and on a foreign page (her cookies go along either way): the
    channels take a token in an Authorization header only, which no page can set."""
    kim, mallory = lab_user("sshchankim"), lab_user("sshchanmal")
    kim.start_server()
    mallory.start_server()
    for endpoint in ("exec", "tcp/8888"):
        path = f"/user/{kim.name}/gpulab/{endpoint}"
        assert channel(path, kim.token) == "open"  # control
        assert channel(path, mallory.token) == 403
        assert channel(path, "0" * 40) == 403

    page = new_page()
    submit_login(page, kim.name, kim.token)  # on to her JupyterLab: her server's cookie
    page.wait_for_url(re.compile(rf"/user/{kim.name}/lab"))
    assert f"jupyterhub-user-{kim.name}" in {c["name"] for c in page.context.cookies()}
    ws_url = "ws" + HUB_URL[len("http"):] + f"/user/{kim.name}/gpulab/exec"
    assert page.evaluate(EXEC_IN_BROWSER, ws_url) == "closed: 1006"  # her own page

    evil = tempfile.mkdtemp()
    Path(evil, "index.html").write_text("<title>a page on another site</title>")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler,
                                                           directory=evil))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page.goto(f"http://127.0.0.1:{server.server_port}/index.html")
        assert page.evaluate(EXEC_IN_BROWSER, ws_url) == "closed: 1006"
    finally:
        server.shutdown()
    refusals = re.findall(rf"403 GET /user/{re.escape(kim.name)}/gpulab/exec \(",
                          container_logs(kim.container, 30))
    assert len(refusals) >= 2, container_logs(kim.container, 30)
