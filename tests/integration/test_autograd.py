"""The whole path, for real: REST API -> spawner -> dockerd -> container -> kernel websocket.

A lab member's server runs the autograd walkthroughs from the project's seed document
(exact expected gradients), on the GPU when the host has one and on the CPU otherwise;
then the server stops, its container is removed, and the home volume keeps their files.
"""

from __future__ import annotations

import json

from .autograd_cell import AUTOGRAD_CELL, check_result
from .stack import docker, host_has_nvidia_gpu


def test_autograd_in_spawned_server_and_home_persists(hub, lab_user):
    user = lab_user()
    gpu = host_has_nvidia_gpu()
    user.start_server({"gpus": 1} if gpu else {})

    # The container is gpulab's: hardened, labelled, with the volumes and shm we asked for.
    info = json.loads(docker("inspect", user.container))[0]
    assert info["Config"]["User"] == "1000:1000"
    assert info["HostConfig"]["CapDrop"] == ["ALL"]
    assert info["HostConfig"]["ShmSize"] == 2 * 1024**3
    assert info["Config"]["Labels"]["org.gpulab.user"] == user.name
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    assert mounts["/home/jovyan"]["Name"] == user.home_volume == f"gpulab-home-{user.name}"
    assert mounts["/datasets"]["RW"] is False

    result = json.loads(user.run_code(AUTOGRAD_CELL).strip().splitlines()[-1])
    print(f"autograd ran on {result['device']} with torch {result['torch']}")
    check_result(result, "cuda" if gpu else "cpu")

    # Write a file in the home directory, stop: the container is removed, the volume stays.
    r = user.api("PUT", "/contents/notes.txt",
                 json={"type": "file", "format": "text", "content": "kept across spawns"})
    assert r.status_code in (200, 201), r.text
    user.stop_server()
    assert docker("ps", "-aq", "--filter", f"name=^/{user.container}$") == ""

    user.start_server({"gpus": 1} if gpu else {})
    r = user.api("GET", "/contents/notes.txt")
    assert r.status_code == 200, r.text
    assert r.json()["content"] == "kept across spawns"
