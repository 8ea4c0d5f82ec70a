"""The line in Prometheus (gpulab.line.metrics): the families the hub's /hub/metrics
carries, read through prometheus_client's own text exposition, and gpus.yaml's
line.alert_after. The alert that uses them is tested by promtool
(monitoring/prometheus/alerts_test.yml); the hub's real /hub/metrics, scraped by the
real Prometheus, by tests/integration/test_line.py."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpulab.gpus.config import parse_gpus_config
from gpulab.line import metrics
from gpulab.line.order import Entry
from gpulab.line.store import LineStore
from gpulab.yamlfile import ConfigError

NOW = 1_800_000_000.0


def samples(registry: CollectorRegistry) -> dict[tuple, float]:
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def as_registry(families) -> CollectorRegistry:
    class Fixed:
        def collect(self):
            return families

    registry = CollectorRegistry()
    registry.register(Fixed())
    return registry


def test_waiting_and_offered_servers_with_how_long_each_has_waited():
    entries = [Entry(1, "ann", "", 1, NOW - 600),
               Entry(2, "bob", "big", 2, NOW - 900, offered_at=NOW - 60),
               Entry(3, "cy", "", 1, NOW - 30)]
    got = samples(as_registry(metrics.families(entries, parse_gpus_config(""), NOW)))
    assert got == {
        ("gpulab_line_waiting", ()): 2.0,
        ("gpulab_line_offered", ()): 1.0,
        ("gpulab_line_wait_seconds", (("server", ""), ("state", "waiting"), ("user", "ann"))): 600.0,
        ("gpulab_line_wait_seconds", (("server", "big"), ("state", "offered"), ("user", "bob"))): 900.0,
        ("gpulab_line_wait_seconds", (("server", ""), ("state", "waiting"), ("user", "cy"))): 30.0,
        ("gpulab_line_alert_after_seconds", ()): 1800.0,  # the default: 30 minutes
        ("gpulab_line_idle_below_ratio", ()): 0.05,
    }


def test_an_empty_line_is_zero_and_alert_after_0_exports_no_limit():
    config = parse_gpus_config("line: {alert_after: 0}\nculling: {idle_below: 10}\n")
    got = samples(as_registry(metrics.families([], config, NOW)))
    assert got == {("gpulab_line_waiting", ()): 0.0, ("gpulab_line_offered", ()): 0.0,
                   ("gpulab_line_idle_below_ratio", ()): 0.1}


def test_a_clock_behind_a_join_never_makes_a_negative_wait():
    (wait,) = [f for f in metrics.families([Entry(1, "ann", "", 1, NOW + 5)],
                                            parse_gpus_config(""), NOW)
               if f.name == "gpulab_line_wait_seconds"]
    assert [s.value for s in wait.samples] == [0.0]


def test_the_collector_reads_the_store_and_the_last_good_gpus_yaml_at_each_scrape(tmp_path):
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("line: {alert_after: 1h}\n")
    store = LineStore(tmp_path / "line.sqlite", now=lambda: NOW - 120)
    registry = CollectorRegistry()
    collector = metrics.register(store.path, gpus, registry)
    collector.now = lambda: NOW
    assert samples(registry)[("gpulab_line_waiting", ())] == 0.0
    store.join("ann", "", 1)
    got = samples(registry)
    assert got[("gpulab_line_waiting", ())] == 1.0
    assert got[("gpulab_line_wait_seconds",
                (("server", ""), ("state", "waiting"), ("user", "ann")))] == 120.0
    assert got[("gpulab_line_alert_after_seconds", ())] == 3600.0
    # a broken edit of gpus.yaml: the last good version still counts
    gpus.write_text("line: {alert_after: soon}\n")
    assert samples(registry)[("gpulab_line_alert_after_seconds", ())] == 3600.0


def test_registering_again_replaces_the_collector(tmp_path):
    registry = CollectorRegistry()
    metrics.register(tmp_path / "line.sqlite", tmp_path / "gpus.yaml", registry)
    metrics.register(tmp_path / "line.sqlite", tmp_path / "gpus.yaml", registry)
    text = generate_latest(registry).decode()
    assert text.count("\ngpulab_line_waiting ") == 1, text


@pytest.mark.parametrize("text, seconds", [("", 1800), ("line: {alert_after: 2h}", 7200),
                                           ("line: {alert_after: 0}", 0)])
def test_alert_after_in_gpus_yaml(text, seconds):
    assert parse_gpus_config(text).line.alert_after == seconds


def test_a_bad_alert_after_is_a_clear_error_with_its_line():
    with pytest.raises(ConfigError, match=r"gpus.yaml:2: line.alert_after"):
        parse_gpus_config("# the line\nline: {alert_after: soon}\n")


def test_an_unreadable_store_leaves_the_lines_families_out_and_the_rest_served(tmp_path):
    (tmp_path / "line.sqlite").mkdir()  # a folder where the store should be
    registry = CollectorRegistry()
    metrics.register(tmp_path / "line.sqlite", tmp_path / "gpus.yaml", registry)
    assert samples(registry) == {}  # no exception: the scrape still answers
