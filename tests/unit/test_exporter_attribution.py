"""PID -> container from /proc/PID/cgroup text, and container labels -> hub user."""

import os

import pytest

from gpulab_exporter.attribution import (
    Container,
    DockerContainerDirectory,
    container_from_labels,
    container_id_from_cgroup,
    container_of,
)

CID = "3f1c0a9b8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b"
assert len(CID) == 64


@pytest.mark.parametrize(
    "text, expected",
    [
        # cgroup v1: one line per hierarchy, all naming the same container
        (f"12:pids:/docker/{CID}\n11:memory:/docker/{CID}\n1:name=systemd:/docker/{CID}\n",
         CID),
        # cgroup v2, cgroupfs driver
        (f"0::/docker/{CID}\n", CID),
        # cgroup v2, systemd driver
        (f"0::/system.slice/docker-{CID}.scope\n", CID),
        # seen from a private cgroup namespace: relative path, id anywhere in it
        (f"0::/../../system.slice/docker-{CID}.scope\n", CID),
        (f"0::/../{CID}\n", CID),
        # containerd under Kubernetes, podman
        (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234_5678"
         f".slice/cri-containerd-{CID}.scope\n", CID),
        (f"0::/machine.slice/libpod-{CID}.scope/container\n", CID),
        # not in a container
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("0::/\n", None),
        ("12:pids:/\n11:memory:/user.slice\n", None),
        ("", None),
        # hex runs that are not a 64-hex container id
        ("0::/system.slice/docker-" + "a" * 63 + ".scope\n", None),
        ("0::/x/" + "b" * 65 + "\n", None),
        ("0::/foo-" + CID.upper() + ".scope\n", None),
    ],
)
def test_container_id_from_cgroup(text, expected):
    assert container_id_from_cgroup(text) == expected


def test_nested_container_reports_innermost():
    outer = "a" * 64
    assert container_id_from_cgroup(f"0::/docker/{outer}/docker/{CID}\n") == CID


def test_container_of_reads_injected_proc(tmp_path):
    (tmp_path / "100").mkdir()
    (tmp_path / "100" / "cgroup").write_text(f"0::/system.slice/docker-{CID}.scope\n")
    (tmp_path / "200").mkdir()
    (tmp_path / "200" / "cgroup").write_text("0::/init.scope\n")
    assert container_of(100, proc=str(tmp_path)) == CID
    assert container_of(200, proc=str(tmp_path)) is None
    assert container_of(300, proc=str(tmp_path)) is None  # exited between NVML and us


def test_container_of_own_process_on_this_host():
    # The real /proc: our own PID resolves to a container ID or to None, never raises.
    got = container_of(os.getpid())
    assert got is None or len(got) == 64


@pytest.mark.parametrize(
    "labels, expected",
    [
        ({"org.gpulab.user": "ann", "org.gpulab.server": "", "org.gpulab.gpus": "GPU-a,GPU-b"},
         Container(CID, "gpulab-ann", "ann", "", ("GPU-a", "GPU-b"))),
        ({"org.gpulab.user": "ann", "org.gpulab.server": "big", "org.gpulab.gpus": " GPU-a , "},
         Container(CID, "gpulab-ann", "ann", "big", ("GPU-a",))),
        ({"org.gpulab.user": "ann"}, Container(CID, "gpulab-ann", "ann", "", ())),
        ({"org.gpulab.gpus": "GPU-a"}, None),  # not a hub user container
        ({}, None),
    ],
)
def test_container_from_labels(labels, expected):
    assert container_from_labels(CID, "gpulab-ann", labels) == expected


def test_docker_directory_against_the_local_daemon():
    """The real directory against this host's dockerd (read-only: one list call)."""
    if not os.path.exists("/var/run/docker.sock"):
        pytest.skip("no Docker socket at /var/run/docker.sock on this host")
    directory = DockerContainerDirectory()
    try:
        found = directory.containers()
    except Exception as e:  # daemon not running
        pytest.skip(f"Docker daemon not answering: {e}")
    finally:
        directory.close()
    for c in found:
        assert len(c.id) == 64 and c.user and c.name
