"""`make down && make up`: users, login tokens, homes, the last good settings and the
line for GPUs are kept; `make down` takes the firewall rules away and `make up` puts
them back.

This takes the whole stack down (about a minute with the way back), so it is marked
``stack_restart`` and runs after every other test (tests/integration/conftest.py), and
it brings the stack up again whatever happens, with the exporter flags it found.
"""

from __future__ import annotations

import json
import subprocess
from urllib.parse import urlsplit

import pytest

from gpulab.contract import INFRA_CONTAINERS as STACK

from .browser import submit_login
from .stack import container_logs, docker, exporter_flags, make, wait_for
from .standin import GPU0, gpus_of
from .test_line import ONE_GPU, place, server_ready, spawn

pytestmark = pytest.mark.stack_restart

def firewall_rules() -> list[str]:
    out = subprocess.run(["iptables", "-S"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if "gpulab-netguard" in line]


def running(name: str) -> bool:
    return docker("ps", "-q", "--filter", f"name=^/{name}$") != ""


def memory_limit(container: str) -> int:
    return int(docker("inspect", "-f", "{{.HostConfig.Memory}}", container))


def job_state(user, job: str) -> str | None:
    """What ~/jobs/JOB/status.json says, read through her default server."""
    r = user.api("GET", f"/contents/jobs/{job}/status.json",
                 params={"content": "1", "format": "text"})
    return json.loads(r.json()["content"])["state"] if r.status_code == 200 else None


def test_make_down_and_up_keep_users_tokens_and_homes_and_toggle_the_firewall(hub, lab_user,
                                                                             lab_config,
                                                                             new_page,
                                                                             gpus_yaml):
    user = lab_user("keeper")
    # a member waits in line for the one GPU, which another holds
    lab_config.write("gpus.yaml", ONE_GPU)
    holder, waiter = lab_user("holder"), lab_user("waiter")
    holder.start_server({"gpus": 1})
    r = spawn(waiter, {"gpus": 1, "wait": True})
    assert r.status_code == 202 and place(waiter) == ("waiting", 1, 1), r.text
    original = lab_config.original("gpulab.yaml")
    lab_config.write("gpulab.yaml", original.replace("  mem_limit: 8g\n", "  mem_limit: 3g\n"))
    user.start_server()
    assert memory_limit(user.container) == 3 << 30
    note = f"written before make down by {user.name}\n"
    r = user.api("PUT", "/contents/kept.txt",
                 json={"type": "file", "format": "text", "content": note})
    assert r.status_code in (200, 201), r.text
    # her job, left running overnight
    r = user.ask_server("overnight", {"gpus": 0, "job": "sleep 3600"})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: job_state(user, "overnight") == "running", 120, interval=0.5,
             what="her job to run")
    flags = exporter_flags()
    assert firewall_rules(), "no gpulab-netguard rules while the stack is up"
    # An admin's typo, then a restart of everything: the lab comes back on the last good
    # settings, and `make up` says which edit it refused.
    bad = original.replace("  mem_limit: 8g\n", "  mem_limit: plenty\n")
    line = bad.splitlines().index("  mem_limit: plenty") + 1
    lab_config.write("gpulab.yaml", bad)

    try:
        make("down", flags)
        assert [name for name in STACK if running(name)] == []
        assert not running(user.container)
        assert firewall_rules() == []
        assert not hub.is_up()
    finally:
        out = make("up", flags)  # on failure too: the stack is up again for whoever is next
        wait_for(hub.is_ready, 120, what="the hub to answer after make up")
    assert "JupyterHub is up" in out
    assert f"warning: config/gpulab.yaml:{line}: spawn.mem_limit" in out, out[-3000:]
    assert "the lab goes on with the last good version of gpulab.yaml" in out, out[-3000:]
    assert wait_for(firewall_rules, 30, what="gpulab-netguard to put its rules back")
    assert exporter_flags() == flags

    # the user and their login token: signing in works as before
    page = new_page()
    response = submit_login(page, user.name, user.token, next_url="/hub/home")
    assert response.status == 200 and urlsplit(page.url).path == "/hub/home", page.url
    assert hub.server_model(user.name) is None  # make down stopped every server

    # the home: the file is there in the new container, which has the last good settings
    user.start_server()
    assert memory_limit(user.container) == 3 << 30
    r = user.api("GET", "/contents/kept.txt", params={"content": "1", "format": "text"})
    assert r.status_code == 200, (r.text, container_logs(user.container))
    assert r.json()["content"] == note
    # her job was stopped with the stack, and says so rather than "running"
    assert hub.server_model(user.name, "overnight") is None
    assert job_state(user, "overnight") == "stopped"

    # the line: she kept her place, and the GPU that make down took from its holder is
    # hers now
    wait_for(lambda: server_ready(waiter), 120, interval=1,
             what="the line to start the waiting member's server after make up")
    assert gpus_of(waiter.container)["device_ids"] == [GPU0]
