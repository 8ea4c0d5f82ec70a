"""An invalid edit of config/gpulab.yaml never stops the lab, even across restarts.

The README and docs/operations.md ("The last good settings") say an edit that does not
validate is refused and the last good version stays in force. That must hold when something restarts while the file is invalid: the
hub killed from the host (a crash, the OOM killer), the Docker proxy restarted (what a
dockerd restart does to it), dockerd itself restarted (an upgrade), and `make down &&
make up` (test_stack_lifecycle.py). Throughout, a member's next server gets the last
good settings, and the error stays in the hub's log and on the admins' lease page.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from .browser import submit_login
from .restarts import hub_reaches_docker_proxy, kill_from_host, state, wait_restarted
from .stack import HUB_URL, docker, wait_for

# Runs alone (scripts/test-integration.sh): it kills the hub, restarts the Docker proxy
# and dockerd, and edits gpulab.yaml.
pytestmark = pytest.mark.disruptive

GiB = 1 << 30
HUB = "gpulab-hub"


def memory_limit(container: str) -> int:
    return int(docker("inspect", "-f", "{{.HostConfig.Memory}}", container))


def spawned_memory_limit(member) -> int:
    """A new server's memory limit: what the settings in force say."""
    member.start_server()
    try:
        return memory_limit(member.container)
    finally:
        member.stop_server()


def hub_log_since(started_at: str) -> str:
    out = subprocess.run(["docker", "logs", "--since", started_at, HUB],
                         capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


def test_an_invalid_edit_survives_a_hub_kill_a_proxy_restart_and_a_dockerd_restart(
        hub, hub_admin, lab_user, lab_config, gpulab_dockerd, new_page):
    member = lab_user("member")
    original = lab_config.original("gpulab.yaml")
    assert "  mem_limit: 8g\n" in original
    lab_config.write("gpulab.yaml", original.replace("  mem_limit: 8g\n", "  mem_limit: 3g\n"))
    assert spawned_memory_limit(member) == 3 * GiB  # the good edit is in force (and kept)

    bad = original.replace("  mem_limit: 8g\n", "  mem_limit: plenty\n")
    line = bad.splitlines().index("  mem_limit: plenty") + 1
    error = (f"gpulab.yaml:{line}: spawn.mem_limit: expected a size such as 2g or 512m, "
             f"got 'plenty'")
    lab_config.write("gpulab.yaml", bad)  # an admin's typo

    # The hub killed from the host: it starts again on the last good version.
    before = kill_from_host(HUB)
    wait_restarted(HUB, before)
    wait_for(hub.is_ready, 90, what="the killed hub to answer again")
    assert error in hub_log_since(state(HUB)["StartedAt"])
    assert spawned_memory_limit(member) == 3 * GiB

    # The Docker proxy restarted: it reads the version the hub kept.
    docker("restart", "--time", "5", "gpulab-docker-proxy")
    wait_for(hub_reaches_docker_proxy, 30, interval=0.3, what="the Docker proxy to answer")
    assert spawned_memory_limit(member) == 3 * GiB

    # dockerd restarted (--live-restore: the hub and the proxy's container keep running;
    # the proxy's socket file mount is now stale). The proxy notices by itself and is
    # restarted on the new socket; the next spawn needs no retry.
    gpulab_dockerd()
    t0 = time.monotonic()
    wait_for(hub_reaches_docker_proxy, 30, interval=0.2,
             what="the Docker proxy to answer after dockerd's restart")
    print(f"the Docker proxy answered the hub {time.monotonic() - t0:.1f} s after dockerd "
          f"was back")
    assert spawned_memory_limit(member) == 3 * GiB

    # The admins see why their edit is not in force (the dashboard started again too).
    page = new_page()
    submit_login(page, hub_admin.name, hub_admin.token, next_url="/hub/home")
    page.goto(f"{HUB_URL}/services/gpus/leases")
    banner = page.locator("#config-errors .banner")
    assert banner.count() == 1 and error in banner.inner_text(), banner.all_inner_texts()
    assert "last good version" in banner.inner_text()
