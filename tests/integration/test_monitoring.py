"""Monitoring, for real: the exporter sidecar, Prometheus and the operators' dashboard.

Prometheus (Debian's package, in the stack) must report both of its targets up: the
exporter and the hub's /hub/metrics (scraped with a read:metrics-only token). The
dashboard service at /services/gpus/ is open to admins and the `operators` group and
refused to everyone else. On hosts without GPUs `make test` runs the exporter with two
FAKE GPUs (it says so in its data) whose UUIDs match the stand-in inventory, so a lease
taken through the hub must show up as that user's in the exporter and the dashboard.

Those fake GPUs are steered through the exporter's fake-NVML control file
(``--fake-control``, by default /dev/shm/gpulab-fake-nvml.json inside the exporter's
container): a test puts a REAL process of a user's container (its host PID) on fake
GPU 0, which the exporter attributes through the host's /proc/<pid>/cgroup and the
container's labels, and marks fake GPU 1 lost.
"""

from __future__ import annotations

import pytest
import requests

from .browser import screenshot, submit_login
from .fake_gpus import exporter_snapshot
from .stack import HUB_URL, docker, prometheus_query, wait_for
from .standin import GPU0, GPU1, MIG10, MIG11, STANDIN_GPUS, gpus_of

GiB = 1 << 30


def test_prometheus_scrapes_exporter_and_hub(hub):
    def both_up():
        out = prometheus_query("up")
        return ('job="gpulab-exporter"} => 1' in out and 'job="gpulab-hub"} => 1' in out) and out

    out = wait_for(both_up, 60, interval=2, what="Prometheus to report both targets up")
    assert "gpulab-hub:8081" in out
    # The hub's own metrics arrived through the read:metrics token.
    assert "jupyterhub_total_users" in prometheus_query("jupyterhub_total_users")
    rules = docker("exec", "gpulab-prometheus", "promtool", "check", "rules",
                   "/etc/prometheus/gpulab/alerts.yml")
    assert "SUCCESS" in rules


def dashboard_json(user) -> requests.Response:
    return requests.get(f"{user.hub.url}/services/gpus/api/gpus",
                        headers={"Authorization": f"token {user.token}"}, timeout=30)


def test_dashboard_is_for_operators_only(hub, lab_user):
    operator, member = lab_user("oper"), lab_user("member")
    r = hub.request("POST", "/groups/operators/users", json={"users": [operator.name]})
    assert r.status_code == 200, r.text
    try:
        refused = dashboard_json(member)
        assert refused.status_code == 403
        assert "may not see the GPU dashboard" in refused.json()["error"]

        r = dashboard_json(operator)
        assert r.status_code == 200, r.text
        body = r.json()
        assert {"gpus", "summary", "snapshot"} <= set(body), sorted(body)
        assert len(body["gpus"]) == len(exporter_snapshot()["gpus"])
    finally:
        hub.request("DELETE", "/groups/operators/users", json={"users": [operator.name]})


def test_lease_is_attributed_to_its_user(hub, lab_user, gpus_yaml):
    snapshot = exporter_snapshot()
    if not snapshot["fake"] or not snapshot["gpus"]:
        pytest.skip("the exporter runs without fake GPUs (start the stack with `make test`)")
    user = lab_user("trainer")
    user.start_server({"gpus": 1})

    def holder_seen():
        gpu = next(g for g in exporter_snapshot()["gpus"] if g["uuid"] == GPU0)
        return gpu if user.name in [le["user"] for le in gpu["leases"]] else None

    wait_for(holder_seen, 40, interval=1, what="the exporter to attribute GPU 0")

    def prometheus_has_lease():
        out = prometheus_query(f'gpulab_gpu_lease_info{{uuid="{GPU0}"}}')
        return f'user="{user.name}"' in out

    wait_for(prometheus_has_lease, 60, interval=3, what="Prometheus to scrape the lease")
    r = dashboard_json(user)  # a plain user: refused, even for the GPU they hold
    assert r.status_code == 403


def test_users_gpu_memory_and_a_lost_gpu_reach_the_dashboard(hub, lab_user, gpus_yaml,
                                                             fake_control, new_page):
    operator, trainer = lab_user("oper"), lab_user("trainer")
    r = hub.request("POST", "/groups/operators/users", json={"users": [operator.name]})
    assert r.status_code == 200, r.text
    try:
        trainer.start_server({"gpus": 1})
        # a real process of trainer's container: its init, by host PID
        pid = int(docker("inspect", "-f", "{{.State.Pid}}", trainer.container))
        fake_control({"processes": {"0": [[pid, 3 * GiB]]}, "lost": [1]})

        def exporter_sees_both():
            gpus = {g["uuid"]: g for g in exporter_snapshot()["gpus"]}
            procs = gpus[GPU0]["processes"] or []
            return (not gpus[GPU1]["up"] and [(p["pid"], p["user"]) for p in procs]
                    == [(pid, trainer.name)]) and gpus
        # the exporter lists processes and containers every 15 s
        gpus = wait_for(exporter_sees_both, 45, interval=1,
                        what="the exporter to attribute the process and lose fake GPU 1")
        assert gpus[GPU0]["user_memory_bytes"] == {trainer.name: 3 * GiB}
        assert gpus[GPU1]["error"].startswith("NVMLError_GpuIsLost")

        # the dashboard's JSON, through the published port, as the operator
        r = dashboard_json(operator)
        assert r.status_code == 200, r.text
        view = {g["uuid"]: g for g in r.json()["gpus"]}
        ok, lost = view[GPU0], view[GPU1]
        assert (ok["state"], lost["state"]) == ("ok", "lost")
        assert [(h["user"], h["memory_text"]) for h in ok["holders"]] == [(trainer.name,
                                                                          "3.0 GiB")]
        assert [(p["pid"], p["user"], p["memory_text"]) for p in ok["processes"]] == [
            (pid, trainer.name, "3.0 GiB")]
        assert ok["memory_text"] == "3.0 GiB / 141.0 GiB"
        assert ok["temperature_text"] != "N/A"  # the other GPU keeps reporting
        assert lost["temperature_text"] == "N/A" and "GpuIsLost" in lost["error"]
        assert r.json()["summary"]["lost"] == 1

        # and the page, in Chromium, as the operator reads it
        page = new_page()
        submit_login(page, operator.name, operator.token, next_url="/hub/home")
        page.goto(f"{HUB_URL}/services/gpus/")
        rows = page.locator("#gpu-rows tr.gpu")
        details = page.locator("#gpu-rows tr.detail")
        assert rows.count() == 2
        assert rows.nth(0).locator("td").last.inner_text().startswith("OK")
        assert rows.nth(1).locator("td").last.inner_text() == "LOST"
        assert page.locator("#gpu-rows tr.gpu.lost").count() == 1
        held = details.nth(0).inner_text()
        assert f"Held by: {trainer.name} (3.0 GiB)" in held, held
        assert f"Processes: {pid} {trainer.name} 3.0 GiB" in held, held
        assert "GpuIsLost" in details.nth(1).inner_text()
        assert page.locator("#summary").inner_text().endswith(", 1 lost")
        screenshot(page, "dashboard-user-memory-and-lost-gpu.png")
    finally:
        hub.request("DELETE", "/groups/operators/users", json={"users": [operator.name]})


MIG_GPUS = f"""
inventory:  # fake GPU 1 in MIG mode: its two MIG devices, under its index
  - {{index: 1, uuid: {MIG10}, model: stand-in MIG}}
  - {{index: 1, uuid: {MIG11}, model: stand-in MIG}}
defaults:
  gpus: 0
  max_gpus: 1
"""


def test_mig_devices_are_leased_one_member_each_and_shown_per_device(
        hub, lab_user, lab_config, gpus_yaml, fake_control, new_page):
    """MIG devices, the whole path on the fake NVML: fake GPU 1 in MIG mode with two MIG
    devices, the lab's inventory listing them. Two members each get one: its MIG UUID in
    their container's GPU request. The exporter and Prometheus attribute each device to
    its holder with the GPU it is part of, and the operators' dashboard shows rows 1:0
    and 1:1 under GPU 1, in Chromium."""
    fake_control({"mig": {"1": 2}})
    lab_config.write("gpus.yaml", MIG_GPUS)
    operator, ann, bob = lab_user("oper"), lab_user("mig"), lab_user("mig")
    r = hub.request("POST", "/groups/operators/users", json={"users": [operator.name]})
    assert r.status_code == 200, r.text
    try:
        for member in (ann, bob):
            member.start_server({"gpus": 1})
        held = {m.name: gpus_of(m.container) for m in (ann, bob)}
        assert sorted(h["device_ids"][0] for h in held.values()) == [MIG10, MIG11], held
        assert all(h["device_ids"] == [h["env"]] == [h["label"]] for h in held.values()), held
        holder = {h["device_ids"][0]: name for name, h in held.items()}

        def exporter_attributes_both():
            gpus = {g["uuid"]: g for g in exporter_snapshot()["gpus"]}
            return all([le["user"] for le in gpus.get(uuid, {}).get("leases", [])] == [name]
                       for uuid, name in holder.items()) and gpus
        gpus = wait_for(exporter_attributes_both, 45, interval=1,
                        what="the exporter to attribute each MIG device to its holder")
        assert [(gpus[u]["index"], gpus[u]["mig_device"], gpus[u]["parent_uuid"])
                for u in (MIG10, MIG11)] == [(1, 0, GPU1), (1, 1, GPU1)]
        assert gpus[MIG10]["processes_unavailable"] == "mig"
        assert gpus[GPU1]["leases"] == []  # the GPU itself is not leased whole

        def prometheus_has_both():
            out = prometheus_query(f'gpulab_gpu_lease_info * on(uuid) group_left(parent_uuid) '
                                   f'gpulab_gpu_mig_device_info{{parent_uuid="{GPU1}"}}')
            return all(f'user="{name}"' in out for name in holder.values())
        wait_for(prometheus_has_both, 60, interval=3,
                 what="Prometheus to scrape the MIG devices' leases with their GPU")

        r = dashboard_json(operator)
        assert r.status_code == 200, r.text
        rows = {g["uuid"]: g for g in r.json()["gpus"]}
        assert [(rows[u]["label"], [h["user"] for h in rows[u]["holders"]])
                for u in (MIG10, MIG11)] == [("1:0", [holder[MIG10]]), ("1:1", [holder[MIG11]])]
        assert r.json()["summary"]["text"].startswith("2 GPUs (2 MIG devices), 2 allocated")

        page = new_page()
        submit_login(page, operator.name, operator.token, next_url="/hub/home")
        page.goto(f"{HUB_URL}/services/gpus/")
        labels = page.locator("#gpu-rows tr.gpu td.num").first
        labels.wait_for()
        cells = [page.locator("#gpu-rows tr.gpu").nth(i).locator("td").first.inner_text()
                 for i in range(page.locator("#gpu-rows tr.gpu").count())]
        assert cells == ["0", "1", "1:0", "1:1"], cells
        detail = page.locator("#gpu-rows tr.detail").nth(2).inner_text()
        assert f"Held by: {holder[MIG10]}" in detail, detail
        assert "MIG device of GPU 1" in page.locator("#gpu-rows tr.gpu").nth(2).inner_text()
        screenshot(page, "dashboard-mig-devices.png")
    finally:
        hub.request("DELETE", "/groups/operators/users", json={"users": [operator.name]})
        for member in (ann, bob):  # off the MIG devices before the inventory drops them
            hub.request("DELETE", f"/users/{member.name}/server")
        for member in (ann, bob):
            wait_for(lambda m=member: hub.server_model(m.name) is None, 60,
                     what=f"{member.name}'s server to stop")
        lab_config.write("gpus.yaml", STANDIN_GPUS)
