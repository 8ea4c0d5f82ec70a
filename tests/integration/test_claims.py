"""Claims of docs/gpus.md and docs/security.md ("Security defaults"), each
proven the way its user meets it: through the published port, and in Chromium for the
pages a person uses.

* The spawn form lists the GPUs, free or held, names the holders to admins only, and
  the number of GPUs chosen there is what the container gets.
* Tokens are never accepted in URLs (hub pages, the REST API, users' servers), while
  the same token works where it belongs (sign-in form, Authorization header).
* The Prometheus token reads the hub's metrics and nothing else.

(An invalid edit of config/gpulab.yaml, refused with file:line while the last good
settings stay in force, across restarts too: test_last_good.py.)
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import requests
import websocket

from .browser import SESSION_COOKIES, gpu_table, screenshot, session_cookies, submit_login
from .stack import HUB_URL, REPO, wait_for
from .standin import GPU0, GPU1, gpus_of

GiB = 1 << 30


def get(url: str, token: str | None = None, **kw) -> requests.Response:
    headers = kw.pop("headers", {})
    if token is not None:
        headers["Authorization"] = f"token {token}"
    kw.setdefault("timeout", 30)
    kw.setdefault("allow_redirects", False)
    return requests.get(url, headers=headers, **kw)


# ----------------------------------------------------------------------- the spawn form


def spawn_from_form(page, gpus: str) -> None:
    page.select_option("#gpulab-gpus", gpus)
    with page.expect_navigation():
        page.click("#spawn_form [type=submit]")


def test_spawn_form_shows_gpus_names_holders_to_admins_and_the_choice_reaches_the_container(
        hub, hub_admin, lab_user, gpus_yaml, new_page):
    holder, member = lab_user("holder"), lab_user("member")
    holder.start_server({"gpus": 1})  # GPU 0

    page = new_page()
    submit_login(page, member.name, member.token, next_url="/hub/spawn")
    assert urlsplit(page.url).path == "/hub/spawn", page.url
    assert "you may use up to 1" in page.locator("label[for=gpulab-gpus]").inner_text()
    assert page.locator("#gpulab-gpus option").all_inner_texts() == ["0", "1"]
    assert gpu_table(page) == [("0", "in use"), ("1", "free")]
    assert holder.name not in page.content()  # members are not told who holds a GPU
    # and when GPUs come back (the shipped defaults: 2 h idle, a 15 min warning)
    assert page.locator("#gpulab-culling").inner_text() == (
        "A server holding GPUs is stopped when its GPUs stay under 5% utilization for 2 h, "
        "after a warning 15 min ahead on your hub home page. Your files stay in your home.")
    screenshot(page, "spawn-form-member.png")
    spawn_from_form(page, "1")
    wait_for(lambda: (hub.server_model(member.name) or {}).get("ready"), 120,
             what=f"{member.name}'s server to be ready")
    assert gpus_of(member.container) == {"device_ids": [GPU1], "env": GPU1, "label": GPU1}

    # An admin sees who holds each GPU, on the form she opens for a member (never her own
    # server: the suite leaves the state of the admin's account alone, which a person
    # signed in as the README says may be using).
    third = lab_user("third")
    admin = new_page()
    submit_login(admin, hub_admin.name, hub_admin.token, next_url=f"/hub/spawn/{third.name}")
    assert urlsplit(admin.url).path == f"/hub/spawn/{third.name}", admin.url
    assert gpu_table(admin) == [("0", f"held by {holder.name}"),
                                ("1", f"held by {member.name}")]
    screenshot(admin, "spawn-form-admin.png")
    spawn_from_form(admin, "0")
    wait_for(lambda: (hub.server_model(third.name) or {}).get("ready"), 120,
             what=f"{third.name}'s server, started by the admin, to be ready")
    assert gpus_of(third.container) == {"device_ids": [], "env": "void", "label": ""}
    assert gpus_of(holder.container)["device_ids"] == [GPU0]


# ------------------------------------------------------------------ tokens in URLs


def test_tokens_in_urls_are_refused_and_the_same_token_works_where_it_belongs(
        hub, lab_user, new_page):
    user = lab_user("urltoken")
    user.start_server()
    server = f"{HUB_URL}/user/{user.name}"

    # Hub pages: a link with ?token= signs nobody in; the sign-in form does.
    page = new_page()
    for path in ("/hub/home", "/hub/spawn"):
        response = page.goto(f"{HUB_URL}{path}?token={user.token}")
        assert urlsplit(page.url).path == "/hub/login", (path, page.url)
        assert session_cookies(page) == set(), path
        # ... and the login page says why instead of carrying the token on after sign-in
        assert response.status == 400, (path, response.status)
        assert "Tokens must not be sent in a URL" in page.content(), path
    page.goto(f"{server}/lab?token={user.token}")  # the user's JupyterLab: the hub's login
    assert urlsplit(page.url).path == "/hub/login", page.url
    assert page.locator("#jp-main-dock-panel").count() == 0
    assert session_cookies(page) == set()
    submit_login(page, user.name, user.token, next_url="/hub/home")
    assert urlsplit(page.url).path == "/hub/home" and session_cookies(page) == SESSION_COOKIES

    # The REST API and the user's server: refused with ?token=, served with the header.
    cases = {f"{HUB_URL}/hub/api/user": 403, f"{server}/api/status": 403}
    for url, refused in cases.items():
        r = get(f"{url}?token={user.token}")
        assert r.status_code == refused, (url, r.status_code, r.text)
        r = get(url, user.token)
        assert r.status_code == 200, (url, r.status_code, r.text)
    assert get(f"{HUB_URL}/hub/api/user", user.token).json()["name"] == user.name
    r = get(f"{server}/lab?token={user.token}")
    assert r.status_code == 302 and "/hub/api/oauth2/authorize" in r.headers["location"]
    assert get(f"{server}/lab", user.token).status_code == 200

    # JupyterHub takes a URL token on users' servers from any request that says it is a
    # websocket (Sec-Fetch-Mode, a header any client sets): gpulab does not.
    ws_mode = {"Sec-Fetch-Mode": "websocket"}
    for path in ("/api/status", "/lab"):
        r = get(f"{server}{path}?token={user.token}", headers=dict(ws_mode))
        assert r.status_code in (302, 403), (path, r.status_code)
    kernel = user.start_kernel()
    channels = server.replace("http", "ws", 1) + f"/api/kernels/{kernel}/channels"
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(f"{channels}?token={user.token}",
                                    header=[f"{k}: {v}" for k, v in ws_mode.items()])
    assert refused.value.status_code == 403
    websocket.create_connection(channels, header=[f"Authorization: token {user.token}"]).close()
    # and a browser needs no URL token for a websocket: its session cookie does it
    page.goto(f"{server}/lab")
    page.locator("#jp-main-dock-panel").wait_for(state="visible", timeout=60_000)
    opened = page.evaluate("""url => new Promise(done => {
        const ws = new WebSocket(url);
        ws.onopen = () => { ws.close(); done("open"); };
        ws.onerror = () => done("error");
    })""", channels)
    assert opened == "open"


# --------------------------------------------------------------- the Prometheus token


def test_the_prometheus_token_reads_metrics_and_nothing_else(hub, lab_user):
    metrics = (REPO / "secrets" / "metrics-token").read_text().strip()
    member = lab_user("scraped")
    member.start_server()

    r = get(f"{HUB_URL}/hub/metrics", metrics)
    assert r.status_code == 200 and "jupyterhub_total_users" in r.text
    assert get(f"{HUB_URL}/hub/metrics").status_code == 403  # the token is what lets it in
    # who am I: the one thing every token may ask, and it says the one scope it has
    me = get(f"{HUB_URL}/hub/api/user", metrics).json()
    assert (me["kind"], me["name"], me["scopes"]) == ("service", "prometheus", ["read:metrics"])

    api = f"{HUB_URL}/hub/api"
    refused = [
        ("GET", f"{api}/users", None), ("GET", f"{api}/users/{member.name}", None),
        ("GET", f"{api}/users/{member.name}/tokens", None),
        ("POST", f"{api}/users/{member.name}/tokens", {}),
        ("POST", f"{api}/users/scraper-made-me", {}),
        ("DELETE", f"{api}/users/{member.name}/server", None),
        ("GET", f"{api}/gpulab/login-tokens/{member.name}", None),
        ("POST", f"{api}/gpulab/login-tokens/{member.name}", {"expires_in": 60}),
        ("GET", f"{api}/groups", None), ("GET", f"{api}/services", None),
        ("GET", f"{api}/proxy", None),
        ("GET", f"{HUB_URL}/user/{member.name}/api/status", None),
        ("GET", f"{HUB_URL}/services/gpus/api/gpus", None),
        ("GET", f"{HUB_URL}/services/gpus/api/leases", None),
    ]
    for method, url, body in refused:
        r = requests.request(method, url, json=body, timeout=30, allow_redirects=False,
                             headers={"Authorization": f"token {metrics}"})
        assert r.status_code == 403, (method, url, r.status_code, r.text)
    r = get(f"{HUB_URL}/hub/home", metrics)  # pages: not signed in
    assert r.status_code == 302 and urlsplit(r.headers["location"]).path == "/hub/login"
    assert hub.request("GET", "/users/scraper-made-me").status_code == 404
    assert hub.server_model(member.name)["ready"]
