"""`make upgrade` from a real older gpulab to this checkout's HEAD, as a lab's admin
meets it (docs/backups-and-upgrades.md#upgrading; `make test-upgrade`, the last step of .ci/run).

A clone of this repository at GPULAB_UPGRADE_FROM (default: the last release before
backups and make upgrade existed) is the lab's checkout: its own `make up` builds and
starts the older version on this Docker engine, from fresh volumes. An admin edits
config/gpulab.yaml, issues members login tokens with the older CLI, a member writes a
file into her home and leaves her server running, Prometheus records history. Then, as
after `git pull --autostash`: the clone's branch fast-forwarded to HEAD's commit, and `make upgrade`:
- first with a config/ the new version refuses: the upgrade stops, the older version
  goes on running, unchanged (the same hub container, answering her token);
- then fixed: everything is checked from outside: her old login token signs her in
  (the REST API and the login form), her server ran through the upgrade and still
  answers with her file, a new server has her home, the admin's edit is in effect,
  Prometheus answers the same for a time before the upgrade, and the upgrade said what
  changed in configuration;
- then `make upgrade-back` and the older checkout's `make up`: the older version runs
  again, on the hub's data as they were when the upgrade began (her token), and her home
  as it is now: her file, and one she wrote after the upgrade (homes do not depend on
  gpulab's version; the way back must not lose her work).

It takes this engine's gpulab stack for itself (make down first, fresh volumes): CI runs
it after everything else; after it, `make up` brings this checkout's stack back.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.integration.stack import REPO, Hub, LabUser, docker, wait_for

# It takes this engine's stack (make down, fresh volumes), so it runs only when asked by
# name: `make test-upgrade` sets this. Selected any other way (`pytest -k upgrade`, a bare
# `pytest`), it is skipped and the lab that runs here is left alone.
TAKES_THE_STACK = "GPULAB_TEST_TAKES_THE_STACK"
pytestmark = [
    pytest.mark.upgrade,
    pytest.mark.skipif(os.environ.get(TAKES_THE_STACK) != "yes",
                       reason=f"takes this engine's gpulab stack down: run it with make "
                              f"test-upgrade ({TAKES_THE_STACK}=yes)"),
]

# 56d1fa3: stop 31's landing, the last gpulab without backups or make upgrade
OLD = os.environ.get("GPULAB_UPGRADE_FROM", "56d1fa3")
URL = "http://127.0.0.1:8000"
STACK_VOLUMES = ("gpulab-hub-data", "gpulab-last-good", "gpulab-ssh-data",
                 "gpulab-alertmanager-data", "gpulab-prometheus-data")
WHEELHOUSES = ("images/hub/wheels", "images/singleuser/wheels", "monitoring/exporter/wheels")
HISTORY = 'count_over_time(up{job="gpulab-hub"}[5m])'


# What make exports (make test-upgrade runs this) would point the lab's makes at this
# checkout: its config/ above all.
NOT_PASSED = {"GPULAB_CONFIG", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES"}


def run(argv: list[str], cwd: Path, timeout: float = 900, **env: str):
    environ = {k: v for k, v in os.environ.items() if k not in NOT_PASSED} | env
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=environ)


def lab_make(lab: Path, target: str, *, ok: bool = True, **env: str) -> str:
    """`make -s TARGET` in the lab's checkout with the test stack's settings."""
    environ = {"GPULAB_EXPORTER_FLAGS": "--fake-gpus 2 --interval 1 --process-interval 2",
               "GPULAB_SCRAPE_SECONDS": "2", "GPULAB_BACKUP_DIR": str(lab / ".test-backups"),
               **env}
    out = run(["make", "-s", target], lab, **environ)
    said = out.stdout + out.stderr
    assert (out.returncode == 0) == ok, f"make {target} exited {out.returncode}:\n{said[-6000:]}"
    return said


def git(lab: Path, *args: str) -> str:
    out = run(["git", *args], lab, timeout=60)
    assert out.returncode == 0, f"git {' '.join(args)}: {out.stderr}"
    return out.stdout.strip()


def history_at(moment: float) -> str:
    return docker("exec", "gpulab-prometheus", "promtool", "query", "instant",
                  f"--time={moment:.3f}", "http://127.0.0.1:9090", HISTORY)


def issue_token(name: str) -> str:
    """A login token, issued as an admin does it: the running version's own CLI."""
    out = docker("exec", "gpulab-hub", "gpulab", "token", "issue", name, "--expires", "1d")
    return re.search(r"^\s+(\S{32,})\s*$", out, re.M).group(1)


def signs_in(name: str, token: str) -> bool:
    """The hub's login form takes her name and token (as a browser posts it)."""
    s = requests.Session()
    page = s.get(f"{URL}/hub/login", timeout=30)
    xsrf = s.cookies.get("_xsrf") or re.search(r'name="_xsrf" value="([^"]+)"', page.text)[1]
    r = s.post(f"{URL}/hub/login?next=%2Fhub%2Fhome", timeout=30, allow_redirects=False,
               data={"username": name, "password": token, "_xsrf": xsrf})
    return r.status_code == 302 and r.headers.get("Location", "").endswith("/hub/home")


@pytest.fixture
def lab(tmp_path):
    """The lab's checkout at OLD, this engine's stack removed and its volumes fresh."""
    subprocess.run(["make", "-s", "down"], cwd=REPO, capture_output=True, timeout=300)
    present = set(docker("volume", "ls", "-q").split())
    if present & set(STACK_VOLUMES):
        docker("volume", "rm", "-f", *(present & set(STACK_VOLUMES)))
    lab = tmp_path / "lab"
    out = run(["git", "clone", "-q", str(REPO), str(lab)], tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    if run(["git", "cat-file", "-e", f"{OLD}^{{commit}}"], lab).returncode != 0:
        pytest.fail(f"{OLD} (GPULAB_UPGRADE_FROM) is not in this repository's history: "
                    f"a shallow clone? git fetch --unshallow")
    git(lab, "checkout", "-q", "-B", "main", OLD)  # the lab's branch, at the older gpulab
    for wheels in WHEELHOUSES:  # what make images downloaded already, not again
        if (REPO / wheels).is_dir():
            shutil.copytree(REPO / wheels, lab / wheels, dirs_exist_ok=True)
    try:
        yield lab
    finally:
        run(["make", "-s", "down"], lab, timeout=300)
        homes = [v for v in docker("volume", "ls", "-q").split() if v.startswith("gpulab-home-upg")]
        if homes:
            docker("volume", "rm", "-f", *homes)


def test_make_upgrade_from_an_older_gpulab_keeps_members_homes_history_and_config(lab):
    new = git(REPO, "rev-parse", "--short", "HEAD")
    said = lab_make(lab, "up")
    assert "JupyterHub is up" in said, said
    hub = Hub(URL, (lab / "secrets" / "api-token").read_text().strip())

    # The lab as it was used: an admin's edit, members with login tokens, a home, history.
    settings = lab / "config" / "gpulab.yaml"
    text = settings.read_text()
    assert "\n  admins: [admin]\n" in text, text
    settings.write_text(text.replace("\n  admins: [admin]\n",
                                     "\n  admins: [admin]\n  idle_timeout: 2h\n", 1))
    line = settings.read_text().splitlines().index("  idle_timeout: 2h") + 1
    wait_for(lambda: docker("exec", "gpulab-hub", "gpulab", "config", "get",
                            "hub.idle_timeout") == "7200", 30, what="the edit to be read")
    name = f"upg-{os.urandom(3).hex()}"
    user = LabUser(hub, name, issue_token(name))
    other = LabUser(hub, f"upg-{os.urandom(3).hex()}", "")
    other.token = issue_token(other.name)
    user.start_server()
    note = f"{name}'s results, written before the upgrade\n"
    r = user.api("PUT", "/contents/results.txt",
                 json={"type": "file", "format": "text", "content": note})
    assert r.status_code in (200, 201), r.text
    server_container = docker("inspect", "-f", "{{.Id}}", user.container)
    old_hub = docker("inspect", "-f", "{{.Id}}", "gpulab-hub")
    wait_for(lambda: "=>" in history_at(time.time() - 3), 60, what="Prometheus' first samples")
    moment = time.time() - 3
    before = history_at(moment)

    # After git pull: a config/ the new version refuses stops the upgrade before anything
    # that runs changes.
    # what `git pull --autostash` does (ORIG_HEAD: the older), with the admin's edit of
    # gpulab.yaml carried over the new version's own changes to that file
    git(lab, "merge", "-q", "--ff-only", "--autostash", new)
    edited = settings.read_text()
    settings.write_text(edited.replace("  idle_timeout: 2h\n", "  idle_timeout: 2 hours\n"))
    said = lab_make(lab, "upgrade", ok=False)
    assert "refuses this lab's configuration" in said, said
    assert f"gpulab.yaml:{line}" in said and "hub.idle_timeout" in said, said
    assert "the old version still runs, unchanged" in said, said
    assert docker("inspect", "-f", "{{.Id}}", "gpulab-hub") == old_hub
    assert docker("image", "inspect", "-f", "{{.Id}}", "gpulab/hub:latest") == \
        docker("inspect", "-f", "{{.Image}}", "gpulab-hub"), "make up would start the new images"
    assert hub.request("GET", f"/users/{name}").status_code == 200
    assert user.api("GET", "/status").status_code == 200

    # Fixed: the upgrade.
    settings.write_text(edited)
    said = lab_make(lab, "upgrade")
    assert f"upgrading from {OLD[:7]}" in said and f"to {new}" in said, said
    assert "new setting backup.every" in said, said  # what changed in configuration
    snapshot = re.search(r"backup ([0-9a-f]{8}): ", said)
    assert snapshot, said
    assert f"upgraded from {OLD[:7]} to {new}" in said, said
    assert "make upgrade-back" in said, said
    assert docker("inspect", "-f", "{{.Id}}", "gpulab-hub") != old_hub

    # From outside, on the new version.
    assert (lab / ".gpulab-running").read_text().strip() == new
    assert signs_in(name, user.token) and signs_in(other.name, other.token)
    assert docker("inspect", "-f", "{{.Id}}", user.container) == server_container, \
        "her server did not run through the upgrade"
    r = user.api("GET", "/contents/results.txt", params={"content": "1", "format": "text"})
    assert r.status_code == 200 and r.json()["content"] == note, r.text
    assert docker("exec", "gpulab-hub", "gpulab", "config", "get", "hub.idle_timeout") == "7200"
    assert history_at(moment) == before
    user.stop_server()
    user.start_server()  # a server of the new version, on her home
    r = user.api("GET", "/contents/results.txt", params={"content": "1", "format": "text"})
    assert r.status_code == 200 and r.json()["content"] == note, r.text
    assert snapshot.group(1) in docker("exec", "gpulab-backup", "gpulab-backup", "list")

    # The way back: make upgrade-back here, then the older checkout's make up.
    r = user.api("PUT", "/contents/after.txt",
                 json={"type": "file", "format": "text", "content": "written after\n"})
    assert r.status_code in (200, 201), r.text
    said = lab_make(lab, "upgrade-back")
    assert f"start it: git checkout -m {OLD[:7]} && make up BUILD_IMAGES=no" in said, said
    assert "Kept as they are now: members' homes (files written since the upgrade stay)" \
        in said, said  # said before anything was put back
    git(lab, "checkout", "-q", "-m", OLD)  # as the way back says
    lab_make(lab, "up", BUILD_IMAGES="no")
    assert docker("ps", "-q", "--filter", "name=^gpulab-backup$") == "", \
        "the older version has no backup service"
    assert docker("inspect", "-f", "{{.Image}}", "gpulab-hub") == \
        docker("image", "inspect", "-f", "{{.Id}}", "gpulab/hub:previous")
    assert signs_in(name, user.token)
    user.start_server()
    r = user.api("GET", "/contents/results.txt", params={"content": "1", "format": "text"})
    assert r.status_code == 200 and r.json()["content"] == note, r.text
    # her home as it is now: what she wrote after the upgrade is still there
    r = user.api("GET", "/contents/after.txt", params={"content": "1", "format": "text"})
    assert r.status_code == 200 and r.json()["content"] == "written after\n", r.text
