"""The disruptive lane's own engine (tests/lane_engine.py): what its stack and tests are
given. The lane itself runs in `make test` (scripts/test-integration.sh)."""

from __future__ import annotations

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
