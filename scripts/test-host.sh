#!/usr/bin/env bash
# Make this host ready for the whole test suite (`make test` runs it before `make up`):
#  - the browser the Chromium tests drive, promtool for the alert-rule tests and the
#    OpenSSH client for the SSH gateway's tests;
#  - on a host WITHOUT an NVIDIA GPU, a dockerd that can start containers with GPU
#    requests: dockerd registers its nvidia device driver only when it finds
#    nvidia-container-runtime-hook on its PATH at start, so the STAND-IN hook in
#    tests/gpu_standin (injects nothing; proves the plumbing, not CUDA) must be on the
#    PATH of the dockerd that runs. A dockerd that gpulab itself started
#    (scripts/ensure-docker.sh, PID in /run/gpulab-dockerd.pid) is restarted with it;
#    containers keep running (--live-restore). Any other dockerd is left alone and this
#    script stops with the command that arranges it.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[gpulab] %s\n' "$*" >&2; }

need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# test_https.py: certutil puts the local CA in a test browser's NSS database; openssl.
command -v certutil >/dev/null 2>&1 || need+=(libnss3-tools)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# test_ssh.py: the real OpenSSH client (ssh, sftp, scp) and rsync against gpulab-ssh.
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
# The simulated Swarm (tests/swarm): network namespaces (ip), nsenter and unshare.
command -v ip >/dev/null 2>&1 || need+=(iproute2)
{ command -v nsenter && command -v unshare; } >/dev/null 2>&1 || need+=(util-linux)
# test_full_home.py: a member's home as a small ext4 filesystem in a loop file.
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
command -v losetup >/dev/null 2>&1 || need+=(mount)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    log "The tests need ${need[*]}: apt-get install --no-install-recommends ${need[*]}"
    exit 1
  fi
  log "Installing what the tests need: ${need[*]} ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null; }
fi

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
