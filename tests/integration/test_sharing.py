"""A member shares her running server with a colleague (gpulab.shares, JupyterHub's shares).

Tried as the two members meet it: she shares from /hub/sharing in Chromium, he finds her
server on his own /hub/sharing page and works in its JupyterLab, signed in as himself.
Then everything a share must not give him is tried as he would try it (the hub's REST
API with his own token, SSH), and each way a share ends is watched from his side, with a
kernel websocket open in her server: she ends it on the page, his access ends, her server
stops; a share code (a link) is accepted in the browser and ends with the server too. A
share with a whole group is refused (JupyterHub 6.1.1 would let none of its members in:
tests/unit/test_shares.py). Then, with the lab's real-time collaboration on, two members
co-edit one notebook in two browsers (that test edits gpulab.yaml: the disruptive lane).
"""

from __future__ import annotations

import re
import time

import requests
import websocket

from .browser import submit_login
from .stack import HUB_URL, docker, wait_for
from .test_revocation import DEADLINE, closed_with
from .test_ssh import ssh  # noqa: F401  (the SSH client fixture)


def as_him(member, method: str, url: str, **kw) -> requests.Response:
    kw.setdefault("timeout", 60)
    return requests.request(method, url, headers={"Authorization": f"token {member.token}"},
                            **kw)


def share(owner, colleague, server: str = "") -> requests.Response:
    return as_him(owner, "POST", f"{HUB_URL}/hub/api/shares/{owner.name}/{server}",
                  json={"user": colleague.name})


def shares_of(owner, server: str = "") -> list[str]:
    r = as_him(owner, "GET", f"{HUB_URL}/hub/api/shares/{owner.name}/{server}")
    assert r.status_code == 200, r.text
    return [s["user"]["name"] for s in r.json()["items"] if s["user"]]


def his_kernel_in_her_server(her, him) -> websocket.WebSocket:
    r = as_him(him, "POST", f"{her.server_url}/api/kernels", json={"name": "python3"})
    assert r.status_code == 201, r.text
    url = her.server_url.replace("http", "ws", 1) + f"/api/kernels/{r.json()['id']}/channels"
    ws = websocket.create_connection(url, header=[f"Authorization: token {him.token}"],
                                     timeout=30)
    ws.settimeout(1)
    return ws


def into_her_lab(page, her) -> None:
    """From a link to her server, in his browser, into her JupyterLab (JupyterHub asks him
    once to let her server know who he is)."""
    page.wait_for_url(re.compile(rf"/user/{re.escape(her.name)}/|/hub/api/oauth2/"),
                      timeout=60_000)
    if "/oauth2/" in page.url:
        page.click("button[type=submit]")
    page.wait_for_url(re.compile(rf"/user/{re.escape(her.name)}/lab"), timeout=60_000)


def cut_off(ws: websocket.WebSocket, her, him) -> dict[str, float]:
    """Seconds until his kernel websocket in her server closed (1008 or plain) and her
    server refused his token, each; fails past DEADLINE."""
    t0, ended = time.monotonic(), {}
    while len(ended) < 2 and time.monotonic() - t0 < DEADLINE:
        if "kernel" not in ended and closed_with(ws) in (1008, 0):
            ended["kernel"] = time.monotonic() - t0
        if "server API" not in ended and as_him(
                him, "GET", f"{her.server_url}/api/status", timeout=10).status_code == 403:
            ended["server API"] = time.monotonic() - t0
    assert set(ended) == {"kernel", "server API"}, f"still open after {DEADLINE:.0f} s: {ended}"
    return ended


def test_she_shares_her_server_he_works_in_it_as_himself_and_every_end_cuts_him_off(
        hub, lab_user, new_page, ssh):  # noqa: F811
    her, him, third = lab_user("sharer"), lab_user("colleague"), lab_user("other")
    her.start_server()
    assert her.api("PUT", "/contents/from-her.txt",
                   json={"type": "file", "format": "text", "content": "hi"}).status_code == 201
    status = f"{her.server_url}/api/status"
    assert as_him(him, "GET", status).status_code == 403  # nothing shared yet

    # She shares, in Chromium, from her sharing page.
    page = new_page()
    submit_login(page, her.name, her.token)
    page.goto(f"{HUB_URL}/hub/sharing")
    page.fill(".shared-server .share-with", him.name)
    page.click(".shared-server button[type=submit]")
    page.locator(".share-row", has_text=him.name).wait_for(state="visible")
    assert shares_of(her) == [him.name]

    # He finds it on his own page and opens her JupyterLab, signed in as himself.
    his_page = new_page()
    submit_login(his_page, him.name, him.token, next_url="/hub/sharing")  # no server of his
    his_page.locator(".shared-server-link", has_text=her.name).click()
    into_her_lab(his_page, her)
    his_page.locator(".jp-DirListing-item", has_text="from-her.txt").wait_for(
        state="visible", timeout=60_000)
    me = as_him(him, "GET", f"{her.server_url}/api/me")
    assert me.status_code == 200 and me.json()["identity"]["username"] == him.name, me.text

    # What the share does not give him, tried as he would.
    for method, path, body in [
            ("POST", f"/shares/{her.name}/", {"user": him.name}),  # share it on
            ("POST", f"/shares/{her.name}/", {"user": third.name}),
            ("POST", f"/users/{her.name}/tokens", {"note": "mine now"}),  # her token
            ("DELETE", f"/users/{her.name}/server", None),  # stop it
            ("POST", f"/users/{her.name}/servers/other", {})]:  # start one of hers
        r = as_him(him, method, f"{HUB_URL}/hub/api{path}", json=body)
        assert r.status_code in (403, 404), (method, path, r.status_code, r.text)
    # her name is all he may read of her (sharing needs it), not her servers or activity
    seen = as_him(him, "GET", f"{HUB_URL}/hub/api/users/{her.name}")
    assert seen.status_code in (200, 403, 404) and "server" not in seen.text, seen.text
    # ... nor SSH: his token is no password of hers, and his own name reaches his own
    # server only (none runs), never hers
    assert ssh.run(her.name, him.token, command="true").returncode != 0
    his = ssh.run(him.name, him.token, command="echo $JUPYTERHUB_USER")
    assert his.returncode != 0 and her.name not in his.stdout, (his.stdout, his.stderr)
    assert "not running" in his.stderr, his.stderr
    # and she can grant no more than access to that one server, and to members, not to
    # a group (whose members JupyterHub 6.1.1 would not let in: its page offers none)
    r = as_him(her, "POST", f"{HUB_URL}/hub/api/shares/{her.name}/",
               json={"user": him.name, "scopes": ["admin:users"]})
    assert r.status_code in (400, 403), r.text
    r = as_him(her, "POST", f"{HUB_URL}/hub/api/shares/{her.name}/",
               json={"group": "operators"})
    assert r.status_code == 403 and "read:groups:name" in r.text, r.text
    assert page.locator(".share-kind").count() == 0

    # 1. She ends it on the page: his open kernel and his requests are cut off.
    ws = his_kernel_in_her_server(her, him)
    page.locator(".share-row", has_text=him.name).locator(".end-share").click()
    page.locator(".share-row").wait_for(state="detached")
    print(f"share ended on her page, his cut-off: {cut_off(ws, her, him)}")
    ws.close()

    # 2. His access ends (an admin): the share goes with it, and so does his kernel.
    assert share(her, him).status_code == 200
    # (her server trusts the hub's last answer for his token for up to 5 s)
    wait_for(lambda: as_him(him, "GET", status).status_code == 200, 30,
             what="her server to let him in again")
    ws = his_kernel_in_her_server(her, him)
    out = docker("exec", "gpulab-hub", "gpulab", "access", "end", him.name)
    assert him.name in out, out
    print(f"his access ended, his cut-off: {cut_off(ws, her, him)}")
    ws.close()
    assert shares_of(her) == []

    # 3. A link instead of a name (JupyterHub's share code): the third member accepts it
    # in his browser and is in her JupyterLab.
    codes = f"{HUB_URL}/hub/api/share-codes/{her.name}/"
    r = as_him(her, "POST", codes, json={})
    assert r.status_code == 200, r.text
    third_page = new_page()
    submit_login(third_page, third.name, third.token, next_url="/hub/home")
    third_page.goto(HUB_URL + r.json()["accept_url"])
    third_page.get_by_role("button", name="Accept invitation").click()
    into_her_lab(third_page, her)
    assert shares_of(her) == [third.name]
    wait_for(lambda: as_him(third, "GET", status).status_code == 200, 30,
             what="her server to let the third member in")
    # Her server stops: its shares and codes end, not carried to her next server.
    her.stop_server()
    wait_for(lambda: shares_of(her) == [], 30, what="her stopped server's shares to end")
    assert as_him(her, "GET", codes).json()["items"] == []
    her.start_server()
    assert as_him(third, "GET", status).status_code == 403


NOTEBOOK = {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                        "language": "python"}},
            "cells": [{"cell_type": "code", "id": "c1", "metadata": {}, "source": "",
                       "outputs": [], "execution_count": None}]}


def test_two_members_edit_one_notebook_and_see_each_others_cursors(hub, lab_user, new_page,
                                                                   spawn_settings):
    """JupyterLab's real-time collaboration (jupyter-collaboration, in the image, on where
    the lab sets spawn.collaboration): in two browsers, each member's typing shows in the
    other's notebook, with her cursor, and the notebook on disk holds both."""
    spawn_settings(collaboration=True)
    her, him = lab_user("coeditor"), lab_user("coeditor")
    her.start_server()
    assert her.api("PUT", "/contents/together.ipynb",
                   json={"type": "notebook", "content": NOTEBOOK}).status_code == 201
    assert share(her, him).status_code == 200
    url = f"{HUB_URL}/user/{her.name}/lab/tree/together.ipynb"
    cell = ".jp-NotebookPanel .jp-Cell .cm-content"

    hers = new_page()
    submit_login(hers, her.name, her.token, next_url=f"/user/{her.name}/lab/tree/together.ipynb")
    hers.wait_for_url(re.compile(rf"/user/{re.escape(her.name)}/lab"), timeout=60_000)
    his = new_page()
    submit_login(his, him.name, him.token, next_url="/hub/sharing")
    his.goto(url)
    into_her_lab(his, her)
    for page in (hers, his):
        page.locator(cell).first.wait_for(state="visible", timeout=60_000)

    hers.locator(cell).first.click()
    hers.keyboard.type("by_her = 1")
    his.locator(cell, has_text="by_her = 1").first.wait_for(state="visible", timeout=30_000)
    # her cursor, with her name on its flag, in his browser
    his.locator(".jp-remote-cursor").first.wait_for(state="attached", timeout=30_000)
    flags = his.locator(".jp-remote-userFlag-name").all_text_contents()
    assert any(her.name in f for f in flags), flags

    his.locator(cell).first.click()
    his.keyboard.press("Control+End")
    his.keyboard.type("\nby_him = 2")
    hers.locator(cell, has_text="by_him = 2").first.wait_for(state="visible", timeout=30_000)

    def on_disk() -> str:
        r = her.api("GET", "/contents/together.ipynb")
        return "".join(r.json()["content"]["cells"][0]["source"]) if r.ok else ""
    hers.keyboard.press("Control+s")
    wait_for(lambda: on_disk() == "by_her = 1\nby_him = 2", 30,
             what="the notebook on disk to hold both members' lines")
