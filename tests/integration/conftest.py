"""Fixtures for tests against the real stack: dockerd, the images, the hub and proxy.

The session fixture starts the stack with `make up` when the hub does not answer
(idempotent, cached images make it quick), waits with a deadline, and fails with the
hub's log when it cannot. Every test user is created through the REST API, and on
failure the test's output gets the user's container log and the hub's log.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from ..conftest import REAL_GPU
from ..swarm import Swarm, SwarmError
from .browser import browser, new_page  # noqa: F401  (fixtures for every module)
from .fake_gpus import exporter_snapshot, write_fake_control
from .restarts import gpulab_dockerd_pid, restart_gpulab_dockerd, start_gpulab_dockerd
from .smtp_sink import smtp_server  # noqa: F401  (a fixture for every module)
from .stack import (
    REPO,
    Hub,
    LabConfig,
    LabUser,
    container_logs,
    docker,
    host_has_nvidia_gpu,
    wait_for,
)
from .standin import STANDIN_GPUS, dockerd_has_nvidia_driver

# Fixtures of the tests that use the stand-in GPUs and the exporter's fake ones (and so
# edit gpus.yaml and the fake GPUs' control file): one after another, in one lane.
GPU_FIXTURES = {"gpus_yaml", "fake_control"}
# Modules that run in that lane too (scripts/test-integration.sh), though their tests
# use no stand-in GPU: test_docker_proxy_dockerd's containers carry GPU 0's lease labels,
# which clash only with spawns that ask for a GPU.
GPUS_LANE_MODULES = {"test_docker_proxy_dockerd"}
# Fixtures of tests that edit what every spawn reads (gpulab.yaml's spawn settings): such
# a test runs in the disruptive lane (a stack of its own); its module's other tests need not.
DISRUPTIVE_FIXTURES = {"spawn_settings"}


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
            if GPU_FIXTURES & set(item.fixturenames):
                item.add_marker(pytest.mark.gpus)
                item.add_marker(pytest.mark.gpus_lane)
            elif item.module.__name__.rpartition(".")[2] in GPUS_LANE_MODULES:
                item.add_marker(pytest.mark.gpus_lane)
            if (item.get_closest_marker("stack_restart") is not None
                    or DISRUPTIVE_FIXTURES & set(item.fixturenames)):
                item.add_marker(pytest.mark.disruptive)
    # Tests that take the whole stack down and up again run after everything else, so
    # that no other test sees the stack coming back.
    items.sort(key=lambda item: item.get_closest_marker("stack_restart") is not None)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


@pytest.fixture(scope="session")
def hub() -> Hub:
    if shutil.which("docker") is None:
        pytest.fail("docker CLI not found: run `make test`, which installs the engine")
    probe = Hub(token="-")
    if not probe.is_up():
        # Fixtures start what they need: `make up` is idempotent and uses cached images.
        out = subprocess.run(["make", "-s", "up"], cwd=REPO, capture_output=True, text=True,
                             timeout=1800)
        if out.returncode != 0:
            pytest.fail(f"`make up` failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        wait_for(probe.is_up, 120, what="the hub to answer")
    return Hub()


@pytest.fixture(autouse=True)
def settled_stack(request):
    """Before each test on the stack: the hub and its dashboard service answer. A test
    that restarted something waits for it itself; this makes sure that no later test
    starts in the seconds a managed service needs after a hub restart (CI once got 503
    from the lease page that way), whatever ran before it or was run alone."""
    if "hub" in request.fixturenames:
        probe = Hub(token="-")
        wait_for(probe.is_ready, 120, interval=0.5,
                 what="the hub and its GPU dashboard service to answer")
    yield


@pytest.fixture
def lab_user(hub, request):
    """A fresh lab member with a login token; removed, with their home volume, afterwards."""
    created = []

    def make(prefix: str = "test", name: str | None = None):
        user = hub.create_user(prefix, name)
        created.append(user)
        return user

    yield make
    failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
    if failed:
        for user in created:
            print(f"\n----- log of {user.container} -----\n{container_logs(user.container)}")
    if created:
        hub.delete_users([user.name for user in created])
        docker("volume", "rm", "-f", *(user.home_volume for user in created), check=False)
    if failed:
        print("\n----- hub log -----\n" + container_logs("gpulab-hub", 80))


@pytest.fixture(scope="session")
def hub_admin(hub) -> LabUser:
    """The lab's admin (the first of hub.admins in the gpulab.yaml the hub reads) with a
    login token of their own for this session, issued as `gpulab token issue` does and
    revoked at the end. Admins are made only by hub.admins at hub start (gpulab.login.roles)."""
    from gpulab.settings import load_settings

    name = load_settings(LabConfig().dir / "gpulab.yaml")["hub.admins"][0]
    r = hub.request("POST", f"/gpulab/login-tokens/{name}", json={"expires_in": 3600})
    assert r.status_code == 201, r.text
    assert hub.user_model(name)["admin"] is True, f"{name} is in hub.admins but not an admin"
    yield LabUser(hub, name, r.json()["token"])
    hub.request("DELETE", f"/gpulab/login-tokens/{name}/{r.json()['id']}")


def pytest_report_header(config):
    return [f"gpulab hub under test: {os.environ.get('GPULAB_URL', 'http://127.0.0.1:8000')}"]


@pytest.fixture(scope="module")
def lab_config(hub):
    config = LabConfig()
    yield config
    config.restore()


@pytest.fixture(scope="module")
def gpus_yaml(lab_config):
    """The stand-in inventory in the gpus.yaml the running hub reads, for one test module."""
    if host_has_nvidia_gpu():
        pytest.skip(f"{REAL_GPU}this host has real GPUs: test_gpu_host.py covers it; "
                    f"stand-ins would lie")
    if not dockerd_has_nvidia_driver():
        reason = ("dockerd was started without nvidia-container-runtime-hook on its PATH, so "
                  "it cannot start containers with GPU requests; start it with "
                  "scripts/test-host.sh (which `make test` runs)")
        pytest.skip(reason)
    return lab_config.write("gpus.yaml", STANDIN_GPUS)


@pytest.fixture
def spawn_settings(lab_config):
    """Set spawn.* keys in the hub's gpulab.yaml (on top of the admin's own file)."""

    def set_(**spawn):
        doc = yaml.safe_load(lab_config.original("gpulab.yaml")) or {}
        doc.setdefault("spawn", {}).update(spawn)
        lab_config.write("gpulab.yaml", yaml.safe_dump(doc))

    yield set_
    lab_config.restore()


@pytest.fixture
def fake_control():
    snapshot = exporter_snapshot()
    if not snapshot["fake"] or len(snapshot["gpus"]) != 2:
        pytest.skip("the exporter does not run with --fake-gpus 2 (start the stack with "
                    "`make test`, or GPULAB_EXPORTER_FLAGS='--fake-gpus 2' make up)")
    yield write_fake_control
    write_fake_control(None)


@pytest.fixture
def gpulab_dockerd():
    """The dockerd gpulab started (scripts/ensure-docker.sh: --live-restore, PID file);
    yields a function that stops it, runs a callback while it is down, and starts it again
    as it was (with the stand-in GPU hook on hosts without a GPU)."""
    if not gpulab_dockerd_pid() or docker("info", "--format",
                                          "{{.LiveRestoreEnabled}}") != "true":
        pytest.skip("dockerd was not started by scripts/ensure-docker.sh (with --live-restore)")
    yield restart_gpulab_dockerd
    if not gpulab_dockerd_pid():  # a failure above: never leave the host without Docker
        start_gpulab_dockerd()


@pytest.fixture(scope="module")
def swarm(request):
    """A real Docker Swarm of several engines on this machine (tests/swarm): 1 manager and
    workers with fake GPUs, each dockerd in a network namespace of its own. Module-scoped,
    so that a module may take nodes down. A module sets SWARM_NODES (default 3) and
    SWARM_IMAGES (default: the base image) to change the size and the images copied onto
    every node. Its own stack: it needs neither the hub nor /tmp/gpulab-stack.lock."""
    cluster = Swarm(nodes=getattr(request.module, "SWARM_NODES", 3),
                    images=getattr(request.module, "SWARM_IMAGES", ("gpulab/base:bookworm",)))
    try:
        cluster.start()
    except BaseException as e:
        logs = "\n".join(f"----- dockerd of {n.name} -----\n{cluster.log_tail(n)}"
                         for n in cluster.nodes)
        cluster.close()
        if isinstance(e, SwarmError):
            pytest.fail(f"the simulated Swarm did not start: {e}\n{logs}")
        raise
    yield cluster
    cluster.close()
