"""The idle culler stops a server in which nothing happens, and keeps one whose work runs,
as a member meets it overnight: no browser open on any of them.

hub.idle_timeout is read when the hub starts (it becomes the culler service's
--timeout), so the test sets a short one in the gpulab.yaml the hub reads and restarts
the hub, as an admin would; the culler then checks every half timeout
(gpulab.hubconfig.cull_every) and servers report their activity every quarter
(activity_every). The file and the hub are put back afterwards.

Five members, two stand-in GPUs, after their last Jupyter traffic:
- one whose GPU works (the fake NVML's control file: 95 %) and nothing else: the GPU
  culler reports the server active;
- one whose kernel runs a single silent cell (time.sleep), its websocket closed;
- one who started a script with nohup over SSH and logged out;
- one holding the other GPU who does nothing: stopped within 1.5 timeouts, warned
  first and told after on her home page, and the GPU goes to
- the one waiting in line for a GPU.
The first three survive three timeouts.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid

import pytest
import requests
import websocket

from .stack import container_logs, docker, form_login, wait_for
from .standin import GPU0, GPU1, STANDIN_GPUS, gpus_of
from .test_ssh import SSH

# Runs alone (scripts/test-integration.sh): it restarts the hub.
pytestmark = pytest.mark.disruptive

# seconds: servers then report activity every 6 s (activity_every), the image's work
# watcher looks every 6 s, and the culler checks every 12 s (cull_every)
IDLE_TIMEOUT = 24
# the GPU culler reports GPU work (and warns) every 2 s; GPUs are never idle-culled here
GPUS = STANDIN_GPUS + "  gpu_idle_timeout: 0\nculling: {check_every: 2s}\n"
# a script that works, lightly (a tenth of a core), and never ends
WORKER = ("nohup python3 -c 'import time\nwhile True:\n  t = time.time()\n"
          "  while time.time() - t < 0.02: pass\n  time.sleep(0.18)' > train.log 2>&1 &")


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


def start_silent_cell(user, seconds: int) -> None:
    """A cell that computes for *seconds* without printing, in a new kernel; the
    websocket is closed at once, as when her laptop's lid closes."""
    kernel_id = user.start_kernel()
    ws_url = user.server_url.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
    ws = websocket.create_connection(ws_url, header=user._headers(), timeout=30)
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": user.name,
                   "session": uuid.uuid4().hex, "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": f"import time\ntime.sleep({seconds})", "silent": False,
                    "store_history": True, "user_expressions": {}, "allow_stdin": False}}))
    while True:  # until the kernel says it is busy with it
        msg = json.loads(ws.recv())
        if msg.get("msg_type") == "status" and msg["content"]["execution_state"] == "busy" \
                and msg.get("parent_header", {}).get("msg_id") == msg_id:
            break
    ws.close()


def home_page(user) -> str:
    """Her hub home page, signed in through the login form as a browser is."""
    signed_in = form_login(user.name, user.token)
    assert signed_in.status_code == 302, signed_in.text[:300]
    r = signed_in.session.get(f"{user.hub.url}/hub/home", timeout=30)
    assert r.status_code == 200 and "gpu-notices" in r.text, r.status_code
    return re.sub(r"\s+", " ", r.text)


def test_work_that_runs_survives_and_the_idle_server_is_culled_for_the_next(
        hub, lab_user, lab_config, gpus_yaml, fake_control, tmp_path):
    lab_config.write("gpus.yaml", GPUS)
    gpuer, sleeper, nohup, idler, waiter = (lab_user(p) for p in (
        "gpuwork", "silentcell", "nohupssh", "idle", "inline"))
    settings = lab_config.original("gpulab.yaml")
    assert "idle_timeout" not in settings
    lab_config.write("gpulab.yaml", settings.replace("hub:\n", f"hub:\n  idle_timeout: "
                                                                f"{IDLE_TIMEOUT}s\n", 1))
    try:
        culler = restart_hub(hub)
        assert f"'--timeout={IDLE_TIMEOUT}', '--cull-every={IDLE_TIMEOUT // 2}'" in culler, \
            culler

        gpuer.start_server({"gpus": 1})
        assert gpus_of(gpuer.container)["device_ids"] == [GPU0]
        fake_control({"utilization": {"0": 95, "1": 0}})
        idler.start_server({"gpus": 1})
        assert gpus_of(idler.container)["device_ids"] == [GPU1]
        r = requests.post(f"{hub.api}/users/{waiter.name}/server",
                          json={"gpus": 1, "wait": True}, headers=waiter._headers(),
                          timeout=60)
        assert r.status_code == 202, r.text  # in line: both GPUs are held
        sleeper.start_server()
        start_silent_cell(sleeper, 3600)
        nohup.start_server()
        ssh = SSH(tmp_path)
        r = ssh.run(nohup.name, nohup.token, command=WORKER)
        assert r.returncode == 0, r
        quiet_since = time.monotonic()  # no Jupyter traffic to any of them from here

        # the idle one: warned on her home page, then stopped by the idle culler
        wait_for(lambda: "will be stopped" in home_page(idler), 30, interval=1,
                 what="the warning ahead of the idle culler on her home page")
        assert "nothing has happened in it for" in home_page(idler)
        wait_for(lambda: hub.server_model(idler.name) is None, 2 * IDLE_TIMEOUT, interval=0.5,
                 what="the idle culler to stop the idle server")
        assert re.search(rf"Culling server {re.escape(idler.name)} \(inactive for [^)]*\)",
                         container_logs("gpulab-hub", 400))
        # ... and her GPU goes to the next in line
        wait_for(lambda: (hub.server_model(waiter.name) or {}).get("ready"), 60, interval=0.5,
                 what="the line to start the waiting member's server")
        assert gpus_of(waiter.container)["device_ids"] == [GPU1]
        wait_for(lambda: "nothing had happened in it for" in home_page(idler), 30,
                 interval=1, what="the stop notice on her home page")

        # the three at work run on through three timeouts without a byte of Jupyter traffic
        while time.monotonic() - quiet_since < 3 * IDLE_TIMEOUT + 5:
            for user in (gpuer, sleeper, nohup):
                assert (hub.server_model(user.name) or {}).get("ready"), (
                    f"{user.name}'s server was stopped after "
                    f"{time.monotonic() - quiet_since:.0f} s though it worked")
            time.sleep(2)
        logs = container_logs("gpulab-hub", 2000)
        for user in (gpuer, sleeper, nohup):
            assert f"Culling server {user.name} " not in logs, user.name
        assert "1 kernel(s) executing" in container_logs(sleeper.container, 200)
        assert "1 process(es) working" in container_logs(nohup.container, 200)
        assert "will be stopped" not in home_page(gpuer)
    finally:
        fake_control(None)
        lab_config.write("gpulab.yaml", settings)
        culler = restart_hub(hub)
    assert "'--timeout=3600', '--cull-every=60'" in culler  # the shipped default is back
