"""The dashboard on several GPU machines (a Swarm): the node label flows from Prometheus'
series into the snapshot, the view and the page. With more than one node the table gets
a Node column and per-node totals; with one node, or no node label, it is the page it
always was. Table tests of the pure parts, and the page rendered by the real template."""

import re

import pytest

from gpulab.dashboard.__main__ import main
from gpulab.dashboard.app import make_templates, render_page
from gpulab.dashboard.sources import snapshot_from_prometheus
from gpulab.dashboard.view import NA, build_view, gpu_row, node_totals, show_nodes

GiB = 1 << 30
SOURCE = {"source": {"name": "prometheus", "url": "http://prometheus:9090"}, "unreachable": []}


def row(node=None, up=True, util=None, used=None, total=None, held=False, index=0):
    gpu = {"index": index, "uuid": f"GPU-{node}-{index}", "up": up, "utilization_ratio": util,
           "memory_used_bytes": used, "memory_total_bytes": total,
           "leases": [{"user": "ann", "server": ""}] if held else []}
    if node is not None:
        gpu["node"] = node
    return gpu_row(gpu)


# -- when the Node column shows ------------------------------------------------------
@pytest.mark.parametrize("nodes,down,shown", [
    ([], [], False),                          # no GPUs at all
    ([None, None], [], False),                # single host through the exporter: no label
    (["local", "local"], [], False),          # single host through Prometheus: one node
    (["gpu1", "gpu2"], [], True),
    (["gpu1", "gpu1", "gpu2"], [], True),
    (["gpu1"], ["gpu2"], True),               # gpu2's exporter is down: still two nodes
    (["gpu1"], ["gpu1"], False),
    (["gpu1", None], [], True),               # a GPU without a node beside named ones
    (["", "gpu1"], [], True),
])
def test_show_nodes(nodes, down, shown):
    rows = [row(node=n, index=i) for i, n in enumerate(nodes)]
    assert show_nodes(rows, [{"node": d, "instance": ""} for d in down]) is shown


# -- per-node totals -----------------------------------------------------------------
A = [row("gpu1", util=0.5, used=10 * GiB, total=80 * GiB, held=True, index=0),
     row("gpu1", util=0.0, used=0, total=80 * GiB, index=1),
     row("gpu1", up=False, util=0.9, used=70 * GiB, total=80 * GiB, held=True, index=2)]
B = [row("gpu2", util=0.25, used=40 * GiB, total=141 * GiB, index=0)]


@pytest.mark.parametrize("rows,down,expected", [
    # memory and utilization over the GPUs that report them: the lost GPU 2 adds neither,
    # but counts as a GPU, as held and as lost
    (A + B, [], [
        ("gpu1", True, 3, 2, 1, "10.0 GiB / 160.0 GiB", 6, 25, "25%", "3 GPUs, 2 held, 1 lost"),
        ("gpu2", True, 1, 0, 0, "40.0 GiB / 141.0 GiB", 28, 25, "25%", "1 GPU, 0 held, 0 lost"),
    ]),
    # a node whose only GPU is lost: nothing known, N/A, never 0
    ([row("gpu3", up=False, index=0)] + B, [], [
        ("gpu2", True, 1, 0, 0, "40.0 GiB / 141.0 GiB", 28, 25, "25%", "1 GPU, 0 held, 0 lost"),
        ("gpu3", True, 1, 0, 1, NA, 0, None, NA, "1 GPU, 0 held, 1 lost"),
    ]),
    # an exporter Prometheus does not reach: the node, with no GPUs
    (B, [{"node": "gpu9", "instance": "10.0.0.9:9445"}], [
        ("gpu2", True, 1, 0, 0, "40.0 GiB / 141.0 GiB", 28, 25, "25%", "1 GPU, 0 held, 0 lost"),
        ("gpu9", False, 0, 0, 0, NA, 0, None, NA, "0 GPUs, 0 held, 0 lost"),
    ]),
    # mean of 33 % and 67 % (the rows' rounded percentages)
    ([row("n", util=1 / 3, index=0), row("n", util=2 / 3, index=1)], [], [
        ("n", True, 2, 0, 0, NA, 0, 50, "50%", "2 GPUs, 0 held, 0 lost"),
    ]),
])
def test_node_totals(rows, down, expected):
    got = [(n["node"], n["exporter_up"], n["gpus"], n["held"], n["lost"], n["memory_text"],
            n["memory_bar"], n["utilization_percent"], n["utilization_text"], n["text"])
           for n in node_totals(rows, down)]
    assert got == expected


def test_node_totals_name_a_missing_node():
    [unnamed, named] = node_totals([row(None), row("gpu1")])
    assert (unnamed["node"], unnamed["node_text"]) == (None, "?")
    assert (named["node"], named["node_text"], named["state_text"]) == ("gpu1", "gpu1", "OK")


# -- Prometheus series -> snapshot ---------------------------------------------------
def series(name, value, **labels):
    return {"metric": {"__name__": name, **labels}, "value": [0, str(value)]}


def node_series(node, uuid, *, nvml=1, gpu_up=1, used=GiB, driver="550.54.15"):
    g = {"node": node, "gpu": "0", "uuid": uuid, "instance": f"{node}:9445"}
    target = {"node": node, "instance": f"{node}:9445"}
    return [
        series("up", 1, job="gpulab-exporter", **target),
        series("gpulab_exporter_nvml_up", nvml, **target),
        series("gpulab_exporter_docker_up", 1, **target),
        series("gpulab_exporter_info", 1, driver=driver, backend="nvml", **target),
        series("gpulab_gpu_up", gpu_up, **g),
        series("gpulab_gpu_info", 1, model="H100", **g),
        series("gpulab_gpu_memory_used_bytes", used, **g),
        series("gpulab_gpu_memory_total_bytes", 80 * GiB, **g),
        series("gpulab_gpu_utilization_ratio", 0.5, **g),
        series("gpulab_gpu_lease_info", 1, user=f"{node}-user", server="", **g),
    ]


def test_every_machines_gpu_0_is_a_gpu_of_its_own():
    # the same index, and (as with today's fakes) even the same UUID, on two machines
    snap = snapshot_from_prometheus(node_series("gpu2", "GPU-x", used=2 * GiB)
                                    + node_series("gpu1", "GPU-x"), timestamp=1.0)
    assert [(g["node"], g["index"], g["memory_used_bytes"], g["leases"][0]["user"])
            for g in snap["gpus"]] == [("gpu1", 0, GiB, "gpu1-user"),
                                       ("gpu2", 0, 2 * GiB, "gpu2-user")]
    assert (snap["nvml_up"], snap["nvml_error"], snap["docker_up"]) == (True, None, True)
    assert snap["driver_version"] == "550.54.15" and "nodes_down" not in snap


def test_nvml_down_on_one_node_and_a_lost_gpu_on_another():
    snap = snapshot_from_prometheus(node_series("gpu1", "GPU-a", nvml=0)
                                    + node_series("gpu2", "GPU-b", gpu_up=0, driver="535.1"))
    assert snap["nvml_up"] is False
    assert snap["nvml_error"] == "gpulab_exporter_nvml_up is 0 on gpu1 (see the exporter's log)"
    assert snap["driver_version"] == "535.1, 550.54.15"
    view = build_view({**snap, **SOURCE})
    lost = [(r["node"], r["index"], r["state"]) for r in view["gpus"] if r["state"] == "lost"]
    assert lost == [("gpu2", 0, "lost")]  # on its own node's rows, as on one machine
    assert [n["lost"] for n in view["nodes"]] == [0, 1]


def test_an_exporter_prometheus_does_not_reach():
    down = series("up", 0, job="gpulab-exporter", node="gpu3", instance="10.0.0.3:9445")
    snap = snapshot_from_prometheus(node_series("gpu1", "GPU-a") + [down])
    assert snap["nodes_down"] == [{"node": "gpu3", "instance": "10.0.0.3:9445"}]
    view = build_view({**snap, **SOURCE})
    assert [(n["node"], n["exporter_up"], n["gpus"]) for n in view["nodes"]] == [
        ("gpu1", True, 1), ("gpu3", False, 0)]
    assert ("The exporter on node gpu3 (10.0.0.3:9445) is not answering Prometheus: that "
            "node's GPUs are missing from the table.") in view["banners"]


def test_single_host_series_stay_as_they_were():
    """No node label (or one node): no node key on the GPUs, no totals, same order."""
    plain = [series("gpulab_exporter_nvml_up", 1),
             series("gpulab_gpu_up", 1, gpu="1", uuid="GPU-b"),
             series("gpulab_gpu_up", 1, gpu="0", uuid="GPU-a")]
    snap = snapshot_from_prometheus(plain)
    assert [sorted(g) for g in snap["gpus"]] == [sorted(g) for g in snap["gpus"]
                                                 if "node" not in g]
    assert [g["index"] for g in snap["gpus"]] == [0, 1]
    local = snapshot_from_prometheus([{**s, "metric": {**s["metric"], "node": "local"}}
                                      for s in plain])
    for snapshot in (snap, local):
        view = build_view({**snapshot, **SOURCE})
        assert view["nodes"] is None and [r["index"] for r in view["gpus"]] == [0, 1]


# -- the page ------------------------------------------------------------------------
def page(view):
    return render_page(make_templates(), view, api_url="/api/gpus", refresh_seconds=5,
                       xsrf_token="x", user="olga")


def test_one_node_page_has_no_node_column():
    snap = snapshot_from_prometheus(node_series("gpu1", "GPU-a"))
    html = page(build_view({**snap, **SOURCE}))
    assert '<th class="node">' not in html and '<td class="node">' not in html
    assert '<table id="nodes" hidden>' in html
    assert '<tr class="detail ok"><td></td><td colspan="8">' in html


def test_two_node_page_has_the_column_and_the_totals():
    snap = snapshot_from_prometheus(node_series("gpu1", "GPU-a")
                                    + node_series("gpu2", "GPU-b", gpu_up=0))
    html = page(build_view({**snap, **SOURCE}))
    assert '<table id="nodes">' in html and '<th class="node">Node</th>' in html
    assert re.findall(r'<tr class="gpu (\w+)">\s*<td class="node">(\w+)</td>', html) == [
        ("ok", "gpu1"), ("lost", "gpu2")]
    totals = re.findall(r'<tr class="node">\s*<td class="node">(\w+)</td>\s*'
                        r'<td class="num">(\d+)</td>\s*<td>([^<]*)<', html)
    assert totals == [("gpu1", "1", "1.0 GiB / 80.0 GiB"), ("gpu2", "1", NA)]
    assert '<tr class="detail lost"><td colspan="2"></td><td colspan="8">' in html


def test_dashboard_needs_a_source():
    with pytest.raises(SystemExit, match="both 'none'"):
        main(["--exporter-url", "none", "--prometheus-url", "none"])
