"""GPU leases against the real dockerd and hub, on a host WITHOUT a GPU.

dockerd here runs with a STAND-IN nvidia-container-runtime-hook on its PATH
(tests/gpu_standin; `.ci/run` starts it so): containers with GPU DeviceRequests start,
and dockerd fills in NVIDIA_VISIBLE_DEVICES, but no device is injected. These tests
prove the plumbing (allocation -> Docker API -> DeviceRequests -> container) and the
lease bookkeeping, not CUDA; test_gpu_host.py checks CUDA where a GPU exists.

The GPU inventory is declared the way an admin does it: by editing the gpus.yaml the
running hub reads (restored afterwards), which the hub picks up at the next spawn.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from .stack import StackError, container_logs, docker, wait_for
from .standin import GPU0, GPU1, STANDIN_GPUS, gpus_of, memory_cap


def spawn_refused(user, options) -> tuple[int, str]:
    import requests

    r = requests.post(f"{user.hub.api}/users/{user.name}/server", json=options,
                      headers={"Authorization": f"token {user.token}"}, timeout=60)
    return r.status_code, r.json().get("message", "")


def server_state(hub, user) -> dict:
    """The spawner's saved state of the user's server, as admins see it in the REST API."""
    return hub.server_model(user.name)["state"]


def no_container(user) -> bool:
    return docker("ps", "-aq", "--filter", f"name=^/{user.container}$") == ""


def test_users_get_distinct_gpus_third_is_refused_and_stop_frees(hub, lab_user, gpus_yaml):
    alice, bob, carol = lab_user("alice"), lab_user("bob"), lab_user("carol")
    alice.start_server({"gpus": 1})
    bob.start_server({"gpus": 1})
    a, b = gpus_of(alice.container), gpus_of(bob.container)
    assert a["device_ids"] == [GPU0] and a["env"] == GPU0 and a["label"] == GPU0
    assert b["device_ids"] == [GPU1] and b["env"] == GPU1 and b["label"] == GPU1

    status, message = spawn_refused(carol, {"gpus": 1})
    assert status == 409
    assert "only 0 of the 2 GPUs available to you are free" in message, message
    assert alice.name not in message  # a plain user is not told who holds them
    assert no_container(carol)

    # Without GPUs, carol starts fine, and sees no GPU even though images may say "all".
    carol.start_server({"gpus": 0})
    assert gpus_of(carol.container) == {"device_ids": [], "env": "void", "label": ""}
    carol.stop_server()

    alice.stop_server()
    assert no_container(alice)
    carol.start_server({"gpus": 1})
    assert gpus_of(carol.container)["device_ids"] == [GPU0]


@pytest.mark.parametrize("options, status", [
    ({"gpus": "all"}, 400), ({"device_ids": [0, 1]}, 400), ({"gpus": -1}, 400),
    ({"gpus": 10**9}, 400), ({"gpus": 1.5}, 400), ({"gpus": [1]}, 400),
    ({"gpus": 1, "image": "evil"}, 400), ({"gpus": 2}, 403),
])
def test_rest_bypass_is_rejected_before_any_container(hub, lab_user, gpus_yaml, options, status):
    user = lab_user("mallory")
    got, message = spawn_refused(user, options)
    assert got == status, message
    assert message
    assert no_container(user)


def test_concurrent_spawns_never_double_book(hub, lab_user, gpus_yaml):
    users = [lab_user("rush") for _ in range(5)]

    def try_spawn(user):
        try:
            user.start_server({"gpus": 1}, timeout=120)
            return user
        except StackError:
            return None

    with ThreadPoolExecutor(len(users)) as pool:
        winners = [u for u in pool.map(try_spawn, users) if u]
    held = [gpus_of(u.container)["device_ids"] for u in winners]
    assert sorted(d for ids in held for d in ids) == [GPU0, GPU1]
    losers = [u for u in users if u not in winners]
    assert len(losers) == 3 and all(no_container(u) for u in losers)


@pytest.mark.disruptive  # restarts the hub: runs alone (scripts/test-integration.sh)
def test_leases_survive_hub_restart_and_a_dead_container_frees_its_gpu(hub, lab_user, gpus_yaml):
    alice, bob, carol = lab_user("alice"), lab_user("bob"), lab_user("carol")
    alice.start_server({"gpus": 1})
    bob.start_server({"gpus": 1})

    assert server_state(hub, alice)["gpu_uuids"] == [GPU0]

    docker("restart", "--time", "10", "gpulab-hub")  # SIGTERM, then start again
    wait_for(hub.is_ready, 90, what="the hub to come back")
    assert spawn_refused(carol, {"gpus": 1})[0] == 409  # nothing double-booked
    assert gpus_of(alice.container)["device_ids"] == [GPU0]
    assert hub.server_model(alice.name)["ready"]
    # The spawner of a server that outlived the restart still knows its GPUs.
    assert server_state(hub, alice)["gpu_uuids"] == [GPU0]

    docker("kill", bob.container)  # died on its own: its GPU is free again
    carol.start_server({"gpus": 1})
    assert gpus_of(carol.container)["device_ids"] == [GPU1]


def test_edits_take_effect_at_next_spawn_and_bad_edits_keep_the_last_good(hub, lab_user, gpus_yaml):
    alice, bob, carol = lab_user("alice"), lab_user("bob"), lab_user("carol")
    gpus_yaml.write_text(STANDIN_GPUS.replace("  - {index: 1", "  # - {index: 1"))
    alice.start_server({"gpus": 1})
    assert spawn_refused(bob, {"gpus": 1})[0] == 409  # only GPU 0 is in the inventory now

    gpus_yaml.write_text(STANDIN_GPUS + "pools:\n  default:\n    mode: shared\n    max_users: 2\n")
    bob.start_server({"gpus": 1})  # GPU 0 is shared by two users now, or GPU 1 is free
    assert gpus_of(bob.container)["device_ids"] in ([GPU0], [GPU1])
    # on a shared GPU each of his PyTorch processes may take half its memory; alice's
    # GPU was her own when she started
    assert memory_cap(bob.container) == "per_process_memory_fraction:0.5"
    assert memory_cap(alice.container) == ""

    gpus_yaml.write_text("defaults:\n  max_gpus: lots\n")  # an admin's typo
    try:
        carol.start_server({"gpus": 1})  # the last good config (shared, 2 GPUs) stays in force
        assert gpus_of(carol.container)["device_ids"] in ([GPU0], [GPU1])
        assert "gpus.yaml:2: defaults.max_gpus: expected a number of GPUs" in container_logs(
            "gpulab-hub", 200)
    finally:
        gpus_yaml.write_text(STANDIN_GPUS)


def test_a_start_without_options_after_her_gpu_access_went_starts_without_gpus(
        hub, lab_user, gpus_yaml, new_page):
    """JupyterHub starts a server with the options of its last start when a request
    gives none (the spawn page when it has no form, a REST start without a body). Seen
    fail before: alice started with 1 GPU; an admin then took GPU access away (the same
    happens when a driver failure empties the inventory), the spawn page had no form,
    and every start of hers was refused "You asked for 1 GPU", with no way to ask for
    none. Now it starts without GPUs and says why."""
    import requests

    from .browser import submit_login

    alice = lab_user("alice")
    alice.start_server({"gpus": 1, "wait": True})
    alice.stop_server()
    gpus_yaml.write_text(STANDIN_GPUS + f"users:\n  {alice.name}: {{no_gpu: true}}\n")
    try:
        r = requests.post(f"{hub.api}/users/{alice.name}/server",
                          headers={"Authorization": f"token {alice.token}"}, timeout=120)
        assert r.status_code in (201, 202), r.text
        wait_for(lambda: (hub.server_model(alice.name) or {}).get("ready"), 120,
                 what="alice's server, started without options")
        assert gpus_of(alice.container)["label"] == ""
        log = container_logs("gpulab-hub", 300)
        assert (f"{alice.name}: Starting with no GPUs: your last start asked for 1, and no "
                "GPU is available to you now.") in log
        alice.stop_server()
        # the spawn page (no form now) does the same in her browser
        page = new_page()
        submit_login(page, alice.name, alice.token, next_url="/hub/spawn")
        wait_for(lambda: (hub.server_model(alice.name) or {}).get("ready"), 120,
                 what="alice's server from the spawn page")
        assert gpus_of(alice.container)["label"] == ""
    finally:
        gpus_yaml.write_text(STANDIN_GPUS)
