#!/usr/bin/env bash
# The GPUs the lab assistant's container gets from `make up`: config/gpulab.yaml's
# assistant.gpus while assistant.model is set (its last good version, as the hub reads
# it), comma-separated; nothing when it holds none. The hub holds the same GPUs for it
# in its lease table (gpulab.assistant.gpus).
# Usage: scripts/assistant-gpus.sh   (GPULAB_CONFIG: the config folder)
set -euo pipefail
config=${GPULAB_CONFIG:-$(cd "$(dirname "$0")/.." && pwd)/config}
# shellcheck source=scripts/hub-cli.sh
source "$(dirname "$0")/hub-cli.sh"
gpulab assistant gpus "${last_good[@]}" /srv/gpulab/config/gpulab.yaml
