"""Pure helpers of gpulab.spawn.spawner: what a member is told when Docker refuses."""

from __future__ import annotations

import docker.errors
import pytest
import requests

from gpulab.spawn.spawner import policy_refusal


def api_error(status: int, explanation: str) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = status
    return docker.errors.APIError("refused", response=response, explanation=explanation)


@pytest.mark.parametrize("status, explanation, reason", [
    (403, "gpulab docker-proxy: HostConfig: key 'Privileged' is not allowed",
     "HostConfig: key 'Privileged' is not allowed"),
    (400, "gpulab docker-proxy: container create body: duplicate key 'HostConfig'",
     "container create body: duplicate key 'HostConfig'"),
    (403, "forbidden by something else", None),  # not gpulab's proxy
    (409, "gpulab docker-proxy: whatever", None),  # not a refusal
    (500, "gpulab docker-proxy: Docker engine unreachable", None),
])
def test_only_the_proxys_refusals_are_told_as_such(status, explanation, reason):
    assert policy_refusal(api_error(status, explanation)) == reason
