"""Several servers per member (JupyterHub's named servers; gpus.yaml's max_servers), on
the real stack, through the REST API a member's scripts use and the hub home page she
clicks in Chromium: a named server beside her default one, each with its own GPU and her
one home; a server past max_servers and GPUs past max_gpus refused with a 403 that starts
nothing; the admins' lease page naming which of her servers holds which GPU; and the end
of her access stopping all of them and giving their GPUs back."""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

import requests

from .browser import screenshot, start_without_a_gpu_if_asked, submit_login
from .stack import (
    HUB_URL,
    container_gone,
    container_logs,
    docker,
    form_login,
    scrape_seconds,
    wait_for,
)
from .standin import GPU0, GPU1, STANDIN_GPUS, gpus_of

TWO_EACH = STANDIN_GPUS.replace("  max_gpus: 1\n", "  max_gpus: 2\n  max_servers: 2\n")
LEASES_API = f"{HUB_URL}/services/gpus/api/leases"


def labels_of(container: str) -> dict:
    return json.loads(docker("inspect", "--format", "{{json .Config.Labels}}", container))


def test_a_named_server_beside_her_default_one_within_her_limits(lab_config, gpus_yaml,
                                                                 lab_user, hub, hub_admin):
    lab_config.write("gpus.yaml", TWO_EACH)
    ann = lab_user("named")
    ann.start_server({"gpus": 1})
    ann.start_server({"gpus": 1}, server="train")
    default, train = ann.container_of(), ann.container_of("train")
    assert train == f"{default}--train"

    # each its own GPU, labelled with its server; one home, seen from both
    assert labels_of(train)["org.gpulab.server"] == "train"
    assert labels_of(default)["org.gpulab.server"] == ""
    got = {gpus_of(default)["env"], gpus_of(train)["env"]}
    assert got == {GPU0, GPU1}, got
    docker("exec", default, "sh", "-c", "echo from-default > ~/shared.txt")
    assert docker("exec", train, "cat", "/home/jovyan/shared.txt") == "from-default"

    # the admins' lease page names which of her servers holds which GPU
    r = requests.get(LEASES_API, headers={"Authorization": f"token {hub_admin.token}"},
                     timeout=30)
    assert r.status_code == 200, r.text
    held = sorted((le["server"], le["gpu_uuid"]) for le in r.json()["leases"]
                  if le["user"] == ann.name)
    assert [s for s, _ in held] == ["", "train"] and {u for _, u in held} == {GPU0, GPU1}

    # a third server: past max_servers, a 403 that names what runs; nothing starts
    r = ann.ask_server("notes", {"gpus": 0})
    assert r.status_code == 403, r.text
    assert ('You already have 2 servers running (your default one, "train"), the most the '
            'lab gives you at once (max_servers: 2): stop one first.') in r.json()["message"]
    assert container_gone(ann.container_of("notes"))

    # her GPUs count over all her servers: train may not take two while default holds one
    ann.stop_server(server="train")
    assert container_gone(train)
    page = form_login(ann.name, ann.token).session.get(f"{HUB_URL}/hub/spawn/{ann.name}/train",
                                                      timeout=30)
    assert page.status_code == 200, page.text[:300]
    assert "yours (your default server)" in page.text, page.text[-3000:]
    offered = re.findall(r'<option value="(\d+)"', page.text)
    assert offered == ["0", "1"], offered  # the other of her 2 is her default server's
    r = ann.ask_server("train", {"gpus": 2})
    assert r.status_code == 403, r.text
    assert "already hold 1 on server(s) default and may use at most 2" in r.json()["message"]
    assert container_gone(train)
    ann.start_server({"gpus": 0}, server="train")  # her named server is hers to start again

    # the end of her access stops every server of hers and gives their GPUs back
    r = hub.request("DELETE", f"/gpulab/access/{ann.name}", json={"stop_servers": True})
    assert r.status_code == 200, r.text
    assert sorted(r.json()["stopped_servers"]) == ["", "train"]
    wait_for(lambda: container_gone(default) and container_gone(train), 60, what="both her servers to be gone")
    r = requests.get(LEASES_API, headers={"Authorization": f"token {hub_admin.token}"},
                     timeout=30)
    assert not [le for le in r.json()["leases"] if le["user"] == ann.name], r.text


def test_deleting_a_member_stops_her_named_servers_too(gpus_yaml, lab_user, hub):
    """JupyterHub stops only her default server when an admin deletes her, and then fails
    (a 500) on a named one that runs, her tokens already gone: gpulab stops them first."""
    cal = lab_user("named")
    cal.start_server({"gpus": 0})
    cal.start_server({"gpus": 0}, server="train")
    r = hub.request("DELETE", f"/users/{cal.name}")
    assert r.status_code == 204, r.text
    assert hub.request("GET", f"/users/{cal.name}").status_code == 404
    wait_for(lambda: container_gone(cal.container_of()) and container_gone(cal.container_of("train")), 60,
             what="both her servers to be gone")


def test_she_adds_and_opens_a_named_server_from_her_home_page(lab_config, gpus_yaml,
                                                             lab_user, new_page):
    lab_config.write("gpus.yaml", TWO_EACH)
    bea = lab_user("named")
    page = new_page()
    submit_login(page, bea.name, bea.token, next_url="/hub/home")
    page.wait_for_url(re.compile(r"/hub/home"), timeout=60_000)
    assert "You may run 2 servers at once" in page.locator("#max-servers").inner_text()
    # "Add New Server" names it (JupyterHub's page reloads with its row), "start" opens
    # her spawn form for it
    page.fill("input.new-server-name", "writing")
    # JupyterHub's home.js (loaded by requirejs after the page's load event) binds the
    # button: a click before that does nothing (CI saw it, on a loaded machine)
    page.wait_for_function("() => { const b = document.querySelector('.new-server-btn'); "
                           "return !!(window.jQuery && b && (jQuery._data(b, 'events') || "
                           "{}).click); }", timeout=60_000)
    with page.expect_navigation(timeout=60_000):
        page.click("button.new-server-btn")
    with page.expect_navigation(timeout=60_000):
        page.locator("#start-writing").click()
    page.wait_for_url(re.compile(r"/hub/spawn"), timeout=60_000)
    start_without_a_gpu_if_asked(page)
    page.wait_for_url(re.compile(rf"/user/{bea.name}/writing/"), timeout=180_000)
    assert urlsplit(page.url).path.startswith(f"/user/{bea.name}/writing/"), page.url
    assert labels_of(bea.container_of("writing"))["org.gpulab.server"] == "writing"
    page.goto(f"{HUB_URL}/hub/home")
    row = page.locator('tr.home-server-row[data-server-name="writing"]')
    assert f"/user/{bea.name}/writing/" in row.locator("a.server-link").inner_text()
    screenshot(page, "named-servers-home.png")
    bea.stop_server(server="writing")


def test_a_named_server_waits_in_line_and_the_line_starts_it(lab_config, gpus_yaml,
                                                            lab_user, hub):
    """Her named server waits in the line on its own, beside her default one that runs;
    when the GPU comes free, the line starts that server, not her default one."""
    lab_config.write("gpus.yaml", TWO_EACH.replace("  - {index: 1", "  # - {index: 1"))
    ann, dan = lab_user("named"), lab_user("named")
    ann.start_server({"gpus": 1})
    dan.start_server({"gpus": 0})
    r = dan.ask_server("train", {"gpus": 1, "wait": True})
    assert r.status_code == 202 and "number 1 in line" in r.json()["message"], r.text
    r = requests.get(f"{hub.api}/gpulab/line/{dan.name}", timeout=30,
                     headers={"Authorization": f"token {dan.token}"})
    assert [(e["server"], e["state"]) for e in r.json()["line"]] == [("train", "waiting")]
    ann.stop_server()
    wait_for(lambda: (hub.server_model(dan.name, "train") or {}).get("ready"), 120,
             interval=0.5, what="the line to start dan's server train with the freed GPU")
    assert gpus_of(dan.container_of("train"))["device_ids"] == [GPU0]
    assert gpus_of(dan.container_of())["device_ids"] == []  # her default one, as it was


def test_the_gpu_culler_stops_her_idle_named_server_and_names_it(lab_config, gpus_yaml,
                                                                lab_user, hub, fake_control):
    """Her named server's GPU sits idle while her default one's works: the culler warns of
    and stops that server, by name, and leaves the other running."""
    idle_timeout, warn_before = max(20, 3 * scrape_seconds()), max(10, scrape_seconds())
    lab_config.write("gpus.yaml", TWO_EACH + f"  gpu_idle_timeout: {idle_timeout}s\n"
                     f"culling: {{idle_below: 5%, warn_before: {warn_before}s, "
                     f"check_every: 2s}}\n")
    fake_control({"utilization": {"0": 0, "1": 80}})
    eve = lab_user("named")
    eve.start_server({"gpus": 1}, server="train")  # the lowest free: GPU 0, idle
    eve.start_server({"gpus": 1})  # GPU 1, at work
    assert gpus_of(eve.container_of("train"))["label"] == GPU0
    wait_for(lambda: hub.server_model(eve.name, "train") is None, idle_timeout + 120,
             interval=1, what="the GPU culler to stop her idle server train")
    assert hub.server_model(eve.name) is not None  # her working one runs on
    log = container_logs("gpulab-hub", 600)
    assert f"GPU culler: warned {eve.name} that their server 'train' stops at" in log, log[-3000:]
    assert f"GPU culler: stopped {eve.name}'s server 'train'" in log, log[-3000:]
    home = form_login(eve.name, eve.token).session.get(f"{HUB_URL}/hub/home", timeout=30)
    assert "server &#39;train&#39;" in home.text or "server 'train'" in home.text, home.text
