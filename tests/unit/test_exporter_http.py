"""/metrics, /api/gpus and /healthz over real HTTP on 127.0.0.1 (ephemeral port), and
the console script end to end with --fake-gpus."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulab_exporter.attribution import Container, StaticContainerDirectory
from gpulab_exporter.fake_nvml import FakeGpu, FakeNvml, fake_uuid
from gpulab_exporter.nvml import GpuProcess
from gpulab_exporter.server import make_app, make_registry, parse_listen, serve
from gpulab_exporter.snapshot import Poller
from tests.ports import free_port

ANN = "a" * 64


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


@pytest.fixture
def exporter(tmp_path):
    (tmp_path / "101").mkdir()
    (tmp_path / "101" / "cgroup").write_text(f"0::/docker/{ANN}\n")
    nvml = FakeNvml([FakeGpu(0, utilization_percent=80, memory_used=3 << 30,
                             processes=[GpuProcess(101, 3 << 30)]),
                     FakeGpu(1, unsupported={"fan"})])
    directory = StaticContainerDirectory([Container(ANN, "gpulab-ann", "ann", "", (fake_uuid(0),))])
    poller = Poller(nvml, directory=directory, proc=str(tmp_path), interval=0.05,
                    process_interval=0.05)
    poller.poll()
    poller.start()
    server, thread = serve(make_app(poller, make_registry(poller, process_info=True)),
                           "127.0.0.1:0")
    yield f"http://127.0.0.1:{server.server_port}", nvml, poller
    server.shutdown()
    server.server_close()
    poller.stop()


def test_metrics_over_http(exporter):
    base, _, _ = exporter
    status, ctype, body = get(base + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(body) for s in fam.samples}
    g0 = (("gpu", "0"), ("uuid", fake_uuid(0)))
    assert samples[("gpulab_gpu_utilization_ratio", g0)] == pytest.approx(0.8)
    assert samples[("gpulab_gpu_user_memory_used_bytes", tuple(sorted(g0 + (("user", "ann"),))))
                   ] == 3 << 30
    assert ("gpulab_gpu_fan_speed_ratio", (("gpu", "1"), ("uuid", fake_uuid(1)))) not in samples
    # only this collector: no process_/python_ metrics from the default registry
    assert not re.search(r"^(process|python)_", body, re.M)


def test_api_gpus_json(exporter):
    base, _, _ = exporter
    status, ctype, body = get(base + "/api/gpus")
    assert status == 200 and ctype == "application/json"
    data = json.loads(body)
    assert data["nvml_up"] is True and data["fake"] is True
    g0, g1 = data["gpus"]
    assert g0["index"] == 0 and g0["uuid"] == fake_uuid(0) and g0["up"] is True
    assert g0["model"] == "NVIDIA H200 (fake)"
    assert g0["utilization_ratio"] == pytest.approx(0.8)
    assert g0["memory_used_bytes"] == 3 << 30 and g0["memory_total_bytes"] == 141 << 30
    for key in ("temperature_celsius", "power_watts", "fan_speed_ratio", "clock_sm_hertz",
                "clock_memory_hertz"):
        assert key in g0
    assert g0["leases"] == [{"user": "ann", "server": "", "container": "gpulab-ann",
                             "job": False}]
    assert g0["processes"][0]["pid"] == 101 and g0["processes"][0]["user"] == "ann"
    assert g0["processes"][0]["used_memory_bytes"] == 3 << 30
    assert g0["user_memory_bytes"] == {"ann": 3 << 30}
    assert g1["fan_speed_ratio"] is None


def test_nvml_failure_never_gives_500(exporter):
    base, nvml, poller = exporter
    nvml.gpus[1].lost_after = 0
    nvml.init_error = pynvml.NVMLError_DriverNotLoaded
    nvml.shutdown()  # the driver goes away: next calls raise Uninitialized -> reinit
    deadline = time.monotonic() + 5
    # first cycle: Uninitialized (mid-use); next ones: init fails with DriverNotLoaded
    while "DriverNotLoaded" not in (poller.latest.nvml_error or "") and time.monotonic() < deadline:
        time.sleep(0.02)
    for path in ("/metrics", "/api/gpus", "/healthz"):
        status, _, body = get(base + path)
        assert status == 200, (path, body)
    assert "gpulab_exporter_nvml_up 0.0" in get(base + "/metrics")[2]
    health = json.loads(get(base + "/healthz")[2])
    assert health["status"] == "ok" and health["nvml_up"] is False
    assert "DriverNotLoaded" in health["nvml_error"]


def test_unknown_path_is_404(exporter):
    base, _, _ = exporter
    assert get(base + "/nope")[0] == 404


def test_healthz_503_when_poller_is_stuck():
    poller = Poller(FakeNvml([FakeGpu(0)]), interval=5)
    poller.poll()
    server, _ = serve(make_app(poller, make_registry(poller), stale_after=0.0), "127.0.0.1:0")
    try:
        time.sleep(0.01)
        status, _, body = get(f"http://127.0.0.1:{server.server_port}/healthz")
        assert status == 503 and json.loads(body)["status"] == "stale"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("listen, expected", [
    ("0.0.0.0:9445", ("0.0.0.0", 9445)), (":9445", ("0.0.0.0", 9445)),
    ("[::]:9445", ("::", 9445)), ("127.0.0.1:0", ("127.0.0.1", 0)),
])
def test_parse_listen(listen, expected):
    assert parse_listen(listen) == expected


@pytest.mark.parametrize("listen", ["9445", "host:", "host:http"])
def test_parse_listen_rejects(listen):
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(listen)


def exporter_process(*flags: str):
    """`python -m gpulab_exporter FLAGS` on a free port, until its /metrics answers:
    (the process, the port, the first /metrics body). The caller stops it."""
    port = free_port()
    cmd = [sys.executable, "-m", "gpulab_exporter", *flags, "--docker-url", "none",
           "--listen", f"127.0.0.1:{port}", "--interval", "0.2", "--process-interval", "0.4"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 15
    while True:
        try:
            status, _, body = get(f"http://127.0.0.1:{port}/metrics")
            assert status == 200
            return p, port, body
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline or p.poll() is not None:
                p.kill()
                raise AssertionError(f"exporter did not start: {p.communicate()[0]}") from None
            time.sleep(0.1)


def stopped(p) -> str:
    """SIGTERM, then its output; it must exit 0."""
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=10)
    assert p.returncode == 0, out
    return out


def test_console_script_with_fake_gpus(tmp_path):
    """`python -m gpulab_exporter --fake-gpus 2` serves, says it is fake, stops on SIGTERM."""
    p, _, body = exporter_process("--fake-gpus", "2")
    try:
        assert 'gpulab_exporter_info{backend="fake"' in body
        assert f'gpulab_gpu_up{{gpu="1",uuid="{fake_uuid(1)}"}} 1.0' in body
    finally:
        out = stopped(p)
    assert "FAKE NVML" in out


def test_console_script_on_a_host_without_gpus_by_design():
    """`--no-gpus` (what make up passes on a host without an NVIDIA GPU): it serves, says
    why there are no GPUs, and tells Prometheus that none are expected, so the critical
    GpulabNvmlDown stays quiet (monitoring/prometheus/alerts_test.yml)."""
    p, port, body = exporter_process("--no-gpus")
    try:
        assert "gpulab_exporter_gpus_expected 0.0" in body
        assert "gpulab_exporter_nvml_up 0.0" in body and "gpulab_gpu_up{" not in body
        snapshot = json.loads(get(f"http://127.0.0.1:{port}/api/gpus")[2])
        assert snapshot["expects_gpus"] is False and snapshot["gpus"] == []
        assert "this host has no GPUs (--no-gpus" in snapshot["nvml_error"]
    finally:
        out = stopped(p)
    assert "NVML unavailable" not in out, out  # not a failure: logged once, as a fact
    assert "this host has no GPUs" in out
    both = subprocess.run([sys.executable, "-m", "gpulab_exporter", "--no-gpus",
                           "--fake-gpus", "2"], capture_output=True, text=True, timeout=30)
    assert both.returncode != 0 and "exclude each other" in both.stderr


def test_console_script_rejects_bad_intervals():
    p = subprocess.run([sys.executable, "-m", "gpulab_exporter", "--interval", "10",
                        "--process-interval", "5"], capture_output=True, text=True, timeout=30,
                       env={**os.environ})
    assert p.returncode != 0 and "--process-interval" in p.stderr


def test_metrics_follow_new_snapshots_and_encodings(exporter):
    """Rendered once per snapshot, but a new snapshot shows at once; gzip and
    OpenMetrics come from prometheus_client's encoders."""
    import gzip

    base, nvml, poller = exporter
    nvml.gpus[0].utilization_percent = 13
    poller.poll()  # this and every later snapshot carries the new value
    line = f'gpulab_gpu_utilization_ratio{{gpu="0",uuid="{fake_uuid(0)}"}} 0.13'
    assert line in get(base + "/metrics")[2]
    req = urllib.request.Request(base + "/metrics", headers={
        "Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        text = gzip.decompress(r.read()).decode()
    assert text.rstrip().endswith("# EOF") and "gpulab_gpu_up" in text


def test_with_a_token_only_its_holder_reads_who_holds_which_gpu(tmp_path):
    """A Swarm's GPU server publishes the exporter's port on the lab's network: with
    --auth-token-file, /metrics and /api/gpus answer only to the manager's Prometheus
    (Bearer token), and /healthz stays open (it names nobody)."""
    token = "t" * 64
    (tmp_path / "token").write_text(token + "\n")
    port = free_port()
    cmd = [sys.executable, "-m", "gpulab_exporter", "--fake-gpus", "2", "--docker-url", "none",
           "--listen", f"127.0.0.1:{port}", "--auth-token-file", str(tmp_path / "token")]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def ask(path, authorization=None):
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
        if authorization:
            req.add_header("Authorization", authorization)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                status, _ = ask("/healthz")
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline and p.poll() is None, "exporter did not start"
                time.sleep(0.1)
        assert status == 200
        for path in ("/metrics", "/api/gpus", "/"):
            assert ask(path) == (401, "")
            assert ask(path, "Bearer wrong")[0] == 401
            assert ask(path, f"Basic {token}")[0] == 401
        status, body = ask("/metrics", f"Bearer {token}")
        assert status == 200 and "gpulab_gpu_up" in body
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=10)


def test_a_short_token_file_is_refused_at_start(tmp_path):
    (tmp_path / "token").write_text("short\n")
    p = subprocess.run([sys.executable, "-m", "gpulab_exporter", "--fake-gpus", "1",
                        "--docker-url", "none", "--auth-token-file", str(tmp_path / "token")],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "at least 32 characters" in p.stderr
