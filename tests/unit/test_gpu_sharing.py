"""A server on a shared GPU gets PyTorch's memory cap at its share (gpulab.gpus.sharing).

That the cap holds is seen on a real GPU (scripts/gpu-host-check.sh, step 6, with the
environment this module builds); that a spawned server has it, in
tests/integration/test_gpu_leases.py. Here: the decisions."""

from __future__ import annotations

import pytest

from gpulab.gpus.sharing import alloc_conf, memory_fraction, merged_env, server_share
from gpulab.settings import defaults
from gpulab.spawn.containers import container_options
from gpulab.spawn.swarm_services import service_spec

CAP = "PYTORCH_CUDA_ALLOC_CONF"


@pytest.mark.parametrize(("share", "fraction"), [(1, None), (0, None), (2, 0.5),
                                                 (3, 0.3333), (4, 0.25), (7, 0.1428),
                                                 (1024, 0.0009)])
def test_each_server_may_take_its_share_rounded_down(share, fraction):
    assert memory_fraction(share) == fraction
    if fraction:
        assert 0 < memory_fraction(share) * share <= 1  # max_users goes up to 1024


LABELLED = {"org.gpulab.pytorch-memory-cap": "per_process_memory_fraction"}


def test_only_an_image_that_says_its_torch_takes_the_cap_gets_it():
    """A torch without the option refuses it, and then every CUDA allocation fails:
    an image without gpulab's label (an admin's own environment) gets no cap."""
    assert server_share([1, 4, 2], LABELLED) == 4
    assert server_share([], LABELLED) == 1
    assert server_share([4], {}) == server_share([4], None) == 1
    assert server_share([4], {"org.gpulab.pytorch-memory-cap": "expandable_segments"}) == 1
    assert server_share([4], {"org.gpulab.pytorch-memory-cap": "a, per_process_memory_fraction"}) == 4


def test_a_gpu_of_its_own_gets_no_cap_and_a_shared_one_gets_its_share():
    assert container_options(defaults(), "alice", "", ["GPU-a"]).environment == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a", "GPULAB_GPUS": "GPU-a", "OMP_NUM_THREADS": "4"}
    env = container_options(defaults(), "alice", "", ["GPU-a"], gpu_share=3).environment
    assert env[CAP] == "per_process_memory_fraction:0.3333"
    # no GPU, no cap, whatever the share; and an admin may turn it off
    assert CAP not in container_options(defaults(), "alice", "", [], gpu_share=3).environment
    off = {**defaults(), "spawn.shared_gpu_memory_cap": False}
    assert CAP not in container_options(off, "alice", "", ["GPU-a"], gpu_share=3).environment


def test_an_admins_own_allocator_options_stay_and_gain_the_cap():
    ours = {"GPULAB_GPUS": "GPU-a", **alloc_conf(2)}
    assert merged_env({"JUPYTERHUB_API_TOKEN": "t"}, ours) == {
        "JUPYTERHUB_API_TOKEN": "t", "GPULAB_GPUS": "GPU-a",
        CAP: "per_process_memory_fraction:0.5"}
    admin = {CAP: "expandable_segments:True", "GPULAB_GPUS": "admin's"}
    assert merged_env(admin, ours) == {
        "GPULAB_GPUS": "GPU-a", CAP: "expandable_segments:True,per_process_memory_fraction:0.5"}
    # an admin who set the fraction herself keeps hers; without a cap hers stays as is
    mine = {CAP: "per_process_memory_fraction:0.9"}
    assert merged_env(mine, ours)[CAP] == "per_process_memory_fraction:0.9"
    assert merged_env(admin, {"GPULAB_GPUS": ""})[CAP] == "expandable_segments:True"
    # no empty option between them (which a torch may refuse)
    assert merged_env({CAP: "garbage_collection_threshold:0.6,"}, ours)[CAP] == (
        "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5")


def test_a_swarm_server_gets_the_same_cap_once():
    hub_env = {"JUPYTERHUB_API_TOKEN": "t", CAP: "expandable_segments:True"}
    spec = service_spec(defaults(), "alice", "", ["GPU-a"], "node1", "sha256:" + "0" * 64,
                        env=hub_env, gpu_share=2)
    env = dict(e.split("=", 1) for e in spec["TaskTemplate"]["ContainerSpec"]["Env"])
    assert env[CAP] == "expandable_segments:True,per_process_memory_fraction:0.5"
    # what the spawner passes is already merged (its get_env): it is not capped twice
    spec = service_spec(defaults(), "alice", "", ["GPU-a"], "node1", "sha256:" + "0" * 64,
                        env=merged_env(hub_env, alloc_conf(2)), gpu_share=2)
    env = dict(e.split("=", 1) for e in spec["TaskTemplate"]["ContainerSpec"]["Env"])
    assert env[CAP] == "expandable_segments:True,per_process_memory_fraction:0.5"
