"""The Prometheus config and alert rules, checked by the real promtool.

Install it with `apt-get install --no-install-recommends prometheus` (this does not
start a Prometheus server)."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

PROM = Path(__file__).resolve().parents[2] / "monitoring" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (apt-get install --no-install-recommends prometheus)",
)
ALERTS = {"GpulabGpuAllocatedIdle", "GpulabGpuMemoryNearlyFull", "GpulabGpuTemperatureHigh",
          "GpulabGpuLost", "GpulabExporterDown", "GpulabNvmlDown", "GpulabWaitingWhileGpuIdle",
          "GpulabBackupTooOld", "GpulabBackupFailed", "GpulabBackupServiceDown",
          "GpulabDiskNearlyFull", "GpulabLoginProviderUnreachable"}


def promtool(*args, cwd=PROM):
    p = subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"promtool {' '.join(args)}:\n{p.stdout}\n{p.stderr}"
    return p.stdout + p.stderr


@needs_promtool
def test_rules_are_valid():
    out = promtool("check", "rules", "alerts.yml")
    assert f"{len(ALERTS)} rules found" in out


@needs_promtool
def test_rule_unit_tests_pass():
    promtool("test", "rules", "alerts_test.yml")


@needs_promtool
def test_rule_unit_tests_catch_a_wrong_threshold(tmp_path):
    """The test file really pins the numbers: loosen the idle threshold and it fails."""
    for name in ("alerts.yml", "alerts_test.yml"):
        shutil.copy(PROM / name, tmp_path / name)
    rules = tmp_path / "alerts.yml"
    rules.write_text(rules.read_text().replace("< 0.05)", "< 0.7)"))
    p = subprocess.run([PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "GpulabGpuAllocatedIdle" in p.stdout + p.stderr


@needs_promtool
def test_config_is_valid(tmp_path):
    # promtool stats the credentials file: check a copy pointing at a test token.
    for name in ("prometheus.yml", "alerts.yml", "usage.yml"):
        shutil.copy(PROM / name, tmp_path / name)
    (tmp_path / "metrics-token").write_text("test-token\n")
    config = tmp_path / "prometheus.yml"
    text = config.read_text()
    assert "/etc/prometheus/secrets/metrics-token" in text
    config.write_text(text.replace("/etc/prometheus/secrets/metrics-token",
                                   str(tmp_path / "metrics-token")))
    out = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert "SUCCESS" in out


def test_config_scrapes_exporter_and_hub():
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["gpulab-exporter"]["static_configs"][0]["targets"] == ["exporter:9445"]
    hub = jobs["gpulab-hub"]
    assert hub["metrics_path"] == "/hub/metrics"
    assert hub["static_configs"][0]["targets"] == ["gpulab-hub:8081"]
    assert hub["authorization"]["credentials_file"] == "/etc/prometheus/secrets/metrics-token"
    # the backup service, by its Compose service name on gpulab-monitoring
    assert jobs["gpulab-backup"]["static_configs"][0]["targets"] == ["backup:9446"]
    assert config["rule_files"] == ["alerts.yml", "usage.yml"]


def test_every_alert_has_a_test_case():
    rules = yaml.safe_load((PROM / "alerts.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert names == ALERTS
    tests = yaml.safe_load((PROM / "alerts_test.yml").read_text())["tests"]
    for name in names:
        cases = [c for t in tests for c in t.get("alert_rule_test", []) if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in cases), f"{name}: no case where it fires"
        assert any(not c["exp_alerts"] for c in cases), f"{name}: no case where it stays quiet"


@needs_promtool
def test_usage_recording_rule_adds_up_gpu_hours():
    assert "3 rules found" in promtool("check", "rules", "usage.yml")
    promtool("test", "rules", "usage_test.yml")


def rendered(tmp_path: Path, scrape_seconds: str) -> subprocess.CompletedProcess:
    """The prometheus service's own entrypoint (docker-compose.yml), run here on a copy of
    monitoring/prometheus with GPULAB_SCRAPE_SECONDS, up to the point it starts
    Prometheus; what it wrote is in tmp_path/out."""
    compose = yaml.safe_load((PROM.parents[1] / "docker-compose.yml").read_text())
    script = compose["services"]["prometheus"]["entrypoint"][2].replace("$$", "$")
    script = (script.replace("/etc/prometheus/gpulab", str(PROM))
              .replace("/prometheus/gpulab-config", str(tmp_path / "out"))
              .replace('exec /usr/bin/prometheus "$@"', "exit 0"))
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "GPULAB_SCRAPE_SECONDS": scrape_seconds})


@needs_promtool
@pytest.mark.parametrize("seconds, scrape, timeout, evaluation, gpu_lost", [
    ("15", "15s", "10s", "30s", "60s"),  # a lab's: the files as they are
    ("2", "2s", "2s", "4s", "8s"),  # the test stack's
])
def test_the_entrypoint_scales_the_marked_intervals_and_prometheus_accepts_them(
        tmp_path, seconds, scrape, timeout, evaluation, gpu_lost):
    out = rendered(tmp_path, seconds)
    assert out.returncode == 0, out.stderr
    rules = yaml.safe_load((tmp_path / "out" / "alerts.yml").read_text())
    assert {r["alert"]: r.get("for") for g in rules["groups"] for r in g["rules"]
            }["GpulabGpuLost"] == gpu_lost
    config = yaml.safe_load((tmp_path / "out" / "prometheus.yml").read_text())["global"]
    assert (config["scrape_interval"], config["scrape_timeout"],
            config["evaluation_interval"]) == (scrape, timeout, evaluation)
    usage = yaml.safe_load((tmp_path / "out" / "usage.yml").read_text())
    assert {g["interval"] for g in usage["groups"]} == {scrape}
    (tmp_path / "out" / "metrics-token").write_text("t\n")
    for name in ("prometheus.yml", "prometheus.swarm.yml"):
        text = (tmp_path / "out" / name).read_text().replace(
            "/etc/prometheus/secrets/", str(tmp_path / "out") + "/")
        (tmp_path / "out" / name).write_text(text)
    (tmp_path / "out" / "exporter-token").write_text("t\n")
    promtool("check", "config", "prometheus.yml", cwd=tmp_path / "out")
    promtool("check", "config", "prometheus.swarm.yml", cwd=tmp_path / "out")
    if seconds == "15":  # a lab's stack runs exactly the files in the repository
        for name in ("prometheus.yml", "usage.yml", "alerts.yml"):
            assert (tmp_path / "out" / name).read_text().replace(
                str(tmp_path / "out") + "/", "/etc/prometheus/secrets/") == \
                (PROM / name).read_text()


def test_the_entrypoint_refuses_a_scrape_interval_that_is_no_number(tmp_path):
    out = rendered(tmp_path, "2s")
    assert out.returncode == 2 and "must be whole seconds" in out.stderr
