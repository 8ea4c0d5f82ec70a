"""The admins' GPU lease page (/services/gpus/leases) and its JSON, on the real stack.

Leases are real: users' servers spawned through the hub, holding stand-in GPUs
(tests/gpu_standin; the inventory is the `gpus_yaml` fixture's). The page is used as
an admin uses it, signed in through the login form in Chromium; the JSON is fetched
through the published port with the admin's own login token.

The stuck lease is made the way one happens: the hub's database is restored from a
backup taken before a user's spawn (a hub rebuilt after a disk failure, say), so the
hub no longer knows a server whose container still runs and holds its GPU.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
import requests

from .browser import answer_shown, screenshot, submit_login
from .stack import HUB_URL, docker, wait_for
from .standin import GPU0, GPU1, STANDIN_GPUS, gpus_of

LEASES = f"{HUB_URL}/services/gpus/leases"
LEASES_API = f"{HUB_URL}/services/gpus/api/leases"
RELEASE_API = f"{HUB_URL}/services/gpus/api/leases/release"
HUB_DB = "/srv/jupyterhub/jupyterhub.sqlite"
HUB_DB_BACKUP = "/srv/jupyterhub/gpulab-test-backup.sqlite"
ONE_GPU = STANDIN_GPUS.replace("  - {index: 1", "  # - {index: 1")  # GPU 0 only


def as_user(user, method: str, url: str, **kw) -> requests.Response:
    kw.setdefault("timeout", 30)
    return requests.request(method, url, headers={"Authorization": f"token {user.token}"},
                            **kw)


def open_leases(page, admin):
    """Sign in through the form and open the lease page (through the service's OAuth)."""
    submit_login(page, admin.name, admin.token, next_url="/hub/home")
    response = page.goto(LEASES)
    assert response.status == 200, (response.status, page.url)
    assert urlsplit(page.url).path == "/services/gpus/leases", page.url
    return page


def lease_rows(page) -> list[list[str]]:
    """The lease table's cells, row by row, as the admin reads them."""
    return [[c.strip() for c in row.locator("td").all_inner_texts()]
            for row in page.locator("#lease-rows tr.lease").all()]


def row_of(page, user):
    return page.locator("#lease-rows tr.lease", has=page.locator("td.user", has_text=user.name))


def click_release(page, user) -> str:
    """Click the Release button of *user*'s lease, accept the confirmation, and return
    what the page then says."""
    confirmations = []
    page.once("dialog", lambda d: (confirmations.append(d.message), d.accept()))
    said = answer_shown(page, RELEASE_API, row_of(page, user).locator("button.release").click)
    assert confirmations and user.name in confirmations[0], confirmations
    return said


def test_admin_sees_a_running_lease_and_cannot_release_it(hub, hub_admin, lab_user, gpus_yaml,
                                                          new_page):
    admin, alice = hub_admin, lab_user("alice")
    alice.start_server({"gpus": 1})
    assert gpus_of(alice.container)["device_ids"] == [GPU0]

    page = open_leases(new_page(), admin)
    rows = lease_rows(page)
    assert len(rows) == 1, rows
    gpu, model, _pool, user, server, since, state, container, button = rows[0]
    assert gpu.split() == ["0", GPU0]
    assert (model, user, server, state, container, button) == (
        "stand-in", alice.name, "(default)", "active", "running", "Release")
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", since), since
    assert page.locator("#summary").inner_text() == "1 lease on 1 of 2 GPUs"
    gpus = page.locator("#gpu-table tbody tr.gpu")
    assert gpus.nth(0).locator("td").nth(6).inner_text() == alice.name  # holders
    assert gpus.nth(1).locator("td").nth(6).inner_text() == "nobody"
    screenshot(page, "lease-page.png")

    # The same as JSON, through the published port, with the admin's own token.
    r = as_user(admin, "GET", LEASES_API)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [(le["gpu_uuid"], le["user"], le["server"], le["state"], le["container_state"])
            for le in body["leases"]] == [(GPU0, alice.name, "", "active", "running")]
    assert [(g["uuid"], g["held"], g["free"]) for g in body["gpus"]] == [(GPU0, 1, 0),
                                                                       (GPU1, 0, 1)]

    # The hub runs alice's server: releasing it here would pull it from under the hub.
    said = click_release(page, alice)
    assert said.startswith("409 Not released: the hub runs this server"), said
    assert "/hub/admin" in said
    r = as_user(admin, "POST", RELEASE_API, json={"gpu_uuid": GPU0, "user": alice.name,
                                                  "server": ""})
    assert r.status_code == 409, r.text
    assert gpus_of(alice.container)["device_ids"] == [GPU0]  # untouched
    assert hub.server_model(alice.name)["ready"]


def backup_hub_db() -> None:
    """What an admin's nightly backup does: sqlite's online backup of the hub database."""
    docker("exec", "gpulab-hub", "python3", "-c",
           "import sqlite3, sys; src, dst = sqlite3.connect(sys.argv[1]), "
           "sqlite3.connect(sys.argv[2]); src.backup(dst); dst.close()", HUB_DB, HUB_DB_BACKUP)


def restore_hub_db(hub) -> None:
    """Stop the hub, put the backup back in place of its database, start it again."""
    docker("stop", "--time", "10", "gpulab-hub")
    try:
        docker("run", "--rm", "--network", "none", "-v", "gpulab-hub-data:/srv/jupyterhub",
               "--entrypoint", "python3", "gpulab/hub:latest", "-c",
               "import os, sqlite3, sys; src, dst = sqlite3.connect(sys.argv[2]), "
               "sqlite3.connect(sys.argv[1]); src.backup(dst); dst.close(); "
               "os.remove(sys.argv[2])", HUB_DB, HUB_DB_BACKUP)
    finally:
        docker("start", "gpulab-hub")
        wait_for(hub.is_ready, 90, what="the hub to come back")


@pytest.mark.disruptive  # stops the hub: runs alone (scripts/test-integration.sh)
def test_admin_releases_a_stuck_lease_and_the_gpu_is_spawnable_again(hub, hub_admin, lab_user,
                                                                    lab_config, gpus_yaml,
                                                                    new_page):
    lab_config.write("gpus.yaml", ONE_GPU)  # one GPU: whoever holds it blocks everyone
    admin, alice, bob = hub_admin, lab_user("alice"), lab_user("bob")
    try:
        backup_hub_db()
        alice.start_server({"gpus": 1})
        restore_hub_db(hub)  # the hub forgets alice's server; her container runs on

        assert hub.server_model(alice.name) is None
        assert gpus_of(alice.container)["device_ids"] == [GPU0]
        r = requests.post(f"{hub.api}/users/{bob.name}/server", json={"gpus": 1}, timeout=60,
                          headers={"Authorization": f"token {bob.token}"})
        assert r.status_code == 409, r.text  # the stuck lease holds the only GPU

        page = open_leases(new_page(), admin)
        assert [(row[3], row[6], row[7]) for row in lease_rows(page)] == [
            (alice.name, "active", "running")]
        said = click_release(page, alice)
        assert said == (f"200 Released GPU {GPU0} of {alice.name}: removed {alice.container}."), said
        screenshot(page, "lease-page-released.png")
        page.wait_for_selector("#lease-rows tr:not(.lease)")  # the page reloads by itself
        assert page.locator("#lease-rows").inner_text().strip() == "No leases: every GPU is free."

        assert docker("ps", "-aq", "--filter", f"name=^/{alice.container}$") == ""
        bob.start_server({"gpus": 1})
        assert gpus_of(bob.container)["device_ids"] == [GPU0]
    finally:  # a container the hub does not know: lab_user's clean-up cannot remove it
        docker("rm", "-f", alice.container, check=False)


@pytest.fixture
def operator(hub, lab_user):
    user = lab_user("oper")
    r = hub.request("POST", "/groups/operators/users", json={"users": [user.name]})
    assert r.status_code == 200, r.text
    yield user
    hub.request("DELETE", "/groups/operators/users", json={"users": [user.name]})


def test_members_and_operators_are_refused(hub, lab_user, operator, gpus_yaml, new_page):
    member, alice = lab_user("plain"), lab_user("alice")
    alice.start_server({"gpus": 1})
    release = {"gpu_uuid": GPU0, "user": alice.name, "server": ""}

    # a member does not get past the hub's OAuth for the service; an operator does (the
    # GPU dashboard is theirs) and the lease page refuses them
    for who, says in ((member, "You do not have permission to access JupyterHub service gpus"),
                      (operator, "The GPU leases and the members page are for hub admins")):
        page = new_page()
        submit_login(page, who.name, who.token, next_url="/hub/home")
        response = page.goto(LEASES)
        assert response.status == 403, (who.name, response.status)
        assert says in page.locator("body").inner_text()
        assert page.locator("#lease-table").count() == 0

        r = as_user(who, "GET", LEASES_API)
        assert r.status_code == 403, r.text
        assert "leases" not in r.json()
        r = as_user(who, "POST", RELEASE_API, json=release)
        assert r.status_code == 403, r.text
        # nor the members page, nor issuing a token through its API
        assert page.goto(f"{HUB_URL}/services/gpus/members").status == 403
        assert says in page.locator("body").inner_text()
        r = as_user(who, "POST", f"{HUB_URL}/services/gpus/api/members",
                    json={"name": who.name, "expires": "1h"})
        assert r.status_code == 403 and "token" not in r.json(), r.text

    # what an operator may do: the GPU dashboard, without a link to the leases
    page = new_page()
    submit_login(page, operator.name, operator.token, next_url="/hub/home")
    assert page.goto(f"{HUB_URL}/services/gpus/").status == 200
    assert page.locator("#leases-link").count() == 0
    assert page.locator("#members-link").count() == 0
    assert gpus_of(alice.container)["device_ids"] == [GPU0]  # nothing was released
