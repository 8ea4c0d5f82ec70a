"""A start that gives no options gets those of her last start (JupyterHub's way): only
what she could still choose is kept (gpulab.spawn.reused), and which requests those are
(gpulab.compat.options_reused). On the real stack: test_gpu_leases.py's
test_a_start_without_options_after_the_gpus_went_starts_without_them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.handlers.pages import SpawnHandler

from gpulab.compat import options_reused
from gpulab.spawn.reused import still_choosable


def test_gpus_she_cannot_have_now_are_dropped_and_she_is_told():
    kept, said = still_choosable({"gpus": 1, "wait": True, "environment": "pytorch"},
                                 gpus_offered=False, environments={"pytorch"})
    assert kept == {"gpus": 0, "environment": "pytorch"}
    assert said == ["Starting without GPUs: your last start asked for 1, and no GPU is "
                    "available to you now."]


def test_what_she_can_still_choose_is_kept_but_never_the_line():
    kept, said = still_choosable({"gpus": 2, "wait": True}, gpus_offered=True,
                                 environments={"default"})
    assert kept == {"gpus": 2} and said == []
    kept, said = still_choosable({"gpus": 0}, gpus_offered=False, environments=set())
    assert kept == {"gpus": 0} and said == []


def test_an_environment_no_longer_open_to_her_falls_back_to_her_first():
    kept, said = still_choosable({"environment": "course"}, gpus_offered=True,
                                 environments={"pytorch", "light"})
    assert kept == {}
    assert said == ["Starting in your first environment: 'course', which your last start "
                    "used, is not open to you now."]


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
    (None, False),
])
def test_which_starts_reuse_the_last_options(h, reused):
    assert options_reused(h) is reused
