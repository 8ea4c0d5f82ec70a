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


def test_registries_made_and_dropped_one_after_another_each_get_their_own_collector(tmp_path):
    """Each test's registry is dropped after it: a new one may get a dead one's id().
    Kept by id, register() unregistered the dead one's collector from the new registry
    (KeyError in CI's unit lane); 200 in a row reproduced it every time."""
    for _ in range(200):
        registry = CollectorRegistry()
        collector = metrics.register(tmp_path / "line.sqlite", tmp_path / "gpus.yaml",
                                     registry)
        assert registry._collector_to_names.keys() == {collector}
        del registry


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


# ---------------------------------------------------------------- budget use

BUDGETS = """\
defaults: {budget: {gpu_hours: 10, per: month}}
groups:
  students: {budget: {gpu_hours: 4, per: week, enforce: hard}}
  staff: {budget: none}
users:
  zed: {budget: {gpu_hours: 1, per: week}}
"""


def test_budget_use_per_member_and_group_with_each_members_own_budget():
    from gpulab.line.usage import Usage

    usage = Usage(periods={"week": {"sue": 3.5, "tim": 1.0, "zed": 2.0},
                           "month": {"sue": 9.0, "tim": 1.0, "zed": 2.0, "ann": 12.0}},
                  groups={"students": ("sue", "tim", "tim"), "staff": ("pat",)})
    got = samples(as_registry(metrics.budget_families(parse_gpus_config(BUDGETS), usage)))
    used = {labels: v for (name, labels), v in got.items()
            if name == "gpulab_budget_used_gpu_hours"}
    assert used[(("period", "week"), ("user", "sue"))] == 3.5
    assert used[(("period", "month"), ("user", "ann"))] == 12.0
    # pat, in a group but with no use yet, used 0 (not "unknown")
    assert used[(("period", "week"), ("user", "pat"))] == 0.0
    assert {labels for labels in used} == {(("period", p), ("user", u)) for p in
                                           ("week", "month")
                                           for u in ("ann", "pat", "sue", "tim", "zed")}
    budgets = {labels: v for (name, labels), v in got.items()
               if name == "gpulab_budget_gpu_hours"}
    assert budgets == {
        (("enforce", "soft"), ("period", "month"), ("user", "ann")): 10.0,  # the default
        (("enforce", "hard"), ("period", "week"), ("user", "sue")): 4.0,  # her group's
        (("enforce", "hard"), ("period", "week"), ("user", "tim")): 4.0,
        (("enforce", "soft"), ("period", "week"), ("user", "zed")): 1.0,  # his own entry
    }  # pat: staff have none
    groups = {labels: v for (name, labels), v in got.items()
              if name == "gpulab_group_used_gpu_hours"}
    assert groups == {(("group", "students"), ("period", "week")): 4.5,  # tim counted once
                      (("group", "students"), ("period", "month")): 10.0,
                      (("group", "staff"), ("period", "week")): 0.0,
                      (("group", "staff"), ("period", "month")): 0.0}


def test_budget_use_is_left_out_while_the_line_services_numbers_are_old_or_absent(tmp_path):
    from gpulab.line import usage

    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(BUDGETS)
    registry = CollectorRegistry()
    collector = metrics.register(tmp_path / "line.sqlite", gpus, registry,
                                 usage_path=tmp_path / "usage.json")
    collector.now = lambda: NOW
    names = lambda: {name for name, _ in samples(registry)}  # noqa: E731
    assert "gpulab_budget_used_gpu_hours" not in names()  # no file yet
    usage.write(tmp_path / "usage.json", NOW - 30, None, {"month": {"ann": 2.0}},
                {"students": ["sue"]})
    got = samples(registry)
    assert got[("gpulab_budget_used_gpu_hours", (("period", "month"), ("user", "ann")))] == 2.0
    assert got[("gpulab_budget_used_gpu_hours", (("period", "month"), ("user", "sue")))] == 0.0
    # sue's week budget (her group's) is not shown while this week's use is not known
    assert ("gpulab_budget_gpu_hours", (("enforce", "hard"), ("period", "week"),
                                        ("user", "sue"))) not in got
    assert got[("gpulab_group_used_gpu_hours", (("group", "students"), ("period", "month")))] == 0.0
    collector.now = lambda: NOW - 30 + usage.MAX_AGE + 1  # the line service stopped
    assert "gpulab_budget_used_gpu_hours" not in names()
    assert "gpulab_line_waiting" in names()  # the line's own families are still there


def test_a_shared_budget_is_the_groups_not_each_members():
    from gpulab.line.usage import Usage

    config = parse_gpus_config(
        "groups: {lab: {budget: {gpu_hours: 50, per: week, enforce: hard, shared: true}}}\n")
    usage = Usage(periods={"week": {"ann": 30.0, "bob": 25.0}}, groups={"lab": ("ann", "bob")})
    got = samples(as_registry(metrics.budget_families(config, usage)))
    assert got[("gpulab_group_budget_gpu_hours",
                (("enforce", "hard"), ("group", "lab"), ("period", "week")))] == 50.0
    assert got[("gpulab_group_used_gpu_hours", (("group", "lab"), ("period", "week")))] == 55.0
    assert not [k for k in got if k[0] == "gpulab_budget_gpu_hours"]  # nobody's own
