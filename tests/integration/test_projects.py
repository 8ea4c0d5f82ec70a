"""A group's project folders (gpus.yaml groups: NAME: {projects: [...]}) on the real
stack: its members' servers mount /projects/NAME read-write and see each other's files;
a member outside the group has no such folder, and no server option mounts one; a member
taken out of the group keeps it in her running server and has none from her next start;
the files outlive every server. spawn.project_size that this Docker cannot apply fails the
start clearly; a full project folder is named as such, over SSH and when saving."""

from __future__ import annotations

import os
import subprocess

import pytest
import requests
import yaml

from .stack import container_gone, docker, wait_for
from .test_full_home import on_a_small_filesystem
from .test_ssh import read_until, ssh  # noqa: F401  (the SSH client fixture)

# edits gpus.yaml's groups while servers start: a stack of its own
pytestmark = pytest.mark.disruptive

# a group the hub makes (hub.operators), as the admin service may fill groups, not make
# them: a lab's groups come from its admins or its identity provider
GROUP = "operators"
PROJECT = "alpha"
VOLUME = f"gpulab-project-{PROJECT}"


def sh(member, command: str, check: bool = True) -> str:
    return docker("exec", member.container, "sh", "-c", command, check=check)


def has_project(member) -> bool:
    return sh(member, f"test -d /projects/{PROJECT} && echo yes || echo no") == "yes"


def with_project(lab_config, project: str) -> None:
    """gpus.yaml (the admin's, plus this): GROUP has *project*."""
    doc = yaml.safe_load(lab_config.original("gpus.yaml")) or {}
    doc["groups"] = {**(doc.get("groups") or {}), GROUP: {"projects": [project]}}
    lab_config.write("gpus.yaml", yaml.safe_dump(doc))


def stopped(*members) -> None:
    for member in members:  # whatever ran: gone before its volume goes
        requests.delete(member.server_path(), headers=member._headers(), timeout=60)
        wait_for(lambda m=member: container_gone(m.container), 60,
                 what=f"{member.name}'s server to be gone")


def test_a_groups_members_share_a_project_folder_and_nobody_else_sees_it(
        lab_config, lab_user, hub):
    with_project(lab_config, PROJECT)
    ann, bob, eve = lab_user("proj"), lab_user("proj"), lab_user("proj")
    r = hub.request("POST", f"/groups/{GROUP}/users", json={"users": [ann.name, bob.name]})
    assert r.status_code == 200, r.text
    docker("volume", "rm", "-f", VOLUME, check=False)  # a new project
    try:
        for member in (ann, bob, eve):
            member.start_server({"gpus": 0})
        # ann writes, bob reads and adds, ann reads both: one folder, writable by both
        sh(ann, f"echo 'from ann' > /projects/{PROJECT}/notes.txt")
        sh(bob, f"cat /projects/{PROJECT}/notes.txt >/dev/null && "
                f"echo 'and bob' >> /projects/{PROJECT}/notes.txt && "
                f"mkdir /projects/{PROJECT}/runs && touch /projects/{PROJECT}/runs/1")
        assert sh(ann, f"cat /projects/{PROJECT}/notes.txt") == "from ann\nand bob"
        sh(ann, f"touch /projects/{PROJECT}/runs/2")  # his folder is hers to write in too
        # eve, outside the group: no folder, and nothing of it anywhere she can list
        assert not has_project(eve)
        assert sh(eve, "grep -c ' /projects/' /proc/self/mounts || true") == "0"
        # a mount asked for through the REST API is no option of a server
        r = eve.ask_server("forged", {"gpus": 0, "volumes": {VOLUME: f"/projects/{PROJECT}"}})
        assert r.status_code == 400 and "Unknown server option(s): volumes" in r.text, r.text
        assert docker("ps", "-aq", "--filter", f"name=^{eve.container_of('forged')}$") == ""

        # bob leaves the group: his running server keeps the folder until it stops
        r = hub.request("DELETE", f"/groups/{GROUP}/users", json={"users": [bob.name]})
        assert r.status_code == 200, r.text
        assert has_project(bob)
        bob.stop_server()
        bob.start_server({"gpus": 0})
        assert not has_project(bob)
        # and the files outlive every server: ann's next start finds them
        ann.stop_server()
        ann.start_server({"gpus": 0})
        assert sh(ann, f"ls /projects/{PROJECT}/runs") == "1\n2"
    finally:
        stopped(ann, bob, eve)
        hub.request("DELETE", f"/groups/{GROUP}/users", json={"users": [ann.name, bob.name]})
        docker("volume", "rm", "-f", VOLUME, check=False)


def test_a_project_size_this_docker_cannot_apply_fails_the_start_clearly(
        lab_config, lab_user, hub, spawn_settings):
    """spawn.project_size on a Docker whose volumes have no project quotas (this
    machine's ext4): her start is refused with the reason, and nothing is made; without
    the setting she starts. On XFS with pquota, the folder gets the size."""
    project, volume = "sized", "gpulab-project-sized"
    with_project(lab_config, project)
    spawn_settings(project_size="16m")
    member = lab_user("psize")
    r = hub.request("POST", f"/groups/{GROUP}/users", json={"users": [member.name]})
    assert r.status_code == 200, r.text
    docker("volume", "rm", "-f", volume, check=False)
    probe = subprocess.run(["docker", "volume", "create", "--opt", "size=16m",
                            "gpulab-size-probe"], capture_output=True, text=True)
    docker("volume", "rm", "-f", "gpulab-size-probe", check=False)
    try:
        r = member.ask_server("", {"gpus": 0})
        if probe.returncode == 0:  # a Docker whose volumes are on XFS with pquota
            assert r.status_code in (201, 202), r.text
            assert docker("volume", "inspect", "-f", "{{.Options.size}}", volume) == \
                str(16 * 1024**2)
            return
        assert "no quota support" in probe.stderr, probe.stderr
        assert r.status_code == 503, r.text
        message = r.json()["message"]
        assert f"The project folder /projects/{project} cannot be made" in message, message
        assert "the lab limits project folders to 16m (spawn.project_size)" in message
        assert "quota size requested but no quota support" in message, message
        assert hub.server_model(member.name) is None
        assert docker("ps", "-aq", "--filter", f"name=^{member.container}$") == ""
        assert docker("volume", "ls", "-q", "--filter", f"name={volume}") == ""
        spawn_settings()  # the admin removes it: she starts, with her folder
        member.start_server({"gpus": 0})
        assert sh(member, f"test -w /projects/{project} && echo yes") == "yes"
    finally:
        stopped(member)
        hub.request("DELETE", f"/groups/{GROUP}/users", json={"users": [member.name]})
        docker("volume", "rm", "-f", volume, check=False)


def test_a_full_project_folder_is_named_over_ssh_and_when_saving(
        lab_config, lab_user, hub, ssh, tmp_path):  # noqa: F811  (ssh)
    """Her group's folder fills up (an ext4 filesystem of its own, as a folder of
    spawn.project_size is to her): her SSH shell names that folder, not her home, and a
    save into it (through a link in her home, as JupyterLab reaches it) says the same."""
    project, volume = "full", "gpulab-project-full"
    with_project(lab_config, project)
    member = lab_user("pfull")
    r = hub.request("POST", f"/groups/{GROUP}/users", json={"users": [member.name]})
    assert r.status_code == 200, r.text
    docker("volume", "rm", "-f", volume, check=False)
    try:
        with on_a_small_filesystem(volume, tmp_path):
            member.start_server({"gpus": 0})
            # a runaway job of the group's fills it (the dd ends on "No space left")
            sh(member, f"ln -s /projects/{project} ~/{project} && "
                       f"dd if=/dev/zero of=/projects/{project}/filler bs=1M 2>/dev/null; "
                       f"dd if=/dev/zero of=/projects/{project}/filler-small bs=1k "
                       f"2>/dev/null; true")
            with ssh.terminal(member.name, member.token) as master:
                seen = read_until(master, "more room")
                assert f"gpulab: the project folder /projects/{project} is full:" in seen, seen
                assert "your home" not in seen, seen
                os.write(master, b"exit\r")
            r = member.api("PUT", f"/contents/{project}/notes.txt",
                           json={"type": "file", "format": "text", "content": "x" * 65536})
            assert r.status_code == 507, r.text
            said = r.json()["message"]
            assert f"The project folder /projects/{project} is full:" in said, said
            assert f"du -sh /projects/{project}/*" in said, said
            # her home has room: a save there works
            r = member.api("PUT", "/contents/fine.txt",
                           json={"type": "file", "format": "text", "content": "ok"})
            assert r.status_code == 201, r.text
            stopped(member)
    finally:
        stopped(member)
        hub.request("DELETE", f"/groups/{GROUP}/users", json={"users": [member.name]})
