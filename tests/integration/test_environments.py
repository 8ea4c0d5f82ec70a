"""Environments members choose (spawn.environments, docs/operations.md "Environments"), on the
real stack: two images the test builds (the lab's single-user image and a "light" one
made from it, told apart by an environment variable), listed in gpulab.yaml as an admin
would; members choose through the spawn form in Chromium and through the REST API, the
hub refuses anything else naming her choices, an environment's changed image is used
from the next start, and a member waiting in line for a GPU gets the environment she
asked for when her turn comes."""

from __future__ import annotations

import json
import subprocess

import pytest
import requests

from .browser import screenshot, submit_login
from .stack import docker, wait_for
from .standin import GPU0, STANDIN_GPUS, gpus_of
from .test_resources import seen_inside

pytestmark = pytest.mark.integration

LIGHT = "gpulab/test-light:{}"


def build_light(tag: str) -> str:
    """A second environment's image: the lab's, with GPULAB_TEST_ENVIRONMENT=light-TAG."""
    image = LIGHT.format(tag)
    dockerfile = f"FROM gpulab/singleuser:latest\nENV GPULAB_TEST_ENVIRONMENT=light-{tag}\n"
    subprocess.run(["docker", "build", "-q", "-t", image, "-"], input=dockerfile, text=True,
                   check=True, capture_output=True, timeout=120)
    return image


@pytest.fixture(scope="module")
def light_images():
    images = [build_light("1"), build_light("2")]
    yield images
    docker("rmi", *images, check=False)


def environments(light: str) -> list[dict]:
    return [
        {"name": "pytorch", "image": "gpulab/singleuser:latest", "description": "PyTorch"},
        {"name": "light", "image": light, "description": "for writing", "gpus": False,
         "cpus": 1, "memory": "768m"},  # its servers' own size
        # for one group only: the lab's operators group (hub.operators; the hub makes
        # the groups it knows, and its API token may add members to them)
        {"name": "course", "image": light, "groups": ["operators"]},
    ]


def image_of(user) -> tuple[str, str]:
    """(image name, GPULAB_TEST_ENVIRONMENT) of her running container."""
    info = json.loads(docker("inspect", user.container))[0]
    env = dict(e.split("=", 1) for e in info["Config"]["Env"])
    return info["Config"]["Image"], env.get("GPULAB_TEST_ENVIRONMENT", "")


def post_spawn(user, options) -> requests.Response:
    return requests.post(f"{user.hub.api}/users/{user.name}/server", json=options,
                         headers={"Authorization": f"token {user.token}"}, timeout=120)


def test_members_choose_an_environment_and_get_its_image(spawn_settings, light_images,
                                                         lab_user, new_page, hub):
    spawn_settings(environments=environments(light_images[0]))
    alice, bob, carol = lab_user("env"), lab_user("env"), lab_user("env")

    # through the REST API
    alice.start_server({"environment": "light"})
    assert image_of(alice) == (light_images[0], "light-1")
    # the environment's size, as her server's cgroup and nproc see it
    assert seen_inside(alice.container) == {
        "nproc": 1, "memory": 768 << 20, "cpu_quota_us": 100_000, "torch_threads": 1}
    assert json.loads(docker("inspect", alice.container))[0]["HostConfig"]["DeviceRequests"] \
        in (None, [])
    bob.start_server({})  # none named: the first open to him
    assert image_of(bob) == ("gpulab/singleuser:latest", "")
    bob.stop_server()

    # anything else: refused, naming his choices, and nothing started
    for options, status, says in (
            ({"environment": "course"}, 400, "No environment 'course' is open to you"),
            ({"environment": "alpine"}, 400, "Yours: pytorch: PyTorch; light: for writing "
                                             "(no GPU)."),
            ({"environment": "light", "gpus": 1}, 400, "runs without GPUs")):
        r = post_spawn(bob, options)
        assert r.status_code == status and says in r.json()["message"], (options, r.text)
        assert hub.server_model(bob.name) is None

    # a member of the course's group may use it
    r = hub.request("POST", "/groups/operators/users", json={"users": [bob.name]})
    assert r.status_code == 200, r.text
    try:
        bob.start_server({"environment": "course"})
        assert image_of(bob)[0] == light_images[0]
    finally:
        hub.request("DELETE", "/groups/operators/users", json={"users": [bob.name]})

    # the spawn form in Chromium: the environments open to her, and her choice
    page = new_page()
    submit_login(page, carol.name, carol.token, next_url="/hub/spawn")
    options = page.locator("#gpulab-environment option").all_inner_texts()
    assert options == ["pytorch: PyTorch", "light: for writing (no GPU)"], options
    page.select_option("#gpulab-environment", "light")
    screenshot(page, "spawn-form-environments.png")
    with page.expect_navigation():
        page.click("#spawn_form [type=submit]")
    wait_for(lambda: (hub.server_model(carol.name) or {}).get("ready"), 120,
             what="carol's server from the form")
    assert image_of(carol) == (light_images[0], "light-1")

    # an admin points "light" at a new image: used from the next start, not before
    spawn_settings(environments=environments(light_images[1]))
    assert image_of(alice) == (light_images[0], "light-1")
    alice.stop_server()
    alice.start_server({"environment": "light"})
    assert image_of(alice) == (light_images[1], "light-2")


def test_a_member_waits_in_line_in_her_environment_and_gets_it(spawn_settings, light_images,
                                                               lab_user, lab_config,
                                                               gpus_yaml, hub):
    """Waiting in line keeps the environment she asked for: when her turn comes, the
    line starts her server from its image, with the GPU kept for her."""
    spawn_settings(environments=[
        {"name": "pytorch", "image": "gpulab/singleuser:latest"},
        {"name": "light", "image": light_images[0], "description": "light, with a GPU"}])
    lab_config.write("gpus.yaml", STANDIN_GPUS.replace("  - {index: 1", "  # - {index: 1"))
    alice, bob = lab_user("env"), lab_user("env")
    alice.start_server({"gpus": 1})
    assert gpus_of(alice.container)["label"] == GPU0

    r = post_spawn(bob, {"gpus": 1, "wait": True, "environment": "light"})
    assert r.status_code == 202 and "number 1 in line" in r.json()["message"], r.text
    r = requests.get(f"{hub.api}/gpulab/line/{bob.name}",
                     headers={"Authorization": f"token {bob.token}"}, timeout=30)
    assert [e["environment"] for e in r.json()["line"]] == ["light"], r.text

    alice.stop_server()
    wait_for(lambda: (hub.server_model(bob.name) or {}).get("ready"), 120, interval=0.5,
             what="the line to start bob's server")
    assert image_of(bob) == (light_images[0], "light-1")
    assert gpus_of(bob.container)["label"] == GPU0
