"""Monitoring across several GPU machines (a Swarm), with real parts and no stack: two
real gpulab-exporter processes, each with two FAKE GPUs of its own (--fake-uuids), stand
for two GPU nodes; a real Prometheus (Debian's 2.42, the package the gpulab/prometheus
image ships) scrapes them every second.

* With a static config giving each target its `node` label, every gpulab_* series
  carries its node, and the real dashboard app, reading that Prometheus, lists the four
  GPUs with a Node column and per-node totals (GPUs, memory, mean utilization, held,
  lost), in its JSON, its HTML and in Chromium after the page's own refresh. A fake GPU
  lost on one node shows on that node's rows; a lease (a hub container's label, from
  the stand-in Docker API) counts as held on its node only. Read straight from one
  exporter (no node label), the page has no Node column, as on one machine today.
* With monitoring/prometheus/prometheus.swarm.yml itself (only its Docker host, its
  intervals and the parts no test runs here changed), Prometheus finds the exporters
  through a stand-in for the Swarm manager's Docker API listing five nodes: it scrapes
  the two ready, active ones at <address>:9445 and names their series after the
  hostnames; the manager (gpulab.exporter=false), a drained and a down node are left out.

The exporters listen on 127.0.0.2:9445 and 127.0.0.3:9445 (the swarm config's fixed
port, on two loopback addresses). About 30 seconds.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import yaml

from gpulab.dashboard.sources import ExporterSource, PrometheusSource
from gpulab.dashboard.view import build_view
from tests.unit.test_dashboard_app import PREFIX, token

from .browser import screenshot
from .local_monitoring import (
    PROM_CONFIG,
    Dashboard,
    DockerApi,
    exporter,
    prometheus,
    query,
    swarm_node,
    targets,
    wait_for_series,
)
from .stack import wait_for

pytestmark = pytest.mark.integration

GiB = 1 << 30
UUIDS = {"gpu-a": [f"GPU-fa4e0a00-0000-4000-8000-00000000000{i}" for i in range(2)],
         "gpu-b": [f"GPU-fa4e0b00-0000-4000-8000-00000000000{i}" for i in range(2)]}
ADDRESS = {"gpu-a": "127.0.0.2", "gpu-b": "127.0.0.3"}
# The GPU servers' exporters answer only the manager's token (docker-compose.node.yml).
EXPORTER_TOKEN = Path(tempfile.gettempdir()) / f"gpulab-test-exporter-token-{os.getpid()}"
ANN = "a" * 64  # a hub container holding gpu-a's GPU 0
CONTAINERS = [{"Id": ANN, "Names": ["/gpulab-ann"], "State": "running",
               "Labels": {"org.gpulab.managed": "true", "org.gpulab.user": "ann",
                          "org.gpulab.server": "", "org.gpulab.gpus": UUIDS["gpu-a"][0]}}]
NODES = [
    swarm_node("gpu-a", ADDRESS["gpu-a"], gpus=UUIDS["gpu-a"]),
    swarm_node("gpu-b", ADDRESS["gpu-b"], gpus=UUIDS["gpu-b"]),
    swarm_node("manager", "127.0.0.4", role="manager", labels={"gpulab.exporter": "false"}),
    swarm_node("gpu-drained", "127.0.0.5", availability="drain", gpus=["GPU-fa4e0c00-x"]),
    swarm_node("gpu-gone", "127.0.0.6", state="down", gpus=["GPU-fa4e0d00-x"]),
]
FAST = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}


@pytest.fixture(scope="module")
def docker_api():
    api = DockerApi(NODES, CONTAINERS)
    yield api
    api.close()


@pytest.fixture(scope="module")
def exporters(tmp_path_factory, docker_api):
    """{node: (exporter URL, its fake-control file)} for gpu-a and gpu-b."""
    d = tmp_path_factory.mktemp("exporters")
    EXPORTER_TOKEN.write_text("e" * 64 + "\n")  # as make swarm-node's, from the manager
    with exporter(f"{ADDRESS['gpu-a']}:9445", UUIDS["gpu-a"], d / "a.json",
                  docker_api.url, EXPORTER_TOKEN) as a, \
         exporter(f"{ADDRESS['gpu-b']}:9445", UUIDS["gpu-b"], d / "b.json",
                  docker_api.url, EXPORTER_TOKEN) as b:
        yield {"gpu-a": (a, d / "a.json"), "gpu-b": (b, d / "b.json")}


def nodes_and_uuids(result):
    return sorted((s["metric"].get("node"), s["metric"]["uuid"]) for s in result)


def test_dashboard_shows_both_nodes_from_a_real_prometheus(exporters, tmp_path, new_page):
    config = {"global": FAST, "scrape_configs": [{
        "job_name": "gpulab-exporter",
        "authorization": {"type": "Bearer", "credentials_file": str(EXPORTER_TOKEN)},
        "static_configs": [{"targets": [f"{ADDRESS[n]}:9445"], "labels": {"node": n}}
                           for n in ("gpu-a", "gpu-b")]}]}
    control_b = exporters["gpu-b"][1]
    control_b.write_text('{"lost": [1]}')  # gpu-b's GPU 1 falls off the bus
    try:
        with prometheus(config, tmp_path) as prom:
            # every series carries its node
            up = wait_for_series(prom, "gpulab_gpu_up", 4)
            assert nodes_and_uuids(up) == sorted((n, u) for n, us in UUIDS.items() for u in us)
            assert query(prom, '{__name__=~"gpulab_.+", node=""}') == []
            wait_for_series(prom, f'gpulab_gpu_up{{node="gpu-b", uuid="{UUIDS["gpu-b"][1]}"}}'
                                  " == 0", 1)
            lease = wait_for_series(prom, 'gpulab_gpu_lease_info{user="ann"}', 1)
            assert nodes_and_uuids(lease) == [("gpu-a", UUIDS["gpu-a"][0])]

            dashboard = Dashboard([PrometheusSource(prom)])
            try:
                check_dashboard(dashboard.url, new_page, control_b)
            finally:
                dashboard.close()
    finally:
        control_b.unlink(missing_ok=True)


def check_dashboard(url, new_page, control_b):
    r = requests.get(url + PREFIX + "api/gpus", headers=token("operator-token"), timeout=10)
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["source"]["name"] == "prometheus" and view["message"] is None
    assert [(g["node"], g["index"], g["uuid"], g["state"]) for g in view["gpus"]] == [
        ("gpu-a", 0, UUIDS["gpu-a"][0], "ok"), ("gpu-a", 1, UUIDS["gpu-a"][1], "ok"),
        ("gpu-b", 0, UUIDS["gpu-b"][0], "ok"), ("gpu-b", 1, UUIDS["gpu-b"][1], "lost")]
    assert [h["user"] for h in view["gpus"][0]["holders"]] == ["ann"]
    totals = {n["node"]: n for n in view["nodes"]}
    assert [(n, t["gpus"], t["held"], t["lost"], t["exporter_up"]) for n, t in totals.items()] \
        == [("gpu-a", 2, 1, 0, True), ("gpu-b", 2, 0, 1, True)]
    assert totals["gpu-a"]["memory_text"].endswith(" / 282.0 GiB")  # two fake H200s
    assert totals["gpu-b"]["memory_text"].endswith(" / 141.0 GiB")  # the lost one unknown
    rows_a = [g for g in view["gpus"] if g["node"] == "gpu-a"]
    assert totals["gpu-a"]["utilization_percent"] == round(
        sum(g["utilization_percent"] for g in rows_a) / 2)
    assert (view["summary"]["gpus"], view["summary"]["allocated"], view["summary"]["lost"]) \
        == (4, 1, 1)

    html = requests.get(url + PREFIX, headers=token("operator-token"), timeout=10).text
    assert '<table id="nodes">' in html and '<th class="node">Node</th>' in html
    assert html.count('<td class="node">gpu-a</td>') == 3  # two GPU rows and its totals
    assert html.count('<td class="node">gpu-b</td>') == 3

    # Chromium: the page as served, then as its own script re-renders it every 3 s,
    # once gpu-b's GPU 1 is back
    page = new_page()
    page.set_extra_http_headers(token("operator-token"))
    assert page.goto(url + PREFIX).status == 200
    cells = page.locator("#gpu-rows tr.gpu td.node")
    assert cells.all_inner_texts() == ["gpu-a", "gpu-a", "gpu-b", "gpu-b"]
    assert page.locator("#gpu-rows tr.gpu.lost td.node").inner_text() == "gpu-b"
    control_b.unlink()
    page.locator("#gpu-rows tr.gpu.lost").wait_for(state="detached", timeout=20_000)
    assert page.locator("#gpu-head th").first.inner_text() == "Node"
    assert page.locator("#gpu-head th.node").count() == 1
    assert cells.all_inner_texts() == ["gpu-a", "gpu-a", "gpu-b", "gpu-b"]
    assert page.locator("#nodes").is_visible()
    node_rows = page.locator("#node-rows tr.node")
    assert [node_rows.nth(i).locator("td").nth(0).inner_text() for i in range(2)] == [
        "gpu-a", "gpu-b"]
    assert [node_rows.nth(i).locator("td").nth(5).inner_text() for i in range(2)] == ["0", "0"]
    assert [node_rows.nth(i).locator("td").nth(4).inner_text() for i in range(2)] == ["1", "0"]
    assert [node_rows.nth(i).locator("td").nth(2).inner_text().split(" / ")[1]
            for i in range(2)] == ["282.0 GiB", "282.0 GiB"]  # gpu-b's GPU 1 is back
    screenshot(page, "dashboard-nodes.png")


def test_one_machine_has_no_node_column(tmp_path):
    """Straight from one exporter (no node label, no token: on one host it is reached on
    the stack's internal network only): the page it always was."""
    with exporter("127.0.0.4:9445", UUIDS["gpu-a"], tmp_path / "c.json") as url:
        dashboard = Dashboard([ExporterSource(url)])
        try:
            r = requests.get(dashboard.url + PREFIX + "api/gpus",
                             headers=token("operator-token"), timeout=10)
            assert r.status_code == 200 and r.json()["nodes"] is None
            assert [g["node"] for g in r.json()["gpus"]] == [None, None]
            html = requests.get(dashboard.url + PREFIX, headers=token("operator-token"),
                                timeout=10).text
            assert '<table id="nodes" hidden>' in html and 'class="node"' not in html
        finally:
            dashboard.close()


def fetch(source) -> dict:
    """*source*'s snapshot, read on a loop of its own (Playwright's sync API holds this
    thread's)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, source.fetch()).result(timeout=30)


def swarm_config(docker_url: str) -> dict:
    """prometheus.swarm.yml, pointed at *docker_url*, fast, without Alertmanager and the
    hub's scrape (neither runs here)."""
    config = yaml.safe_load((PROM_CONFIG / "prometheus.swarm.yml").read_text())
    config["global"].update(FAST)
    config.pop("alerting")
    config["scrape_configs"] = [j for j in config["scrape_configs"]
                                if j["job_name"] == "gpulab-exporter"]
    [sd] = config["scrape_configs"][0]["dockerswarm_sd_configs"]
    assert sd["host"] == "tcp://docker-proxy-ro:2375"
    sd.update(host=docker_url, refresh_interval="1s")
    auth = config["scrape_configs"][0]["authorization"]
    assert auth["credentials_file"] == "/etc/prometheus/secrets/exporter-token"
    auth["credentials_file"] = str(EXPORTER_TOKEN)  # the same token the exporters hold
    return config


def test_swarm_config_discovers_the_ready_gpu_nodes(exporters, docker_api, tmp_path):
    with prometheus(swarm_config(docker_api.url), tmp_path,
                    rule_files=("alerts.yml", "usage.yml")) as prom:
        def both_up():
            found = sorted((t["labels"].get("node"), t["labels"]["instance"], t["health"])
                           for t in targets(prom))
            return found if all(h == "up" for *_, h in found) and len(found) == 2 else None
        # (90 s: a host busy with make test's other lanes scrapes late)
        found = wait_for(both_up, 90, interval=0.5, what="two exporter targets up")
        assert found == [("gpu-a", "127.0.0.2:9445", "up"), ("gpu-b", "127.0.0.3:9445", "up")]
        dropped = requests.get(f"{prom}/api/v1/targets", timeout=10).json()["data"][
            "droppedTargets"]
        assert sorted(t["discoveredLabels"]["__meta_dockerswarm_node_hostname"]
                      for t in dropped) == ["gpu-drained", "gpu-gone", "manager"]
        assert any(p.split("?")[0].endswith("/nodes") for p in docker_api.requests)

        up = wait_for_series(prom, "gpulab_gpu_up", 4)
        assert nodes_and_uuids(up) == sorted((n, u) for n, us in UUIDS.items() for u in us)
        assert query(prom, '{__name__=~"gpulab_.+", node=""}') == []
        # the dashboard's own reading of it
        view = build_view({**fetch(PrometheusSource(prom)),
                           "source": {"name": "prometheus", "url": prom}, "unreachable": []})
        assert [(n["node"], n["gpus"]) for n in view["nodes"]] == [("gpu-a", 2), ("gpu-b", 2)]
        # the rules load with this config
        rules = requests.get(f"{prom}/api/v1/rules", timeout=10).json()["data"]["groups"]
        assert {g["name"] for g in rules} == {"gpulab-gpus", "gpulab-line", "gpulab-exporter",
                                             "gpulab-usage", "gpulab-backup"}
