"""The lab assistant, asked as members ask it: from a notebook in their own server, with
the server's own token, through the hub, answered by llama.cpp's server on a tiny model
the test writes (tests/integration/tiny_model.py; it proves the path, not the answers).

The decisions (groups, the minute's limit, what is forwarded) are unit-tested in
tests/unit/test_assistant_rules.py; here they are met through the real hub, and the
inference server's network is tried from a member's container.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .browser import gpu_table, run_in_new_notebook, screenshot, sign_in_to_lab, submit_login
from .fake_gpus import exporter_snapshot
from .stack import HUB_URL, REPO, container_logs, docker, exporter_flags, make, wait_for
from .standin import GPU0, GPU1, gpus_of
from .tiny_model import write_tiny_model

pytestmark = pytest.mark.integration

MODEL = "gpulab-test-tiny.gguf"
# The hub makes the groups it knows (hub.operators' group among them), and the test's
# admin token may add members to them, not make new ones.
GROUP = "operators"

# What a member runs in her notebook: OpenAI's chat API at the hub, her server's token
# as the key. Prints one JSON line per call: [status, headers, body].
ASK = r'''
import json, os, time, urllib.request, urllib.error
BASE = os.environ["JUPYTERHUB_API_URL"] + "/gpulab/assistant"
def call(path, body=None, token=os.environ["JUPYTERHUB_API_TOKEN"]):
    req = urllib.request.Request(BASE + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + token,
                                          "Content-Type": "application/json"})
    try:
        r = urllib.request.urlopen(req, timeout=60)
    except urllib.error.HTTPError as e:
        r = e
    return [r.status, dict(r.headers), r.read().decode("utf-8", "replace")]
def ask(**extra):
    body = {"messages": [{"role": "user", "content": "Why x.unsqueeze(0) before model(x)?"}],
            "max_tokens": 4, **extra}
    return call("/v1/chat/completions", {k: v for k, v in body.items() if v is not None})
def ready():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = call("")
        if json.loads(status[2]).get("ready"):
            return status
        time.sleep(0.5)
    return status
'''


def answers(out: str) -> list:
    return [json.loads(line) for line in out.splitlines() if line.startswith("[")]


def ask_in_notebook(user, code: str) -> list:
    return answers(user.run_code(ASK + code, timeout=180))


def hub_metrics() -> str:
    token = (REPO / "secrets" / "metrics-token").read_text().strip()
    r = requests.get(f"{HUB_URL}/hub/metrics", headers={"Authorization": f"token {token}"},
                     timeout=30)
    assert r.status_code == 200, r.text
    return r.text


def counted(metrics: str, user: str, outcome: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(metrics)
               if f.name == "gpulab_assistant_requests"
               for s in f.samples if s.name.endswith("_total")
               and s.labels == {"user": user, "outcome": outcome})


@pytest.fixture
def assistant(hub, lab_config):
    """Turn the lab assistant on in gpulab.yaml, as an admin does, with the tiny model in
    the models folder the assistant's container mounts; off and gone afterwards."""
    mounts = json.loads(docker("inspect", "gpulab-assistant"))[0]["Mounts"]
    models = next(m["Source"] for m in mounts if m["Destination"] == "/models")
    model = write_tiny_model(Path(models) / MODEL)

    def turn_on(**settings):
        doc = yaml.safe_load(lab_config.original("gpulab.yaml")) or {}
        doc["assistant"] = {"model": MODEL, "threads": 1, "parallel": 2, "context": 4096,
                            **settings}
        lab_config.write("gpulab.yaml", yaml.safe_dump(doc))

    turn_on.off = lambda: lab_config.write("gpulab.yaml", lab_config.original("gpulab.yaml"))
    yield turn_on
    lab_config.restore()
    model.unlink(missing_ok=True)


def test_members_ask_from_their_notebooks_and_each_is_counted(assistant, lab_user):
    assistant(max_tokens=4)
    alice, bob = lab_user("askalice"), lab_user("askbob")
    alice.start_server()
    bob.start_server()
    status, models, plain, streamed, uncapped = ask_in_notebook(alice, """
print(json.dumps(ready()))
print(json.dumps(call("/v1/models")))
print(json.dumps(ask()))
print(json.dumps(ask(stream=True)))
print(json.dumps(ask(max_tokens=None, n_predict=40, temperature=0)))
""")
    assert status[0] == 200 and json.loads(status[2]) == {
        "on": True, "ready": True, "model": MODEL, "may_ask": True, "reason": ""}, status
    assert models[0] == 200 and [m["id"] for m in json.loads(models[2])["data"]] == [MODEL]
    # the lab's model answered her (a random model: four tokens of anything)
    assert plain[0] == 200, plain
    answer = json.loads(plain[2])
    assert answer["model"] == MODEL and answer["usage"]["completion_tokens"] == 4, answer
    assert isinstance(answer["choices"][0]["message"]["content"], str)
    # streamed as server-sent events, passed on as they come
    assert streamed[0] == 200 and streamed[1]["Content-Type"].startswith("text/event-stream")
    events = [e for e in streamed[2].split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]" and len(events) >= 3, streamed[2]
    # llama.cpp's own n_predict does not get past the lab's cap (assistant.max_tokens,
    # 4 here): it did before the gateway dropped keys that are not OpenAI's
    answer = json.loads(uncapped[2])
    assert answer["usage"]["completion_tokens"] == 4, answer
    assert answer["choices"][0]["finish_reason"] == "length", answer
    assert ask_in_notebook(bob, "print(json.dumps(ask()))")[0][0] == 200

    # counted under each member's name on the hub's /hub/metrics (Prometheus scrapes it)
    metrics = hub_metrics()
    assert counted(metrics, alice.name, "ok") == 4, metrics  # models, and three answers
    assert counted(metrics, bob.name, "ok") == 1

    # what she asked is in no log: the hub's has the path and her name, llama.cpp's its
    # timings
    logs = {c: container_logs(c, 2000) for c in ("gpulab-hub", "gpulab-assistant")}
    assert not [c for c, log in logs.items() if "unsqueeze" in log]
    assert f"/hub/api/gpulab/assistant/v1/chat/completions ({alice.name}@" in logs["gpulab-hub"]

    # the inference server itself is not on any network of members' servers
    ip = docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                "gpulab-assistant").strip()
    tried = alice.run_code(f"""
import socket
try:
    socket.create_connection(("{ip}", 8080), timeout=3).close(); print("reached")
except OSError as e:
    print("unreachable", e)
""")
    assert tried.startswith("unreachable"), tried


def test_who_may_not_ask_is_told_why(assistant, lab_user, hub):
    assistant(groups=[GROUP], requests_per_minute=2)
    carol, dave = lab_user("askcarol"), lab_user("askdave")
    r = hub.request("POST", f"/groups/{GROUP}/users", json={"users": [carol.name]})
    assert r.status_code == 200, r.text
    carol.start_server()
    dave.start_server()
    # a token of carol's made without the assistant's scope (read her name only)
    r = hub.request("POST", f"/users/{carol.name}/tokens",
                    json={"scopes": [f"read:users:name!user={carol.name}"], "expires_in": 600})
    assert r.status_code == 201, r.text
    narrow = r.json()["token"]

    refused = ask_in_notebook(dave, "print(json.dumps(ask()))\nprint(json.dumps(call('')))")
    assert refused[0][0] == 403, refused
    reason = json.loads(refused[0][2])["error"]["message"]
    assert f"open to the groups {GROUP} only, and you are in none of them" in reason
    assert json.loads(refused[1][2])["may_ask"] is False

    asked = ask_in_notebook(carol, f"""
print(json.dumps(ready()))
for _ in range(3):
    print(json.dumps(ask()))
print(json.dumps(call("/v1/chat/completions", {{"messages": [{{"role": "user"}}]}}, token={narrow!r})))
""")
    assert [a[0] for a in asked[1:]] == [200, 200, 429, 403], asked
    limited = asked[3]
    assert int(limited[1]["Retry-After"]) > 0
    assert "2 requests in the last minute" in json.loads(limited[2])["error"]["message"]
    assert "lacks the scope custom:gpulab:assistant" in json.loads(asked[4][2])["message"]

    # turned off: said so, not a connection error
    assistant(model="")
    off = ask_in_notebook(dave, "print(json.dumps(ask()))")[0]
    assert off[0] == 503 and "The lab assistant is off" in json.loads(off[2])["message"], off
    # a model file that is not there: nothing serves, and the member is told that much
    assistant(model="not-there.gguf", groups=[GROUP], requests_per_minute=100)
    missing = ask_in_notebook(carol, """
deadline = time.monotonic() + 30
while json.loads(call("")[2])["ready"] and time.monotonic() < deadline:
    time.sleep(0.5)
print(json.dumps(call("")))
print(json.dumps(ask()))
""")
    assert json.loads(missing[0][2])["ready"] is False, missing
    assert missing[1][0] == 503, missing
    assert "The lab assistant is not answering" in json.loads(missing[1][2])["message"]

    metrics = hub_metrics()
    assert counted(metrics, dave.name, "refused") == 1
    assert counted(metrics, dave.name, "off") == 1
    assert counted(metrics, carol.name, "ok") == 2
    assert counted(metrics, carol.name, "limited") == 1
    assert counted(metrics, carol.name, "unavailable") == 1


CHAT = "#jupyter-ai\\:\\:chat"  # jupyter-ai's chat panel (its sidebar widget's id)


def explain_a_cell(page, code: str, output: str):
    """In a new notebook: run *code*, then ask to explain it; the chat panel is where
    the answer goes."""
    run_in_new_notebook(page, code, output)
    return explain_the_cell(page)


def explain_the_cell(page):
    """The first cell's context menu, Generative AI > Explain code, as a member does
    (its active cell: running it made the next one active)."""
    cell = page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
    cell.click()
    cell.click(button="right")
    page.locator(".lm-Menu-item", has_text="Generative AI").first.hover()
    page.locator(".lm-Menu-item", has_text="Explain code").first.click()
    return page.locator(CHAT)


def test_a_member_asks_jupyterlabs_assistant_to_explain_a_cell(assistant, lab_user, new_page,
                                                                 hub):
    """In Chromium: JupyterLab's assistant (jupyter-ai, on because the lab's is) explains
    her cell with the lab's model, through the hub, counted under her name; a member
    outside assistant.groups reads why she may not."""
    assistant(groups=[GROUP])
    erin, finn = lab_user("askerin"), lab_user("askfinn")
    r = hub.request("POST", f"/groups/{GROUP}/users", json={"users": [erin.name]})
    assert r.status_code == 200, r.text
    page = new_page()
    sign_in_to_lab(page, erin.name, erin.token)
    chat = explain_a_cell(page, "x = torch_free = [1, 2]\nprint('ran', x)", "ran [1, 2]")
    # her question in the chat, then the lab model's answer to it (a random model: any
    # text), streamed through the hub (counted there once it ended), then shown whole
    chat.get_by_text("Explain the code below.").first.wait_for(timeout=60_000)
    wait_for(lambda: counted(hub_metrics(), erin.name, "ok") == 1, 90, interval=1,
             what="her request to be answered and counted under her name")
    answer = chat.locator("text=Jupyternaut").last  # the newest message's author
    answer.wait_for()
    chat.get_by_text("Generating response").wait_for(state="detached", timeout=30_000)
    screenshot(page, "assistant-explain.png")
    text = chat.inner_text()
    assert "Sorry, an error occurred" not in text, text
    assert text.rindex("Jupyternaut") > text.rindex("Explain the code below."), text
    # nothing outside the lab is configured: one provider, the lab's, at the hub
    assert no_outside_endpoint(erin) == "http://172.30.0.250:8081/hub/api/gpulab/assistant/v1"
    # the lab turns its assistant off while her server runs: the panel says so
    assistant(groups=[GROUP], model="")
    explain_the_cell(page)
    chat.get_by_text("The lab assistant is off").first.wait_for(timeout=60_000)
    assistant(groups=[GROUP])

    page = new_page()
    sign_in_to_lab(page, finn.name, finn.token)
    chat = explain_a_cell(page, "print('ran', 2)", "ran 2")
    chat.get_by_text(f"open to the groups {GROUP} only").first.wait_for(timeout=90_000)
    screenshot(page, "assistant-refused.png")
    assert counted(hub_metrics(), finn.name, "refused") == 1


def no_outside_endpoint(member) -> str:
    """What JupyterLab's assistant in her running server is configured to ask (its own
    API, as the chat panel reads it), checked to be the lab's only: the one provider
    allowed is OpenAI's API at a custom address, and no AI key or address comes from the
    image's environment. Returns the address."""
    config = member.api("GET", "/ai/config").json()
    providers = member.api("GET", "/ai/providers").json()["providers"]
    assert [p["id"] for p in providers] == ["openai-chat-custom"], providers
    assert config["model_provider_id"] == "openai-chat-custom:lab-assistant", config
    assert config["completions_model_provider_id"] is None, config  # no inline completion
    image = json.loads(docker("inspect", member.container))[0]["Config"]["Env"]
    assert not [e for e in image if re.match(r"(OPENAI|ANTHROPIC|AZURE|MISTRAL|GOOGLE|"
                                             r"HUGGINGFACE|COHERE|AWS)", e)], image
    return config["fields"]["openai-chat-custom:lab-assistant"]["openai_api_base"]



def test_servers_start_without_jupyterlabs_assistant_while_the_lab_has_none(lab_user, hub):
    """gpulab.yaml names no model (the stack's default): her server neither loads
    jupyter-ai's server part (its API is not there) nor offers its JupyterLab part (no
    chat panel to fail, and no scripts for her browser to fetch: JupyterLab loads every
    federated extension it finds, disabled or not), so it pays nothing for it."""
    gus = lab_user("askgus")
    gus.start_server()
    assert gus.api("GET", "/ai/config").status_code == 404
    page = requests.get(f"{gus.server_url}/lab", headers=gus._headers(), timeout=60)
    config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">'
                                  r"(.*?)</script>", page.text, re.S).group(1))
    assert "@jupyter-ai/core" in config["disabledExtensions"], config["disabledExtensions"]
    offered = [e["name"] for e in config["federated_extensions"]]
    assert "@jupyter-ai/core" not in offered and offered, offered


ASSISTANT = "(lab assistant)"  # gpulab.assistant.gpus.ASSISTANT


@pytest.mark.disruptive  # gpulab.yaml with gpus.yaml, and make up: a stack of its own
def test_the_assistants_gpu_is_held_for_it_never_offered_and_handed_to_its_container(
        assistant, gpus_yaml, fake_control, hub_admin, lab_user, new_page):
    """An admin gives the lab assistant GPU 1 (of the two stand-ins) in gpulab.yaml: the
    hub holds it for the assistant at once (spawn form, REST API, lease page), and `make
    up` hands it to the assistant's container, whose labels name the same holder to the
    exporter and the dashboard. GPU 0, named too while a member's server holds it, stays
    hers."""
    assistant(gpus=[1])
    member, other = lab_user("gpuasker"), lab_user("gpuother")
    page = new_page()
    submit_login(page, member.name, member.token, next_url="/hub/spawn")
    assert gpu_table(page) == [("0", "free"), ("1", "held for the lab assistant")]
    assert page.locator("#gpulab-gpus option").all_inner_texts() == ["0", "1"]
    screenshot(page, "spawn-form-assistant-gpu.png")
    # straight to the REST API too: GPU 0 is hers, and then there is none for another
    member.start_server({"gpus": 1})
    assert gpus_of(member.container)["device_ids"] == [GPU0]
    r = requests.post(f"{other.hub.api}/users/{other.name}/server", json={"gpus": 1},
                      headers={"Authorization": f"token {other.token}"}, timeout=60)
    assert r.status_code == 409 and "only 0 of the 2 GPUs" in r.json()["message"], r.text

    # the admins' lease table: the assistant's, by gpulab.yaml, not to be released
    r = requests.get(f"{HUB_URL}/services/gpus/api/leases", timeout=30,
                     headers={"Authorization": f"token {hub_admin.token}"})
    assert r.status_code == 200, r.text
    rows = {le["gpu_uuid"]: le for le in r.json()["leases"]}
    assert (rows[GPU1]["user"], rows[GPU1]["state"], rows[GPU1]["releasable"]) == (
        ASSISTANT, "reserved", False), rows
    assert rows[GPU0]["user"] == member.name
    r = requests.post(f"{HUB_URL}/services/gpus/api/leases/release", timeout=30,
                      json={"gpu_uuid": GPU1, "user": ASSISTANT, "server": "assistant"},
                      headers={"Authorization": f"token {hub_admin.token}"})
    assert r.status_code == 409 and "assistant.gpus" in r.json()["error"], r.text

    # the admin gives it GPU 0 too, which she holds: the hub holds it for the assistant
    # (it goes to no one else), but it stays hers until her server stops
    assistant(gpus=[0, 1])
    try:
        # make up hands GPU 1 to the assistant's container, and only it
        out = make("up", exporter_flags())
        assert (f"GPU 0 (assistant.gpus) is in use by {member.name}'s server: the lab "
                f"assistant's container gets it at the first make assistant (or make up) "
                f"after that server stops") in out, out
        assert "the lab assistant holds GPU(s) 1 (assistant.gpus)" in out, out
        assert gpus_of("gpulab-assistant") == {"device_ids": ["1"], "env": "1", "label": "1"}
        # the exporter names its holder as the lease table does (and hers, hers)
        def holders():
            return {g["uuid"]: [le["user"] for le in g["leases"]]
                    for g in exporter_snapshot()["gpus"]}

        wait_for(lambda: holders() == {GPU0: [member.name], GPU1: [ASSISTANT]}, 30,
                 what=lambda: f"the exporter to name the holders (it says {holders()})")
        # and the operators' dashboard, as they watch it, says whose GPU 1 is
        ops = new_page()
        submit_login(ops, hub_admin.name, hub_admin.token, next_url="/services/gpus/")
        held_by = ops.locator("div").filter(has_text=re.compile(r"^Held by: "))

        def named():  # "Held by: NAME (memory)" for GPU 0, then GPU 1
            said = held_by.all_inner_texts()
            return len(said) == 2 and said[0].startswith(f"Held by: {member.name} (") \
                and said[1].startswith(f"Held by: {ASSISTANT} (")

        wait_for(named, 15, what=lambda: f"the dashboard to name GPU 0's and GPU 1's holders "
                                         f"(it says {held_by.all_inner_texts()})")
        screenshot(ops, "dashboard-assistant-gpu.png")
        log = container_logs("gpulab-assistant", 50)
        assert "GPU devices this llama.cpp build sees: none" in log, log
        assert "assistant.gpus names 0, 1, this container holds 1" in log, log
    finally:
        member.stop_server()
        assistant.off()
        # the container without them, for the tests after: what an admin runs after such
        # an edit (only the assistant's container restarts)
        make("assistant", exporter_flags())
    info = json.loads(docker("inspect", "gpulab-assistant"))[0]
    assert not info["HostConfig"]["DeviceRequests"], info["HostConfig"]["DeviceRequests"]
