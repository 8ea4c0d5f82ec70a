"""A start that gives no options gets those of her last start (JupyterHub's way): only
what she could still choose is kept (gpulab.spawn.reused), and which requests those are
(gpulab.compat.options_reused). On the real stack: test_gpu_leases.py's
test_a_start_without_options_after_her_gpu_access_went_starts_without_gpus."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.handlers.pages import SpawnHandler

from gpulab.compat import options_reused
from gpulab.spawn.reused import still_choosable

ENVS = [("pytorch", True), ("light", False)]


def test_gpus_she_cannot_have_now_are_dropped_and_she_is_told():
    kept, said = still_choosable({"gpus": 1, "wait": True, "environment": "pytorch"},
                                 most_gpus=0, environments=ENVS)
    assert kept == {"gpus": 0, "environment": "pytorch"}
    assert said == ["Starting with no GPUs: your last start asked for 1, and no GPU is "
                    "available to you now."]


def test_a_lowered_quota_brings_them_within_it():
    kept, said = still_choosable({"gpus": 2}, most_gpus=1, environments=ENVS)
    assert kept == {"gpus": 1}
    assert said == ["Starting with 1 GPU: your last start asked for 2, and you may have at "
                    "most 1 now."]


def test_what_she_can_still_choose_is_kept_but_never_the_line():
    kept, said = still_choosable({"gpus": 2, "wait": True}, most_gpus=2, environments=ENVS)
    assert kept == {"gpus": 2} and said == []
    kept, said = still_choosable({"gpus": 0}, most_gpus=0, environments=ENVS)
    assert kept == {"gpus": 0} and said == []
    # fewer CPUs or less memory: not kept (the lab's limits may have gone down since)
    kept, said = still_choosable({"gpus": 1, "cpus": 2, "memory": "4g"}, most_gpus=1,
                                 environments=ENVS)
    assert kept == {"gpus": 1} and said == []


def test_an_environment_no_longer_open_to_her_falls_back_to_her_first():
    kept, said = still_choosable({"environment": "course", "gpus": 1}, most_gpus=1,
                                 environments=ENVS)
    assert kept == {"gpus": 1}
    assert said == ["Starting in your first environment: 'course', which your last start "
                    "used, is not open to you now."]


def test_an_environment_now_without_gpus_starts_without_them():
    kept, said = still_choosable({"environment": "light", "gpus": 1}, most_gpus=2,
                                 environments=ENVS)
    assert kept == {"environment": "light", "gpus": 0}
    assert said[0].startswith("Starting with no GPUs: your last start asked for 1")


def handler(cls, method, body=b"", query=None):
    h = cls.__new__(cls)  # the type is what counts; no application needed
    h.request = SimpleNamespace(method=method, body=body,
                                query_arguments={k: [v.encode()] for k, v in
                                                 (query or {}).items()})
    return h


@pytest.mark.parametrize("h, reused", [
    (handler(SpawnHandler, "GET"), True),  # the spawn page, no form
    (handler(SpawnHandler, "GET", query={"next": "/user/x/lab"}), True),
    (handler(SpawnHandler, "GET", query={"gpus": "1"}), False),  # options in the query
    (handler(SpawnHandler, "POST", b"gpus=1"), False),  # the form
    (handler(APIHandler, "POST"), True),  # REST, no body
    (handler(APIHandler, "POST", b"  "), True),
    (handler(APIHandler, "POST", b'{"gpus": 1}'), False),
    # what JupyterHub reads as no options (apihandlers/users.py get_server_json_body)
    (handler(APIHandler, "POST", b"{}"), True),
    (handler(APIHandler, "POST", b"null"), True),
    (handler(APIHandler, "POST", b'{"display_name": "x"}'), True),
    (handler(APIHandler, "POST", b'{"user_options": null}'), True),
    (handler(APIHandler, "POST", b'{"user_options": {"gpus": 1}}'), False),
    (handler(APIHandler, "POST", b"not json"), False),
    (None, False),
])
def test_which_starts_reuse_the_last_options(h, reused):
    assert options_reused(h) is reused
