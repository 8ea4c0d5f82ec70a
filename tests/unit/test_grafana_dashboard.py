"""The Grafana dashboard JSON: structure, the datasource variable, and every query uses
only metric names the exporter really produces (Grafana itself cannot run here)."""

import json
import re
from pathlib import Path

import pytest

DASHBOARD = Path(__file__).resolve().parents[2] / "monitoring" / "grafana" / "gpulab-gpus.json"


@pytest.fixture(scope="module")
def dashboard():
    return json.loads(DASHBOARD.read_text())


def all_panels(dash):
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def exprs(dash):
    for p in all_panels(dash):
        for t in p.get("targets", []):
            yield p["title"], t["expr"]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            yield f"${v['name']}", v["definition"]


def test_top_level_structure(dashboard):
    assert dashboard["uid"] == "gpulab-gpus" and dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in all_panels(dashboard):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]


def test_datasource_is_a_variable(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for p in all_panels(dashboard):
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
    assert {"instance", "gpu"} <= set(variables)


def test_panels_cover_the_nvidia_smi_view(dashboard):
    titles = {p["title"] for p in all_panels(dashboard)}
    assert {"Utilization", "Memory used", "Temperature", "Power", "GPUs",
            "Lease holders and their memory"} <= titles
    kinds = {p["type"] for p in all_panels(dashboard)}
    assert {"timeseries", "table", "stat"} <= kinds


def test_every_expr_uses_only_produced_metrics(dashboard, produced):
    for where, expr in exprs(dashboard):
        names = set(re.findall(r"\bgpulab_[a-z_]+\b", expr))
        assert names, f"{where}: {expr!r} queries no gpulab metric"
        unknown = names - produced
        assert not unknown, f"{where}: {expr!r} uses {unknown}, which the exporter never emits"


def test_panel_queries_filter_by_the_variables(dashboard):
    for p in all_panels(dashboard):
        for t in p.get("targets", []):
            assert '$instance' in t["expr"], f"{p['title']}: {t['expr']}"
