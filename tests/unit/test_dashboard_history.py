"""gpulab.dashboard.history: ranges, steps, PromQL, Prometheus matrices -> series with
their gaps, and holders' spans (pure); then the I/O shell against a canned Prometheus
over real HTTP on loopback, and the dashboard page with its history below the table,
also when Prometheus does not answer."""

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from gpulab.dashboard.app import DashboardConfig, make_app
from gpulab.dashboard.history import (
    DEFAULT_RANGE,
    RANGES,
    PrometheusHistory,
    choose_step,
    history_model,
    holder_spans,
    matrix_series,
    parse_range,
    queries,
    time_grid,
    window,
)
from gpulab.dashboard.sources import SnapshotReader
from gpulab.dashboard.usage import PrometheusUsage, gpu_hours_query
from tests.unit.test_dashboard_app import SECRET, SNAPSHOT, CannedSource, get, make_auth, token

G0 = {"gpu": "0", "uuid": "GPU-aaaa", "instance": "exporter:9445", "job": "gpulab-exporter"}
G1 = {"gpu": "1", "uuid": "GPU-bbbb", "instance": "exporter:9445", "job": "gpulab-exporter"}
T0 = 1_700_000_100  # a multiple of 15 s and of 300 s


# -- pure: ranges, steps, queries ----------------------------------------------------
@pytest.mark.parametrize("text, expected", [(None, "1h"), ("", "1h"), ("1h", "1h"),
                                            ("1d", "1d"), ("1w", "1w")])
def test_ranges_are_one_hour_day_or_week(text, expected):
    assert parse_range(text) == expected
    assert DEFAULT_RANGE == "1h" and list(RANGES) == ["1h", "1d", "1w"]


@pytest.mark.parametrize("text", ["2h", "1H", "week", "3600", " 1h"])
def test_other_ranges_are_refused_naming_the_choices(text):
    with pytest.raises(ValueError, match=r"expected one of 1h, 1d, 1w"):
        parse_range(text)


@pytest.mark.parametrize("range_seconds, points, step, points_drawn", [
    (3600, 300, 15, 240),  # 12 s would be below the scrape interval
    (86400, 300, 300, 288),
    (7 * 86400, 300, 2025, 298),  # 2016 s, up to a multiple of 15 s
    (60, 300, 15, 4),
    (3600, 10, 360, 10),
])
def test_the_step_gives_about_300_points_and_whole_scrapes(range_seconds, points, step,
                                                           points_drawn):
    assert choose_step(range_seconds, points) == step
    assert step % 15 == 0 and step >= 15
    assert range_seconds // step == points_drawn


@pytest.mark.parametrize("step, seconds", [(15, 30), (30, 30), (300, 300), (2025, 2025)])
def test_each_point_covers_its_step_and_at_least_two_scrapes(step, seconds):
    assert window(step) == seconds


@pytest.mark.parametrize("now, range_seconds, step, grid", [
    (T0, 3600, 15, (T0 - 3600, T0)),
    (T0 + 14.9, 3600, 15, (T0 - 3600, T0)),  # reloads within a step ask the same
    (T0 + 15, 3600, 15, (T0 + 15 - 3600, T0 + 15)),
    (T0 + 299, 86400, 300, (T0 - 86400, T0)),
])
def test_the_grid_ends_on_a_multiple_of_the_step(now, range_seconds, step, grid):
    assert time_grid(now, range_seconds, step) == grid


@pytest.mark.parametrize("step, util, memory, holders", [
    (15, "max_over_time(gpulab_gpu_utilization_ratio[30s])",
     "max_over_time(gpulab_gpu_memory_used_bytes[30s]) / "
     "max_over_time(gpulab_gpu_memory_total_bytes[30s])",
     "max_over_time(gpulab_gpu_lease_info[30s])"),
    (300, "max_over_time(gpulab_gpu_utilization_ratio[300s])",
     "max_over_time(gpulab_gpu_memory_used_bytes[300s]) / "
     "max_over_time(gpulab_gpu_memory_total_bytes[300s])",
     "max_over_time(gpulab_gpu_lease_info[300s])"),
])
def test_queries_take_the_busiest_sample_of_each_step(step, util, memory, holders):
    assert queries(step) == {"utilization": util, "memory": memory, "holders": holders}


@pytest.mark.parametrize("seconds, expr", [
    (3600, "sum_over_time(gpulab:user_gpus_held[3600s]) * 15 / 3600"),
    (604800, "sum_over_time(gpulab:user_gpus_held[604800s]) * 15 / 3600"),
])
def test_gpu_hours_are_the_usage_pages_query(seconds, expr):
    assert gpu_hours_query(seconds) == expr


# -- pure: matrix -> series ----------------------------------------------------------
def matrix(labels, points):
    """A query_range result row; a point's value None leaves the point out."""
    return {"metric": labels, "values": [[t, str(v)] for t, v in points if v is not None]}


def ts(*offsets):
    return [T0 + 15 * i for i in offsets]


@pytest.mark.parametrize("points, segments", [
    # unbroken
    ([(t, 0.5) for t in ts(0, 1, 2)], [[[T0, 0.5], [T0 + 15, 0.5], [T0 + 30, 0.5]]]),
    # a GPU that fell off the bus for two steps: two segments, no zeros in between
    ([(ts(0)[0], 0.2), (ts(1)[0], 0.4), (ts(2)[0], None), (ts(3)[0], None),
      (ts(4)[0], 0.9)],
     [[[T0, 0.2], [T0 + 15, 0.4]], [[T0 + 60, 0.9]]]),
    # NaN (a division by a missing total) breaks the line too
    ([(ts(0)[0], 0.1), (ts(1)[0], "NaN"), (ts(2)[0], 0.3)], [[[T0, 0.1]], [[T0 + 30, 0.3]]]),
    # a step with float noise in the timestamps stays one segment
    ([(T0, 1), (T0 + 15.001, 1)], [[[T0, 1.0], [T0 + 15.001, 1.0]]]),
    # nothing at all: the series is left out
    ([], None),
])
def test_matrix_to_series_breaks_at_gaps(points, segments):
    series = matrix_series([matrix({"__name__": "x", **G0}, points)], 15)
    if segments is None:
        assert series == []
    else:
        assert series == [{"labels": G0, "segments": segments}]


def test_holders_are_spans_from_each_run_of_points_cut_to_the_range():
    start, end, step = T0, T0 + 3600, 15
    lease = {**G0, "user": "alice", "server": ""}
    other = {**G0, "user": "bob", "server": "train"}
    series = matrix_series([
        matrix(lease, [(T0, 1), (T0 + 15, 1), (T0 + 600, 1), (T0 + 615, 1), (T0 + 630, 1)]),
        matrix(other, [(T0 + 1200, 1)]),
        matrix({**G1, "user": "cy", "server": ""}, [(T0 + 3600, 1)]),
    ], step)
    spans = holder_spans(series, step, start, end)
    assert spans == {
        "GPU-aaaa": [
            {"user": "alice", "server": "", "start": T0, "end": T0 + 15},  # cut at start
            {"user": "alice", "server": "", "start": T0 + 585, "end": T0 + 630},
            {"user": "bob", "server": "train", "start": T0 + 1185, "end": T0 + 1200}],
        "GPU-bbbb": [{"user": "cy", "server": "", "start": T0 + 3585, "end": T0 + 3600}]}


def test_the_model_has_each_gpu_its_lines_holders_and_the_members_hours():
    step = 15
    util = matrix_series([matrix({**G1}, [(T0, 0.5)]),
                          matrix({**G0}, [(T0, 0.1), (T0 + 15, 0.9), (T0 + 45, 0.4)])], step)
    mem = matrix_series([matrix({**G0}, [(T0, 0.25), (T0 + 15, 0.25)])], step)
    leases = matrix_series([matrix({**G0, "user": "alice", "server": ""}, [(T0 + 15, 1)]),
                            matrix({"gpu": "2", "uuid": "GPU-cccc", "user": "bob",
                                    "server": ""}, [(T0, 1)])], step)
    model = history_model("1h", T0 - 3540, T0 + 60, step, util, mem, leases,
                          {"bob": 0.25, "alice": 1.004, "cy": 0.0, "dee": 0.004})
    assert [(g["index"], g["uuid"], g["has_data"]) for g in model["gpus"]] == [
        (0, "GPU-aaaa", True), (1, "GPU-bbbb", True), (2, "GPU-cccc", False)]
    g0 = model["gpus"][0]
    assert g0["utilization"] == [[[T0, 0.1], [T0 + 15, 0.9]], [[T0 + 45, 0.4]]]
    assert g0["memory"] == [[[T0, 0.25], [T0 + 15, 0.25]]]
    assert g0["holders"] == [{"user": "alice", "server": "", "start": T0, "end": T0 + 15}]
    assert model["members"] == [{"user": "alice", "hours": 1.0}, {"user": "bob", "hours": 0.25}]
    assert model["total_hours"] == 1.25
    assert (model["range"], model["step"], model["error"]) == ("1h", 15, None)
    assert json.loads(json.dumps(model)) == model  # plain JSON types


# -- the I/O shell, against a canned Prometheus --------------------------------------
class CannedRangePrometheus:
    """Answers /api/v1/query_range and /api/v1/query with canned results keyed by the
    PromQL; records (path, params) of every request."""

    def __init__(self, ranges, instants):
        self.ranges, self.instants, self.requests = ranges, instants, []
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                url = urllib.parse.urlsplit(self.path)
                params = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
                canned.requests.append((url.path, params))
                table, kind = ((canned.ranges, "matrix") if url.path == "/api/v1/query_range"
                               else (canned.instants, "vector"))
                if params.get("query") in table:
                    status, body = 200, {"status": "success", "data": {
                        "resultType": kind, "result": table[params["query"]]}}
                else:
                    status, body = 400, {"status": "error", "error": "unexpected query"}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


NOW = T0 + 7.5
Q = queries(15)
RANGE_ANSWERS = {
    Q["utilization"]: [matrix(G0, [(T0 - 30, 0.2), (T0 - 15, 0.8), (T0, 0.6)]),
                       matrix(G1, [(T0 - 60, 0.5), (T0, 0.5)])],  # G1: a gap
    Q["memory"]: [matrix(G0, [(T0 - 30, 0.1), (T0 - 15, 0.1), (T0, 0.5)])],
    Q["holders"]: [matrix({**G0, "user": "alice", "server": ""}, [(T0 - 15, 1), (T0, 1)])],
}
HOURS = {gpu_hours_query(3600): [{"metric": {"user": "alice"}, "value": [T0, "0.5"]}]}


@pytest.fixture
def prometheus():
    canned = CannedRangePrometheus(RANGE_ANSWERS, HOURS)
    yield canned
    canned.close()


def closed_url():
    sock, port = bind_unused_port()
    sock.close()
    return f"http://127.0.0.1:{port}"


async def test_the_shell_asks_one_range_query_per_line_on_the_grid(prometheus):
    model = await PrometheusHistory(prometheus.url).read("1h", NOW)
    ranges = sorted(p["query"] for path, p in prometheus.requests
                    if path == "/api/v1/query_range")
    assert ranges == sorted(Q.values())
    assert {(p["start"], p["end"], p["step"]) for path, p in prometheus.requests
            if path == "/api/v1/query_range"} == {(f"{T0 - 3600:.3f}", f"{T0:.3f}", "15")}
    assert ("/api/v1/query", {"query": gpu_hours_query(3600), "time": f"{T0:.3f}"}) in \
        prometheus.requests
    assert model["error"] is None
    g0, g1 = model["gpus"]
    assert g0["utilization"] == [[[T0 - 30, 0.2], [T0 - 15, 0.8], [T0, 0.6]]]
    assert g1["utilization"] == [[[T0 - 60, 0.5]], [[T0, 0.5]]]
    assert g0["holders"] == [{"user": "alice", "server": "", "start": T0 - 30, "end": T0}]
    assert model["members"] == [{"user": "alice", "hours": 0.5}]


async def test_prometheus_down_gives_a_model_that_says_so():
    url = closed_url()
    model = await PrometheusHistory(url, timeout=2).read("1d", NOW)
    assert model["gpus"] == [] and model["range"] == "1d"
    assert model["error"].startswith(f"Prometheus at {url}: ")


async def test_gpu_hours_failing_alone_keeps_the_charts(prometheus):
    usage = PrometheusUsage(closed_url(), timeout=2)
    model = await PrometheusHistory(prometheus.url, usage=usage).read("1h", NOW)
    assert model["error"] is None and len(model["gpus"]) == 2
    assert model["members"] is None and "did not answer" in model["hours_error"]


# -- the page ------------------------------------------------------------------------
async def serve(history):
    app = make_app(make_auth(), SnapshotReader([CannedSource(SNAPSHOT)], max_age=0),
                   DashboardConfig(refresh_seconds=3), cookie_secret=SECRET, history=history)
    sock, port = bind_unused_port()
    server = HTTPServer(app)
    server.add_sockets([sock])
    return server, f"http://127.0.0.1:{port}/services/gpus/"


async def test_the_page_draws_history_below_the_table(prometheus):
    server, base = await serve(PrometheusHistory(prometheus.url))
    try:
        status, _, body = await get(base + "?range=1h", token("operator-token"))
        assert status == 200
        assert body.index('id="gpu-rows"') < body.index('id="history"')
        assert body.count("<svg") == 2 and 'class="line utilization"' in body
        assert 'data-user="alice"' in body
        assert 'id="range-1h" class="range current"' in body
        assert 'href="/services/gpus/?range=1w#history"' in body
        assert "0.50" in body and 'id="history-hours"' in body
        status, _, body = await get(base + "api/history?range=1h", token("operator-token"))
        assert status == 200 and json.loads(body)["members"] == [{"user": "alice",
                                                                  "hours": 0.5}]
        status, _, body = await get(base + "?range=2h", token("operator-token"))
        assert status == 400 and "expected one of 1h, 1d, 1w" in body
        status, _, body = await get(base + "api/history", token("user-token"))
        assert status == 403
    finally:
        server.stop()


async def test_prometheus_down_the_table_stays_and_the_page_says_so():
    url = closed_url()
    server, base = await serve(PrometheusHistory(url, timeout=2))
    try:
        status, _, body = await get(base, token("operator-token"))
        assert status == 200
        assert 'id="gpu-rows"' in body and "GPU-aaaa" in body  # the table, from the exporter
        assert 'id="history-error"' in body and f"Prometheus at {url}" in body
        assert "<svg" not in body
    finally:
        server.stop()


async def test_without_a_prometheus_there_is_no_history_section():
    server, base = await serve(None)
    try:
        status, _, body = await get(base, token("operator-token"))
        assert status == 200 and 'id="history"' not in body
        status, _, _ = await get(base + "api/history", token("operator-token"))
        assert status == 404
    finally:
        server.stop()
