"""Environments members choose (spawn.environments): the setting with file:line errors, the pure
choices, the Docker proxy's list of images, and the spawn form. The real spawns are
tests/integration/test_environments.py's."""

from __future__ import annotations

import pytest

from gpulab.dockerapi.policy import proxy_verdict
from gpulab.environments import (
    Environment,
    EnvironmentRefused,
    choose,
    gpu_count,
    lab_environments,
    lab_images,
    open_to,
    with_environment,
)
from gpulab.gpus.allocator import InvalidRequest, validate_user_options
from gpulab.settings import ConfigError, Settings, defaults, settings_from_yaml
from gpulab.spawn.form import SpawnForm, render_spawn_form
from gpulab.yamlfile import parse_yaml

TWO = """\
spawn:
  environments:
    - name: pytorch
      image: gpulab/singleuser:latest
      description: PyTorch and CUDA
    - name: writing
      image: lab/light:2026
      gpus: false
    - name: course
      image: lab/course:1
      groups: [teaching]
"""


def load(text: str) -> Settings:
    return settings_from_yaml(parse_yaml(text, "gpulab.yaml"))


@pytest.fixture
def settings() -> Settings:
    return load(TWO)


def test_the_list_is_read_with_defaults(settings):
    assert settings["spawn.environments"] == (
        Environment("pytorch", "gpulab/singleuser:latest", "PyTorch and CUDA"),
        Environment("writing", "lab/light:2026", gpus=False),
        Environment("course", "lab/course:1", groups=("teaching",)),
    )
    assert lab_images(settings) == ("gpulab/singleuser:latest", "lab/light:2026", "lab/course:1")


def test_without_the_list_the_lab_has_spawn_image():
    assert lab_environments(defaults()) == (Environment("default", "gpulab/singleuser:latest"),)
    assert lab_images(defaults()) == ("gpulab/singleuser:latest",)


@pytest.mark.parametrize(("change", "line", "where", "says"), [
    ("      image: lab/light:2026\n", 6, "environments[1].image",
     "expected an image name"),  # the writing image removed
    ("      gpus: false\n", 8, "environments[1].gpus", "expected true or false"),
    ("      description: PyTorch and CUDA\n", 5, "environments[0].colour", "unknown key 'colour'"),
    ("    - name: writing\n", 6, "environments[1].name", "listed twice"),
    ("      groups: [teaching]\n", 11, "environments[2].groups", "group names"),
])
def test_a_bad_entry_is_refused_at_its_own_line(change, line, where, says):
    replacement = {
        "      image: lab/light:2026\n": "",
        "      gpus: false\n": "      gpus: maybe\n",
        "      description: PyTorch and CUDA\n": "      colour: blue\n",
        "    - name: writing\n": "    - name: pytorch\n",
        "      groups: [teaching]\n": "      groups: teaching\n",
    }[change]
    with pytest.raises(ConfigError) as e:
        load(TWO.replace(change, replacement))
    assert str(e.value).startswith(f"gpulab.yaml:{line}: spawn.{where}: "), str(e.value)
    assert says in str(e.value)


def test_a_swarm_takes_them_too():
    # the proxy in front of a Swarm's manager lets each listed image run by its ID there
    # (tests/unit/test_swarm_proxy.py, tests/integration/test_docker_proxy_swarm.py)
    assert [e.name for e in load("hub:\n  swarm: true\n" + TWO)["spawn.environments"]] == [
        e.name for e in load(TWO)["spawn.environments"]]


def test_a_member_gets_the_first_open_to_her_and_may_choose_another(settings):
    assert choose(settings, None, [], False).name == "pytorch"
    assert choose(settings, {"gpus": 1}, [], False).name == "pytorch"
    assert choose(settings, {"environment": "writing"}, [], False).image == "lab/light:2026"
    assert choose(settings, {"environment": "course"}, ["teaching"], False).name == "course"
    assert choose(settings, {"environment": "course"}, [], True).name == "course"  # admin


@pytest.mark.parametrize(("options", "groups", "status", "says"), [
    ({"environment": "course"}, [], 400, "No environment 'course' is open to you"),
    ({"environment": "nope"}, [], 400, "Yours: pytorch: PyTorch and CUDA; writing (no GPU)."),
    ({"environment": ["pytorch"]}, [], 400, "must be the name of one"),
])
def test_anything_else_is_refused_naming_her_choices(settings, options, groups, status, says):
    with pytest.raises(EnvironmentRefused) as e:
        choose(settings, options, groups, False)
    assert e.value.status == status and says in str(e.value), str(e.value)
    assert "course" not in str(e.value).split("Yours:")[1]  # not hers: not listed


def test_a_member_with_no_environment_open_is_told_so():
    only_course = load(TWO.split("    - name: pytorch")[0] + "    - name: course\n"
                       "      image: lab/course:1\n      groups: [teaching]\n")
    assert open_to(lab_environments(only_course), ["physics"], False) == ()
    with pytest.raises(EnvironmentRefused) as e:
        choose(only_course, None, ["physics"], False)
    assert e.value.status == 403


def test_an_environment_without_gpus_gets_none():
    writing = Environment("writing", "lab/light:2026", gpus=False)
    assert gpu_count(writing, None, from_form=False) == 0
    assert gpu_count(writing, 0, from_form=False) == 0
    assert gpu_count(writing, 2, from_form=True) == 0  # the form's GPU choice: not for it
    with pytest.raises(EnvironmentRefused, match="runs without GPUs"):
        gpu_count(writing, 1, from_form=False)  # the REST API asked for GPUs: said
    assert gpu_count(Environment("x", "y"), 2, from_form=False) == 2


def test_the_spawn_reads_the_chosen_image(settings):
    writing = choose(settings, {"environment": "writing"}, [], False)
    assert with_environment(settings, writing)["spawn.image"] == "lab/light:2026"
    assert settings["spawn.image"] == "gpulab/singleuser:latest"  # unchanged


def test_environment_is_a_user_option():
    assert validate_user_options({"environment": "writing", "gpus": 0}, 2) == 0
    with pytest.raises(InvalidRequest, match='"environment": the name of one'):
        validate_user_options({"image": "alpine"}, 2)


# -- the Docker proxy runs exactly the listed images --------------------------------------
def test_the_proxy_lets_each_listed_image_run_and_no_other(settings):
    from tests.unit.test_docker_proxy import legit

    for image, allowed in (("lab/light:2026", True), ("lab/course:1", True),
                           ("gpulab/singleuser:latest", True), ("lab/light:2027", False),
                           ("gpulab/hub:latest", False)):
        body = legit(gpus=())
        body["Image"] = image
        verdict = proxy_verdict("POST", "/v1.43/containers/create?name=gpulab-user-alice",
                                __import__("json").dumps(body).encode(), settings=settings)
        assert verdict.allowed == allowed, (image, verdict.reason)
        if not allowed:
            assert "only the lab's images may be run (gpulab/singleuser:latest, " \
                   "lab/light:2026, lab/course:1" in verdict.reason


# -- the spawn form ----------------------------------------------------------------------
def test_the_form_offers_the_environments_and_hides_gpus_when_there_are_none():
    form = SpawnForm(0, 0, (), environments=(("pytorch", "pytorch: PyTorch"),
                                             ("writing", "writing (no GPU) <b>")))
    html = render_spawn_form(form)
    assert '<select class="form-control" id="gpulab-environment" name="environment">' in html
    assert '<option value="writing">writing (no GPU) &lt;b&gt;</option>' in html
    assert 'name="gpus"' not in html
    with_gpus = render_spawn_form(SpawnForm(2, 1, (), environments=form.environments,
                                            environments_without_gpus=True))
    assert 'name="gpus"' in with_gpus and 'name="environment"' in with_gpus
    assert "no GPU\" starts without GPUs" in with_gpus
    all_gpus = render_spawn_form(SpawnForm(2, 1, (), environments=form.environments))
    assert "starts without GPUs" not in all_gpus
    assert 'name="environment"' not in render_spawn_form(SpawnForm(2, 1, ()))


SIZED = TWO.replace("      gpus: false\n", "      gpus: false\n      cpus: 1\n      memory: 2g\n"
                    ).replace("      description: PyTorch and CUDA\n",
                              "      description: PyTorch and CUDA\n      cpus_per_gpu: 8\n"
                              "      memory_per_gpu: 64g\n      max_cpus: 16\n")


def test_an_environment_may_size_its_servers_with_gpus_yamls_keys():
    writing, pytorch = (next(e for e in load(SIZED)["spawn.environments"] if e.name == n)
                        for n in ("writing", "pytorch"))
    assert dict(writing.resources) == {"cpus": 1.0, "memory": 2 << 30}
    assert dict(pytorch.resources) == {"cpus_per_gpu": 8.0, "max_cpus": 16.0,
                                       "memory_per_gpu": 64 << 30}


@pytest.mark.parametrize("entry, where, says", [
    ("      cpus: -1\n", "environments[1].cpus", "expected a number of CPUs above 0"),
    ("      memory: 2048\n", "environments[1].memory", "with its unit, such as 8g"),
    ("      cpus: 8\n      max_cpus: 4\n", "environments[1].cpus", "cpus: 8 is more than max_cpus: 4"),
])
def test_a_bad_size_is_refused_at_its_line(entry, where, says):
    with pytest.raises(ConfigError) as e:
        load(TWO.replace("      gpus: false\n", "      gpus: false\n" + entry))
    assert str(e.value).startswith(f"gpulab.yaml:9: spawn.{where}: "), str(e.value)
    assert says in str(e.value)


@pytest.mark.parametrize("mine, sizes, gpus, cpus, gib", [
    ("", {"cpus": 1.0, "memory": 2 << 30}, 0, 1, 2),           # the environment's, not the lab's
    ("defaults: {cpus: 2, memory: 8g, cpus_per_gpu: 4, memory_per_gpu: 16g}",
     {"cpus_per_gpu": 8.0}, 2, 18, 40),                        # its per-GPU CPUs, her memory
    ("defaults: {max_cpus: 6}", {"cpus": 12.0}, 0, 6, 8),      # never past her own cap
    ("defaults: {max_cpus: 64}", {"cpus": 4.0, "max_cpus": 8.0, "cpus_per_gpu": 4.0},
     4, 8, 8),                                                # its cap, lower than hers
    ("defaults: {max_cpus: 6}", {"max_cpus": 32.0, "cpus_per_gpu": 4.0}, 4, 6, 8),  # not higher
])
def test_an_environments_sizes_replace_gpus_yamls_within_her_caps(mine, sizes, gpus, cpus, gib):
    from gpulab.gpus.config import parse_gpus_config
    from gpulab.gpus.policy import in_environment, policy_for, server_resources

    policy = in_environment(policy_for(parse_gpus_config(mine), "ann"), sizes)
    got = server_resources(policy, gpus, base_cpus=2.0, base_memory=8 << 30)
    assert (got.cpus, got.memory) == (cpus, gib << 30)


def test_the_form_says_what_each_sized_environment_gives():
    from gpulab.gpus.config import parse_gpus_config
    from gpulab.gpus.policy import policy_for, sizes_note

    policy = policy_for(parse_gpus_config("defaults: {max_gpus: 2}"), "ann")
    envs = load(SIZED)["spawn.environments"]
    assert sizes_note(policy, envs, 2.0, 8 << 30) == (
        "A server gets 2 CPUs and 8 GB of memory. In pytorch, a server gets 2 CPUs and 8 GB "
        "of memory, and 8 CPUs and 64 GB of memory more for each GPU (at most 16 CPUs). In "
        "writing, a server gets 1 CPU and 2 GB of memory.")
    # one environment open to her: its sizes alone
    assert sizes_note(policy, envs[1:2], 2.0, 8 << 30) == \
        "A server gets 1 CPU and 2 GB of memory."
