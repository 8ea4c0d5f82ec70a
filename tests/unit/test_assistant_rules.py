"""The lab assistant's decisions (gpulab.assistant.rules, .serve.wanted): who may ask,
how often, what is forwarded, what is served. That the path works (a member's server
asks through the hub, llama.cpp answers) is tested on the stack:
tests/integration/test_assistant.py."""

from __future__ import annotations

import json

import pytest

from gpulab.assistant.rules import WINDOW_SECONDS, RateWindow, Refused, chat_request, refusal
from gpulab.assistant.serve import wanted
from gpulab.settings import ConfigError, defaults, settings_from_yaml
from gpulab.yamlfile import parse_yaml

ON = defaults().with_values({"assistant.model": "tiny.gguf"})


def test_off_until_a_model_is_named():
    r = refusal(defaults(), [], is_admin=False)
    assert r.status == 503 and "names no model (assistant.model)" in r.reason
    assert refusal(ON, [], is_admin=False) is None


@pytest.mark.parametrize(("groups", "is_admin", "may"), [
    (["staff"], False, True), (["physics", "students"], False, True),
    ([], False, False), (["physics"], False, False), ([], True, True)])
def test_only_the_named_groups_and_admins(groups, is_admin, may):
    s = ON.with_values({"assistant.groups": ("students", "staff")})
    r = refusal(s, groups, is_admin)
    assert (r is None) == may
    if r:
        assert r.status == 403
        assert "open to the groups students, staff only" in r.reason


def test_each_member_has_her_own_minute():
    w = RateWindow()
    assert [w.take("alice", t, 3) for t in (0, 1, 2)] == [None] * 3
    r = w.take("alice", 10, 3)
    assert r.status == 429 and r.retry_after == 50 and "try again in 50 s" in r.reason
    assert w.take("bob", 10, 3) is None  # her limit is not his
    assert w.take("alice", WINDOW_SECONDS + 0.5, 3) is None  # her first request aged out
    assert w.take("alice", WINDOW_SECONDS + 0.6, 3).status == 429
    # refused requests do not count: she is not locked out longer by retrying
    assert w.take("alice", WINDOW_SECONDS + 2.5, 3) is None


def chat(body, cap=512):
    fwd = chat_request(json.dumps(body).encode(), cap)
    return json.loads(fwd.body), fwd.stream


def test_the_answer_is_capped_and_the_model_is_the_labs():
    msgs = [{"role": "user", "content": "why unsqueeze(0)?"}]
    assert chat({"messages": msgs}) == ({"messages": msgs, "max_tokens": 512}, False)
    assert chat({"messages": msgs, "max_tokens": 9000, "model": "gpt-4o"})[0] == \
        {"messages": msgs, "max_tokens": 512}
    assert chat({"messages": msgs, "max_completion_tokens": 20, "stream": True}) == \
        ({"messages": msgs, "stream": True, "max_tokens": 20}, True)
    # the inference server's own options do not get past the cap (llama.cpp reads
    # n_predict before max_tokens)
    assert chat({"messages": msgs, "n_predict": 100000, "grammar": "x", "id_slot": 1,
                 "temperature": 0.2, "n": 1}) == \
        ({"messages": msgs, "temperature": 0.2, "n": 1, "max_tokens": 512}, False)


@pytest.mark.parametrize(("raw", "says"), [
    (b"{nope", "not JSON"), (b"[1]", "JSON object"), (b"", "JSON object"),
    (b'{"messages": []}', "non-empty list"), (b'{"messages": [{"content": "x"}]}', "role"),
    (b'{"messages": [{"role": "user"}], "stream": "yes"}', "\"stream\" must be"),
    (b'{"messages": [{"role": "user"}], "max_tokens": -1}', "positive whole number"),
    (b'{"messages": [{"role": "user"}], "max_tokens": true}', "positive whole number"),
    (b'{"messages": [{"role": "user"}], "n": 5}', "one answer per request")])
def test_a_bad_request_is_refused_with_the_reason(raw, says):
    with pytest.raises(Refused) as e:
        chat_request(raw, 512)
    assert e.value.status == 400 and says in e.value.reason


def settings(text):
    return settings_from_yaml(parse_yaml(text, "gpulab.yaml"))


@pytest.mark.parametrize("name", ["/etc/passwd.gguf", "../up.gguf", "a/../../b.gguf",
                                  "model.bin", "a//b.gguf", 3])
def test_the_model_is_a_gguf_file_inside_the_models_folder(name):
    with pytest.raises(ConfigError) as e:
        settings(f"assistant:\n  model: {json.dumps(name)}\n")
    assert "gpulab.yaml:2" in str(e.value) and "models folder" in str(e.value)


def test_what_is_served(tmp_path):
    s = settings("assistant:\n  model: coder/m.gguf\n  threads: 3\n")
    want, why = wanted(s, tmp_path)
    assert want is None and "cannot be read" in why and "GPULAB_MODELS_DIR" in why
    (tmp_path / "coder").mkdir()
    (tmp_path / "coder" / "m.gguf").write_bytes(b"GGUF")
    want, why = wanted(s, tmp_path)
    assert why == "" and want.model == tmp_path / "coder" / "m.gguf" and want.threads == 3
    assert wanted(s, tmp_path)[0] == want  # unchanged: the server is not restarted
    (tmp_path / "coder" / "m.gguf").write_bytes(b"GGUF, a new version")
    assert wanted(s, tmp_path)[0] != want  # replaced in place: loaded again
    assert wanted(defaults(), tmp_path) == (None, "assistant.model is empty: no assistant")


def test_an_endpoint_of_the_labs_gets_its_model_by_name_and_the_local_server_serves_none(
        tmp_path):
    msgs = [{"role": "user", "content": "why unsqueeze(0)?"}]
    forward = chat_request(json.dumps({"messages": msgs, "model": "gpt-4o"}).encode(), 512,
                           "Qwen/Qwen2.5-Coder-7B-Instruct")
    assert json.loads(forward.body) == {"messages": msgs, "max_tokens": 512,
                                        "model": "Qwen/Qwen2.5-Coder-7B-Instruct"}
    s = settings("assistant:\n  model: Qwen/Qwen2.5-Coder-7B-Instruct\n"
                 "  endpoint: http://vllm.lab.example:8000/v1/\n")
    assert s["assistant.endpoint"] == "http://vllm.lab.example:8000/v1"
    want, why = wanted(s, tmp_path)
    assert want is None and "the hub asks Qwen/Qwen2.5-Coder-7B-Instruct at " \
        "http://vllm.lab.example:8000/v1, and this server runs nothing" in why
    assert refusal(s, [], is_admin=False) is None  # on


@pytest.mark.parametrize("text, says", [
    ("  endpoint: http://vllm.lab.example:8000/\n  model: m\n", "ending in /v1"),
    ("  endpoint: vllm.lab.example:8000/v1\n  model: m\n", "http:// or https:// URL"),
    ("  endpoint: http://vllm.lab.example:8000/v1\n", "needs assistant.model"),
    ("  model: Qwen/Qwen2.5\n", "a .gguf file in the models folder"),
])
def test_a_bad_endpoint_is_refused_with_file_and_line(text, says):
    with pytest.raises(ConfigError) as e:
        settings("assistant:\n" + text)
    assert "gpulab.yaml:" in str(e.value) and says in str(e.value)
