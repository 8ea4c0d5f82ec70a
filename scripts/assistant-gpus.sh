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
# make assistant (not make up, whose preflight says it already): an edit of gpulab.yaml
# that is refused (assistant.gpus, for one) is said, and the last good version holds
if [ -n "${GPULAB_SAY_REFUSED:-}" ]; then
  checked=$(gpulab config check "${last_good[@]}" /srv/gpulab/config/gpulab.yaml) || {
    echo "$checked"; exit 1; }
  grep -v ': OK$' <<<"$checked" | sed 's/^/[gpulab] /' >&2 || true
fi
gpus=$(gpulab assistant gpus "${last_good[@]}" /srv/gpulab/config/gpulab.yaml) || {
  echo "$gpus"; exit 1; }
[ -n "$gpus" ] || exit 0
# Can this engine give a container those GPUs? Without NVIDIA's container toolkit it
# cannot, and Compose would stop half-way through `make up` saying only "could not
# select device driver".
if ! probe=$(docker run --rm --network none --gpus "\"device=$gpus\"" gpulab/hub:latest true 2>&1)
then
  probe=${probe##*Error response from daemon: }
  echo "config/gpulab.yaml's assistant.gpus names GPU(s) $gpus, but this Docker engine cannot"
  echo "give a container GPUs: ${probe%%$'\n'*}"
  echo "Install NVIDIA's container toolkit (docs/gpus.md, Hosts with NVIDIA GPUs), or set"
  echo "assistant.gpus: [] to run the lab assistant on the CPU."
  exit 1
fi
# A GPU a member's server holds now goes to the assistant's container only once that
# server ends (the hub holds it for the assistant already, so no one else gets it): no
# GPU is ever in two containers. Said on stderr; the others are handed over.
if [ "$(docker inspect -f '{{.State.Running}}' gpulab-hub 2>/dev/null)" = true ]; then
  in_use=$(docker exec gpulab-hub gpulab assistant in-use) || {
    echo "cannot tell which of the assistant's GPUs members hold now: $in_use"; exit 1; }
  while IFS=$'\t' read -r gpu holder; do
    [ -n "$gpu" ] || continue
    echo "[gpulab] GPU $gpu (assistant.gpus) is in use by $holder's server: the lab assistant's" \
         "container gets it at the first make assistant (or make up) after that server stops" >&2
    gpus=$(tr , '\n' <<<"$gpus" | grep -vx -- "$gpu" | paste -sd, -) || true
  done <<<"$in_use"
fi
echo "$gpus"
