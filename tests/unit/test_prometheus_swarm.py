"""Every GPU series carries its node on a Swarm (prometheus.swarm.yml): the nodes found
through the manager's Docker API, each scraped at <address>:9445 and labelled with its
hostname; the single-host config stays as it was. The swarm config keeps
everything else of prometheus.yml (rules, Alertmanager, the hub's scrape), and the real
promtool accepts it. tests/integration/test_monitoring_nodes.py runs it in a real
Prometheus against a Docker API that lists nodes."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

PROM = Path(__file__).resolve().parents[2] / "monitoring" / "prometheus"
PROMTOOL = shutil.which("promtool")
TOKEN = "/etc/prometheus/secrets/metrics-token"
EXPORTER_TOKEN = "/etc/prometheus/secrets/exporter-token"  # the GPU servers' exporters


def load(name):
    return yaml.safe_load((PROM / name).read_text())


def jobs(config):
    return {j["job_name"]: j for j in config["scrape_configs"]}


def test_single_host_exporter_has_no_node_label():
    """Left as it was: a static node label would change every exporter series' label set,
    and the stack's own tests read them as promtool prints them (test_monitoring.py
    looks for `job="gpulab-exporter"} => 1`, which a trailing node="..." breaks). The
    dashboard needs none there: no node label reads as one machine."""
    exporter = jobs(load("prometheus.yml"))["gpulab-exporter"]
    assert exporter["static_configs"] == [{"targets": ["exporter:9445"]}]


def test_swarm_config_differs_only_in_how_exporters_are_found():
    single, swarm = load("prometheus.yml"), load("prometheus.swarm.yml")
    assert {k: v for k, v in swarm.items() if k != "scrape_configs"} == \
        {k: v for k, v in single.items() if k != "scrape_configs"}
    assert jobs(swarm)["gpulab-hub"] == jobs(single)["gpulab-hub"]
    assert jobs(swarm)["gpulab-backup"] == jobs(single)["gpulab-backup"]
    assert set(jobs(swarm)) == set(jobs(single)) == {"gpulab-exporter", "gpulab-hub",
                                                     "gpulab-backup"}


def test_swarm_exporter_job_discovers_ready_nodes_through_the_read_only_proxy():
    job = jobs(load("prometheus.swarm.yml"))["gpulab-exporter"]
    assert "static_configs" not in job
    [sd] = job["dockerswarm_sd_configs"]
    assert (sd["host"], sd["role"], sd["port"]) == ("tcp://docker-proxy-ro:2375", "nodes", 9445)
    rules = [(r.get("source_labels"), r.get("regex"), r.get("action", "replace"),
              r.get("target_label"), r.get("replacement")) for r in job["relabel_configs"]]
    assert rules == [
        (["__meta_dockerswarm_node_status"], "ready", "keep", None, None),
        (["__meta_dockerswarm_node_availability"], "drain", "drop", None, None),
        (["__meta_dockerswarm_node_label_gpulab_exporter"], "false", "drop", None, None),
        (["__meta_dockerswarm_node_address"], None, "replace", "__address__", "$1:9445"),
        (["__meta_dockerswarm_node_hostname"], None, "replace", "node", None),
    ]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install "
                                             "--no-install-recommends prometheus)")
def test_swarm_config_is_valid(tmp_path):
    for name in ("prometheus.swarm.yml", "alerts.yml", "usage.yml"):
        shutil.copy(PROM / name, tmp_path / name)
    (tmp_path / "metrics-token").write_text("test-token\n")
    (tmp_path / "exporter-token").write_text("test-token\n")
    config = tmp_path / "prometheus.swarm.yml"
    text = config.read_text()
    assert TOKEN in text and EXPORTER_TOKEN in text
    config.write_text(text.replace(TOKEN, str(tmp_path / "metrics-token"))
                      .replace(EXPORTER_TOKEN, str(tmp_path / "exporter-token")))
    p = subprocess.run([PROMTOOL, "check", "config", config.name], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "SUCCESS" in p.stdout + p.stderr, p.stdout + p.stderr


def test_the_read_only_swarm_proxy_lets_prometheus_list_nodes():
    from gpulab.dockerapi.policy import proxy_verdict

    # what Prometheus' Docker client sends for role: nodes without filters
    decision = proxy_verdict("GET", "/v1.41/nodes", read_only=True, swarm=True)
    assert decision.allowed, decision.reasons
    # and nothing else of the Swarm's: services and tasks hold members' environments
    for target in ("/v1.41/services?filters=%7B%22label%22%3A%5B%22org.gpulab.managed%3Dtrue%22%5D%7D",
                   "/v1.41/tasks", f"/v1.41/nodes/{'a' * 25}"):
        assert not proxy_verdict("GET", target, read_only=True, swarm=True).allowed, target
