"""What one member's server may take of a GPU it shares with other members' (pure).

A GPU of a ``shared`` pool goes to up to ``max_users`` servers at once, each a container
with the same GPU. Measured on an H200 (scripts/gpu-host-check.sh, step 6;
docs/gpus.md, "What members sharing a GPU can do to each other"): the driver
time-slices their kernels (a member's bf16 matmuls ran at 0.46 of their rate
alone while another member's ran), and nothing stops one member's process from taking
the GPU's memory: the next member's allocation fails with "CUDA out of memory". Docker
limits neither. PyTorch's caching allocator takes a cap from its environment,
``PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:F`` (seen refusing 70 GiB at 0.25
of 140 GiB there): the spawner gives each server on a shared GPU F = 1/max_users
(``spawn.shared_gpu_memory_cap``), in images that say their torch takes it: the option
came with pytorch/pytorch#161035 (2025; torch 2.11 and 2.13 take it), a torch refuses
an allocator option it does not know (seen on 2.13 with a made-up one), and a torch
that refuses it fails every CUDA allocation, so an image without the label
:data:`IMAGE_LABEL` (gpulab's single-user image has it) gets no cap. It is PyTorch's own
cap, per process and per GPU: a member can lift it in her own code, and other frameworks
ignore it, so it keeps the accidents of a shared GPU apart (a notebook that keeps every
tensor), not a member who means to take more. The driver's own limits (MPS) need the MPS
daemon's IPC shared with every container, which gpulab does not open.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
FRACTION = "per_process_memory_fraction"
# An image's label: the allocator options of PYTORCH_CUDA_ALLOC_CONF its torch takes, of
# those gpulab sets (comma-separated).
IMAGE_LABEL = "org.gpulab.pytorch-memory-cap"


def memory_fraction(share: int) -> float | None:
    """The part of a GPU's memory one process of a server may take when *share* servers
    may hold that GPU at once (rounded down to 4 decimals, so that they add up to no more
    than all of it); None for a GPU that is not shared."""
    if share <= 1:
        return None
    return math.floor(10_000 / share) / 10_000


def server_share(capacities: Iterable[int], image_labels: Mapping[str, str] | None) -> int:
    """The share a server's cap is made for: the most servers that may hold one of its
    GPUs at once (*capacities*), or 1 (no cap) when its image does not say its torch takes
    the cap (:data:`IMAGE_LABEL`)."""
    takes = FRACTION in (image_labels or {}).get(IMAGE_LABEL, "").replace(" ", "").split(",")
    return max(capacities, default=1) if takes else 1


def alloc_conf(share: int) -> dict[str, str]:
    """The environment that caps each PyTorch process of a server at its share of a GPU
    that *share* servers may hold at once ({} for a GPU of its own)."""
    fraction = memory_fraction(share)
    return {} if fraction is None else {ALLOC_CONF: f"{FRACTION}:{fraction:g}"}


def merged_env(base: Mapping[str, str], ours: Mapping[str, str]) -> dict[str, str]:
    """*base* (what JupyterHub and the admin's ``environment`` give every server) with
    gpulab's variables over it, except that an admin's own PYTORCH_CUDA_ALLOC_CONF
    options stay: gpulab's cap is added to them, and an admin who set the fraction
    herself keeps hers."""
    env = {**base, **ours}
    admin, cap = base.get(ALLOC_CONF, "").strip(), ours.get(ALLOC_CONF)
    if admin and cap:
        env[ALLOC_CONF] = admin if FRACTION in admin else f"{admin.rstrip(',')},{cap}"
    elif admin:
        env[ALLOC_CONF] = admin
    return env
