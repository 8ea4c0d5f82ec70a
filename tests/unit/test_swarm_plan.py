"""The simulated Swarm's pure parts (tests/swarm/plan.py and the stand-in runtime's
parsing): names, addresses, fake GPUs, dockerd's command line, mount ordering."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.swarm import plan as P
from tests.swarm import standin_nvidia_runtime as R

STACK_AND_DOCKER = [ipaddress.ip_network(n) for n in (
    "172.30.0.0/24",      # the stack's network
    "172.16.0.0/12",      # Docker's default bridge and address pools
    "192.168.0.0/16",
    "198.18.203.0/24",    # test_https.py
)]


def test_three_nodes_default():
    nodes = P.plan_nodes("abc123")
    assert [(n.name, n.role, n.hostname, str(n.address)) for n in nodes] == [
        ("manager", "manager", "gpulab-swarm-manager", "198.18.210.1"),
        ("worker1", "worker", "gpulab-swarm-worker1", "198.18.210.2"),
        ("worker2", "worker", "gpulab-swarm-worker2", "198.18.210.3"),
    ]
    assert [n.netns for n in nodes] == [
        "gpulab-swarm-abc123-manager", "gpulab-swarm-abc123-worker1",
        "gpulab-swarm-abc123-worker2"]
    assert P.bridge_netns("abc123") == "gpulab-swarm-abc123-link"
    assert nodes[1].cgroup_parent == "/gpulab-swarm-abc123-worker1"
    assert [n.veth for n in nodes] == ["n1", "n2", "n3"]  # in the link namespace only
    assert nodes[0].gpus == ()
    assert [len(n.gpus) for n in nodes[1:]] == [2, 2]


def test_no_address_collides_with_each_other_or_the_stack():
    nodes = P.plan_nodes("abc123", P.MAX_NODES)
    nets = [P.LINK, P.SWARM_POOL]
    nets += [n.bip.network for n in nodes] + [n.local_pool for n in nodes]
    for i, a in enumerate(nets):
        assert a.subnet_of(ipaddress.ip_network("198.18.0.0/15")), a
        for b in nets[i + 1:] + STACK_AND_DOCKER:
            assert not a.overlaps(b), (a, b)
    assert {str(n.address) for n in nodes} | {str(P.BRIDGE_ADDRESS)} <= {
        str(h) for h in P.LINK.hosts()}
    assert len({n.address for n in nodes}) == P.MAX_NODES


def test_fake_gpus_look_like_nvidia_uuids_unique_and_stable():
    shape = re.compile(r"^GPU-fa4e[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    nodes = P.plan_nodes("abc123", P.MAX_NODES, gpus_per_worker=8)
    gpus = [g for n in nodes for g in n.gpus]
    assert all(shape.match(g) for g in gpus), gpus[:3]
    assert len(set(gpus)) == len(gpus) == 8 * (P.MAX_NODES - 1)
    assert P.plan_nodes("fedcba")[1].gpus == P.plan_nodes("abc123")[1].gpus  # every run
    assert P.fake_gpu_uuids(2, 0) == ()


@pytest.mark.parametrize("run,nodes,gpus,error", [
    ("abc12", 3, 2, "6 lowercase hex"),
    ("ABC123", 3, 2, "6 lowercase hex"),
    ("abc123", 0, 2, "1 to 16 nodes"),
    ("abc123", 17, 2, "1 to 16 nodes"),
    ("abc123", 3, -1, "gpus_per_worker"),
])
def test_plan_refuses(run, nodes, gpus, error):
    with pytest.raises(ValueError, match=error):
        P.plan_nodes(run, nodes, gpus)


def test_one_node_is_a_manager_alone():
    (node,) = P.plan_nodes("abc123", 1)
    assert node.role == "manager" and node.gpus == ()


def test_dockerd_argv():
    node = P.plan_nodes("abc123")[1]
    paths = P.NodePaths(Path("/tmp/gpulab-swarm-abc123/worker1"))
    argv = P.dockerd_argv(node, paths)
    root = "/tmp/gpulab-swarm-abc123/worker1"
    assert argv[:10] == [
        "nsenter", "--net=/run/netns/gpulab-swarm-abc123-worker1", "--",
        "unshare", "--uts", "--",
        "sh", "-c", 'hostname "$0" && exec "$@"', "gpulab-swarm-worker1"]
    dockerd = argv[10:]
    assert dockerd[0] == "dockerd"
    flags = dict(zip(dockerd[1::2], dockerd[2::2], strict=False))
    labels = [v for k, v in zip(dockerd[1::2], dockerd[2::2], strict=False) if k == "--label"]
    assert flags["--config-file"] == f"{root}/daemon.json"
    assert flags["--host"] == f"unix://{root}/docker.sock"
    assert flags["--data-root"] == f"{root}/data"
    assert flags["--exec-root"] == f"{root}/exec"
    assert flags["--pidfile"] == f"{root}/dockerd.pid"
    assert flags["--bip"] == "198.18.212.1/24"
    assert flags["--default-address-pool"] == "base=198.19.8.0/21,size=24"
    assert flags["--cgroup-parent"] == "/gpulab-swarm-abc123-worker1"
    assert flags["--add-runtime"] == f"nvidia={root}/nvidia-runtime"
    assert flags["--default-runtime"] == "nvidia"
    assert labels == ["gpulab.swarm.node=worker1", "gpulab.gpus=" + ",".join(node.gpus)]
    # the manager has no GPU label at all
    manager_argv = P.dockerd_argv(P.plan_nodes("abc123")[0], paths)
    assert not any(a.startswith("gpulab.gpus=") for a in manager_argv)


def test_the_sh_in_dockerd_argv_passes_its_arguments_untouched():
    # the hostname and each argument reach the command as they are, never as shell text
    out = subprocess.run(["sh", "-c", 'echo "$0" && exec "$@"', "host;name",
                          "printf", "%s|", "a b", "$HOME", "'"],
                         capture_output=True, text=True, check=True).stdout
    assert out == "host;name\na b|$HOME|'|"


def test_swarm_init_and_join_args():
    manager, worker = P.plan_nodes("abc123")[:2]
    assert P.swarm_init_args(manager) == [
        "swarm", "init", "--advertise-addr", "198.18.210.1",
        "--listen-addr", "198.18.210.1:2377", "--dispatcher-heartbeat", "1s",
        "--default-addr-pool", "198.19.128.0/17", "--default-addr-pool-mask-length", "24"]
    assert P.swarm_join_args(worker, manager, "SWMTKN-x") == [
        "swarm", "join", "--token", "SWMTKN-x", "--advertise-addr", "198.18.210.2",
        "--listen-addr", "198.18.210.2:2377", "198.18.210.1:2377"]


def test_runtime_wrapper_quotes_paths(tmp_path):
    text = P.runtime_wrapper("/venv/bin/python", Path("/a b/rt.py"), Path("/r/rec.jsonl"),
                             "/usr/sbin/runc")
    assert text == ("#!/bin/sh\nexec /venv/bin/python -I -S '/a b/rt.py' /r/rec.jsonl "
                    '/usr/sbin/runc "$@"\n')


def test_mounts_under_deepest_first_and_only_below_root():
    mounts = "\n".join([
        "/dev/vda / ext4 rw 0 0",
        "/dev/vda /tmp/gpulab-swarm-abc123/manager/data ext4 rw 0 0",
        "overlay /tmp/gpulab-swarm-abc123/manager/data/overlay2/x/merged overlay rw 0 0",
        "nsfs /tmp/gpulab-swarm-abc123/manager/exec/netns/ingress_sbox nsfs rw 0 0",
        r"tmpfs /tmp/gpulab-swarm-abc123/manager/a\040b tmpfs rw 0 0",
        "tmpfs /tmp/gpulab-swarm-abc1234/x tmpfs rw 0 0",  # another root, same start
        "nsfs /run/netns/gpulab-swarm-abc123-manager nsfs rw 0 0",
    ])
    assert P.mounts_under(mounts, "/tmp/gpulab-swarm-abc123/") == [
        "/tmp/gpulab-swarm-abc123/manager/data/overlay2/x/merged",
        "/tmp/gpulab-swarm-abc123/manager/exec/netns/ingress_sbox",
        "/tmp/gpulab-swarm-abc123/manager/a b",
        "/tmp/gpulab-swarm-abc123/manager/data",
    ]


@pytest.mark.parametrize("name,run", [
    ("gpulab-swarm-abc123", "abc123"),
    ("gpulab-swarm-abc123-worker1", "abc123"),
    ("gpulab-swarm-abc123-link", "abc123"),
    ("gpulab-swarm-manager", None),  # a hostname, not a run
    ("gpulab-swarm-ABC123-x", None),
    ("gpulab-hub", None),
    ("", None),
])
def test_run_id_of(name, run):
    assert P.run_id_of(name) == run


@pytest.mark.parametrize("args,expected", [
    (["--root", "/r", "--log", "/l", "create", "--bundle", "/b", "--pid-file", "/p", "cid"],
     ("cid", "/b")),
    (["run", "--bundle=/b2", "cid2"], ("cid2", "/b2")),
    (["create", "-b", "/b3", "cid3"], ("cid3", "/b3")),
    (["create", "cid4"], ("cid4", ".")),
    (["--root", "/r", "start", "cid"], None),
    (["state", "cid"], None),
    (["delete", "--force", "cid"], None),
])
def test_standin_runtime_sees_creates(args, expected):
    assert R.container_of(args) == expected


def test_standin_runtime_records_then_execs(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"process": {"env": [
        "PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=GPU-fa4e0200-x", "NVIDIA_DRIVER_CAPABILITIES=all",
    ]}}))
    record = tmp_path / "record.jsonl"
    fake_runc = tmp_path / "runc"
    fake_runc.write_text('#!/bin/sh\necho "runc $*"\n')
    fake_runc.chmod(0o755)
    script = Path(R.__file__)
    for args in (["--root", "/r", "create", "--bundle", str(bundle), "c1"], ["start", "c1"]):
        out = subprocess.run([sys.executable, "-I", "-S", str(script), str(record),
                              str(fake_runc), *args],
                             capture_output=True, text=True, check=True).stdout
        assert out == f"runc {' '.join(args)}\n"  # arguments reach runc unchanged
    assert [json.loads(line) for line in record.read_text().splitlines()] == [
        {"id": "c1", "NVIDIA_VISIBLE_DEVICES": "GPU-fa4e0200-x",
         "nvidia_env": {"NVIDIA_VISIBLE_DEVICES": "GPU-fa4e0200-x",
                        "NVIDIA_DRIVER_CAPABILITIES": "all"}}]


def test_standin_runtime_records_a_container_without_gpus():
    assert json.loads(R.record_line("c", {"process": {"env": ["PATH=/bin"]}})) == {
        "id": "c", "NVIDIA_VISIBLE_DEVICES": None, "nvidia_env": {}}
