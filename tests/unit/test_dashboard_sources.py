"""gpulab.dashboard.sources against real HTTP on loopback: a real gpulab-exporter process
(--fake-gpus) and a tiny HTTP server answering Prometheus' /api/v1/query with canned
JSON. Unreachable sources must turn into a view that says so."""

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulab.dashboard.sources import (
    PROMETHEUS_SCRAPED,
    PROMETHEUS_SERIES,
    ExporterSource,
    PrometheusSource,
    SnapshotReader,
    SourceUnreachable,
    read_first,
    snapshot_from_prometheus,
)
from gpulab.dashboard.view import build_view
from tests.ports import free_port

SCRAPED_AT = 1_700_000_000.0



def closed_url():
    """A loopback URL nothing listens on (connection refused at once)."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    """The real exporter on three fake GPUs, GPU 2 in MIG mode with two MIG devices."""
    port = free_port()
    control = tmp_path_factory.mktemp("exporter") / "control.json"
    control.write_text('{"mig": {"2": 2}}')
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulab_exporter", "--listen", f"127.0.0.1:{port}",
         "--fake-gpus", "3", "--docker-url", "none", "--interval", "0.5",
         "--process-interval", "0.5", "--fake-control", str(control)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out = proc.communicate()[0].decode(errors="replace")
            pytest.fail(f"gpulab-exporter did not come up on {url}:\n{out}")
        time.sleep(0.1)
    yield url
    proc.terminate()
    proc.communicate(timeout=10)  # reaps it and closes the pipe


class CannedPrometheus:
    """Answers /api/v1/query from a dict {query: JSON body}; records the queries."""

    def __init__(self, answers):
        self.answers = answers
        self.queries = []
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query).get("query", [""])[0]
                canned.queries.append(query)
                status, body = (200, canned.answers[query]) if (
                    url.path == "/api/v1/query" and query in canned.answers) else (
                    400, {"status": "error", "errorType": "bad_data",
                          "error": f"unexpected {url.path} {query}"})
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


def vector(samples):
    return {"status": "success", "data": {"resultType": "vector", "result": samples}}


def sample(name, value, **labels):
    return {"metric": {"__name__": name, **labels}, "value": [SCRAPED_AT + 14, str(value)]}


G0 = {"gpu": "0", "uuid": "GPU-aaaa"}
G1 = {"gpu": "1", "uuid": "GPU-bbbb"}
CANNED_SERIES = [
    sample("gpulab_exporter_nvml_up", 1),
    sample("gpulab_exporter_docker_up", 1),
    sample("gpulab_exporter_info", 1, version="0.1.0", driver="550.54.15", backend="nvml"),
    sample("gpulab_gpu_up", 1, **G0),
    sample("gpulab_gpu_up", 0, **G1),
    sample("gpulab_gpu_info", 1, model="NVIDIA A100-SXM4-80GB", **G0),
    sample("gpulab_gpu_info", 1, model="NVIDIA A100-SXM4-80GB", **G1),
    sample("gpulab_gpu_utilization_ratio", 0, **G0),
    sample("gpulab_gpu_memory_used_bytes", 6 << 30, **G0),
    sample("gpulab_gpu_memory_total_bytes", 80 << 30, **G0),
    sample("gpulab_gpu_temperature_celsius", 44, **G0),
    sample("gpulab_gpu_power_watts", 88.5, **G0),
    sample("gpulab_gpu_fan_speed_ratio", "NaN", **G0),
    sample("gpulab_gpu_energy_joules_total", 123456, **G0),
    sample("gpulab_gpu_lease_info", 1, user="alice", server="", **G0),
    sample("gpulab_gpu_lease_info", 1, user="bob", server="train", kind="job", **G1),
    sample("gpulab_gpu_user_memory_used_bytes", 6 << 30, user="alice", **G0),
    sample("gpulab_gpu_process_info", 1, pid="4242", user="alice", server="train",
           container="gpulab-alice--train", **G0),
]
SCRAPED = vector([{"metric": {}, "value": [SCRAPED_AT + 14, str(SCRAPED_AT)]}])


@pytest.fixture
def prometheus():
    canned = CannedPrometheus({PROMETHEUS_SERIES: vector(CANNED_SERIES),
                               PROMETHEUS_SCRAPED: SCRAPED})
    yield canned
    canned.close()


# -- exporter ------------------------------------------------------------------------
async def test_exporter_source_reads_real_exporter(exporter):
    snap = await ExporterSource(exporter).fetch()
    assert snap["fake"] is True and snap["nvml_up"] is True
    assert [g["index"] for g in snap["gpus"]] == [0, 1, 2, 2, 2]
    assert snap["gpus"][0]["uuid"] == "GPU-fa4e0000-0000-4000-8000-000000000000"
    view = build_view(await read_first([ExporterSource(exporter)]))
    assert view["source"] == {"name": "exporter", "url": exporter}
    assert view["summary"]["text"] == ("3 GPUs (2 MIG devices), 0 allocated, "
                                       "0 idle but allocated, 0 lost")
    assert [r["label"] for r in view["gpus"]] == ["0", "1", "2", "2:0", "2:1"]
    assert all(r["state"] == "ok" for r in view["gpus"])
    assert [r["memory_text"].split(" / ")[1] for r in view["gpus"]] == \
        ["141.0 GiB"] * 3 + ["70.5 GiB"] * 2
    assert [r["parent_uuid"] for r in view["gpus"]] == \
        [None] * 3 + ["GPU-fa4e0000-0000-4000-8000-000000000002"] * 2
    assert any("FAKE GPUs" in b for b in view["banners"])


async def test_prometheus_names_match_what_the_real_exporter_exports(exporter, prometheus):
    """Feed the real exporter's /metrics through the canned Prometheus: the snapshot
    rebuilt from series must agree with the exporter's own /api/gpus."""
    with urllib.request.urlopen(exporter + "/metrics", timeout=5) as r:
        text = r.read().decode()
    series = [{"metric": {"__name__": s.name, **s.labels}, "value": [0, repr(s.value)]}
              for fam in text_string_to_metric_families(text) for s in fam.samples]
    prometheus.answers[PROMETHEUS_SERIES] = vector(series)
    from_prom = await PrometheusSource(prometheus.url).fetch()
    direct = await ExporterSource(exporter).fetch()
    assert from_prom["fake"] is True and from_prom["nvml_up"] is True
    assert from_prom["driver_version"] == direct["driver_version"]
    identity = ("index", "mig_device", "parent_uuid", "uuid", "model", "up")
    assert [tuple(g[k] for k in identity) for g in from_prom["gpus"]] == \
        [tuple(g[k] for k in identity) for g in direct["gpus"]]
    assert [g["mig_device"] for g in from_prom["gpus"]] == [None, None, None, 0, 1]
    for field in ("memory_total_bytes", "clock_sm_hertz", "fan_speed_ratio"):
        assert [g.get(field) for g in from_prom["gpus"]] == [g[field] for g in direct["gpus"]]
    # utilization: not under MIG (neither the MIG GPU nor its devices), else given
    assert [g.get("utilization_ratio") is not None for g in from_prom["gpus"]] == \
        [True, True, False, False, False]


# -- Prometheus ----------------------------------------------------------------------
async def test_prometheus_source_canned_series(prometheus):
    snap = await PrometheusSource(prometheus.url).fetch()
    assert sorted(prometheus.queries) == sorted([PROMETHEUS_SERIES, PROMETHEUS_SCRAPED])
    assert snap["timestamp"] == SCRAPED_AT  # sample time, not evaluation time
    assert (snap["nvml_up"], snap["docker_up"], snap["driver_version"], snap["fake"]) == \
        (True, True, "550.54.15", False)
    g0, g1 = snap["gpus"]
    assert g0 == {"index": 0, "mig_device": None, "parent_uuid": None, "uuid": "GPU-aaaa", "model": "NVIDIA A100-SXM4-80GB", "up": True,
                  "error": None, "utilization_ratio": 0.0, "memory_used_bytes": 6 << 30,
                  "memory_total_bytes": 80 << 30, "temperature_celsius": 44.0,
                  "power_watts": 88.5, "energy_joules": 123456.0,
                  # (no kind: an older exporter's series)
                  "leases": [{"user": "alice", "server": "", "container": None,
                              "job": False}],
                  "user_memory_bytes": {"alice": 6 << 30},
                  "processes": [{"pid": 4242, "used_memory_bytes": None, "container_id": None,
                                 "container": "gpulab-alice--train", "user": "alice",
                                 "server": "train"}]}
    assert g1["up"] is False and "lost" in g1["error"]
    assert g1["leases"] == [{"user": "bob", "server": "train", "container": None,
                             "job": True}]
    assert g1["processes"] is None  # no process_info series: not listed

    view = build_view({**snap, "source": {"name": "prometheus", "url": prometheus.url},
                       "unreachable": []})
    assert view["summary"]["text"] == "2 GPUs, 2 allocated, 1 idle but allocated, 1 lost"
    r0, r1 = view["gpus"]
    assert r0["fan_text"] == "N/A"  # NaN is dropped, not shown as 0
    assert r0["holders"][0]["memory_text"] == "6.0 GiB"
    assert r1["state_text"] == "LOST" and r1["model"] == "NVIDIA A100-SXM4-80GB"


async def test_prometheus_without_exporter_series_is_reported(prometheus):
    prometheus.answers[PROMETHEUS_SCRAPED] = vector([])
    with pytest.raises(SourceUnreachable, match="no gpulab_exporter_nvml_up series"):
        await PrometheusSource(prometheus.url).fetch()


async def test_prometheus_query_error_is_reported(prometheus):
    prometheus.answers.pop(PROMETHEUS_SERIES)  # the canned server answers 400 + error JSON
    with pytest.raises(SourceUnreachable, match="answered 400 to"):
        await PrometheusSource(prometheus.url).fetch()


def test_snapshot_from_prometheus_without_series():
    snap = snapshot_from_prometheus([], timestamp=5.0)
    assert snap["gpus"] == [] and snap["nvml_up"] is None and snap["timestamp"] == 5.0


# -- fallback and failure ------------------------------------------------------------
async def test_exporter_down_falls_back_to_prometheus(prometheus):
    dead = closed_url()
    snap = await read_first([ExporterSource(dead, timeout=2), PrometheusSource(prometheus.url)])
    assert snap["source"] == {"name": "prometheus", "url": prometheus.url}
    assert snap["unreachable"][0]["name"] == "exporter"
    assert "ConnectionRefusedError" in snap["unreachable"][0]["error"]
    view = build_view(snap)
    assert view["banners"][0].startswith(f"Data source unreachable: exporter at {dead} (")
    assert view["banners"][1] == f"Showing data from prometheus ({prometheus.url}) instead."
    assert view["summary"]["gpus"] == 2


async def test_everything_unreachable_gives_a_view_not_an_exception():
    dead_exporter, dead_prometheus = closed_url(), closed_url()
    snap = await read_first([ExporterSource(dead_exporter, timeout=2),
                             PrometheusSource(dead_prometheus, timeout=2)])
    view = build_view(snap)
    assert view["source"] is None and view["gpus"] == []
    assert view["message"] == "No GPU data: every data source is unreachable."
    assert dead_exporter in view["banners"][0] and dead_prometheus in view["banners"][0]


async def test_not_an_exporter_and_not_json_are_unreachable(prometheus):
    # the canned Prometheus answers /api/gpus with a 400 JSON body: not an exporter
    with pytest.raises(SourceUnreachable, match="HTTP 400"):
        await ExporterSource(prometheus.url).fetch()
    prometheus.answers[PROMETHEUS_SERIES] = {"status": "success", "data": {}}
    with pytest.raises(SourceUnreachable, match="not an API answer"):
        await PrometheusSource(prometheus.url).fetch()


async def test_timeout_is_reported():
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(SourceUnreachable, match="no answer within 0.3s"):
            await ExporterSource(url, timeout=0.3).fetch()


class CountingSource(ExporterSource):
    """The real exporter source, counting how often it is asked."""

    calls = 0

    async def fetch(self):
        self.calls += 1
        return await super().fetch()


async def test_reader_shares_reads_within_max_age(exporter):
    now = [100.0]
    source = CountingSource(exporter)
    reader = SnapshotReader([source], max_age=1.0, clock=lambda: now[0])
    first, second = await asyncio.gather(reader.read(), reader.read())
    assert source.calls == 1 and first is second
    now[0] += 0.5
    assert await reader.read() is first and source.calls == 1
    now[0] += 1.0
    await reader.read()
    assert source.calls == 2


def test_alertmanager_alerts_become_lines_critical_first():
    import asyncio

    from gpulab.dashboard.sources import AlertmanagerAlerts, alert_line

    raw = [
        {"labels": {"alertname": "GpulabGpuAllocatedIdle", "severity": "warning"},
         "annotations": {"summary": "GPU 0 held by alice, idle"},
         "startsAt": "2026-11-30T10:00:00.123Z"},
        {"labels": {"alertname": "GpulabGpuLost", "severity": "critical"},
         "annotations": {"description": "GPU 1 is gone"}, "startsAt": "2026-11-30T11:00:00Z"},
    ]
    assert alert_line(raw[1]) == {"name": "GpulabGpuLost", "severity": "critical",
                                  "summary": "GPU 1 is gone", "since": "2026-11-30 11:00"}
    assert alert_line({}) == {"name": "?", "severity": "", "summary": "", "since": ""}

    class Answering(AlertmanagerAlerts):
        async def _get_json(self, url):
            assert url.endswith("/api/v2/alerts?active=true&silenced=false&inhibited=false")
            return raw

    lines = asyncio.run(Answering("http://alertmanager:9093").fetch())
    assert [a["name"] for a in lines] == ["GpulabGpuLost", "GpulabGpuAllocatedIdle"]


def test_the_page_shows_active_alerts_and_says_when_alertmanager_is_down():
    from gpulab.dashboard.view import build_view

    snapshot = {"gpus": [], "source": {"name": "exporter", "url": "x"}, "unreachable": [],
                "alerts": [{"name": "GpulabGpuLost", "severity": "critical",
                            "summary": "GPU 1 is not answering", "since": "2026-11-30 11:00"}]}
    assert ("Alert GpulabGpuLost (critical) since 2026-11-30 11:00 UTC: GPU 1 is not answering"
            in build_view(snapshot)["banners"])
    down = {**snapshot, "alerts": None, "alerts_unreachable": "http://alertmanager:9093: "
                                                              "no answer within 3s"}
    banners = build_view(down)["banners"]
    assert any(b.startswith("Alertmanager unreachable (http://alertmanager:9093") for b in banners)
    assert not any(b.startswith("Alert Gpulab") for b in banners)


async def test_the_reader_adds_the_line_in_its_order(exporter, tmp_path):
    """line_in_order reads the real store and gpus.yaml: a higher line_priority goes
    first, the server the line started already leads, whoever joined first after."""
    from gpulab.line.store import LineStore
    from gpulab.line.view import line_in_order

    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("users: {cy: {line_priority: 5}}\n")
    clock = [1000.0]
    store = LineStore(tmp_path / "line.sqlite", now=lambda: clock[0])
    for user in ("ann", "bob", "cy", "dee"):
        store.join(user, "", 1)
        clock[0] += 10
    store.offer("dee", "")
    reader = SnapshotReader([ExporterSource(exporter)], max_age=0,
                            line=line_in_order(store.path, gpus))
    snap = await reader.read()
    assert [(e["user"], e["offered_at"] is not None) for e in snap["line"]] == [
        ("dee", True), ("cy", False), ("ann", False), ("bob", False)]
    assert [w["place"] for w in build_view(snap)["line"]] == [None, 1, 2, 3]
    # without a line file: no line
    assert (await SnapshotReader([ExporterSource(exporter)], max_age=0).read())["line"] == []


async def test_an_unreadable_line_store_leaves_the_line_off_and_the_table_on(exporter, tmp_path):
    """A line store the dashboard cannot open (here: a folder where the file should be)
    costs the line's section, not the GPU table."""
    from gpulab.line.view import line_in_order

    (tmp_path / "line.sqlite").mkdir()
    reader = SnapshotReader([ExporterSource(exporter)], max_age=0,
                            line=line_in_order(tmp_path / "line.sqlite", tmp_path / "gpus.yaml"))
    snap = await reader.read()
    assert snap["line"] == [] and len(snap["gpus"]) == 5  # 3 GPUs, 2 MIG devices


async def test_bookings_come_from_their_store_and_an_unreadable_one_costs_only_them(
        exporter, tmp_path):
    import time

    from gpulab.bookings.store import BookingStore
    from gpulab.bookings.view import bookings_for_dashboard
    from gpulab.gpus.allocator import Gpu
    from gpulab.gpus.config import parse_gpus_config

    store = BookingStore(tmp_path / "bookings.sqlite")
    now = time.time()
    store.make(parse_gpus_config(""), [Gpu(0, "GPU-a", "A100")], "ann", (), 1, now + 60,
               now + 120, "ann")
    reader = SnapshotReader([ExporterSource(exporter)], max_age=0,
                            bookings=bookings_for_dashboard(store.path))
    [b] = (await reader.read())["bookings"]
    assert (b["user"], b["gpus"], b["start"]) == ("ann", ["GPU-a"], now + 60)
    (tmp_path / "broken.sqlite").mkdir()
    reader = SnapshotReader([ExporterSource(exporter)], max_age=0,
                            bookings=bookings_for_dashboard(tmp_path / "broken.sqlite"))
    snap = await reader.read()
    assert snap["bookings"] == [] and len(snap["gpus"]) == 5  # 3 GPUs, 2 MIG devices
