"""Monitoring, for real: the exporter sidecar, Prometheus and the operators' dashboard.

Prometheus (Debian's package, in the stack) must report both of its targets up: the
exporter and the hub's /hub/metrics (scraped with a read:metrics-only token). The
dashboard service at /services/gpus/ is open to admins and the `operators` group and
refused to everyone else. On hosts without GPUs `make test` runs the exporter with two
FAKE GPUs (it says so in its data) whose UUIDs match the stand-in inventory, so a lease
taken through the hub must show up as that user's in the exporter and the dashboard.
"""

from __future__ import annotations

import json

import pytest
import requests

from .stack import docker, wait_for
from .standin import GPU0


def prometheus_query(expr: str) -> str:
    return docker("exec", "gpulab-prometheus", "promtool", "query", "instant",
                  "http://127.0.0.1:9090", expr)


def test_prometheus_scrapes_exporter_and_hub(hub):
    def both_up():
        out = prometheus_query("up")
        return ('job="gpulab-exporter"} => 1' in out and 'job="gpulab-hub"} => 1' in out) and out

    out = wait_for(both_up, 60, interval=2, what="Prometheus to report both targets up")
    assert "gpulab-hub:8081" in out
    # The hub's own metrics arrived through the read:metrics token.
    assert "jupyterhub_total_users" in prometheus_query("jupyterhub_total_users")
    rules = docker("exec", "gpulab-prometheus", "promtool", "check", "rules",
                   "/etc/prometheus/alerts.yml")
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


def exporter_snapshot() -> dict:
    """The exporter's /api/gpus, read from inside the hub container (the exporter sits on
    the internal monitoring network, which the host and user containers are not on)."""
    return json.loads(docker(
        "exec", "gpulab-hub", "python3", "-c",
        "import urllib.request; print(urllib.request.urlopen("
        "'http://exporter:9445/api/gpus', timeout=10).read().decode())"))


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
