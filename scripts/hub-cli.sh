# Sourced by scripts that ask gpulab's CLI about the lab's settings before the stack runs
# (scripts/preflight.sh, scripts/assistant-gpus.sh): `gpulab ARGS...` runs it in the hub
# image, with the config folder ($config) and, once a hub has run, the last good version
# of each settings file that the hub keeps (gpulab.live_config: pass "${last_good[@]}").
# shellcheck shell=bash
mounts=(-v "$config:/srv/gpulab/config:ro"); last_good=()
if docker volume inspect gpulab-last-good >/dev/null 2>&1; then
  mounts+=(-v gpulab-last-good:/srv/gpulab/last-good:ro); last_good=(--last-good /srv/gpulab/last-good)
fi
gpulab() {
  docker run --rm --network none "${mounts[@]}" gpulab/hub:latest gpulab "$@" 2>&1 \
    | sed -e 's|/srv/gpulab/config/|config/|g' -e 's|/srv/gpulab/last-good|the volume gpulab-last-good|g'
  return "${PIPESTATUS[0]}"
}
