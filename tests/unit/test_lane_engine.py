"""The disruptive lane's own engine (tests/lane_engine.py): what its stack and tests are
given. The lane itself runs in `make test` (scripts/test-integration.sh)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests import lane_engine


def test_nothing_of_the_main_stack_reaches_the_lanes_stack(monkeypatch):
    # what the outer `make test` exports for the main stack
    for name, value in {"GPULAB_CONFIG": "/work/main/config",
                        "GPULAB_DOCKER_SOCKET": "/var/run/docker.sock",
                        "GPULAB_BACKUP_DIR": "/work/main/.test-backups",
                        "GPULAB_URL": "http://127.0.0.1:8000",
                        "GPULAB_SCRAPE_SECONDS": "2",
                        "GPULAB_EXPORTER_FLAGS": "--fake-gpus 2"}.items():
        monkeypatch.setenv(name, value)
    env = lane_engine.environment()
    assert "GPULAB_CONFIG" not in env and "GPULAB_URL" not in env
    assert env["DOCKER_HOST"] == f"unix://{lane_engine.SOCKET}"
    assert env["GPULAB_DOCKER_SOCKET"] == str(lane_engine.SOCKET)
    assert env["GPULAB_BACKUP_DIR"] == str(lane_engine.COPY / ".test-backups")
    assert env["GPULAB_DOCKERD_PIDFILE"] == str(lane_engine.PIDFILE)
    assert env["GPULAB_DOCKERD_START"].endswith("-m tests.lane_engine start-dockerd")
    # the test stack's own settings carry over
    assert env["GPULAB_SCRAPE_SECONDS"] == "2" and env["GPULAB_EXPORTER_FLAGS"] == "--fake-gpus 2"


def test_everything_it_runs_is_inside_its_namespace():
    assert lane_engine.in_netns(["make", "up"]) == [
        "nsenter", f"--net=/run/netns/{lane_engine.NETNS}", "--", "make", "up"]
    assert lane_engine.ROOT not in lane_engine.REPO.parents  # never inside the checkout


def lane_engine_named(name: str | None) -> subprocess.CompletedProcess:
    """What tests.lane_engine takes for its engine, imported with GPULAB_LANE_ENGINE=*name*
    (its names are set at import, as each lane's process imports it)."""
    env = {k: v for k, v in os.environ.items() if k != "GPULAB_LANE_ENGINE"}
    if name is not None:
        env["GPULAB_LANE_ENGINE"] = name
    code = ("from tests import lane_engine as e; "
            "print(e.ROOT, e.NETNS, e.environment().get('GPULAB_LANE_ENGINE'))")
    return subprocess.run([sys.executable, "-c", code], cwd=lane_engine.REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_second_engine_beside_the_first_has_names_of_its_own():
    assert lane_engine_named(None).stdout.split() == ["/tmp/gpulab-lane", "gpulab-lane", "None"]
    # the backups lane's (scripts/test-integration.sh); its tests' dockerd restarts start
    # the same engine again (GPULAB_DOCKERD_START runs this module with that environment)
    assert lane_engine_named("gpulab-lane-backups").stdout.split() == [
        "/tmp/gpulab-lane-backups", "gpulab-lane-backups", "gpulab-lane-backups"]
    for bad in ("../etc", "docker", "gpulab-lane/../x", ""):
        out = lane_engine_named(bad)
        assert out.returncode != 0 and "not gpulab-lane[a-z0-9-]*" in out.stderr, (bad, out)


def lab_config(directory):
    """The integration tests' LabConfig over *directory* (its constructor asks the
    running hub where its config is)."""
    from tests.integration.stack import LabConfig

    config = LabConfig.__new__(LabConfig)
    config.dir, config._originals = directory, {}
    return config


def test_the_lanes_copy_gets_config_as_the_admin_left_it_not_as_a_test_has_it(tmp_path):
    (tmp_path / "gpulab.yaml").write_text("admin's\n")
    (tmp_path / "gpus.yaml").write_text("gpus\n")
    config = lab_config(tmp_path)
    config.write("gpulab.yaml", "a test's edit\n")
    assert lane_engine.config_as_left(tmp_path) == {"gpulab.yaml": "admin's\n",
                                                    "gpus.yaml": "gpus\n"}
    config.restore()
    assert lane_engine.config_as_left(tmp_path)["gpulab.yaml"] == "admin's\n"


def test_config_as_left_while_a_test_edits_and_puts_back_without_pause(tmp_path):
    """The race seen in `make test`: the copy was taken while the gpus lane's first test
    had config/alertmanager.yml edited. Here the edits and put-backs never stop."""
    import threading

    (tmp_path / "alertmanager.yml").write_text("route: admin\n")
    config, done = lab_config(tmp_path), threading.Event()

    def edit():
        while not done.is_set():
            config.write("alertmanager.yml", "route: webhook of a test\n")
            config.restore()

    editor = threading.Thread(target=edit)
    editor.start()
    try:
        seen = [lane_engine.config_as_left(tmp_path)["alertmanager.yml"] for _ in range(300)]
    finally:
        done.set()
        editor.join()
    assert set(seen) == {"route: admin\n"}
