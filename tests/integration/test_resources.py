"""A server's CPUs and memory follow its GPUs (gpus.yaml's cpus:, memory:, their _per_gpu
and max_), seen from inside members' servers on the real stack: the memory limit and CPU
quota of their cgroups, what `nproc` and PyTorch count, and what the spawn form and the
progress bar tell the member before and while her server starts; and that she may ask
for fewer CPUs or less memory through the REST API and on the form in Chromium, never
more."""

from __future__ import annotations

import html
import os

import requests

from .browser import screenshot, submit_login, wait_for_lab_url
from .stack import HUB_URL, container_logs, docker, form_login
from .standin import STANDIN_GPUS

SIZED = STANDIN_GPUS + """\
  cpus: 1
  memory: 1g
  cpus_per_gpu: 63
  memory_per_gpu: 512m
  max_memory: 1280m
"""
# run in her server: what its cgroup allows (v2, else v1) and what its threads count
INSIDE = (
    "nproc; "
    "cat /sys/fs/cgroup/memory.max 2>/dev/null || "
    "cat /sys/fs/cgroup/memory/memory.limit_in_bytes; "
    "if [ -f /sys/fs/cgroup/cpu.max ]; then cut -d' ' -f1 /sys/fs/cgroup/cpu.max; "
    "else cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us; fi; "
    "python -c 'import torch; print(torch.get_num_threads())'"
)


def seen_inside(container: str) -> dict[str, int]:
    nproc, memory, quota, torch_threads = docker("exec", container, "sh", "-c",
                                                 INSIDE).split()
    return {"nproc": int(nproc), "memory": int(memory), "cpu_quota_us": int(quota),
            "torch_threads": int(torch_threads)}


def test_a_servers_cpus_and_memory_follow_its_gpus(lab_config, gpus_yaml, lab_user):
    lab_config.write("gpus.yaml", SIZED)
    notes, gpu = lab_user("notes"), lab_user("train")

    # the form says what a server gets, before she starts one
    page = form_login(gpu.name, gpu.token).session.get(f"{HUB_URL}/hub/spawn", timeout=30)
    assert page.status_code == 200, page.text[:300]
    assert ("A server gets 1 CPU and 1 GB of memory, and 63 CPUs and 512 MB of memory more "
            "for each GPU (at most 1.2 GB)." in html.unescape(page.text)), page.text[-2000:]

    notes.start_server({"gpus": 0})
    gpu.start_server({"gpus": 1})
    assert seen_inside(notes.container) == {
        "nproc": 1, "memory": 1 << 30, "cpu_quota_us": 100_000, "torch_threads": 1}
    # 1 + 63 CPUs asked: no more than the machine has (this one's, where the lane's
    # engine runs its containers); 1 GB + 512 MB, capped at max_memory
    cores = min(64, len(os.sched_getaffinity(0)))
    assert seen_inside(gpu.container) == {
        "nproc": cores, "memory": 1280 << 20, "cpu_quota_us": cores * 100_000,
        "torch_threads": cores}

    # her progress bar said so while it started (each step is in the hub's log too)
    log = container_logs("gpulab-hub", 400)
    assert f"{gpu.name}: Your server has {cores} CPUs and 1.2 GB of memory" in log, log[-3000:]
    if cores < 64:
        assert (f"{gpu.name}: Your server gets {cores} CPUs: gpulab.yaml and gpus.yaml give "
                f"you 64 CPUs, but the machine it runs on has only {cores}") in log, log[-3000:]

    # through the REST API she may ask for less, never more; a bad value starts nothing
    notes.stop_server()
    for bad, said in (({"gpus": 0, "cpus": 2}, "at most 1 (with 0 GPUs)"),
                      ({"gpus": 0, "memory": "2g"}, "from 256m to 1g (with 0 GPUs)"),
                      ({"gpus": 0, "memory": 0.5}, 'a size such as "4g"')):
        r = requests.post(f"{notes.hub.api}/users/{notes.name}/server", json=bad,
                          headers={"Authorization": f"token {notes.token}"}, timeout=60)
        assert r.status_code == 400 and said in r.json()["message"], (bad, r.text)
        assert docker("ps", "-aq", "--filter", f"name=^{notes.container}$") == ""
    notes.start_server({"gpus": 0, "cpus": 0.5, "memory": "512m"})
    assert seen_inside(notes.container) == {
        "nproc": 1, "memory": 512 << 20, "cpu_quota_us": 50_000, "torch_threads": 1}


def test_the_spawn_forms_fewer_cpus_and_less_memory_in_chromium(lab_config, gpus_yaml,
                                                                lab_user, new_page):
    """As a member does it: the form says what a server gets, she types fewer CPUs and
    less memory, starts, and her server has them; more than her GPUs bring is refused on
    the form's page, and nothing starts."""
    lab_config.write("gpus.yaml", SIZED)
    ivy = lab_user("form")
    page = new_page()
    submit_login(page, ivy.name, ivy.token, next_url="/hub/spawn")
    assert "A server gets 1 CPU and 1 GB of memory" in page.locator(
        "#gpulab-resources").inner_text()

    def start(cpus: str, memory: str) -> None:
        page.goto(f"{HUB_URL}/hub/spawn")
        page.select_option("#gpulab-gpus", "0")
        page.fill("#gpulab-cpus", cpus)
        page.fill("#gpulab-memory", memory)
        page.locator("#spawn_form [type=submit]").click()

    start("2", "")
    error = page.get_by_text("at most 1 (with 0 GPUs)")
    error.first.wait_for(timeout=60_000)
    screenshot(page, "spawn-form-too-many-cpus.png")
    assert docker("ps", "-aq", "--filter", f"name=^{ivy.container}$") == ""
    start("0.5", "600m")
    wait_for_lab_url(page, HUB_URL, ivy.name, 120_000)
    assert seen_inside(ivy.container) == {
        "nproc": 1, "memory": 600 << 20, "cpu_quota_us": 50_000, "torch_threads": 1}
