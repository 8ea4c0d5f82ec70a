"""The whole path, for real: REST API -> spawner -> dockerd -> container -> kernel websocket.

A lab member's server runs the autograd walkthroughs from the project's seed document
(exact expected gradients), on the GPU when the host has one and on the CPU otherwise;
then the server stops, its container is removed, and the home volume keeps their files.
"""

from __future__ import annotations

import json

from .autograd_cell import AUTOGRAD_CELL, chain_grads, close
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
    assert result["device"] == ("cuda" if gpu else "cpu")
    assert result["linear"]["grad_device"].startswith(result["device"])
    assert result["linear"]["loss"] == 4.0
    assert (result["linear"]["w"], result["linear"]["x"], result["linear"]["b"]) == (12.0, 8.0, 4.0)
    assert result["minimum"] == 0.0
    assert result["cubic"] == {"first": [12.0, 3.0], "second": [12.0, -6.0]}
    chain = result["chain"]
    assert [chain[n]["shape"] for n in ("X", "W", "B")] == [[4, 3], [3, 2], [2]]
    dX, dW, dB = chain_grads(chain["X"]["value"], chain["W"]["value"], chain["B"]["value"])
    assert close(chain["X"]["grad"], dX)
    assert close(chain["W"]["grad"], dW)
    assert close(chain["B"]["grad"], dB)

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
