"""The line for GPUs on the real stack: members who ask with "wait": true when the one
stand-in GPU is taken get a place instead of a 409, the hub keeps the freed GPU for the
first of them (nobody else takes it), the line service starts her server, and stops it
again if she does not open it within the claim window, giving the GPU to the next.

Members act as they would: through the published port with their login tokens, and in
Chromium for their home page. "Opening" a server is a request to it through the proxy,
as JupyterLab makes all the time.
"""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime

import pytest
import requests

from .browser import jupyterlab_shows, screenshot, submit_login
from .restarts import kill_from_host, wait_restarted
from .smtp_sink import MAIL_ON
from .stack import HUB_URL, docker, prometheus_query, wait_for
from .standin import GPU0, GPU1, STANDIN_GPUS, gpus_of

ONE_GPU = STANDIN_GPUS.replace("  - {index: 1", "  # - {index: 1")  # GPU 0 only
CLAIM_WINDOW = 20  # seconds (line.claim_window); the test stack's line looks every 2 s
ALERT_AFTER = 4  # seconds (line.alert_after)


def spawn(user, options: dict) -> requests.Response:
    return requests.post(f"{user.hub.api}/users/{user.name}/server", json=options,
                         headers={"Authorization": f"token {user.token}"}, timeout=60)


def line_of(user) -> list[dict]:
    r = requests.get(f"{user.hub.api}/gpulab/line/{user.name}",
                     headers={"Authorization": f"token {user.token}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["line"]


def place(user) -> tuple[str, int, int] | None:
    mine = line_of(user)
    return (mine[0]["state"], mine[0]["position"], mine[0]["waiting"]) if mine else None


def server_ready(user) -> bool:
    model = user.hub.server_model(user.name)
    return bool(model and model["ready"])


def place_offered_at(user) -> float:
    """When the line started *user*'s server (her claim window opened)."""
    return line_of(user)[0]["offered_at"]


def open_server(user) -> bool:
    """What her JupyterLab does once she opens it: ask her server, through the proxy."""
    r = requests.get(f"{HUB_URL}/user/{user.name}/api/status",
                     headers={"Authorization": f"token {user.token}"}, timeout=30)
    return r.status_code == 200


# A stand-in for the browser's Notification API (headless Chromium shows none): what the
# home page would show, recorded in localStorage, which survives the page's reloads.
RECORDING_NOTIFICATION = """
window.Notification = class RecordingNotification {
  constructor(title, options) {
    const seen = JSON.parse(localStorage.getItem("test-notifications") || "[]");
    seen.push([title, (options || {}).body || ""]);
    localStorage.setItem("test-notifications", JSON.stringify(seen));
  }
  static get permission() { return "granted"; }
  static requestPermission() { return Promise.resolve("granted"); }
};
"""


def notifications(page) -> list | None:
    """The notifications the page showed (kept in localStorage, which outlives a
    navigation). None while the page navigates: CI saw the read land on the home page's
    own navigation ("Execution context was destroyed"); the next poll reads again."""
    from playwright.sync_api import Error

    try:
        return page.evaluate("JSON.parse(localStorage.getItem('test-notifications') || '[]')")
    except Error as e:
        if "Execution context was destroyed" not in str(e):
            raise
        return None


def home_page_line(page, user) -> str:
    submit_login(page, user.name, user.token, next_url="/hub/home")
    return page.locator("#gpu-line").inner_text()


def test_members_wait_in_line_and_get_the_gpu_in_turn(hub, hub_admin, lab_user, lab_config,
                                                       gpus_yaml, fake_control, new_page):
    # servers may run for an hour: the line can say by when the GPU comes back;
    # operators are alerted when someone waited ALERT_AFTER while a GPU sat idle
    lab_config.write("gpus.yaml", ONE_GPU.replace("max_gpus: 1", "max_gpus: 1\n  max_server_age: 1h")
                     + "culling: {check_every: 2s}\n"
                     + f"line: {{claim_window: {CLAIM_WINDOW}s, alert_after: {ALERT_AFTER}s}}\n")
    fake_control({"utilization": {"0": 0, "1": 0}})  # alice's GPU will sit idle
    alice, bob, carol, dave = (lab_user(n) for n in ("alice", "bob", "carol", "dave"))
    alice.start_server({"gpus": 1})
    alice_started = datetime.fromisoformat(
        hub.server_model(alice.name)["started"].replace("Z", "+00:00")).timestamp()

    # Nothing free: without "wait" the 409 stays, and says how to wait instead.
    r = spawn(dave, {"gpus": 1})
    assert r.status_code == 409, r.text
    assert "Wait in line" in r.json()["message"]
    r = spawn(dave, {"gpus": 1, "wait": "yes"})
    assert r.status_code == 400 and '"wait" must be true or false' in r.json()["message"]
    # what the line service may say of an entry: a clear 400 for anything else
    r = requests.patch(f"{hub.api}/gpulab/line/{dave.name}", json={"up": "yes"}, timeout=30,
                       headers={"Authorization": f"token {hub_admin.token}"})
    assert r.status_code == 400 and '{"up": true}' in r.json()["message"], r.text

    r = spawn(bob, {"gpus": 1, "wait": True})
    assert r.status_code == 202, r.text
    assert "you are number 1 in line (1 waiting)" in r.json()["message"]
    r = spawn(carol, {"gpus": 1, "wait": True})
    assert r.status_code == 202 and "number 2 in line (2 waiting)" in r.json()["message"]
    assert place(bob) == ("waiting", 1, 2) and place(carol) == ("waiting", 2, 2)
    assert hub.server_model(bob.name) is None  # nothing runs for him yet
    # the GPU culler says when alice's server reaches its hour; bob is next, carol after
    wait_for(lambda: line_of(bob)[0]["eta"], 60, interval=1,
             what="the line to estimate bob's turn from the GPU culler's clocks")
    (mine,) = line_of(bob)
    assert mine["eta_kind"] == "age" and abs(mine["eta"] - (alice_started + 3600)) < 60, mine
    # carol's turn: after bob's hour on it, at the latest
    assert abs(line_of(carol)[0]["eta"] - (mine["eta"] + 3600)) < 1, line_of(carol)
    page = new_page()
    banner = home_page_line(page, carol)
    assert "you are number 2 of 2" in banner, banner
    page.wait_for_selector(".gpu-line-eta:has-text('at the latest')")
    screenshot(page, "line-waiting.png")

    # bob keeps his home page open, with browser notifications allowed.
    bob_page = new_page()
    bob_page.context.add_init_script(RECORDING_NOTIFICATION)
    assert "you are number 1 of 2" in home_page_line(bob_page, bob)
    bob_page.wait_for_selector(".gpu-line-eta:has-text('at the latest')")

    # Operators: the GPU dashboard shows who waits, in order, under the table
    ops = new_page()
    submit_login(ops, hub_admin.name, hub_admin.token, next_url="/services/gpus/")

    def dashboard_line() -> list[list[str]]:
        return [r.split()[:2] + r.split()[-1:]
                for r in ops.locator("#line-rows tr").all_inner_texts()]
    assert dashboard_line() == [["1", bob.name, "waiting"], ["2", carol.name, "waiting"]]

    # The GPU comes free: it is bob's. dave, not in line, cannot take it in between.
    alice.stop_server()
    r = spawn(dave, {"gpus": 1})
    assert r.status_code == 409, r.text
    wait_for(lambda: server_ready(bob), 120, interval=0.5,
             what="the line to start bob's server with the freed GPU")
    assert gpus_of(bob.container)["device_ids"] == [GPU0]
    assert place(bob)[0] == "offered" and place(carol) == ("waiting", 1, 1)
    # the dashboard, redrawing itself, says the line started his server
    wait_for(lambda: dashboard_line() == [["-", bob.name, "yet"], ["1", carol.name, "waiting"]],
             20, interval=1, what="the GPU dashboard to show bob's started server")
    screenshot(ops, "line-on-the-gpu-dashboard.png")

    # Prometheus has the line from the hub's /hub/metrics; carol, who has waited past
    # line.alert_after while the GPU started for bob sits idle (he has not opened it),
    # gets the operators' alert; bob, whose server the line started, no longer does.
    def alerted() -> set[str]:
        out = prometheus_query('ALERTS{alertname="GpulabWaitingWhileGpuIdle",'
                               'alertstate="firing"}')
        return {u.name for u in (bob, carol, dave) if f'user="{u.name}"' in out}
    wait_for(lambda: alerted() == {carol.name}, 30, interval=1,
             what="GpulabWaitingWhileGpuIdle to fire in Prometheus for carol alone")
    for family, count in (("gpulab_line_waiting", 1), ("gpulab_line_offered", 1)):
        out = prometheus_query(family)
        assert f"=> {count} @" in out, out
    # his open home page (it looks again every 10 s) tells him, and so does his browser
    seen = wait_for(lambda: notifications(bob_page), 30, interval=1,
                    what="bob's home page to notify him that his GPUs are ready")
    ((title, body),) = seen
    assert title == "Your GPUs are ready" and "Open it before" in body, body
    assert "was started for you" in bob_page.locator("#gpu-line").inner_text()
    screenshot(bob_page, "line-ready.png")

    # bob does not open it: after the claim window it is stopped and carol's turn comes.
    t0 = time.monotonic()
    wait_for(lambda: hub.server_model(bob.name) is None, CLAIM_WINDOW + 60, interval=0.5,
             what="bob's unopened server to be stopped after the claim window")
    # the line service stops his server, then takes him out of the line (CI once looked
    # between the two: 0.1 s apart)
    wait_for(lambda: place(bob) is None, 30, interval=0.5,
             what="bob to leave the line once his unopened server is stopped")
    wait_for(lambda: server_ready(carol), 120, interval=0.5,
             what="the line to start carol's server next")
    print(f"bob's server stopped and carol's ready {time.monotonic() - t0:.0f} s later")
    assert gpus_of(carol.container)["device_ids"] == [GPU0]

    # carol opens hers: it is hers, and she is out of the line.
    wait_for(lambda: open_server(carol) and place(carol) is None, 60, interval=2,
             what="carol's opened server to count as claimed")
    assert server_ready(carol)
    bob_page.goto(f"{HUB_URL}/hub/home")
    notice = bob_page.locator("#gpu-notices").inner_text()
    assert "Your place in line for GPUs (server) has ended" in notice, notice
    assert f"did not open it within {CLAIM_WINDOW} s" in notice, notice

    # The PI's usage page counts the time each waited in line beside their GPU-hours:
    # carol waited a claim window longer than bob; alice and dave never waited.
    def waited() -> dict[str, float]:
        r = requests.get(f"{HUB_URL}/services/gpus/api/usage", timeout=60,
                         headers={"Authorization": f"token {hub_admin.token}"})
        assert r.status_code == 200, r.text
        return {m["user"]: m["waited_minutes"] for m in r.json()["members"]}
    minutes = wait_for(lambda: (w := waited()).get(carol.name) and w, 30, interval=2,
                       what="the usage page to count carol's time in line")
    assert 0 < minutes[bob.name] < minutes[carol.name], minutes
    assert minutes.get(alice.name, 0) == 0 and dave.name not in minutes, minutes


def test_a_member_waits_from_the_spawn_form_and_leaves_from_her_home_page(
        hub, lab_user, lab_config, gpus_yaml, new_page):
    lab_config.write("gpus.yaml", ONE_GPU.replace("max_gpus: 1", "max_gpus: 2"))
    alice, bob = lab_user("alice"), lab_user("bob")
    alice.start_server({"gpus": 1})
    r = spawn(bob, {"gpus": 2, "wait": True})  # one GPU in all: waiting cannot help
    assert r.status_code == 409 and "however long you wait" in r.json()["message"], r.text
    assert place(bob) is None

    page = new_page()
    submit_login(page, bob.name, bob.token, next_url="/hub/spawn")
    assert "Wait in line" in page.locator("#gpulab-line").inner_text()
    page.select_option("#gpulab-gpus", "1")
    page.check("#gpulab-wait")
    with page.expect_navigation():
        page.click("#spawn_form [type=submit]")
    # to his home page, which shows his place
    page.wait_for_url(f"{HUB_URL}/hub/home")
    said = page.locator("#gpu-line").inner_text()
    screenshot(page, "line-joined-from-form.png")
    assert "you are number 1 of 1" in said, said
    assert place(bob) == ("waiting", 1, 1)
    # On a busy hub, putting him in line takes over the second JupyterHub waits before it
    # shows the spawn-pending page (seen in CI): that page, opened once the spawn has
    # ended, sends him home as well, not to "Spawn failed".
    page.goto(f"{HUB_URL}/hub/spawn-pending/{bob.name}")
    page.wait_for_url(f"{HUB_URL}/hub/home")
    assert "you are number 1 of 1" in page.locator("#gpu-line").inner_text()

    r = requests.delete(f"{hub.api}/gpulab/line/{bob.name}",
                        headers={"Authorization": f"token {alice.token}"}, timeout=30)
    # not hers to remove: JupyterHub's answer to a scope that does not reach
    assert r.status_code == 404, r.text
    assert place(bob) == ("waiting", 1, 1)

    with page.expect_navigation():  # the page reloads once he has left
        page.click(".gpu-line-leave")
    assert page.locator("#gpu-line").count() == 0
    assert place(bob) is None
    alice.stop_server()
    time.sleep(5)  # two rounds of the line service: nothing is started for him
    assert hub.server_model(bob.name) is None


def test_a_member_who_gave_her_address_is_emailed_when_her_turn_comes(
        hub, lab_user, lab_config, gpus_yaml, new_page, smtp_server):
    # two minutes to open it: time to read the e-mail, however slow a start is here
    lab_config.write("gpus.yaml", ONE_GPU + "line: {claim_window: 2m}\n")
    alice, bob = lab_user("alice"), lab_user("bob")
    alice.start_server({"gpus": 1})
    address = f"{bob.name}@lab.example"
    # a lab without SMTP says so, and nothing is done
    r = spawn(bob, {"gpus": 1, "wait": True, "email": address})
    assert r.status_code == 400 and "This lab sends no e-mail" in r.json()["message"], r.text
    settings = lab_config.original("gpulab.yaml")
    try:
        lab_config.write("gpulab.yaml", settings + MAIL_ON)
        emailed_when_his_turn_comes(hub, alice, bob, address, new_page, smtp_server)
    finally:
        lab_config.write("gpulab.yaml", settings)


def emailed_when_his_turn_comes(hub, alice, bob, address, new_page, smtp_server):
    # bad addresses, and an address without waiting: clear 400s that change nothing
    for options, said in (
            ({"gpus": 1, "wait": True, "email": "bob"}, "must be one e-mail address"),
            ({"gpus": 1, "wait": True, "email": f"{address}\r\nBcc: eve@evil.example"},
             "must be one e-mail address"),
            ({"gpus": 1, "wait": True, "email": ["bob@lab.example"]},
             "must be one e-mail address"),
            ({"gpus": 1, "email": address}, 'Tick "Wait in line"')):
        r = spawn(bob, options)
        assert r.status_code == 400 and said in r.json()["message"], (options, r.text)
    assert place(bob) is None and hub.server_model(bob.name) is None

    # bob waits from the spawn form, giving his address
    page = new_page()
    submit_login(page, bob.name, bob.token, next_url="/hub/spawn")
    page.select_option("#gpulab-gpus", "1")
    page.check("#gpulab-wait")
    page.fill("#gpulab-email", address)
    screenshot(page, "line-email-on-the-form.png")
    with page.expect_navigation():
        page.click("#spawn_form [type=submit]")
    page.wait_for_url(f"{HUB_URL}/hub/home")
    assert "you are number 1 of 1" in page.locator("#gpu-line").inner_text()
    assert line_of(bob)[0]["email"] == address
    assert smtp_server() == []

    # the GPU comes free: the line starts his server, and an e-mail says so, with its link
    alice.stop_server()
    got = wait_for(smtp_server, 120, interval=1, what="the e-mail telling bob his turn came")
    ((to, message),) = got
    assert to == [address], to
    assert message["Subject"] == "Your turn for GPUs: your server is starting", message
    body = message.get_content()
    assert "your server is starting, with 1 GPU kept for you" in body, body
    link = re.search(r"Open it within 2 min of it being up \(by (\S+ \S+) UTC if it is up "
                     r"at once\): (\S+)", body)
    assert link and link.group(2) == f"{HUB_URL}/hub/user/{bob.name}/", body
    deadline = datetime.fromisoformat(link.group(1) + "+00:00").timestamp()
    assert 0 <= deadline - place_offered_at(bob) - 120 + 60 <= 60, body  # whole minutes
    # he opens the link in his browser: JupyterLab; his server is his, out of the line
    page.goto(link.group(2))
    assert jupyterlab_shows(page, 90_000), page.url
    wait_for(lambda: open_server(bob) and place(bob) is None, 60, interval=2,
             what="bob's opened server to count as claimed")
    assert hub.server_model(bob.name) is not None


def test_a_free_gpu_kept_for_a_member_waiting_for_two_is_nobody_elses_until_she_leaves(
        hub, hub_admin, lab_user, lab_config, gpus_yaml):
    lab_config.write("gpus.yaml", STANDIN_GPUS.replace("max_gpus: 1", "max_gpus: 2"))
    alice, bob, carol = lab_user("alice"), lab_user("bob"), lab_user("carol")
    alice.start_server({"gpus": 1})  # GPU 0
    assert spawn(bob, {"gpus": 2, "wait": True}).status_code == 202
    # GPU 1 is free, and kept for bob: the admins' lease page says so, carol cannot have it
    r = requests.get(f"{HUB_URL}/services/gpus/api/leases", timeout=30,
                     headers={"Authorization": f"token {hub_admin.token}"})
    assert r.status_code == 200, r.text
    gpus = {g["uuid"]: g for g in r.json()["gpus"]}
    assert gpus[GPU1]["kept_for"] == ["a member waiting in line (for more GPUs than are free)"]
    assert (gpus[GPU1]["held"], gpus[GPU1]["free"]) == (0, 0)
    r = spawn(carol, {"gpus": 1})
    assert r.status_code == 409, r.text
    # bob leaves: it is free again at once
    r = requests.delete(f"{hub.api}/gpulab/line/{bob.name}",
                        headers={"Authorization": f"token {bob.token}"}, timeout=30)
    assert r.status_code == 204, r.text
    carol.start_server({"gpus": 1})
    assert gpus_of(carol.container)["device_ids"] == [GPU1]
    # he waits again, and an admin ends his access: he is out of the line at once
    assert spawn(bob, {"gpus": 1, "wait": True}).status_code == 202
    admin = {"Authorization": f"token {hub_admin.token}"}

    def waiting() -> list[str]:
        r = requests.get(f"{hub.api}/gpulab/line", headers=admin, timeout=30)
        assert r.status_code == 200, r.text
        return [e["user"] for e in r.json()["line"]]

    assert waiting() == [bob.name]
    r = requests.delete(f"{hub.api}/gpulab/access/{bob.name}", headers=admin, timeout=30)
    assert r.status_code == 200, r.text
    assert waiting() == []


def test_under_fair_share_who_used_fewer_gpu_hours_lately_goes_first(
        hub, lab_user, lab_config, gpus_yaml):
    lab_config.write("gpus.yaml", ONE_GPU + "line: {order: fair_share, half_life: 10m}\n")
    alice, bob, carol = lab_user("alice"), lab_user("bob"), lab_user("carol")
    alice.start_server({"gpus": 1})  # alice uses the GPU for a while; bob never has
    time.sleep(10)
    alice.stop_server()
    carol.start_server({"gpus": 1})
    # alice asks first, bob after her
    assert spawn(alice, {"gpus": 1, "wait": True}).status_code == 202
    assert spawn(bob, {"gpus": 1, "wait": True}).status_code == 202

    def by_use():
        r = requests.get(f"{hub.api}/gpulab/line/{alice.name}", timeout=30,
                         headers={"Authorization": f"token {alice.token}"}).json()
        return r["by_use"] and (r["line"][0]["gpu_hours"] or 0) > 0

    wait_for(by_use, 60, interval=1,
             what="the line service to bring alice's GPU-hours from Prometheus")
    (mine,) = line_of(alice)
    print(f"alice's recent GPU-hours: {mine['gpu_hours']:.5f}")
    assert line_of(bob)[0]["gpu_hours"] == 0.0
    assert place(bob) == ("waiting", 1, 2) and place(alice) == ("waiting", 2, 2)
    carol.stop_server()
    wait_for(lambda: server_ready(bob), 120, interval=0.5,
             what="bob, who used fewer GPU-hours, to be served first")
    assert hub.server_model(alice.name) is None and place(alice)[1] == 1
    # dave, who never used a GPU either, asks after her and goes before her...
    dave = lab_user("dave")
    assert spawn(dave, {"gpus": 1, "wait": True}).status_code == 202
    assert place(dave) == ("waiting", 1, 2) and place(alice) == ("waiting", 2, 2)
    # ... until she has waited line.max_wait (the admin shortens it to 5 s): then her
    # GPU-hours count as none, and she asked first
    lab_config.write("gpus.yaml", ONE_GPU + "line: {order: fair_share, half_life: 10m, "
                                            "max_wait: 5s}\n")
    wait_for(lambda: place(alice) == ("waiting", 1, 2), 30, interval=1,
             what="alice, who has waited out max_wait, to go before dave")
    (mine,) = line_of(alice)
    assert mine["max_wait_reached"] and mine["gpu_hours"] == 0.0, mine
    assert place(dave) == ("waiting", 2, 2)


def test_a_spent_hard_budget_refuses_gpus_until_it_renews_and_the_form_says_so(
        hub, lab_user, lab_config, gpus_yaml, new_page):
    # 0.001 GPU-hours (3.6 s) a month, hard; GPU-hours brought every 6 s (half_life / 100)
    lab_config.write("gpus.yaml", ONE_GPU.replace(
        "max_gpus: 1", "max_gpus: 1\n  budget: {gpu_hours: 0.001, per: month, enforce: hard}")
        + "line: {half_life: 10m}\n")
    alice, bob = lab_user("alice"), lab_user("bob")
    # in a group (the one every hub has), for the group's use in Prometheus and its
    # shared budget
    r = hub.request("POST", "/groups/operators/users", json={"users": [alice.name, bob.name]})
    assert r.status_code == 200, r.text
    try:
        _spend_and_be_refused(hub, alice, new_page)
        # a budget the group shares: bob, who used nothing, is refused for alice's use
        lab_config.write("gpus.yaml", ONE_GPU + "groups:\n  operators: {budget: {gpu_hours: "
                         "0.001, per: month, enforce: hard, shared: true}}\n"
                         "line: {half_life: 10m}\n")
        said = {}

        def refused() -> bool:
            r = spawn(bob, {"gpus": 1})
            said["bob"] = (r.status_code, r.text)
            if r.status_code in (201, 202):  # before the hub saw the new gpus.yaml
                bob.stop_server()
            return r.status_code == 403
        wait_for(refused, 30, interval=2, what=f"bob to be refused by the group's budget: "
                                               f"{said}")
        message = json.loads(said["bob"][1])["message"]
        assert message.startswith("Your group operators has used ") and \
            "of its 0.001 GPU-hours this month, so no GPU until its budget renews" in message, \
            message
        wait_for(lambda: 'group="operators"' in prometheus_query(
            "gpulab_group_budget_gpu_hours"), 30, interval=1,
            what="Prometheus to have the group's shared budget")
    finally:
        hub.request("DELETE", "/groups/operators/users", json={"users": [alice.name, bob.name]})


def _spend_and_be_refused(hub, alice, new_page):
    alice.start_server({"gpus": 1})
    time.sleep(8)
    alice.stop_server()
    page = new_page()
    submit_login(page, alice.name, alice.token, next_url="/hub/spawn")

    def spent():
        page.goto(f"{HUB_URL}/hub/spawn")
        note = page.locator("#gpulab-budget")
        used = re.match(r"You have used ([0-9.e-]+) of", note.inner_text()) \
            if note.count() else None
        return used and float(used[1]) >= 0.001
    wait_for(spent, 60, interval=2, what="the spawn form to show alice's budget spent")
    note = page.locator("#gpulab-budget").inner_text()
    print(note)
    assert "of your 0.001 GPU-hours this month (once they are spent, you get no GPU" in note
    screenshot(page, "budget-spawn-form.png")
    for options in ({"gpus": 1}, {"gpus": 1, "wait": True}):
        r = spawn(alice, options)
        assert r.status_code == 403, r.text
        said = r.json()["message"]
        assert "of your 0.001 GPU-hours this month, so no GPU until your budget renews on " \
               "20" in said and "Start the server with 0 GPUs" in said, said
    assert place(alice) is None  # a spent hard budget is never queued
    alice.start_server({"gpus": 0})  # a server without GPUs still starts
    assert hub.server_model(alice.name)["ready"]

    # Prometheus has her use, her budget and her group's use from the hub's /hub/metrics
    def value(expr: str) -> float | None:
        found = re.search(r"=> ([0-9.e+-]+) @", prometheus_query(expr))
        return float(found[1]) if found else None
    used = f'gpulab_budget_used_gpu_hours{{user="{alice.name}",period="month"}}'
    wait_for(lambda: (value(used) or 0) >= 0.001, 30, interval=1,
             what="Prometheus to have alice's budget use")
    assert value(f'gpulab_budget_gpu_hours{{user="{alice.name}",period="month",'
                 f'enforce="hard"}}') == 0.001
    group = 'gpulab_group_used_gpu_hours{group="operators",period="month"}'
    wait_for(lambda: (value(group) or 0) >= value(used), 30, interval=1,
             what="Prometheus to have her group's use")
    print(f"Prometheus: alice used {value(used)} GPU-hours, her group {value(group)}")
    # the query docs/the-line.md gives for members over budget finds her
    over = prometheus_query("gpulab_budget_used_gpu_hours >= on(user, period) "
                            "gpulab_budget_gpu_hours")
    assert f'user="{alice.name}"' in over, over


@pytest.mark.disruptive  # stalls the hub's Docker proxy: runs on a stack of its own
def test_a_member_put_in_line_by_a_slow_hub_is_sent_home_from_the_spawn_pending_page(
        lab_user, lab_config, gpus_yaml, new_page):
    """Seen failing in CI on a busy machine: the hub took more than the 1 s JupyterHub
    waits for a spawn from the form before it shows the spawn-pending page, so bob was
    put in line while his browser sat on that page, reading nothing of his place. A
    Docker proxy stalled for 4 s makes every such spawn that slow."""
    lab_config.write("gpus.yaml", ONE_GPU)
    alice, bob = lab_user("alice"), lab_user("bob")
    alice.start_server({"gpus": 1})
    page = new_page()
    submit_login(page, bob.name, bob.token, next_url="/hub/spawn")
    page.select_option("#gpulab-gpus", "1")
    page.check("#gpulab-wait")
    seen = []
    page.on("framenavigated", lambda frame: seen.append(frame.url)
            if frame == page.main_frame else None)
    docker("pause", "gpulab-docker-proxy")
    unpause = threading.Timer(4, docker, ("unpause", "gpulab-docker-proxy"))
    unpause.start()
    try:
        page.click("#spawn_form [type=submit]")
        page.wait_for_url(f"{HUB_URL}/hub/home", timeout=60_000)
    finally:
        unpause.join()
    assert any(f"/hub/spawn-pending/{bob.name}" in url for url in seen), seen
    assert "you are number 1 of 1" in page.locator("#gpu-line").inner_text()
    assert place(bob) == ("waiting", 1, 1)


@pytest.mark.disruptive  # kills the hub: runs alone (scripts/test-integration.sh)
def test_the_line_survives_a_hub_kill(hub, lab_user, lab_config, gpus_yaml):
    lab_config.write("gpus.yaml", ONE_GPU)
    alice, bob, carol = lab_user("alice"), lab_user("bob"), lab_user("carol")
    alice.start_server({"gpus": 1})
    assert spawn(bob, {"gpus": 1, "wait": True}).status_code == 202
    assert spawn(carol, {"gpus": 1, "wait": True}).status_code == 202

    before = kill_from_host("gpulab-hub")
    wait_restarted("gpulab-hub", before)
    wait_for(hub.is_ready, 90, what="the killed hub to answer again")
    assert place(bob) == ("waiting", 1, 2) and place(carol) == ("waiting", 2, 2)

    alice.stop_server()
    wait_for(lambda: server_ready(bob), 120, interval=0.5,
             what="the restarted hub's line to start bob's server")
    assert gpus_of(bob.container)["device_ids"] == [GPU0]
    assert place(carol) == ("waiting", 1, 1)
