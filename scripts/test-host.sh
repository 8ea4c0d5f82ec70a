#!/usr/bin/env bash
# Make this host ready for the whole test suite (`make test` runs it before `make up`):
#  - the browser the Chromium tests drive, promtool for the alert-rule tests and the
#    OpenSSH client for the SSH gateway's tests;
#  - on a host WITHOUT an NVIDIA GPU, a dockerd that can start containers with GPU
#    requests, with the STAND-IN hook (scripts/standin-gpus.sh, which the demo
#    `make up GPULAB_DEMO=1` runs too).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[gpulab] %s\n' "$*" >&2; }

need=()
# The browsers: the tests drive chromium-headless-shell, `make bench` the full chromium
# (tests/chromium.py says why).
[ -x /usr/bin/chromium-headless-shell ] || need+=(chromium-headless-shell)
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

# --packages-only (make test): this engine is left as it is; the tests' own engines get
# the stand-in hook themselves (tests/lane_engine.py, tests/swarm).
[ "${1:-}" = --packages-only ] && exit 0
exec scripts/standin-gpus.sh
