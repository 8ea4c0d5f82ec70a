"""A group's project folders (gpus.yaml groups: NAME: {projects: [...]}) on the real
stack: its members' servers mount /projects/NAME read-write and see each other's files;
a member outside the group has no such folder, and no server option mounts one; a member
taken out of the group keeps it in her running server and has none from her next start;
the files outlive every server."""

from __future__ import annotations

import pytest
import requests
import yaml

from .stack import container_gone, docker, wait_for

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


def test_a_groups_members_share_a_project_folder_and_nobody_else_sees_it(
        lab_config, lab_user, hub):
    doc = yaml.safe_load(lab_config.original("gpus.yaml")) or {}
    doc["groups"] = {**(doc.get("groups") or {}), GROUP: {"projects": [PROJECT]}}
    lab_config.write("gpus.yaml", yaml.safe_dump(doc))
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
        for member in (ann, bob, eve):  # whatever ran: gone before its volume goes
            requests.delete(member.server_path(), headers=member._headers(), timeout=60)
            wait_for(lambda m=member: container_gone(m.container), 60,
                     what=f"{member.name}'s server to be gone")
        hub.request("DELETE", f"/groups/{GROUP}/users", json={"users": [ann.name, bob.name]})
        docker("volume", "rm", "-f", VOLUME, check=False)
