"""The PI's usage page (/services/gpus/usage): GPU-hours per member, group and day, from
Prometheus' recording rule (monitoring/prometheus/usage.yml), on the real stack.

A member holds a stand-in GPU for a measured while; the page, its JSON and its CSV
download (in Chromium, as an admin uses them) must show about that many GPU-hours for
today, counted in the member's group too. The hold and the waits are counted in the
stack's scrape intervals (2 s on the stack `make test` starts, 15 s on a lab's).
"""

from __future__ import annotations

import csv
import io
import time
from datetime import UTC, datetime

import pytest
import requests

from .browser import screenshot, submit_login
from .stack import HUB_URL, scrape_seconds, wait_for

pytestmark = pytest.mark.integration

USAGE = f"{HUB_URL}/services/gpus/usage"


def hold_and_tolerance(scrape: int) -> tuple[float, float]:
    """How long to hold the GPU (at least 30 s, and 6 samples), and how far the page may
    be off: Prometheus sees a lease up to a scrape late and counts whole samples (two
    scrapes either way), and the page rounds to 0.01 GPU-hours."""
    return max(30, 6 * scrape), 2 * scrape / 3600 + 0.005


def usage_json(admin, month: str | None = None) -> dict:
    r = requests.get(f"{HUB_URL}/services/gpus/api/usage", params={"month": month} if month
                     else None, headers={"Authorization": f"token {admin.token}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def today_hours(model: dict, user: str) -> float:
    today = datetime.now(UTC).date().isoformat()
    row = next((m for m in model["members"] if m["user"] == user), None)
    return 0.0 if row is None else row["days"][model["days"].index(today)]


def test_a_members_held_gpu_shows_up_as_gpu_hours(hub, hub_admin, lab_user, gpus_yaml,
                                                  fake_control, new_page):
    # fake_control: Prometheus counts what the exporter reports, and on a host without
    # GPUs only its fake GPUs (make test) carry the stand-in leases; else it says so.
    alice = lab_user("usage")
    group = f"usage-{alice.name[-8:]}"
    as_admin = {"Authorization": f"token {hub_admin.token}"}  # as an admin makes a group
    r = requests.post(f"{hub.api}/groups/{group}", json={"users": [alice.name]},
                      headers=as_admin, timeout=30)
    assert r.status_code == 201, r.text
    scrape = scrape_seconds()
    hold, tolerance = hold_and_tolerance(scrape)
    try:
        alice.start_server({"gpus": 1})
        started = time.monotonic()
        time.sleep(hold)
        alice.stop_server()
        held = time.monotonic() - started
        expected = held / 3600

        # Prometheus has the last samples within a scrape and a rule interval
        wait_for(lambda: today_hours(usage_json(hub_admin), alice.name) >= expected - tolerance,
                 4 * scrape + 30, interval=1, what="the usage page to count alice's GPU-hours")
        time.sleep(3 * scrape)  # nothing more is added once the lease has ended
        model = usage_json(hub_admin)
        hours = today_hours(model, alice.name)
        assert abs(hours - expected) <= tolerance, (hours, expected)
        assert {"group": group, "members": 1, "total": hours} in model["groups"]

        page = new_page()
        submit_login(page, hub_admin.name, hub_admin.token, next_url="/hub/home")
        assert page.goto(f"{HUB_URL}/services/gpus/").status == 200
        with page.expect_navigation():
            page.click("#usage-link")
        row = page.locator("#member-table tr.member", has_text=alice.name)
        assert row.count() == 1
        assert f"{hours:.2f}" in row.inner_text()
        screenshot(page, "usage-page.png")
        with page.expect_download() as download:
            page.click("#csv-link")
        rows = list(csv.reader(io.StringIO(open(download.value.path()).read())))
        today = datetime.now(UTC).date().isoformat()
        assert rows[0] == ["period", "user", "gpu_hours"]
        assert [today, alice.name, f"{hours:.2f}"] in rows
        assert [model["month"], f"group:{group}", f"{hours:.2f}"] in rows
    finally:
        requests.delete(f"{hub.api}/groups/{group}", headers=as_admin, timeout=30)


def test_a_bad_month_gets_a_clear_error(hub_admin):
    r = requests.get(f"{HUB_URL}/services/gpus/api/usage", params={"month": "2026-13"},
                     headers={"Authorization": f"token {hub_admin.token}"}, timeout=60)
    assert r.status_code == 400 and "expected YYYY-MM" in r.json()["error"], r.text
