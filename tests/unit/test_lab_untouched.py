"""What .ci/run's check of a lab in use around `make test` calls a change
(tests/lab_untouched.py): any container restarted or gone, a lease changed, a config
file edited, a firewall rule gone or added, the admin's server not as it was."""

from __future__ import annotations

import copy

from tests.lab_untouched import differences

BEFORE = {
    "containers": {"gpulab-hub": {"id": "a1", "started": "t0", "running": True, "lease": {}},
                   "gpulab-user-admin": {"id": "b2", "started": "t1", "running": True,
                                         "lease": {"org.gpulab.gpus": "GPU-0"}}},
    "config": {"gpulab.yaml": "h1", "gpus.yaml": "h2"},
    "firewall": ["-A DOCKER-USER -i gpulab0 -o gpulab0 -j DROP"],
    "admin_server": {"ready": True, "started": "t1", "user_options": {"gpus": 1}},
}


def changed(**parts):
    after = copy.deepcopy(BEFORE)
    for part, value in parts.items():
        after[part] = value
    return differences(BEFORE, after)


def test_the_same_lab_is_no_change():
    assert differences(BEFORE, copy.deepcopy(BEFORE)) == []


def test_each_kind_of_change_is_named():
    restarted = copy.deepcopy(BEFORE["containers"])
    restarted["gpulab-hub"]["started"] = "t9"
    assert changed(containers=restarted)[0].startswith("containers gpulab-hub: ")
    gone = {"gpulab-hub": BEFORE["containers"]["gpulab-hub"]}
    assert changed(containers=gone) == [
        f"containers gpulab-user-admin: {BEFORE['containers']['gpulab-user-admin']} -> None"]
    assert changed(config={**BEFORE["config"], "gpulab.yaml": "h9"}) == [
        "config gpulab.yaml: h1 -> h9"]
    assert changed(firewall=[]) == [
        "firewall rule gone: -A DOCKER-USER -i gpulab0 -o gpulab0 -j DROP"]
    assert changed(admin_server={**BEFORE["admin_server"], "ready": None}) == [
        "admin_server ready: True -> None"]
