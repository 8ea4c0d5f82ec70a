"""Bookings of GPUs for a time window, on the real stack, from outside: members book through the
published port (REST, with their login tokens) and on the page /hub/bookings in
Chromium; the GPU culler warns the member whose server holds a GPU someone booked, and
stops it when the booking starts; while it runs, nobody else gets the GPU, and the
booker's server does.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import requests

from .browser import screenshot, submit_login
from .stack import HUB_URL, container_logs, wait_for
from .standin import GPU0, GPU1, STANDIN_GPUS, gpus_of

ONE_GPU = STANDIN_GPUS.replace("  - {index: 1", "  # - {index: 1")  # GPU 0 only
WARN_BEFORE = 6  # seconds (culling.warn_before)
LEAD = 12  # seconds between booking and its start: the culler looks every second


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def bookings_api(user, method: str, path: str = "", **kw) -> requests.Response:
    return requests.request(method, f"{user.hub.api}/gpulab/bookings{path}",
                            headers={"Authorization": f"token {user.token}"}, timeout=30, **kw)


def book(user, gpus, start: float, end: float, for_user=None) -> requests.Response:
    return bookings_api(user, "POST", f"/{for_user or user.name}",
                        json={"gpus": gpus, "start": iso(start), "end": iso(end)})


def mine(user) -> list[dict]:
    r = bookings_api(user, "GET", f"/{user.name}")
    assert r.status_code == 200, r.text
    return r.json()["bookings"]


def test_bad_bookings_are_refused_with_the_reason_and_change_nothing(hub, lab_user, lab_config,
                                                                     gpus_yaml, hub_admin):
    lab_config.write("gpus.yaml", STANDIN_GPUS.replace("max_gpus: 1", "max_gpus: 2")
                     + "bookings: {max_length: 2h, max_ahead: 2d}\n")
    alice, bob = lab_user("alice"), lab_user("bob")
    now = time.time()
    r = book(alice, 1, now + 3600, now + 7200)
    assert r.status_code == 201, r.text
    kept = r.json()
    assert kept["mine"] and kept["user"] == alice.name and kept["gpus"] == 1
    before = mine(alice)
    assert [b["id"] for b in before] == [kept["id"]]

    refused = [
        ({"gpus": -1, "start": iso(now + 60), "end": iso(now + 600)}, 400,
         '"gpus" must be a whole number of GPUs, 1 or more, got -1'),
        ({"gpus": 1, "start": iso(now - 3600), "end": iso(now + 600)}, 400,
         "cannot start in the past"),
        ({"gpus": 1, "start": iso(now + 600), "end": iso(now + 60)}, 400,
         "must end after it starts"),
        ({"gpus": 1, "start": "2027-01-11T09:00:00", "end": iso(now + 600)}, 400,
         "needs its time zone"),
        ({"gpus": 1, "start": iso(now + 60), "end": iso(now + 4 * 3600)}, 400,
         "may last at most 2 h"),
        ({"gpus": 1, "start": iso(now + 3 * 86400), "end": iso(now + 3 * 86400 + 60)}, 400,
         "at most 2 days ahead"),
        ({"gpus": 3, "start": iso(now + 60), "end": iso(now + 600)}, 403,
         "You may book at most 2 GPUs at a time"),
        ({"gpus": 1, "start": iso(now + 5400), "end": iso(now + 9000)}, 409,
         "which overlaps this one"),
        ({"gpus": 1, "start": iso(now + 60)}, 400, 'A booking is {"gpus": N'),
        ({"gpus": 1, "start": iso(now + 60), "end": iso(now + 600), "user": bob.name}, 400,
         "got keys"),
    ]
    for body, status, words in refused:
        r = bookings_api(alice, "POST", f"/{alice.name}", json=body)
        assert r.status_code == status and words in r.json()["message"], (body, r.text)
    # another member's bookings are not hers to make or cancel
    r = book(bob, 1, now + 60, now + 600, for_user=alice.name)
    assert r.status_code == 404, r.text
    assert bookings_api(bob, "DELETE", f"/{alice.name}/{kept['id']}").status_code == 404
    assert bookings_api(alice, "DELETE", f"/{alice.name}/999999").status_code == 404
    assert mine(alice) == before, "a refused request changed her bookings"

    # both GPUs booked by others then: refused, saying so
    r = book(hub_admin, 1, now + 3600, now + 7200, for_user=bob.name)  # an admin, for bob
    assert r.status_code == 201 and r.json()["made_by"] == hub_admin.name, r.text
    for_bob = r.json()
    carol = lab_user("carol")
    r = book(carol, 1, now + 3000, now + 4000)
    assert r.status_code == 409 and "Not enough GPUs for that time" in r.json()["message"]
    # the calendar: every booking, other members' names for admins only
    calendar = bookings_api(carol, "GET").json()["bookings"]
    ours = [b for b in calendar if b["id"] in (kept["id"], for_bob["id"])]
    assert len(ours) == 2 and all(b["user"] is None and not b["mine"] for b in ours), calendar
    names = {b["user"] for b in bookings_api(hub_admin, "GET").json()["bookings"]}
    assert {alice.name, bob.name} <= names
    for who in (alice, bob):
        for b in mine(who):
            assert bookings_api(who, "DELETE", f"/{who.name}/{b['id']}").status_code == 204
    assert mine(alice) == [] and mine(bob) == []


def test_a_booking_stops_an_unbooked_holder_after_the_warning_and_keeps_its_gpu(
        hub, lab_user, lab_config, gpus_yaml, new_page, hub_admin):
    lab_config.write("gpus.yaml", ONE_GPU + "  gpu_idle_timeout: 0\n"
                     + f"culling: {{warn_before: {WARN_BEFORE}s, check_every: 1s}}\n")
    alice, bob, carol = lab_user("alice"), lab_user("bob"), lab_user("carol")
    alice.start_server({"gpus": 1})
    assert gpus_of(alice.container)["label"] == GPU0
    page = new_page()
    submit_login(page, alice.name, alice.token, next_url="/hub/home")

    start = time.time() + LEAD
    r = book(bob, 1, start, start + 600)
    assert r.status_code == 201, r.text
    assert r.json()["gpu_labels"] == ["GPU 0 (stand-in)"]

    # alice is warned before it starts, on her home page
    def warned():
        page.reload()
        return page.locator("#gpu-notices .gpu-notice[data-kind=warning]").count() == 1

    wait_for(warned, LEAD, interval=0.5, what="the culler's warning on alice's home page")
    assert time.time() < start, "warned only after the booking started"
    text = page.locator("#gpu-notices .gpu-notice[data-kind=warning]").inner_text()
    assert "its GPU is booked by another member from" in text, text
    screenshot(page, "booking-warning.png")

    # stopped when it starts (the culler looks every second), not before
    wait_for(lambda: hub.server_model(alice.name) is None, LEAD + 30, interval=0.5,
             what="the culler to stop alice's server")
    stopped = time.time()
    assert stopped >= start, f"stopped {start - stopped:.1f} s before the booking started"
    print(f"alice's server stopped {stopped - start:.1f} s after the booking started")
    page.reload()
    text = page.locator("#gpu-notices .gpu-notice[data-kind=stopped]").inner_text()
    assert "was stopped: its GPU is booked by another member" in text, text

    # operators see it on the GPU dashboard, running
    ops = new_page()
    submit_login(ops, hub_admin.name, hub_admin.token, next_url="/services/gpus/")
    row = ops.locator("#booking-rows tr.booking", has_text=bob.name)
    row.wait_for(timeout=15_000)
    # the page redraws on its own refresh: it may still show the booking as ahead
    # ("booked") from the snapshot before the start; wait for the redraw, not a clock
    wait_for(lambda: "now" in row.inner_text(), 60, interval=0.5,
             what="the dashboard to show bob's booking running now")
    assert "GPU 0" in row.inner_text(), row.inner_text()

    # while it runs the GPU is bob's: carol's spawn finds it taken, bob's gets it
    r = requests.post(f"{hub.api}/users/{carol.name}/server", json={"gpus": 1},
                      headers={"Authorization": f"token {carol.token}"}, timeout=60)
    assert r.status_code == 409 and "1/1 in use (booked by a member)" in r.json()["message"]
    bob.start_server({"gpus": 1})
    assert gpus_of(bob.container)["label"] == GPU0
    bob.stop_server()
    # ...also when his server is stopped; cancelled, it is free again
    r = requests.post(f"{hub.api}/users/{carol.name}/server", json={"gpus": 1},
                      headers={"Authorization": f"token {carol.token}"}, timeout=60)
    assert r.status_code == 409, r.text
    [b] = mine(bob)
    assert b["running"] and bookings_api(bob, "DELETE", f"/{bob.name}/{b['id']}").status_code == 204
    carol.start_server({"gpus": 1})
    assert gpus_of(carol.container)["label"] == GPU0


def test_a_start_takes_a_gpu_nobody_booked_and_says_so_when_none_is(hub, lab_user, lab_config,
                                                                   gpus_yaml):
    """bob booked GPU 0 for tomorrow: carol, starting now, gets GPU 1 (by index she
    would have had GPU 0, to be stopped tomorrow); dan, with only GPU 0 left, gets it
    and is told at once when it will be stopped."""
    lab_config.write("gpus.yaml", STANDIN_GPUS)
    bob, carol, dan = lab_user("bob"), lab_user("carol"), lab_user("dan")
    tomorrow = time.time() + 86400
    r = book(bob, 1, tomorrow, tomorrow + 3600)
    assert r.status_code == 201 and r.json()["gpu_labels"] == ["GPU 0 (stand-in)"], r.text
    carol.start_server({"gpus": 1})
    assert gpus_of(carol.container)["label"] == GPU1
    dan.start_server({"gpus": 1})
    assert gpus_of(dan.container)["label"] == GPU0
    log = container_logs("gpulab-hub", 200)
    assert f"{dan.name}: Another member has booked this GPU from " in log and \
        "this server will be stopped then, after a warning" in log, log[-3000:]


def test_the_lines_estimate_waits_out_another_members_booking(hub, lab_user, lab_config,
                                                              gpus_yaml):
    """alice's server holds the one GPU for an hour at most; carol booked it from in
    10 minutes for two hours: dave, waiting in line, is told when carol's booking ends,
    not when alice's hour does."""
    lab_config.write("gpus.yaml", ONE_GPU + "  max_server_age: 1h\n")
    alice, carol, dave = lab_user("alice"), lab_user("carol"), lab_user("dave")
    alice.start_server({"gpus": 1})
    start = time.time() + 600
    r = book(carol, 1, start, start + 7200)
    assert r.status_code == 201, r.text
    r = requests.post(f"{hub.api}/users/{dave.name}/server", json={"gpus": 1, "wait": True},
                      headers={"Authorization": f"token {dave.token}"}, timeout=60)
    assert r.status_code == 202, r.text

    def estimate():
        r = requests.get(f"{hub.api}/gpulab/line/{dave.name}",
                         headers={"Authorization": f"token {dave.token}"}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["line"][0]["eta"]
    eta = wait_for(estimate, 60, interval=1, what="the line to estimate dave's turn")
    assert abs(eta - (start + 7200)) < 2, (eta, start + 7200)
    # he leaves the line (else it starts his server as alice's teardown frees the GPU)
    r = requests.delete(f"{hub.api}/gpulab/line/{dave.name}",
                        headers={"Authorization": f"token {dave.token}"}, timeout=30)
    assert r.status_code == 204, r.text


def test_members_book_and_cancel_on_the_bookings_page(hub, lab_user, lab_config, gpus_yaml,
                                                     new_page):
    from playwright.sync_api import expect

    lab_config.write("gpus.yaml", STANDIN_GPUS)
    bob, carol = lab_user("bob"), lab_user("carol")
    page = new_page()
    submit_login(page, bob.name, bob.token, next_url="/hub/home")
    page.click("#gpu-bookings-link a")
    page.wait_for_url(f"{HUB_URL}/hub/bookings")
    # the limits come with the calendar from the API, after the page itself
    expect(page.locator("#booking-limits")).to_contain_text("A booking lasts at most 8 h",
                                                            timeout=30_000)
    # tomorrow 10:00-12:00 in the browser's own time
    day = (datetime.now() + timedelta(days=1)).strftime("%Y-%m-%d")
    page.fill("#booking-gpus", "1")
    page.fill("#booking-start", f"{day}T10:00")
    page.fill("#booking-end", f"{day}T12:00")
    page.click("#booking-form button[type=submit]")
    said = page.locator("#booking-said")
    said.wait_for(state="visible")
    assert said.inner_text().startswith("Booked: GPU 0 (stand-in)"), said.inner_text()
    row = page.locator("#booking-calendar tr.booking")
    row.wait_for()
    assert "you" in row.inner_text() and "GPU 0" in row.inner_text()
    screenshot(page, "bookings-page.png")
    [b] = mine(bob)
    start = datetime.fromisoformat(b["start"])
    assert start.astimezone().strftime("%Y-%m-%d %H:%M") == f"{day} 10:00"
    # a refusal is shown, not swallowed: the same time again overlaps his booking
    page.click("#booking-form button[type=submit]")
    page.wait_for_function("document.querySelector('#booking-said').className"
                           ".includes('alert-danger')")
    assert "overlaps" in said.inner_text(), said.inner_text()

    # carol sees it in the calendar without his name, and cannot cancel it
    other = new_page()
    submit_login(other, carol.name, carol.token, next_url="/hub/bookings")
    theirs = other.locator("#booking-calendar tr.booking", has_text="another member")
    theirs.wait_for()
    assert bob.name not in theirs.inner_text()
    assert theirs.locator(".booking-cancel").count() == 0

    page.locator(".booking-cancel").click()
    page.wait_for_function("!document.querySelector('#booking-calendar tr.booking')")
    assert mine(bob) == []
