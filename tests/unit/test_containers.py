import json

import pytest

from gpulab.contract import LABEL_JOB, is_job, label_claims
from gpulab.settings import Settings, defaults
from gpulab.spawn.containers import (
    container_options,
    home_volume_create,
    project_volume_create,
)
from gpulab.spawn.jobs import ENV as JOB_ENV
from gpulab.spawn.jobs import Job
from gpulab.spawn.naming import volume_name


def test_cpu_only_container_matches_expected_structure():
    opts = container_options(defaults(), "alice")
    assert opts.image == "gpulab/singleuser:latest"
    assert opts.volumes == {
        "gpulab-home-alice": {"bind": "/home/jovyan", "mode": "rw"},
        "gpulab-datasets": {"bind": "/datasets", "mode": "ro"},
    }
    assert opts.host_config == {
        "shm_size": 2 * 1024**3,
        "pids_limit": 1024,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "init": True,
        "auto_remove": False,
        "log_config": {"type": "json-file", "config": {"max-size": "10m", "max-file": "3"}},
    }
    assert opts.create_kwargs == {
        "user": "1000:1000",
        "labels": {
            "org.gpulab.managed": "true",
            "org.gpulab.user": "alice",
            "org.gpulab.server": "",
            "org.gpulab.gpus": "",
        },
    }
    # An image that sets NVIDIA_VISIBLE_DEVICES=all still sees no GPU; its libraries start
    # a thread per CPU it has (spawn.cpu_limit), not per CPU of the machine.
    assert opts.environment == {"NVIDIA_VISIBLE_DEVICES": "void", "GPULAB_GPUS": "",
                                "OMP_NUM_THREADS": "4"}
    assert opts.mem_limit == 8 * 1024**3
    assert opts.cpu_limit == 4.0


@pytest.mark.parametrize("cpus,threads", [(6.0, "6"), (2.5, "2"), (0.5, "1")])
def test_cpus_and_memory_by_gpu_count_replace_the_settings_own(cpus, threads):
    from gpulab.gpus.policy import ServerResources

    opts = container_options(defaults(), "bob", "", ["GPU-aaaa"],
                             resources=ServerResources(cpus, 40 * 1024**3))
    assert (opts.cpu_limit, opts.mem_limit) == (cpus, 40 * 1024**3)
    assert opts.environment["OMP_NUM_THREADS"] == threads


def test_gpus_become_one_device_request_for_exactly_those_uuids():
    uuids = ["GPU-aaaa", "GPU-bbbb"]
    opts = container_options(defaults(), "bob", "train", uuids)
    assert opts.host_config["device_requests"] == [
        {"Driver": "nvidia", "DeviceIDs": ["GPU-aaaa", "GPU-bbbb"], "Capabilities": [["gpu"]]}
    ]
    assert opts.environment["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaaa,GPU-bbbb"
    assert opts.labels["org.gpulab.gpus"] == "GPU-aaaa,GPU-bbbb"
    assert opts.labels["org.gpulab.server"] == "train"


def test_no_datasets_volume_when_disabled():
    settings = dict(defaults())
    settings["spawn.datasets_volume"] = ""
    opts = container_options(settings, "carol")
    assert list(opts.volumes) == ["gpulab-home-carol"]


def test_odd_usernames_get_safe_distinct_volumes():
    a = container_options(defaults(), "Zoë.K")
    b = container_options(defaults(), "zoe-k")
    assert set(a.volumes) != set(b.volumes)
    assert all(v.startswith("gpulab-home-") for v in a.volumes if "home" in v)


def test_label_claims_read_back_what_container_options_wrote():
    opts = container_options(defaults(), "bob", "train", ["GPU-aaaa", "GPU-bbbb"])
    assert label_claims({"Labels": opts.labels}) == ("bob", "train", ["GPU-aaaa", "GPU-bbbb"])
    assert label_claims({"Labels": container_options(defaults(), "eve").labels}) == ("eve", "", [])
    assert label_claims({"Labels": None}) == ("", "", [])


def test_a_jobs_container_says_so_in_its_labels_and_carries_the_job_for_its_runner():
    job = Job("python train.py", 3600)
    opts = container_options(defaults(), "bob", "j1", ["GPU-aaaa"], job=job)
    assert is_job({"Labels": opts.labels}) and opts.labels[LABEL_JOB] == "true"
    assert label_claims({"Labels": opts.labels}) == ("bob", "j1", ["GPU-aaaa"])
    assert json.loads(opts.environment[JOB_ENV]) == {
        "id": "j1", "command": "python train.py", "time_limit": 3600}
    server = container_options(defaults(), "bob", "train", ["GPU-aaaa"])
    assert LABEL_JOB not in server.labels and JOB_ENV not in server.environment
    assert not is_job({"Labels": server.labels}) and not is_job({})


def test_a_home_is_created_apart_only_when_its_size_is_limited():
    assert home_volume_create(defaults(), "alice") is None
    sized = Settings({**defaults(), "spawn.home_size": 10 * 1024**3})
    assert home_volume_create(sized, "Zoë.K", "run") == {
        "name": "gpulab-home-zo-k---" + volume_name("{username}", "Zoë.K")[-8:],
        "driver": "local",
        "driver_opts": {"size": str(10 * 1024**3)},
    }


def test_a_project_folder_is_created_apart_only_when_its_size_is_limited():
    assert project_volume_create(defaults(), "cars") is None
    sized = Settings({**defaults(), "spawn.project_size": 200 * 1024**3})
    assert project_volume_create(sized, "cars") == {
        "name": "gpulab-project-cars", "driver": "local",
        "driver_opts": {"size": str(200 * 1024**3)}}


def test_jupyterlabs_assistant_is_on_only_while_the_labs_assistant_is():
    """The image keeps jupyter-ai unloaded (a server start ~1.4 s and ~90 MB dearer);
    its config folder that turns it on is named only while gpulab.yaml names a model."""
    assert "JUPYTER_CONFIG_PATH" not in container_options(defaults(), "alice").environment
    on = defaults().with_values({"assistant.model": "coder.gguf"})
    env = container_options(on, "alice").environment
    assert env["JUPYTER_CONFIG_PATH"] == "/opt/venv/share/gpulab/assistant-on"


def test_real_time_collaboration_is_on_only_where_the_lab_turned_it_on_beside_the_assistant():
    """spawn.collaboration names the image's folder that turns jupyter-collaboration on;
    with the assistant on too, both folders are on Jupyter's path."""
    collab = "/opt/venv/share/gpulab/collaboration-on"
    on = defaults().with_values({"spawn.collaboration": True})
    assert container_options(on, "alice").environment["JUPYTER_CONFIG_PATH"] == collab
    both = on.with_values({"assistant.model": "coder.gguf"})
    assert container_options(both, "alice").environment["JUPYTER_CONFIG_PATH"] == \
        f"/opt/venv/share/gpulab/assistant-on:{collab}"


def test_her_groups_projects_are_mounted_where_docker_makes_a_new_one_hers():
    opts = container_options(defaults(), "bob", "", (), projects=("cars", "faces"))
    assert opts.host_config["mounts"] == [
        {"Type": "volume", "Source": "gpulab-project-cars", "Target": "/srv/gpulab/projects/0",
         "ReadOnly": False},
        {"Type": "volume", "Source": "gpulab-project-cars", "Target": "/projects/cars",
         "ReadOnly": False},
        {"Type": "volume", "Source": "gpulab-project-faces", "Target": "/srv/gpulab/projects/1",
         "ReadOnly": False},
        {"Type": "volume", "Source": "gpulab-project-faces", "Target": "/projects/faces",
         "ReadOnly": False}]
    assert "mounts" not in container_options(defaults(), "bob").host_config
