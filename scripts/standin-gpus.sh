#!/usr/bin/env bash
# On a host WITHOUT an NVIDIA GPU, a dockerd that can start containers with GPU requests
# (`make test` through scripts/test-host.sh, and the demo `make up GPULAB_DEMO=1`):
# dockerd registers its nvidia device driver only when it finds
# nvidia-container-runtime-hook on its PATH at start, so the STAND-IN hook in
# tests/gpu_standin (injects nothing; proves the plumbing, not CUDA) must be on the PATH
# of the dockerd that runs. A dockerd that gpulab itself started
# (scripts/ensure-docker.sh, PID in /run/gpulab-dockerd.pid) is restarted with it;
# containers keep running (--live-restore). Any other dockerd is left alone and this
# script stops with the command that arranges it. On a GPU host it does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[gpulab] %s\n' "$*" >&2; }

if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  exit 0  # a real GPU host: dockerd has NVIDIA's own hook; no stand-in
fi
standin="$PWD/tests/gpu_standin"
pidfile=/run/gpulab-dockerd.pid
pid=$(cat "$pidfile" 2>/dev/null || true)
if [ -n "$pid" ] && [ -r "/proc/$pid/environ" ] && tr '\0' '\n' <"/proc/$pid/environ" \
     | grep -q "^PATH=$standin:"; then
  exit 0  # gpulab's dockerd, already with this checkout's stand-in
fi
if docker info >/dev/null 2>&1; then
  if [ -z "$pid" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != dockerd ]; then
    log "dockerd here was not started by gpulab, and it cannot start containers with GPU"
    log "requests on a host without a GPU. Restart it with the stand-in hook on its PATH:"
    log "  PATH=$standin:\$PATH dockerd --live-restore   (or stop it and run:"
    log "  GPULAB_DOCKERD_PATH=$standin scripts/ensure-docker.sh)"
    exit 1
  fi
  log "Restarting gpulab's dockerd (PID $pid) with the STAND-IN nvidia hook on its PATH"
  log "(containers keep running: --live-restore) ..."
  kill "$pid"
  for _ in $(seq 1 120); do [ -d "/proc/$pid" ] || break; sleep 0.5; done
fi
GPULAB_DOCKERD_PATH="$standin" scripts/ensure-docker.sh
