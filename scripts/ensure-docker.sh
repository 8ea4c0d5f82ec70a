#!/usr/bin/env bash
# Make sure a Docker engine answers on this host, installing and starting one if needed.
# Debian/Ubuntu hosts without an init system (containers, CI sandboxes) get dockerd
# started in the background; its PID is written to /run/gpulab-dockerd.pid, so that
# exactly that process (and nothing else) can be stopped: kill $(cat /run/gpulab-dockerd.pid)
set -euo pipefail

log() { printf '[gpulab] %s\n' "$*" >&2; }

# What the Makefile itself runs on the host: python3 with venv and pip (wheelhouses, the
# test venv), curl (readiness checks). A fresh Debian has none of python3-venv/pip.
ensure_host_tools() {
  local need=()
  # imports, not `-m pip --version` (0.3 s at every make up): Debian's python3 has venv
  # without ensurepip until python3-venv is installed
  python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3 python3-venv)
  python3 -c 'import pip' >/dev/null 2>&1 || need+=(python3-pip)
  command -v curl >/dev/null 2>&1 || need+=(curl)
  [ ${#need[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ]; then
    log "Missing on this host: ${need[*]}; install them (apt-get install ${need[*]}) and re-run."
    exit 1
  fi
  log "Installing ${need[*]} with apt-get ..."
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
}
ensure_host_tools

ensure_compose() {
  if docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; then
    return 0
  fi
  log "Installing Compose (docker-compose) with apt-get ..."
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/dev/null; }
}

if docker info >/dev/null 2>&1; then
  ensure_compose
  exit 0
fi
# The disruptive tests' own engine (tests/lane_engine.py) is started by its own command,
# never as the host's dockerd with the host's PID file.
if [ -n "${GPULAB_DOCKERD_START:-}" ]; then
  # shellcheck disable=SC2086  # a command line, split as written
  exec $GPULAB_DOCKERD_START
fi

if ! command -v dockerd >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    log "No Docker engine found and not root: install Docker (https://docs.docker.com/engine/install/) and re-run."
    exit 1
  fi
  log "Installing the Docker engine (docker.io) with apt-get ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q docker.io >/dev/null
fi

if docker info >/dev/null 2>&1; then
  exit 0
fi

if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  log "Starting docker with systemctl ..."
  systemctl start docker
else
  log "No init system: starting dockerd in the background (log: /var/log/gpulab-dockerd.log) ..."
  # dockerd looks up nvidia-container-runtime-hook on its PATH once, at start.
  # GPULAB_DOCKERD_PATH lets a caller (the GPU-plumbing tests) prepend a folder to it.
  # --live-restore: containers (the hub, users' servers) keep running while dockerd
  # itself is restarted or upgraded.
  PATH="${GPULAB_DOCKERD_PATH:+$GPULAB_DOCKERD_PATH:}$PATH" \
    nohup dockerd --live-restore >/var/log/gpulab-dockerd.log 2>&1 &
  echo $! >/run/gpulab-dockerd.pid
  started_here=yes
fi

for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    log "Docker engine is up."
    if [ "${started_here:-}" = yes ]; then
      # A container whose process exited while dockerd was down can be lost by it a few
      # seconds after it starts (scripts/lost-tasks.sh): look for a minute, in the
      # background. (With systemd: docs/operations.md, Reliability.)
      nohup "$(dirname "$0")/lost-tasks.sh" --watch 60 </dev/null \
        >>/var/log/gpulab-lost-tasks.log 2>&1 &
    fi
    ensure_compose
    exit 0
  fi
  sleep 0.5
done
log "dockerd did not answer within 30 s; see /var/log/gpulab-dockerd.log:"
tail -n 20 /var/log/gpulab-dockerd.log >&2 || true
exit 1
