"""PID -> container from /proc/PID/cgroup text, and container labels -> hub user."""

import io
import os
import re
import subprocess
import tarfile
import uuid

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


@pytest.mark.parametrize(
    "labels, expected",
    [
        ({"org.gpulab.user": "ann", "org.gpulab.server": "", "org.gpulab.gpus": "GPU-a,GPU-b"},
         Container(CID, "gpulab-ann", "ann", "", ("GPU-a", "GPU-b"))),
        ({"org.gpulab.user": "ann", "org.gpulab.server": "big", "org.gpulab.gpus": " GPU-a , "},
         Container(CID, "gpulab-ann", "ann", "big", ("GPU-a",))),
        ({"org.gpulab.user": "ann"}, Container(CID, "gpulab-ann", "ann", "", ())),
        ({"org.gpulab.user": "ann", "org.gpulab.server": "j1", "org.gpulab.job": "true"},
         Container(CID, "gpulab-ann", "ann", "j1", (), job=True)),
        ({"org.gpulab.gpus": "GPU-a"}, None),  # not a hub user container
        ({}, None),
    ],
)
def test_container_from_labels(labels, expected):
    assert container_from_labels(CID, "gpulab-ann", labels) == expected


def host_sleep_image(client) -> str:
    """An image of this host's own ``sleep`` and the libraries it links (ldd), imported
    from a tarball: no build and no registry, so the unit tests need no image that
    ``make images`` builds later (a fresh CI machine has none: docker pulled, and failed)."""
    import docker

    tag = "gpulab-test/host-sleep:latest"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    ldd = subprocess.run(["ldd", "/bin/sleep"], capture_output=True, text=True, check=True)
    files = ["/bin/sleep", *re.findall(r"(/\S+) \(0x", ldd.stdout)]
    tarball = io.BytesIO()
    with tarfile.open(fileobj=tarball, mode="w") as tar:
        for path in files:
            tar.add(os.path.realpath(path), arcname=path.lstrip("/"))
    client.api.import_image_from_data(tarball.getvalue(), repository=tag.split(":")[0],
                                      tag="latest")
    return tag


def test_docker_directory_and_proc_find_a_real_labelled_container():
    """The real directory against this host's dockerd, and the real /proc: a container
    labelled as the hub labels users' containers is listed with its user, server and
    GPUs, and the cgroup file of its process (by host PID) names it."""
    if not os.path.exists("/var/run/docker.sock"):
        pytest.skip("no Docker socket at /var/run/docker.sock on this host")
    docker = pytest.importorskip("docker")
    client = docker.from_env()
    image = host_sleep_image(client)
    name = f"gpulab-test-attribution-{uuid.uuid4().hex[:8]}"
    labels = {"org.gpulab.managed": "true", "org.gpulab.user": "ann",
              "org.gpulab.server": "big", "org.gpulab.gpus": "GPU-a,GPU-b"}
    container = client.containers.run(image, ["sleep", "120"], name=name, labels=labels,
                                      detach=True, network_mode="none")
    directory = DockerContainerDirectory()
    try:
        container.reload()
        pid = container.attrs["State"]["Pid"]
        found = {c.id: c for c in directory.containers()}
        assert found.get(container.id) == Container(container.id, name, "ann", "big",
                                                    ("GPU-a", "GPU-b"))
        assert container_of(pid) == container.id
        container.kill()
        container.wait(timeout=30)
        assert container.id not in {c.id for c in directory.containers()}  # running only
        assert container_of(pid) != container.id
    finally:
        directory.close()
        container.remove(force=True)
        client.close()
