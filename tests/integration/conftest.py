"""Fixtures for tests against the real stack: dockerd, the images, the hub and proxy.

The session fixture starts the stack with `make up` when the hub does not answer
(idempotent, cached images make it quick), waits with a deadline, and fails with the
hub's log when it cannot. Every test user is created through the REST API, and on
failure the test's output gets the user's container log and the hub's log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

from ..conftest import REAL_GPU
from .browser import browser, new_page  # noqa: F401  (fixtures for every module)
from .stack import REPO, Hub, LabUser, container_logs, docker, host_has_nvidia_gpu, wait_for
from .standin import STANDIN_GPUS, dockerd_has_nvidia_driver


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
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
    for user in created:
        if failed:
            print(f"\n----- log of {user.container} -----\n{container_logs(user.container)}")
        hub.delete_user(user.name)
        docker("volume", "rm", "-f", user.home_volume, check=False)
    if failed:
        print("\n----- hub log -----\n" + container_logs("gpulab-hub", 80))


@pytest.fixture(scope="session")
def hub_admin(hub) -> LabUser:
    """The lab's admin (the first of hub.admins in the gpulab.yaml the hub reads) with a
    login token of their own for this session, issued as `gpulab token issue` does and
    revoked at the end. Admins are made only by hub.admins at hub start (gpulab.roles)."""
    from gpulab.settings import load_settings

    name = load_settings(LabConfig().dir / "gpulab.yaml")["hub.admins"][0]
    r = hub.request("POST", f"/gpulab/login-tokens/{name}", json={"expires_in": 3600})
    assert r.status_code == 201, r.text
    assert hub.user_model(name)["admin"] is True, f"{name} is in hub.admins but not an admin"
    yield LabUser(hub, name, r.json()["token"])
    hub.request("DELETE", f"/gpulab/login-tokens/{name}/{r.json()['id']}")


def pytest_report_header(config):
    return [f"gpulab hub under test: {os.environ.get('GPULAB_URL', 'http://127.0.0.1:8000')}"]


class LabConfig:
    """The config files the running hub reads (wherever its checkout is), edited the way
    an admin edits them; every file touched is put back by the fixture.

    Each original is also kept beside the file (`.NAME.before-tests`) until it is put
    back, so that a test run killed mid-test (no teardown) does not leave the admin's
    config edited: the next run puts it back first."""

    def __init__(self):
        mounts = json.loads(docker("inspect", "gpulab-hub"))[0]["Mounts"]
        self.dir = Path(next(m["Source"] for m in mounts
                             if m["Destination"] == "/srv/gpulab/config"))
        self._originals: dict[Path, str] = {}
        for backup in self.dir.glob(".*.before-tests"):
            path = self.dir / backup.name[1:-len(".before-tests")]
            warnings.warn(f"{path} was left edited by a test run that was killed; "
                          f"putting back the original kept in {backup.name}", stacklevel=2)
            path.write_text(backup.read_text())
            backup.unlink()

    def _backup(self, path: Path) -> Path:
        return path.with_name(f".{path.name}.before-tests")

    def write(self, name: str, text: str) -> Path:
        path = self.dir / name
        if path not in self._originals:
            self._originals[path] = path.read_text()
            self._backup(path).write_text(self._originals[path])
        path.write_text(text)
        return path

    def original(self, name: str) -> str:
        path = self.dir / name
        return self._originals.get(path) or path.read_text()

    def restore(self) -> None:
        for path, text in self._originals.items():
            path.write_text(text)
            self._backup(path).unlink(missing_ok=True)
        self._originals.clear()


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
