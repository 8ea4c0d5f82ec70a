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


def model(name="alice", scopes=("access:servers!user=alice",), servers=None, kind="user"):
    return {"kind": kind, "name": name, "scopes": list(scopes), "servers": servers or {}}


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


def test_server_path_only_for_a_ready_default_server():
    ready = {"": {"ready": True, "url": "/user/alice/", "pending": None}}
    assert policy.server_path(model(servers=ready)) == "/user/alice/"
    assert policy.server_path(model(servers={})) is None
    starting = {"": {"ready": False, "url": "/user/alice/", "pending": "spawn"}}
    assert policy.server_path(model(servers=starting)) is None
    assert policy.pending_of(model(servers=starting)) == "spawn"
    named_only = {"gpu": {"ready": True, "url": "/user/alice/gpu/"}}
    assert policy.server_path(model(servers=named_only)) is None
    assert policy.server_path(model(servers={"": {"ready": True, "url": "http://x/"}})) is None


def test_not_running_message_names_where_to_start_it():
    msg = policy.not_running_message("http://127.0.0.1:8000/")
    assert msg == ("Your server is not running; start it at http://127.0.0.1:8000/hub/home, "
                   "then connect again.\r\n")
    assert "the hub's home page" in policy.not_running_message("")
    assert "still starting" in policy.not_running_message("https://gpu.lab", pending="spawn")
