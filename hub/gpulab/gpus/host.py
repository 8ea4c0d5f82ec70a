"""Is this GPU host ready for members' GPU servers? What `make up` checks before starting.

A lab's GPU host needs three things gpulab cannot install for it, and each one missing
used to show up only as members' `torch.cuda.is_available() == False` or as every GPU
spawn failing:

* **NVIDIA's container toolkit.** dockerd registers its ``nvidia`` device driver only
  when ``nvidia-container-runtime-hook`` is on its PATH at its start (or, on engines with
  CDI, from CDI specs). Without it a container asking for GPUs fails at start with
  ``could not select device driver "" with capabilities: [[gpu]]``.
* **A toolkit that honours gpulab's requests.** gpulab asks Docker for the leased GPUs
  by UUID (DeviceRequests); in hook mode the toolkit reads them from
  ``NVIDIA_VISIBLE_DEVICES``. A toolkit hardened with
  ``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` ignores that for
  unprivileged containers (all of gpulab's): servers start with no GPU and no error.
* **A driver new enough for the image's CUDA.** PyPI's torch 2.13.0 is a CUDA 13.0
  build: it needs an R580 driver or newer.

``scripts/gpu-preflight.sh`` observes (nvidia-smi on the host, a probe container started
the way the hub starts members' servers, torch's CUDA in the image) and
:func:`diagnose` decides, as a pure function with a table of tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# NVIDIA's minimum Linux driver for each CUDA major version, with minor version
# compatibility (the runtime torch's wheels carry): CUDA Toolkit release notes, table 2.
MIN_DRIVER = {13: (580, 65, 6), 12: (525, 60, 13), 11: (450, 80, 2)}
# The oldest GPU architecture (compute capability) each CUDA major version builds for:
# CUDA 13 dropped Maxwell, Pascal and Volta (V100, 7.0).
MIN_COMPUTE = {13: (7, 5), 12: (5, 0), 11: (3, 5)}

TOOLKIT_INSTALL = (
    "install NVIDIA's container toolkit from NVIDIA's apt repository "
    "(https://nvidia.github.io/libnvidia-container): add the repository and its key, "
    "apt-get install nvidia-container-toolkit, then `nvidia-ctk runtime configure "
    "--runtime=docker` and restart dockerd (hook mode); or, on Docker 25 or newer with "
    "CDI, `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` and \"features\": "
    "{\"cdi\": true} in /etc/docker/daemon.json")


@dataclass(frozen=True)
class Observed:
    """What scripts/gpu-preflight.sh saw on the host."""

    driver: str  # nvidia-smi's driver_version, "" when nvidia-smi failed
    gpus: tuple[str, ...]  # the host's GPU UUIDs (nvidia-smi)
    probe_status: int  # exit status of the probe container (nvidia-smi -L in it)
    probe_output: str  # what it printed (stdout and stderr, or Docker's error)
    probe_gpu: str  # the UUID the probe asked for
    image_cuda: str  # torch.version.cuda in spawn.image, "" for a CPU build
    toolkit_config: str = ""  # /etc/nvidia-container-runtime/config.toml, if any
    compute_caps: tuple[str, ...] = ()  # nvidia-smi's compute_cap per GPU ("9.0")


def parse_version(text: str) -> tuple[int, ...] | None:
    m = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?\s*", text or "")
    return tuple(int(p) for p in m.groups() if p is not None) if m else None


def hardened_toolkit(config: str) -> bool:
    """Does the toolkit's config.toml refuse NVIDIA_VISIBLE_DEVICES from unprivileged
    containers?"""
    return re.search(r"(?m)^\s*accept-nvidia-visible-devices-envvar-when-unprivileged"
                     r"\s*=\s*false\b", config or "") is not None


def diagnose(o: Observed) -> list[str]:
    """What stands between this host and members' GPU servers (empty: ready)."""
    problems = []
    if not o.driver:
        return ["nvidia-smi found GPUs but did not report the driver version: check the "
                "NVIDIA driver (nvidia-smi -q)"]
    output = o.probe_output.strip()
    if o.probe_status != 0 and "could not select device driver" in output:
        problems.append(f"Docker cannot give containers GPUs ({output[:200]}): {TOOLKIT_INSTALL}")
    elif o.probe_status != 0 and ("nvidia-smi" in output and ("not found" in output
                                                               or "executable file" in output)):
        why = ("its config.toml sets accept-nvidia-visible-devices-envvar-when-unprivileged "
               "= false, so it ignores the GPUs Docker asks for in unprivileged containers "
               "(all of gpulab's); set accept-nvidia-visible-devices-as-volume-mounts = true "
               "or use CDI mode" if hardened_toolkit(o.toolkit_config) else
               "the container toolkit's hook injected no GPU (check `nvidia-ctk --version` "
               "and /etc/nvidia-container-runtime/config.toml)")
        problems.append(f"a container started with GPU {o.probe_gpu} has no GPU inside: {why}. "
                        f"Members' servers would start without their GPUs and no error")
    elif o.probe_status != 0:
        problems.append(f"a container asking for GPU {o.probe_gpu} failed ({output[:300]})")
    elif o.probe_gpu not in output:
        problems.append(f"a container asking for GPU {o.probe_gpu} saw other GPUs "
                        f"({output[:200]}): the toolkit does not honour device requests by "
                        f"UUID")
    return problems + driver_problems(o)


def driver_problems(o: Observed) -> list[str]:
    """Whether the host's driver and GPUs can run spawn.image's CUDA (empty: they can).
    scripts/gpu-host-check.sh also asks this of a lent GPU's real driver, beside
    torch.cuda.is_available() there."""
    problems = []
    if o.image_cuda:
        cuda = parse_version(o.image_cuda)
        driver = parse_version(o.driver)
        need = MIN_DRIVER.get(cuda[0]) if cuda else None
        if need is None:
            problems.append(f"spawn.image's torch is built for CUDA {o.image_cuda}, which this "
                            f"check does not know the driver floor of")
        elif driver is None or driver < need:
            floor = ".".join(map(str, need))
            problems.append(
                f"spawn.image's torch is built for CUDA {o.image_cuda}, which needs NVIDIA "
                f"driver {floor} or newer; this host has {o.driver}, so members would find "
                f"torch.cuda.is_available() == False. Upgrade the driver (R{need[0]} or "
                f"newer), or build the image with a torch for an older CUDA: pin it in "
                f"images/singleuser/requirements-cuda.txt (for example torch===2.13.0 from "
                f"PyTorch's cu126 index through PIP_ARGS) and make images")
        floor = MIN_COMPUTE.get(cuda[0]) if cuda else None
        old = [c for c in o.compute_caps if floor and (parse_version(c) or floor) < floor]
        if old:
            problems.append(
                f"spawn.image's torch is built for CUDA {o.image_cuda}, which does not support "
                f"GPUs of compute capability {', '.join(sorted(set(old)))} (it needs "
                f"{'.'.join(map(str, floor))} or newer): build the image with a torch for an "
                f"older CUDA (images/singleuser/requirements-cuda.txt and PIP_ARGS)")
    return problems


def observed_from_json(data: dict) -> Observed:
    """The JSON scripts/gpu-preflight.sh writes, as :class:`Observed`."""
    return Observed(
        driver=str(data.get("driver") or ""), gpus=tuple(data.get("gpus") or ()),
        probe_status=int(data.get("probe_status", 1)),
        probe_output=str(data.get("probe_output") or ""),
        probe_gpu=str(data.get("probe_gpu") or ""),
        image_cuda=str(data.get("image_cuda") or ""),
        toolkit_config=str(data.get("toolkit_config") or ""),
        compute_caps=tuple(data.get("compute_caps") or ()))
