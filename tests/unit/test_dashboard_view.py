"""gpulab.dashboard.view: snapshot dict -> view model (pure), and the page rendered from
it with the real Jinja2 templates (escaping)."""

import html
import re

import pytest

from gpulab.dashboard.app import make_templates, render_page
from gpulab.dashboard.view import (
    NO_GPUS,
    build_view,
    format_bytes,
    format_duration,
    gpu_row,
    node_totals,
)

GiB = 1 << 30
MiB = 1 << 20
EXPORTER = {"name": "exporter", "url": "http://exporter:9445"}


def gpu(index, **kw):
    """A GPU as the exporter's /api/gpus reports it (Snapshot.to_json())."""
    base = {
        "index": index, "uuid": f"GPU-{index:04d}", "model": "NVIDIA H100 80GB HBM3",
        "up": True, "error": None, "utilization_ratio": 0.5,
        "memory_used_bytes": 20 * GiB, "memory_total_bytes": 80 * GiB,
        "memory_free_bytes": 60 * GiB, "temperature_celsius": 61.0, "power_watts": 312.4,
        "energy_joules": 1e6, "clock_sm_hertz": 1.98e9, "clock_memory_hertz": 2.619e9,
        "fan_speed_ratio": 0.3, "ecc_corrected": 0, "ecc_uncorrected": 0,
        "processes": [], "leases": [], "user_memory_bytes": {},
    }
    base.update(kw)
    return base


def snapshot(gpus, **kw):
    base = {"timestamp": 1_700_000_000.0, "nvml_up": True, "nvml_error": None,
            "driver_version": "550.54.15", "fake": False, "docker_up": True, "gpus": gpus,
            "source": EXPORTER, "unreachable": []}
    base.update(kw)
    return base


def test_multi_gpu_rows_and_summary():
    alice = {"user": "alice", "server": "", "container": "gpulab-alice"}
    view = build_view(snapshot([
        gpu(1, utilization_ratio=0.0, leases=[alice], user_memory_bytes={"alice": 2 * GiB},
            processes=[{"pid": 4242, "used_memory_bytes": 2 * GiB, "user": "alice",
                        "server": "", "container": "gpulab-alice", "container_id": "ab"}]),
        gpu(0, utilization_ratio=0.873),
    ]))
    assert [r["index"] for r in view["gpus"]] == [0, 1]  # sorted by index
    g0, g1 = view["gpus"]
    assert g0 == {**g0, "state": "ok", "utilization_percent": 87, "utilization_text": "87%",
                  "utilization_bar": 87, "memory_text": "20.0 GiB / 80.0 GiB", "memory_bar": 25,
                  "temperature_text": "61C", "power_text": "312W", "fan_text": "30%",
                  "clocks_text": "1980 / 2619 MHz", "allocated": False,
                  "idle_allocated": False, "holders": [], "processes": []}
    assert g1["holders"] == [{"user": "alice", "server": "", "job": False,
                              "memory_text": "2.0 GiB", "since": None, "held_for": None,
                              "cull_text": None}]
    assert g1["processes"] == [{"pid": 4242, "user": "alice", "server": "",
                                "container": "gpulab-alice", "memory_text": "2.0 GiB"}]
    assert view["summary"] == {"gpus": 2, "mig_devices": 0, "allocated": 1, "idle_allocated": 1, "lost": 0,
                               "text": "2 GPUs, 1 allocated, 1 idle but allocated, 0 lost"}
    assert view["message"] is None and view["banners"] == []
    assert view["source"] == EXPORTER and view["driver_version"] == "550.54.15"


def test_zero_gpus_says_so():
    view = build_view(snapshot([]))
    assert view["message"] == NO_GPUS == "No GPUs on this host"
    assert view["gpus"] == []
    assert view["summary"]["text"] == "0 GPUs, 0 allocated, 0 idle but allocated, 0 lost"


def test_lost_gpu_keeps_identity_and_shows_no_stale_numbers():
    lost = gpu(2, up=False, error="NVMLError_GpuIsLost: GPU is lost",
               leases=[{"user": "bob", "server": "train", "container": "gpulab-bob--train"}],
               # a lost GPU's sample carries no readings; any present must not be shown
               utilization_ratio=None, memory_used_bytes=None, memory_total_bytes=None,
               temperature_celsius=99.0, processes=None)
    view = build_view(snapshot([gpu(0), lost]))
    row = view["gpus"][1]
    assert row["state"] == "lost" and row["state_text"] == "LOST"
    assert (row["index"], row["uuid"], row["model"]) == (2, "GPU-0002", "NVIDIA H100 80GB HBM3")
    assert row["error"] == "NVMLError_GpuIsLost: GPU is lost"
    assert row["temperature_text"] == "N/A" and row["utilization_text"] == "N/A"
    assert row["utilization_bar"] == 0 and row["memory_text"] == "N/A"
    assert row["allocated"] and not row["idle_allocated"]  # lost is not "idle"
    assert row["holders"][0]["user"] == "bob" and row["holders"][0]["server"] == "train"
    assert view["summary"]["lost"] == 1 and view["summary"]["allocated"] == 1


def test_lost_gpu_without_error_or_model():
    row = gpu_row({"index": 3, "uuid": "", "model": None, "up": False})
    assert (row["state_text"], row["model"], row["error"]) == ("LOST", "unknown model",
                                                                "GPU lost")


@pytest.mark.parametrize("util, idle", [(0.0, True), (0.009, True), (0.01, False),
                                        (0.9, False), (None, False)])
def test_allocated_but_idle_threshold(util, idle):
    row = gpu_row(gpu(0, utilization_ratio=util,
                      leases=[{"user": "carol", "server": "", "container": "c"}]))
    assert row["allocated"] is True
    assert row["idle_allocated"] is idle


def test_idle_without_holder_is_not_idle_allocated():
    row = gpu_row(gpu(0, utilization_ratio=0.0))
    assert row["allocated"] is False and row["idle_allocated"] is False


def test_missing_optional_fields_are_na_not_zero():
    minimal = {"index": 0, "uuid": "GPU-x", "model": "Tesla T4", "up": True}
    row = gpu_row(minimal)
    for key in ("utilization_text", "memory_text", "temperature_text", "power_text",
                "fan_text", "clocks_text"):
        assert row[key] == "N/A", key
    assert row["utilization_percent"] is None and row["utilization_bar"] == 0
    assert row["holders"] == [] and row["processes"] is None  # not listed != none
    # one clock known, the other NotSupported
    assert gpu_row({**minimal, "clock_sm_hertz": 1.59e9})["clocks_text"] == "1590 / N/A MHz"
    # total known, used not: half a memory cell
    assert gpu_row({**minimal, "memory_total_bytes": 16 * GiB})["memory_text"] == \
        "N/A / 16.0 GiB"


def test_holder_since_becomes_held_for_relative_to_snapshot_time():
    lease = {"user": "dan", "server": "", "container": "c", "since": 1_700_000_000.0 - 7980}
    row = gpu_row(gpu(0, leases=[lease]), now=1_700_000_000.0)
    assert row["holders"][0]["held_for"] == "2h 13m"


@pytest.mark.parametrize("n, text", [(None, "N/A"), (0, "0 MiB"), (512 * MiB, "512 MiB"),
                                     (GiB, "1.0 GiB"), (int(141.5 * GiB), "141.5 GiB")])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("s, text", [(None, None), (-1, None), (40, "40s"), (300, "5m"),
                                     (7980, "2h 13m"), (3 * 86400 + 4 * 3600, "3d 4h")])
def test_format_duration(s, text):
    assert format_duration(s) == text


def test_unreachable_sources_named_in_banner_and_message():
    view = build_view({"gpus": [], "source": None, "timestamp": None, "unreachable": [
        {"name": "exporter", "url": "http://exporter:9445", "error": "ConnectionRefusedError"},
        {"name": "prometheus", "url": "http://prometheus:9090", "error": "no answer within 3s"},
    ]})
    assert view["message"] == "No GPU data: every data source is unreachable."
    assert view["banners"] == [
        "Data source unreachable: exporter at http://exporter:9445 (ConnectionRefusedError); "
        "prometheus at http://prometheus:9090 (no answer within 3s)"]


def test_fallback_source_fake_gpus_nvml_down_and_docker_down_banners():
    view = build_view(snapshot(
        [], fake=True, nvml_up=False, nvml_error="NVMLError_DriverNotLoaded", docker_up=False,
        source={"name": "prometheus", "url": "http://prometheus:9090"},
        unreachable=[{"name": "exporter", "url": "http://exporter:9445", "error": "refused"}]))
    text = "\n".join(view["banners"])
    assert "Data source unreachable: exporter at http://exporter:9445 (refused)" in text
    assert "Showing data from prometheus (http://prometheus:9090) instead." in text
    assert "FAKE GPUs" in text
    assert "NVML is not answering on the exporter: NVMLError_DriverNotLoaded." in text
    assert "cannot list containers" in text
    assert view["message"] == "No GPU data: NVML is not answering on the exporter."


# -- rendered HTML -------------------------------------------------------------------
EVIL = '<script>alert("pwn")</script>'


def render(view, user="admin"):
    return render_page(make_templates(), view, api_url="/services/gpus/api/gpus",
                       refresh_seconds=5, xsrf_token="2|abc", user=user)


def test_malicious_names_are_escaped_in_html():
    evil_proc = {"pid": 7, "used_memory_bytes": GiB, "user": EVIL, "server": "",
                 "container": "c", "container_id": None}
    page = render(build_view(snapshot([
        gpu(0, model='"><img src=x onerror=alert(1)>',
            leases=[{"user": EVIL, "server": "<b>srv</b>", "container": "c"}],
            processes=[evil_proc], user_memory_bytes={EVIL: GiB}),
    ], driver_version="<i>drv</i>")), user=EVIL)
    assert EVIL not in page
    assert "<img src=x" not in page and "<b>srv</b>" not in page and "<i>drv</i>" not in page
    escaped = html.escape(EVIL, quote=True)  # &lt;script&gt;alert(&#34;pwn&#34;)...
    assert page.count("&lt;script&gt;alert(") >= 3  # holder, process, signed-in user
    # the only <script> element is the page's own
    assert len(re.findall(r"<script>", page)) == 1
    assert html.unescape(escaped) == EVIL


def test_page_renders_rows_bars_summary_and_refresh_config():
    page = render(build_view(snapshot([gpu(0, utilization_ratio=0.42),
                                       gpu(1, up=False, error="lost")])))
    assert page.count('<tr class="gpu ') == 2
    assert 'style="width: 42%"' in page and 'style="width: 25%"' in page  # util, memory
    assert "2 GPUs, 0 allocated, 0 idle but allocated, 1 lost" in page
    assert ">LOST<" in page
    assert 'data-api="/services/gpus/api/gpus"' in page and 'data-refresh="5"' in page
    assert "last updated" in page and "22:13:20 UTC" in page  # 1_700_000_000
    assert "http://" not in page.split("<main")[0]  # no external assets in the head
    assert 'id="refresh-error"' in page and "Data source unreachable" in page  # JS banner


def test_page_zero_gpus_shows_message_not_table():
    page = render(build_view(snapshot([])))
    assert '<p id="message">No GPUs on this host</p>' in page
    assert '<table id="gpus" hidden>' in page


def test_a_holder_the_gpu_culler_warned_says_when_it_will_be_stopped():
    stop_at = 1_800_000_000.0  # 2027-01-15 08:00 UTC
    snap = {"source": {"name": "exporter", "url": "x"}, "timestamp": stop_at - 600,
            "gpus": [{"index": 0, "uuid": "GPU-a", "utilization_ratio": 0.0,
                      "leases": [{"user": "alice", "server": ""},
                                 {"user": "bob", "server": "big"}]}],
            "cull_warnings": [{"user": "alice", "server": "", "stop_at": stop_at,
                               "message": "its GPU has been idle for 2 h"},
                              {"user": "bob", "server": "", "stop_at": stop_at,
                               "message": "not this one: bob's default server"}]}
    [row] = build_view(snap)["gpus"]
    alice, bob = row["holders"]
    assert alice["cull_text"] == "to be stopped at 08:00 UTC (its GPU has been idle for 2 h)"
    assert bob["cull_text"] is None  # bob/big was not warned
    html = render_page(make_templates(), build_view(snap), api_url="a", refresh_seconds=5,
                       xsrf_token="t", user="op")
    assert '<span class="cull">to be stopped at 08:00 UTC (its GPU has been idle for 2 h)' \
        in html


def test_the_line_shows_under_the_table_in_its_order_with_places_and_waits():
    now = 1_800_000_000.0
    snap = snapshot([gpu(0)], timestamp=now, line=[
        {"user": "bob", "server": "big", "gpus": 2, "joined_at": now - 900,
         "offered_at": now - 30},  # the line started his server: no place any more
        {"user": "ann", "server": "", "gpus": 1, "joined_at": now - 4000, "offered_at": None},
        {"user": "<cy>", "server": "", "gpus": 1, "joined_at": now - 40, "offered_at": None},
    ])
    view = build_view(snap)
    assert [(w["place"], w["user"], w["server"], w["gpus"], w["waited"], w["state_text"])
            for w in view["line"]] == [
        (None, "bob", "big", 2, "15m", "server started, not opened yet"),
        (1, "ann", "", 1, "1h 6m", "waiting"),
        (2, "<cy>", "", 1, "40s", "waiting")]
    page = render_page(make_templates(), view, api_url="a", refresh_seconds=5,
                       xsrf_token="t", user="op")
    assert '<section id="line">' in page
    rows = re.findall(r'<tr class="waiting">(.*?)</tr>', page)
    assert [re.sub(r"<[^>]+>", " ", r).split() for r in rows] == [
        ["-", "bob", "/big", "2", "15m", "server", "started,", "not", "opened",
         "yet"],
        ["1", "ann", "1", "1h", "6m", "waiting"],
        ["2", "&lt;cy&gt;", "1", "40s", "waiting"]]  # escaped, as every value


def test_nobody_in_line_hides_the_section():
    view = build_view(snapshot([gpu(0)]))
    assert view["line"] == []
    page = render_page(make_templates(), view, api_url="a", refresh_seconds=5,
                       xsrf_token="t", user="op")
    assert '<section id="line" hidden>' in page


def test_bookings_show_under_the_line_by_start_with_the_tables_gpu_names():
    now = 1_800_000_000.0  # 2027-01-15 08:00 UTC
    snap = snapshot([gpu(0), gpu(1)], timestamp=now, bookings=[
        {"user": "<cy>", "gpus": [gpu(1)["uuid"], "GPU-gone"], "start": now + 3600,
         "end": now + 7200},
        {"user": "bob", "gpus": [gpu(0)["uuid"]], "start": now - 60, "end": now + 600},
    ])
    view = build_view(snap)
    assert [(b["user"], b["gpus_text"], b["from"], b["until"], b["state_text"])
            for b in view["bookings"]] == [
        ("bob", "GPU 0", "2027-01-15 07:59", "2027-01-15 08:10", "now"),
        ("<cy>", "GPU 1, GPU-gone", "2027-01-15 09:00", "2027-01-15 10:00", "booked")]
    page = render_page(make_templates(), view, api_url="a", refresh_seconds=5,
                       xsrf_token="t", user="op")
    assert '<section id="bookings">' in page
    rows = re.findall(r'<tr class="booking">(.*?)</tr>', page)
    assert "&lt;cy&gt;" in rows[1] and "<cy>" not in page
    # none: the section is hidden
    assert build_view(snapshot([gpu(0)], timestamp=now))["bookings"] == []
    assert '<section id="bookings" hidden>' in render_page(
        make_templates(), build_view(snapshot([gpu(0)], timestamp=now)), api_url="a",
        refresh_seconds=5, xsrf_token="t", user="op")


def test_a_host_without_gpus_by_design_says_so_without_an_nvml_banner():
    snap = snapshot([], nvml_up=False, expects_gpus=False,
                    nvml_error="this host has no GPUs (--no-gpus: ...)")
    view = build_view(snap)
    assert view["message"].startswith("This host has no GPUs (make up found no NVIDIA GPU)")
    assert "make up GPULAB_DEMO=1" in view["message"]
    assert not any("NVML" in b for b in view["banners"])


def test_mig_devices_are_rows_under_their_gpu_and_counted_apart():
    """A GPU in MIG mode: its row, then one per MIG device ("1:0"), each with its holder.
    Whole GPUs are counted as GPUs; memory totals count a GPU once, not again in its
    devices; a device is allocated on its own."""
    parent = gpu(1, utilization_ratio=None, memory_used_bytes=10 * GiB)
    devices = [gpu(1, uuid=f"MIG-000{slot}", mig_device=slot, parent_uuid=parent["uuid"],
                   utilization_ratio=None, memory_used_bytes=used, memory_total_bytes=40 * GiB,
                   temperature_celsius=None, leases=leases)
               for slot, used, leases in ((1, 0, []), (0, 10 * GiB, [{
                   "user": "ann", "server": "", "container": "gpulab-user-ann"}]))]
    view = build_view(snapshot([*devices, parent, gpu(0)]))
    assert [r["label"] for r in view["gpus"]] == ["0", "1", "1:0", "1:1"]
    assert view["summary"]["text"] == ("2 GPUs (2 MIG devices), 1 allocated, "
                                       "0 idle but allocated, 0 lost")
    mig = view["gpus"][2]
    assert (mig["parent_uuid"], mig["utilization_text"]) == ("GPU-0001", "N/A")
    assert [h["user"] for h in mig["holders"]] == ["ann"]
    html = render_page(make_templates(), view, api_url="a", refresh_seconds=5,
                       xsrf_token="t", user="op")
    assert '<td class="num">1:0</td>' in html and "MIG device of GPU 1" in html
    [node] = node_totals(view["gpus"])
    assert (node["gpus"], node["held"], node["memory_text"]) == (2, 1, "30.0 GiB / 160.0 GiB")
