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
import secrets
import subprocess
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .browser import run_in_new_notebook, screenshot, sign_in_to_lab
from .stack import HUB_URL, REPO, container_logs, docker, wait_for
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
    # (how many chunks carry text is the random model's luck: llama.cpp holds back a
    # token that is part of a UTF-8 character, and CI once saw none of four sent)
    events = [e for e in streamed[2].split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]" and len(events) >= 2, streamed[2]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL
               for c in chunks), streamed[2]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length", streamed[2]
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


def test_gpus_for_the_assistant_are_refused_saying_why(assistant, hub):
    """The PyPI llama.cpp build computes on the CPU only: an admin who names GPUs for the
    assistant after editing gpulab.yaml, as the docs said before, runs `make assistant`:
    it says the edit is refused, with the file and line and what to do instead, and the
    last good settings stay in force (the container holds no GPU; every GPU stays the
    members'); so does the hub's own check."""
    assistant()
    assistant(gpus=[1])
    out = subprocess.run(["make", "-s", "assistant"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said
    assert "assistant.gpus: the lab assistant cannot use GPUs yet" in said, said
    assert "set assistant.endpoint" in said and "This edit is refused" in said, said
    info = json.loads(docker("inspect", "gpulab-assistant"))[0]
    assert not info["HostConfig"]["DeviceRequests"], info["HostConfig"]["DeviceRequests"]
    check = subprocess.run(["docker", "exec", "gpulab-hub", "gpulab", "config", "check",
                            "/srv/gpulab/config/gpulab.yaml"], capture_output=True, text=True,
                           timeout=60)
    assert "assistant.gpus: the lab assistant cannot use GPUs yet" in \
        check.stdout + check.stderr, check


# The lab's own OpenAI-compatible server (vLLM on a GPU machine, in a lab): here a second
# llama.cpp server, gpulab-assistant from the hub image on the tiny model, with a key of
# its own, which the hub reaches on the assistant's network, as it would reach the lab's.
LAB_LLM = "gpulab-test-llm"


@pytest.fixture
def lab_llm(hub, tmp_path):
    served = tmp_path / "lab-llm"
    served.mkdir()
    write_tiny_model(served / MODEL)
    (served / "gpulab.yaml").write_text(f"assistant:\n  model: {MODEL}\n  threads: 1\n"
                                        f"  parallel: 1\n")
    key = secrets.token_hex(16)
    (served / "key").write_text(key + "\n")
    for path in (served, *served.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    tmp_path.chmod(0o755)
    docker("rm", "-f", LAB_LLM, check=False)
    docker("run", "-d", "--name", LAB_LLM, "--network", "gpulab-assistant", "--user",
           "65534:65534", "--read-only", "--cap-drop", "ALL", "--init", "-v",
           f"{served}:/llm:ro", "--entrypoint", "gpulab-assistant", "gpulab/hub:latest",
           "--settings-file", "/llm/gpulab.yaml", "--models", "/llm", "--key-file",
           "/llm/key")
    key_file = REPO / "secrets" / "assistant-endpoint-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    yield key
    key_file.unlink(missing_ok=True)
    print(f"----- {LAB_LLM} -----\n{container_logs(LAB_LLM, 30)}")
    docker("rm", "-f", LAB_LLM, check=False)


def test_the_assistant_can_be_a_server_the_lab_runs_already(assistant, lab_llm, lab_user):
    """assistant.endpoint: members ask the lab's own OpenAI-compatible server through the
    hub's door, as they ask gpulab's: with their own tokens, counted, with the lab's key
    (never theirs), its model by name; nothing of the question or the key in the hub's
    log; and the stack's own llama.cpp serves nothing."""
    assistant(endpoint=f"http://{LAB_LLM}:8080/v1", max_tokens=4)
    wait_for(lambda: "serving" in container_logs(LAB_LLM, 20), 60,
             what="the lab's server to load its model")
    member = lab_user("askendpoint")
    member.start_server()
    [status, models, first, streamed] = ask_in_notebook(member, (
        "print(json.dumps(ready()))\n"
        "print(json.dumps(call('/v1/models')))\n"
        "print(json.dumps(ask(model='gpt-4o')))\n"
        "print(json.dumps(ask(stream=True)))\n"))
    assert status[0] == 200 and json.loads(status[2])["ready"] is True, status
    assert models[0] == 200 and MODEL in models[2], models
    assert first[0] == 200, first
    answer = json.loads(first[2])
    assert answer["choices"][0]["message"]["role"] == "assistant", answer
    assert answer["usage"]["completion_tokens"] <= 4, answer  # the lab's cap
    assert streamed[0] == 200 and "data: " in streamed[2], streamed
    assert counted(hub_metrics(), member.name, "ok") >= 3
    logs = container_logs("gpulab-hub", 300)
    assert "unsqueeze" not in logs and lab_llm not in logs
    assert "assistant.endpoint is set" in container_logs("gpulab-assistant", 20)

    # without the lab's key, its server refuses: she is told, and it is counted
    (REPO / "secrets" / "assistant-endpoint-key").unlink()
    [refused] = ask_in_notebook(member, "print(json.dumps(ask()))\n")
    assert refused[0] == 401, refused
    assert counted(hub_metrics(), member.name, "error") >= 1


