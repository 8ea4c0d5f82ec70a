"""gpulab.dashboard.usage: the days of a month, and GPU-hours per member, group and day."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from gpulab.dashboard.usage import month_days, parse_month, usage_csv, usage_model

NOW = datetime(2026, 11, 3, 6, 30, tzinfo=UTC)


def test_months_are_asked_for_as_yyyy_mm_and_never_in_the_future():
    assert parse_month(None, NOW.date()) == date(2026, 11, 1)
    assert parse_month("2026-02", NOW.date()) == date(2026, 2, 1)
    for bad in ("2026-13", "november", "2026-11-01"):
        with pytest.raises(ValueError, match="expected YYYY-MM"):
            parse_month(bad, NOW.date())
    with pytest.raises(ValueError, match="has not begun"):
        parse_month("2026-12", NOW.date())


def test_a_month_is_its_days_until_now():
    days = month_days(date(2026, 11, 1), NOW)
    assert [(d.day, end.isoformat(), s) for d, end, s in days] == [
        (1, "2026-11-02T00:00:00+00:00", 86400),
        (2, "2026-11-03T00:00:00+00:00", 86400),
        (3, "2026-11-03T06:30:00+00:00", 6 * 3600 + 1800)]
    assert len(month_days(date(2026, 10, 1), NOW)) == 31
    assert len(month_days(date(2026, 2, 1), NOW)) == 28


def test_gpu_hours_add_up_per_member_and_group_busiest_first():
    per_day = {date(2026, 11, 1): {"ann": 20.0, "bob": 1.5},
               date(2026, 11, 2): {"bob": 30.25},
               date(2026, 11, 3): {}}
    groups = {"students": ["bob", "cy"], "staff": ["ann"], "empty": []}
    waited = {"bob": 12.34, "cy": 3.0}  # minutes in line: cy waited and never got a GPU
    jobs = {"bob": 24.004}  # of his GPU-hours, his jobs'
    model = usage_model(date(2026, 11, 1), per_day, groups, waited, jobs)
    assert model["days"] == ["2026-11-01", "2026-11-02", "2026-11-03"]
    assert model["members"] == [
        {"user": "bob", "days": [1.5, 30.25, 0.0], "total": 31.75, "job_hours": 24.0,
         "waited_minutes": 12.3},
        {"user": "ann", "days": [20.0, 0.0, 0.0], "total": 20.0, "job_hours": 0.0,
         "waited_minutes": 0.0},
        {"user": "cy", "days": [0.0, 0.0, 0.0], "total": 0.0, "job_hours": 0.0,
         "waited_minutes": 3.0}]
    assert model["groups"] == [
        {"group": "students", "members": 2, "total": 31.75},
        {"group": "staff", "members": 1, "total": 20.0},
        {"group": "empty", "members": 0, "total": 0.0}]
    assert model["total"] == 51.75
    assert usage_csv(model).splitlines() == [
        "period,user,gpu_hours",
        "2026-11-01,bob,1.50", "2026-11-02,bob,30.25", "2026-11-01,ann,20.00",
        "2026-11,bob,31.75", "2026-11,ann,20.00", "2026-11,cy,0.00",
        "2026-11,group:students,31.75", "2026-11,group:staff,20.00",
        "2026-11,group:empty,0.00"]


def test_the_page_shows_each_members_waiting_time_beside_her_gpu_hours():
    import re

    from gpulab.dashboard.app import make_templates

    per_day = {date(2026, 11, 1): {"ann": 2.0}}
    model = usage_model(date(2026, 11, 1), per_day, {}, {"<cy>": 3.04}, {"ann": 1.5})
    model.update(previous="2026-10", next=None)
    page = make_templates().get_template("usage.html").render(
        model=model, page_url="u", csv_url="c", dashboard_url="d", user="pi",
        updated_text="now")
    rows = {re.sub(r"<[^>]+>", " ", r).split()[0]: re.sub(r"<[^>]+>", " ", r).split()[1:]
            for r in re.findall(r'<tr class="member">(.*?)</tr>', page, re.S)}
    # her month, her jobs' part of it, her wait, then each day
    assert rows == {"ann": ["2.00", "1.50", "0", "2.00"],
                    "&lt;cy&gt;": ["0.00", "0", "3.0", "min", "0"]}


def test_a_months_window_runs_from_its_first_midnight_to_now_or_its_end():
    from gpulab.dashboard.usage import month_window

    now = datetime(2026, 11, 3, 6, 0, tzinfo=UTC)
    assert month_window(date(2026, 11, 1), now) == (now, (2 * 24 + 6) * 3600)
    assert month_window(date(2026, 10, 1), now) == (datetime(2026, 11, 1, tzinfo=UTC),
                                                    31 * 24 * 3600)
    assert month_window(date(2026, 12, 1), now) is None  # not begun
