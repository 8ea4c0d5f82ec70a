#!/usr/bin/env bash
# On a host with NVIDIA GPUs, before `make up` (and `make swarm-node`) starts anything:
# can Docker give a container one GPU, by UUID, as the hub gives members theirs, and is
# the driver new enough for spawn.image's CUDA? Observes here, judges in gpulab.gpus.host
# (`gpulab gpu-preflight`, in the hub image), and says what to install or change.
# Usage: scripts/gpu-preflight.sh [IMAGE]   (IMAGE: spawn.image)
set -euo pipefail
image=${1:-}  # "" (a Swarm's GPU server, which has no settings): no image check
say() { echo "[gpulab] $*"; }

driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
mapfile -t gpus < <(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null || true)
mapfile -t caps < <(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null || true)
probe_gpu=${gpus[0]:-}
# The probe: what the hub asks Docker for (the GPU by UUID, an unprivileged user, no
# capabilities), and nvidia-smi inside, which the toolkit injects with the GPU.
status=0
probe=$(docker run --rm --network none --user 65534:65534 --cap-drop ALL \
  --gpus "device=$probe_gpu" --entrypoint nvidia-smi gpulab/hub:latest -L 2>&1) || status=$?
# torch's CUDA in the image members get ("" for a CPU build); a failure to ask is no verdict.
image_cuda=
if [ -n "$image" ]; then
  image_cuda=$(docker run --rm --network none --entrypoint /opt/venv/bin/python "$image" \
    -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null || true)
fi
toolkit=$(cat /etc/nvidia-container-runtime/config.toml 2>/dev/null || true)

observed=$(python3 -c 'import json, sys; print(json.dumps(dict(zip(
  ["driver", "probe_output", "probe_gpu", "image_cuda", "toolkit_config"], sys.argv[1:6]),
  probe_status=int(sys.argv[6]), gpus=[g.strip() for g in sys.argv[7].split("\n") if g.strip()],
  compute_caps=[c.strip() for c in sys.argv[8].split("\n") if c.strip()])))' \
  "$driver" "$probe" "$probe_gpu" "$image_cuda" "$toolkit" "$status" \
  "$(printf '%s\n' "${gpus[@]}")" "$(printf '%s\n' "${caps[@]}")")
judged=0
verdict=$(docker run --rm -i --network none gpulab/hub:latest gpulab gpu-preflight - \
  <<<"$observed" 2>&1) || judged=$?
if [ "$judged" = 1 ]; then
  echo "$verdict" | sed 's/^error: /[gpulab] /' >&2
  say "this host is not ready for members' GPU servers (above); nothing was started." >&2
  exit 1
elif [ "$judged" != 0 ]; then
  say "could not judge this GPU host (gpulab/hub:latest older than this checkout? make images): $verdict" >&2
  exit 1
fi
say "$verdict"
