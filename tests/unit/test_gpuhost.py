"""gpulab.gpus.host.diagnose: what stands between a GPU host and members' GPU servers."""

from __future__ import annotations

import pytest

from gpulab.gpus.host import Observed, diagnose, hardened_toolkit

GPU = "GPU-8e1a2b3c-0000-1111-2222-333344445555"
READY = Observed(driver="580.82.07", gpus=(GPU,), probe_status=0,
                 probe_output=f"GPU 0: NVIDIA H200 (UUID: {GPU})", probe_gpu=GPU,
                 image_cuda="13.0", compute_caps=("9.0",))
HARDENED = """
[nvidia-container-cli]
  ldconfig = "@/sbin/ldconfig.real"
accept-nvidia-visible-devices-envvar-when-unprivileged = false
"""


def with_(**changes) -> Observed:
    return Observed(**{**READY.__dict__, **changes})


def test_a_ready_host_has_no_problem():
    assert diagnose(READY) == []
    assert diagnose(with_(image_cuda="")) == []  # a CPU image: no driver floor


@pytest.mark.parametrize("observed, says", [
    (with_(probe_status=125, probe_output='docker: Error response from daemon: could not '
           'select device driver "" with capabilities: [[gpu]].'),
     ["Docker cannot give containers GPUs", "apt-get install nvidia-container-toolkit",
      "nvidia-ctk cdi generate"]),
    (with_(probe_status=127, probe_output='exec: "nvidia-smi": executable file not found in '
           '$PATH', toolkit_config=HARDENED),
     [f"a container started with GPU {GPU} has no GPU inside",
      "accept-nvidia-visible-devices-envvar-when-unprivileged = false",
      "accept-nvidia-visible-devices-as-volume-mounts = true"]),
    (with_(probe_status=127, probe_output='exec: "nvidia-smi": executable file not found'),
     ["has no GPU inside", "injected no GPU"]),
    (with_(probe_output="GPU 0: NVIDIA H200 (UUID: GPU-other)"),
     ["saw other GPUs", "does not honour device requests by UUID"]),
    (with_(driver="550.54.15"),
     ["built for CUDA 13.0, which needs NVIDIA driver 580.65.6 or newer",
      "this host has 550.54.15", "Upgrade the driver (R580", "requirements-cuda.txt"]),
    (with_(driver="550.54.15", image_cuda="12.6"), []),
    (with_(driver="470.256.02", image_cuda="12.6"), ["needs NVIDIA driver 525.60.13"]),
    (with_(compute_caps=("9.0", "7.0")),
     ["does not support GPUs of compute capability 7.0", "needs 7.5 or newer"]),
    (with_(image_cuda="14.1"), ["does not know the driver floor"]),
    (with_(driver=""), ["did not report the driver version"]),
])
def test_each_problem_says_what_to_do(observed, says):
    problems = diagnose(observed)
    if not says:
        assert problems == []
        return
    text = "\n".join(problems)
    for phrase in says:
        assert phrase in text, (phrase, problems)


def test_the_hardened_setting_is_recognised_only_when_set_to_false():
    assert hardened_toolkit(HARDENED)
    assert not hardened_toolkit(HARDENED.replace("= false", "= true"))
    assert not hardened_toolkit("# accept-nvidia-visible-devices-envvar-when-unprivileged = false")
    assert not hardened_toolkit("")
