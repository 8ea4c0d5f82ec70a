"""The idle culler stops an idle server, and the GPU it held goes to the next user.

hub.idle_timeout is read when the hub starts (it becomes the culler service's
--timeout), so the test sets a short one in the gpulab.yaml the hub reads and restarts
the hub, as an admin would; the culler then checks every half timeout
(gpulab.hubconfig.cull_every). The file and the hub are put back afterwards.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
import requests

from .stack import container_logs, docker, wait_for
from .standin import GPU0, STANDIN_GPUS, gpus_of

# Runs alone (scripts/test-integration.sh): it restarts the hub.
pytestmark = pytest.mark.disruptive

IDLE_TIMEOUT = 10  # seconds: a spawn takes about 6 s here, so the 409 below comes first
ONE_GPU = STANDIN_GPUS.replace("  - {index: 1", "  # - {index: 1")  # GPU 0 only


def restart_hub(hub) -> str:
    """Restart the hub; the command line its idle-culler service was started with."""
    since = docker("inspect", "-f", "{{.State.StartedAt}}", "gpulab-hub")
    docker("restart", "--time", "10", "gpulab-hub")
    wait_for(hub.is_ready, 90, what="the hub to come back")

    def culler_started() -> str:
        started = docker("inspect", "-f", "{{.State.StartedAt}}", "gpulab-hub")
        out = subprocess.run(["docker", "logs", "--since", started, "gpulab-hub"],
                             capture_output=True, text=True, timeout=60)
        return started != since and next(
            (ln for ln in (out.stdout + out.stderr).splitlines()
             if "Starting service 'idle-culler'" in ln), "")

    return wait_for(culler_started, 30, what="the hub to start its idle culler")


def test_idle_server_is_culled_and_its_gpu_goes_to_the_next_user(hub, lab_user, lab_config,
                                                                  gpus_yaml):
    lab_config.write("gpus.yaml", ONE_GPU)  # one GPU: whoever holds it blocks everyone
    alice, bob = lab_user("alice"), lab_user("bob")
    settings = lab_config.original("gpulab.yaml")
    assert "idle_timeout" not in settings
    lab_config.write("gpulab.yaml", settings.replace("hub:\n", f"hub:\n  idle_timeout: "
                                                                f"{IDLE_TIMEOUT}s\n", 1))
    try:
        culler = restart_hub(hub)
        assert f"'--timeout={IDLE_TIMEOUT}', '--cull-every={IDLE_TIMEOUT // 2}'" in culler, culler

        alice.start_server({"gpus": 1})
        ready = time.monotonic()
        assert gpus_of(alice.container)["device_ids"] == [GPU0]
        r = requests.post(f"{hub.api}/users/{bob.name}/server", json={"gpus": 1}, timeout=60,
                          headers={"Authorization": f"token {bob.token}"})
        assert r.status_code == 409, r.text  # alice holds the only GPU

        # nobody uses alice's server: the culler stops it within 1.5 timeouts
        wait_for(lambda: hub.server_model(alice.name) is None, 3 * IDLE_TIMEOUT, interval=0.5,
                 what="the idle culler to stop alice's server")
        idle_for = time.monotonic() - ready
        culled = re.search(rf"Culling server {re.escape(alice.name)} \(inactive for [^)]*\)",
                           container_logs("gpulab-hub", 400))
        assert culled, "the hub's log does not say the culler stopped alice's server"
        assert idle_for > IDLE_TIMEOUT / 2, idle_for  # not at once: after being idle
        wait_for(lambda: docker("ps", "-aq", "--filter", f"name=^/{alice.container}$") == "",
                 30, what="alice's container to be removed")

        bob.start_server({"gpus": 1})
        assert gpus_of(bob.container)["device_ids"] == [GPU0]
    finally:
        lab_config.write("gpulab.yaml", settings)
        culler = restart_hub(hub)
    assert "'--timeout=3600', '--cull-every=60'" in culler  # the shipped default is back
