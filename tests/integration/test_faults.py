"""Faults the lab will meet, against the real stack: each ends with a clear message for
the user, no container left behind, no GPU lease leaked, and the hub still serving.

Settings are changed the way an admin does it: by editing the gpulab.yaml the running
hub reads (restored afterwards); spawn settings take effect at the next spawn.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import requests
import yaml

from .stack import REPO, docker, host_has_nvidia_gpu, wait_for
from .standin import dockerd_has_nvidia_driver

NEVER_READY = "gpulab-test/never-ready:1"
EXITS_AT_ONCE = "gpulab-test/exits-at-once:1"
# DockerSpawner appends jupyterhub-singleuser's arguments to the image's command, so the
# entrypoints swallow them ("$@" lands in sh -c's positional parameters).
TEST_IMAGES = {
    NEVER_READY: 'FROM gpulab/base:bookworm\nENTRYPOINT ["sh", "-c", "sleep infinity", "--"]\n',
    EXITS_AT_ONCE: 'FROM gpulab/base:bookworm\n'
                   'ENTRYPOINT ["sh", "-c", "echo config file is broken >&2; exit 3", "--"]\n',
}


@pytest.fixture(scope="module")
def broken_images():
    for tag, dockerfile in TEST_IMAGES.items():
        subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=dockerfile, text=True,
                       check=True, capture_output=True, timeout=300)
    yield
    for tag in TEST_IMAGES:
        docker("rmi", "-f", tag, check=False)


@pytest.fixture
def spawn_settings(lab_config):
    """Set spawn.* keys in the hub's gpulab.yaml (on top of the admin's own file)."""

    def set_(**spawn):
        doc = yaml.safe_load(lab_config.original("gpulab.yaml")) or {}
        doc.setdefault("spawn", {}).update(spawn)
        lab_config.write("gpulab.yaml", yaml.safe_dump(doc))

    yield set_
    lab_config.restore()


def post_spawn(user, options=None) -> requests.Response:
    return requests.post(f"{user.hub.api}/users/{user.name}/server", json=options or {},
                         headers={"Authorization": f"token {user.token}"}, timeout=120)


def containers_of(user) -> list[str]:
    return docker("ps", "-aq", "--filter", f"label=org.gpulab.user={user.name}").split()


def test_missing_image_is_a_clear_503_and_nothing_is_created(hub, lab_user, spawn_settings):
    user = lab_user("noimage")
    spawn_settings(image="gpulab-test/does-not-exist:1")
    r = post_spawn(user)
    assert r.status_code == 503
    assert "gpulab-test/does-not-exist:1 is not on this host" in r.json()["message"]
    assert containers_of(user) == []
    assert hub.server_model(user.name) is None


def test_missing_datasets_volume_is_a_clear_503(hub, lab_user, spawn_settings):
    user = lab_user("nodata")
    spawn_settings(datasets_volume="gpulab-test-no-such-volume")
    r = post_spawn(user)
    assert r.status_code == 503
    message = r.json()["message"]
    assert "shared datasets volume 'gpulab-test-no-such-volume' does not exist" in message
    assert containers_of(user) == []
    # docker did not quietly create an empty root-owned volume either
    assert docker("volume", "ls", "-q", "--filter", "name=gpulab-test-no-such-volume") == ""


def test_server_that_exits_at_once_fails_with_its_log(hub, lab_user, spawn_settings, broken_images):
    user = lab_user("crash")
    spawn_settings(image=EXITS_AT_ONCE)
    r = post_spawn(user)
    assert r.status_code >= 400
    message = r.json()["message"]
    assert "exited while starting (exit status 3)" in message
    assert "config file is broken" in message  # the end of its log, for the user
    wait_for(lambda: not containers_of(user), 30, what="the failed container to be removed")
    assert hub.server_model(user.name) is None
    spawn_settings()  # the admin fixes the image: the same user starts fine
    user.start_server()


def test_server_that_never_answers_times_out_and_is_cleaned_up(hub, lab_user, spawn_settings,
                                                              broken_images):
    user = lab_user("slow")
    spawn_settings(image=NEVER_READY, start_timeout="12s")
    r = post_spawn(user)
    assert r.status_code in (202, 500), r.text  # pending after the hub's 10 s, or failed
    wait_for(lambda: hub.server_model(user.name) is None, 60, interval=1,
             what="the hub to give up on the server")
    wait_for(lambda: not containers_of(user), 30, what="the container to be removed")
    # The user's next look at the hub says what happened.
    model = hub.user_model(user.name)
    assert model["pending"] is None


def test_start_stop_races_leave_one_container_at_most(hub, lab_user):
    user = lab_user("racer")
    headers = {"Authorization": f"token {user.token}"}
    url = f"{user.hub.api}/users/{user.name}/server"
    seen = 0
    for _ in range(4):
        requests.post(url, json={}, headers=headers, timeout=120)
        requests.delete(url, headers=headers, timeout=120)
        seen = max(seen, len(containers_of(user)))
    assert seen <= 1
    wait_for(lambda: hub.server_model(user.name) is None, 60, interval=0.5,
             what="the last stop to finish")
    wait_for(lambda: not containers_of(user), 30, what="no container left")
    user.start_server()
    assert len(containers_of(user)) == 1


def _proxy_pid() -> str:
    """PID of configurable-http-proxy (node) inside the hub container; the image has no
    procps, so /proc is read directly."""
    return docker("exec", "gpulab-hub", "sh", "-c",
                  "for p in /proc/[0-9]*; do case \"$(tr '\\0' ' ' < $p/cmdline)\" in "
                  "node*configurable-http-proxy*) echo ${p#/proc/};; esac; done")


def test_killed_proxy_comes_back_with_its_routes(hub, lab_user):
    user = lab_user("routes")
    user.start_server()
    pid = _proxy_pid()
    assert pid.isdigit(), pid
    docker("exec", "gpulab-hub", "sh", "-c", f"kill -9 {pid}")

    def routed():
        try:
            return user.api("GET", "/status", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    wait_for(routed, 90, interval=1, what="the proxy and the user's route to come back")
    assert _proxy_pid() not in ("", pid)


def test_hub_sigkill_keeps_kernels_servers_and_leases(hub, lab_user):
    users = [lab_user("survivor") for _ in range(5)]
    for u in users:
        u.start_server()
    kernels = {u.name: u.start_kernel() for u in users}
    for u in users:
        u.execute(kernels[u.name], "state = 41")

    docker("kill", "--signal", "KILL", "gpulab-hub")
    docker("start", "gpulab-hub")  # what the restart policy or an admin does
    wait_for(hub.is_up, 90, what="the hub to come back")

    for u in users:
        wait_for(lambda u=u: (hub.server_model(u.name) or {}).get("ready"), 60,
                 what=f"{u.name}'s server to be known ready again")
        assert u.execute(kernels[u.name], "print(state + 1)").strip() == "42"
        assert len(containers_of(u)) == 1


def _dockerd_pid() -> str:
    try:
        return open("/run/gpulab-dockerd.pid").read().strip()
    except OSError:
        return ""


def test_docker_engine_restart_keeps_servers_and_spawns_resume(hub, lab_user):
    """dockerd stopped and started again (an upgrade, a crash): with --live-restore the
    hub and users' servers keep running; spawns meanwhile fail with a readable 503, and
    work again afterwards."""
    pid = _dockerd_pid()
    if not pid or docker("info", "--format", "{{.LiveRestoreEnabled}}") != "true":
        pytest.skip("dockerd was not started by scripts/ensure-docker.sh (with --live-restore)")
    running, waiting = lab_user("steady"), lab_user("waiting")
    running.start_server()
    kernel = running.start_kernel()
    running.execute(kernel, "state = 41")
    hub_ip = json.loads(docker("inspect", "gpulab-hub"))[0]["NetworkSettings"]["Networks"][
        "gpulab"]["IPAddress"]
    direct = f"http://{hub_ip}:8000"  # the published port's userland proxy dies with dockerd

    # Restart it as it was: with the stand-in GPU hook if it had it (scripts/ensure-docker.sh).
    env = dict(os.environ)
    if dockerd_has_nvidia_driver() and not host_has_nvidia_gpu():
        env["GPULAB_DOCKERD_PATH"] = str(REPO / "tests" / "gpu_standin")
    subprocess.run(["kill", pid], check=True)
    try:
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 90, what="dockerd to exit")
        r = requests.post(f"{direct}/hub/api/users/{waiting.name}/server", json={},
                          headers={"Authorization": f"token {waiting.token}"}, timeout=60)
        assert r.status_code == 503
        assert "Docker engine on this host is not answering" in r.json()["message"]
        status = requests.get(f"{direct}/user/{running.name}/api/status", timeout=10,
                              headers={"Authorization": f"token {running.token}"})
        assert status.status_code == 200  # the running server never noticed
    finally:
        subprocess.run([str(REPO / "scripts" / "ensure-docker.sh")], check=True, timeout=120,
                       env=env)
    wait_for(hub.is_up, 60, what="the published port to answer again")
    waiting.start_server()
    assert running.execute(kernel, "print(state + 1)").strip() == "42"
