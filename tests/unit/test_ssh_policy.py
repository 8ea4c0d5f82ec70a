"""The SSH gateway's decisions (gpulab.ssh.policy) from literal hub answers."""

from __future__ import annotations

import pytest

from gpulab.ssh import policy
from gpulab.ssh.policy import FAILED, OK, REFUSED


@pytest.mark.parametrize("raw, expected", [
    ("alice", "alice"),
    ("Alice", "alice"),
    (" alice ", "alice"),
    ("ＡＬＩＣＥ", "alice"),  # full-width letters fold as on the login page
    ("j.smith", "j.smith"),
    ("", None),
    ("alice/x", None),
    ("-alice", None),
    ("a" * 33, None),
    ("root@host", None),
])
def test_ssh_username_is_normalised_as_the_login_page_does(raw, expected):
    assert policy.ssh_username(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ("alice", ("alice", "")),
    ("alice+train", ("alice", "train")),
    ("Alice+train-2", ("alice", "train-2")),
    ("j.smith+gpu", ("j.smith", "gpu")),
    ("alice+", None),  # a named server needs its name
    ("alice+Train", None),  # as JupyterHub 6 names servers: lowercase
    ("alice+2run", None),  # from a letter
    ("alice+a--b", None),
    ("alice+../bob", None),
    ("alice+a/b", None),
    ("alice+" + "t" * 31, None),
    ("bob+x+y", None),
    ("+train", None),
])
def test_an_ssh_username_names_a_member_and_one_of_her_servers(raw, expected):
    assert policy.ssh_login(raw) == expected
    assert policy.ssh_username(raw) == (expected[0] if expected else None)


def model(name="alice", scopes=("access:servers!user=alice",), servers=None, kind="user"):
    return {"kind": kind, "name": name, "scopes": list(scopes), "servers": servers or {}}


def test_judge_a_named_server():
    train = ["access:servers!server=alice/train"]
    assert policy.judge("alice", 200, model(scopes=train), "train").outcome == OK
    assert policy.judge("alice", 200, model(scopes=train), "").outcome == REFUSED
    assert policy.judge("alice", 200, model(), "train").outcome == OK  # all her servers
    refused = policy.judge("alice", 200, model(scopes=["access:servers!server=alice/"]), "x")
    assert refused.outcome == REFUSED and "may not open your server x" in refused.message


@pytest.mark.parametrize("status, answer, outcome", [
    (200, model(), OK),
    (200, model(scopes=["access:servers!server=alice/"]), OK),
    (200, model(scopes=["access:servers"]), OK),  # an admin's own login token
    (403, None, FAILED),  # wrong, revoked or expired token
    (401, None, FAILED),
    (200, model(name="bob", scopes=["access:servers!user=bob"]), FAILED),  # bob's token
    (200, model(kind="service", name="alice"), FAILED),
    (200, model(scopes=["read:users!user=alice"]), REFUSED),  # her token, but no access
    (200, model(scopes=["access:servers!user=bob"]), REFUSED),
    (0, None, REFUSED),  # hub unreachable: not the member's fault
    (502, None, REFUSED),
    (200, None, REFUSED),
])
def test_judge(status, answer, outcome):
    verdict = policy.judge("alice", status, answer)
    assert verdict.outcome == outcome
    if outcome == REFUSED:
        assert verdict.message  # the member is told why


HUB = "http://proxy:8000"


def test_server_location_only_for_a_ready_default_server():
    ready = {"": {"ready": True, "url": "/user/alice/", "pending": None}}
    assert policy.server_location(HUB, model(servers=ready)) == (HUB, "/user/alice/")
    assert policy.server_location(HUB, model(servers={})) is None
    starting = {"": {"ready": False, "url": "/user/alice/", "pending": "spawn"}}
    assert policy.server_location(HUB, model(servers=starting)) is None
    assert policy.pending_of(model(servers=starting)) == "spawn"
    named_only = {"gpu": {"ready": True, "url": "/user/alice/gpu/"}}
    assert policy.server_location(HUB, model(servers=named_only)) is None
    assert policy.server_location(HUB, model(servers={"": {"ready": True,
                                                              "url": "http://x/"}})) is None


@pytest.mark.parametrize("url, where", [
    # one origin per server (subdomain_host): the proxy, by the server's own name
    ("https://alice.gpu.lab.example/user/alice/",
     ("https://alice.gpu.lab.example:8000", "/user/alice/")),
    ("https://u-jsmith--b33a535.gpu.lab.example:8443/user/j.smith/",
     ("https://u-jsmith--b33a535.gpu.lab.example:8000", "/user/j.smith/")),
    # never anywhere but the hub's own names
    ("https://alice.evil.example/user/alice/", None),
    ("https://gpu.lab.example.evil.example/user/alice/", None),
    ("https://xgpu.lab.example/user/alice/", None),
    ("ftp://alice.gpu.lab.example/user/alice/", None),
    ("https://alice.gpu.lab.example/user/alice", None),
])
def test_server_location_under_the_hubs_own_names(url, where):
    ready = {"": {"ready": True, "url": url}}
    assert policy.server_location("https://gpu.lab.example:8000", model(servers=ready)) == where


def test_a_named_servers_location_and_what_she_reads_when_it_is_not_running():
    servers = {"": {"ready": True, "url": "/user/alice/"},
               "train": {"ready": True, "url": "/user/alice/train/"},
               "gpu": {"ready": False, "url": "/user/alice/gpu/", "pending": "spawn"}}
    assert policy.server_location(HUB, model(servers=servers), "train") == (
        HUB, "/user/alice/train/")
    assert policy.server_location(HUB, model(servers=servers), "gpu") is None
    assert policy.pending_of(model(servers=servers), "gpu") == "spawn"
    assert policy.running_servers(model(servers=servers)) == ("", "train")
    msg = policy.not_running_message("https://lab", None, "notes", ("", "train"), "alice")
    assert msg == ("Your server notes is not running; start it at https://lab/hub/home, then "
                   "connect again.\r\nRunning: your server (ssh alice@...).\r\n"
                   "Running: your server train (ssh alice+train@...).\r\n")


def test_not_running_message_names_where_to_start_it():
    msg = policy.not_running_message("http://127.0.0.1:8000/")
    assert msg == ("Your server is not running; start it at http://127.0.0.1:8000/hub/home, "
                   "then connect again.\r\n")
    assert "the hub's home page" in policy.not_running_message("")
    assert "still starting" in policy.not_running_message("https://gpu.lab", pending="spawn")


@pytest.mark.parametrize("command, subsystem, argv", [
    # ssh host 'CMD': the member's shell runs it, as sshd does ($1 is the command, so no
    # quoting of it can break out)
    ("echo $HOME; exit 3", None, ["/bin/sh", "-c", 'exec "${SHELL:-/bin/sh}" -c "$1"', "sh",
                                  "echo $HOME; exit 3"]),
    # ssh -T host < script (and VS Code's Remote-SSH, which runs `bash` the same way)
    (None, None, ["/bin/sh", "-c", 'exec "${SHELL:-/bin/sh}"']),
    (None, "sftp", ["/usr/lib/openssh/sftp-server"]),
])
def test_a_session_without_a_terminal_runs_as_under_sshd(command, subsystem, argv):
    assert policy.command_argv(command, subsystem) == argv


def test_the_member_command_reaches_the_shell_unchanged():
    import subprocess

    nasty = "printf '%s|' \"$0\" 'a b' \"$(echo x)\"; echo ';rm -rf /'"
    argv = policy.command_argv(nasty, None)
    out = subprocess.run(argv, capture_output=True, text=True, env={"SHELL": "/bin/sh",
                                                                    "PATH": "/usr/bin:/bin"})
    assert out.stdout == "/bin/sh|a b|x|;rm -rf /\n", out


def test_other_subsystems_are_refused_with_what_is_offered():
    with pytest.raises(policy.Unsupported, match="'netconf'.*sftp is"):
        policy.command_argv(None, "netconf")


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "::1", "[::1]", "LOCALHOST",
                                  "ip6-localhost"])
def test_forwarding_reaches_the_servers_own_loopback(host):
    assert policy.forward_port(host, 8080) == 8080


@pytest.mark.parametrize("host, port", [
    ("hub", 8081),  # the hub's API
    ("172.30.0.5", 8888),  # another member's server
    ("127.0.0.2", 80),  # loopback, but not this server's name for it: refused all the same
    ("localhost.", 80),
    ("0.0.0.0", 80),
    ("169.254.169.254", 80),
    ("example.org", 443),
    ("localhost", 0),
    ("localhost", 70000),
])
def test_forwarding_anywhere_else_is_refused(host, port):
    with pytest.raises(policy.Unsupported):
        policy.forward_port(host, port)
