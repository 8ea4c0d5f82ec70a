"""Faults the lab will meet, against the real stack: each ends with a clear message for
the user, no container left behind, no GPU lease leaked, and the hub still serving.

Settings are changed the way an admin does it: by editing the gpulab.yaml the running
hub reads (restored afterwards); spawn settings take effect at the next spawn.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import requests

from .stack import REPO, docker, wait_for

# The tests that edit the spawn settings (gpulab.yaml) that every spawn reads, through
# the spawn_settings fixture, run alone (conftest.DISRUPTIVE_FIXTURES); the others beside
# the rest of the suite.
pytestmark = pytest.mark.integration

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


def post_spawn(user, options=None) -> requests.Response:
    return requests.post(f"{user.hub.api}/users/{user.name}/server", json=options or {},
                         headers={"Authorization": f"token {user.token}"}, timeout=120)


def spawn_progress(user, timeout: float = 30) -> list[dict]:
    """The events of the hub's spawn progress stream, as the spawn page reads them."""
    r = requests.get(f"{user.hub.api}/users/{user.name}/server/progress", stream=True,
                     headers={"Authorization": f"token {user.token}"}, timeout=timeout)
    return [json.loads(line[len(b"data:"):]) for line in r.iter_lines()
            if line.startswith(b"data:")]


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


def test_a_home_size_the_engine_cannot_apply_fails_new_homes_clearly_and_old_ones_go_on(
        hub, lab_user, spawn_settings):
    """spawn.home_size on a Docker whose volumes have no project quotas (this machine's
    ext4): a member without a home is told why her server cannot start, and nothing of
    her is made; a member whose home exists starts as before (docs/operations.md)."""
    new, old = lab_user("newhome"), lab_user("oldhome")
    docker("volume", "create", old.home_volume)  # her home, made before the setting
    probe = subprocess.run(["docker", "volume", "create", "--opt", "size=16m",
                            "gpulab-size-probe"], capture_output=True, text=True)
    docker("volume", "rm", "-f", "gpulab-size-probe", check=False)
    spawn_settings(home_size="16m")
    r = post_spawn(new)
    if probe.returncode == 0:  # a Docker whose volumes are on XFS with pquota
        assert r.status_code in (201, 202), r.text
        assert docker("volume", "inspect", "-f", "{{.Options.size}}", new.home_volume) \
            == str(16 * 1024**2)
    else:
        assert "no quota support" in probe.stderr, probe.stderr
        assert r.status_code == 503, r.text
        message = r.json()["message"]
        assert "the lab limits homes to 16m (spawn.home_size)" in message, message
        assert "quota size requested but no quota support" in message, message
        assert "XFS with project quotas" in message, message
        assert containers_of(new) == [] and hub.server_model(new.name) is None
        assert docker("volume", "ls", "-q", "--filter", f"name={new.home_volume}") == ""
    old.start_server()
    assert docker("volume", "inspect", "-f", "{{.Options}}", old.home_volume) == "map[]"


@pytest.mark.parametrize("setting, what", [("home_size", "homes"),
                                           ("project_size", "project folders")])
def test_make_up_refuses_a_home_size_the_engine_cannot_apply(tmp_path, setting, what):
    """make up's preflight (scripts/preflight.sh, its first step) with spawn.home_size (or
    spawn.project_size) in the admin's gpulab.yaml tries a sized volume on the real
    engine."""
    config = tmp_path / "config"
    shutil.copytree(REPO / "config", config)
    settings = config / "gpulab.yaml"
    text = settings.read_text()
    assert "\nspawn:\n" in text
    settings.write_text(text.replace("\nspawn:\n", f"\nspawn:\n  {setting}: 50g\n", 1))
    out = subprocess.run([str(REPO / "scripts" / "preflight.sh"), "single"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "GPULAB_CONFIG": str(config)})
    said = out.stdout + out.stderr
    assert docker("volume", "ls", "-q", "--filter", "name=gpulab-size-probe") == ""
    if "no quota support" not in said:  # a Docker whose volumes are on XFS with pquota
        assert out.returncode == 0, said
        assert f"new {what} hold at most 53687091200 bytes (spawn.{setting})" in said, said
        return
    assert out.returncode == 1, said
    assert f"config/gpulab.yaml sets spawn.{setting}, and this Docker engine cannot give a " \
           "volume a size" in said, said
    assert f"on XFS mounted with pquota, or remove spawn.{setting}" in said, said


def test_server_that_exits_at_once_fails_with_its_log(hub, lab_user, spawn_settings, broken_images):
    user = lab_user("crash")
    spawn_settings(image=EXITS_AT_ONCE)
    r = post_spawn(user)
    assert r.status_code == 500  # the server failed, not the request
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
    spawn_settings(image=NEVER_READY, start_timeout="25s")
    r = post_spawn(user)
    # The hub answers 202 (still starting) after its slow_spawn_timeout of 10 s.
    assert r.status_code == 202, r.text
    wait_for(lambda: hub.server_model(user.name) is None, 90, interval=1,
             what="the hub to give up on the server")
    wait_for(lambda: not containers_of(user), 30, what="the container to be removed")
    assert hub.user_model(user.name)["pending"] is None
    # The progress stream (what the spawn page shows) says the start failed and why.
    events = spawn_progress(user)
    assert events and events[-1].get("failed") is True, events
    assert "did not answer within 25 seconds, so it was stopped" in events[-1]["message"]


def test_start_stop_races_leave_one_container_at_most(hub, lab_user):
    user = lab_user("racer")
    headers = {"Authorization": f"token {user.token}"}
    url = f"{user.hub.api}/users/{user.name}/server"
    seen, answers = 0, []
    for _ in range(4):
        started = requests.post(url, json={}, headers=headers, timeout=120)
        stopped = requests.delete(url, headers=headers, timeout=120)
        answers.append((started.status_code, stopped.status_code))
        seen = max(seen, len(containers_of(user)))
    # Start: created or still starting; stop: done or under way. Never an error.
    assert all(a in (201, 202) and b in (202, 204) for a, b in answers), answers
    assert seen <= 1
    wait_for(lambda: hub.server_model(user.name) is None, 60, interval=0.5,
             what="the last stop to finish")
    wait_for(lambda: not containers_of(user), 30, what="no container left")
    user.start_server()
    assert len(containers_of(user)) == 1
