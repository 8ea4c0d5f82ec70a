#!/usr/bin/env bash
# The GPU checks that need a real NVIDIA GPU but no Docker engine, in one short run (for
# a lent GPU machine with PyTorch and nvidia-ml-py, or any lab GPU host):
#  1. the seed's autograd walkthroughs on CUDA, with the exact expected gradients
#     (the same cell the integration test runs inside a spawned container);
#  2. the exporter against the real driver: the device's real memory total, and a
#     utilization that rises under a matmul load (tests/unit/test_exporter_gpu_host.py);
#  3. the exporter beside nvidia-smi, field by field per GPU, idle and under a matmul
#     load, its MIG devices (on a GPU in MIG mode) against `nvidia-smi -L` by UUID, and
#     what a scrape costs each way (python3 -m gpulab_exporter.hostcheck: exit 1 names
#     every field off by more than its tolerance; times are printed, not judged).
# Needs only python3 with torch (CUDA), nvidia-ml-py, prometheus-client and pytest: no
# Docker, no JupyterHub, no package registry. Step 2 runs pytest with --noconftest, so the
# unit tests' conftest (JupyterHub's ORM) is never imported; the hub's own package is not
# on PYTHONPATH either. Every step runs, whatever the one before did; a summary follows,
# and the exit status is 1 if any step failed (2 if there is no GPU to check at all).
# Usage: scripts/gpu-host-check.sh [--runs N]   (from anywhere; prints what it measured;
#   --runs: scrapes timed per method in step 3, 20 by default)
#   GPU_HOST_CHECK_STEP_TIMEOUT: seconds each step may take (300 by default).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/monitoring/exporter:$PWD${PYTHONPATH:+:$PYTHONPATH}"
STEP_TIMEOUT=${GPU_HOST_CHECK_STEP_TIMEOUT:-300}
stop() { printf 'gpu-host-check: %s\n' "$*" >&2; exit 2; }
command -v nvidia-smi >/dev/null 2>&1 \
  || stop "no nvidia-smi on this host: these checks need an NVIDIA GPU and its driver"
nvidia-smi -L || stop "nvidia-smi -L failed (above): the NVIDIA driver does not answer"

results=()
failed=0
# step NAME COMMAND...: runs one check (killed after STEP_TIMEOUT s) and records how it
# ended; never stops the script.
step() {
  local name=$1 started=$SECONDS rc
  shift
  printf '\n=== gpu-host-check: %s\n' "$name"
  if command -v timeout >/dev/null 2>&1; then
    timeout --kill-after=10 "$STEP_TIMEOUT" "$@"
  else
    "$@"
  fi
  rc=$?
  local took=$((SECONDS - started))
  if [ "$rc" -eq 0 ]; then
    results+=("OK      $name (${took} s)")
  else
    failed=1
    case $rc in
      124|137) results+=("FAILED  $name: no result within ${STEP_TIMEOUT} s (exit $rc)") ;;
      *) results+=("FAILED  $name: exit status $rc (${took} s; its output is above)") ;;
    esac
  fi
}

# (a variable, not a function: timeout runs programs only)
AUTOGRAD_ON_CUDA=$(cat <<'PY'
import contextlib
import io
import json

from tests.integration.autograd_cell import AUTOGRAD_CELL, chain_grads, close

out = io.StringIO()
with contextlib.redirect_stdout(out):
    exec(AUTOGRAD_CELL, {})
r = json.loads(out.getvalue().strip().splitlines()[-1])
print("autograd ran on", r["device"], "with torch", r["torch"], "grads on", r["linear"]["grad_device"])
assert r["device"] == "cuda", r["device"]
assert (r["linear"]["w"], r["linear"]["x"], r["linear"]["b"]) == (12.0, 8.0, 4.0), r["linear"]
assert r["minimum"] == 0.0 and r["cubic"] == {"first": [12.0, 3.0], "second": [12.0, -6.0]}, r
c = r["chain"]
dX, dW, dB = chain_grads(c["X"]["value"], c["W"]["value"], c["B"]["value"])
assert close(c["X"]["grad"], dX) and close(c["W"]["grad"], dW) and close(c["B"]["grad"], dB)
print("autograd on CUDA: all gradients as expected")
PY
)

step "1. autograd on CUDA, exact gradients" python3 -c "$AUTOGRAD_ON_CUDA"
# --noconftest: tests/unit/conftest.py imports JupyterHub, which a GPU host need not have.
# The test may skip only where there is no GPU; GPULAB_GPU_HOST=1 (nvidia-smi answered
# above) makes that a failure here too.
step "2. exporter against the real driver (pytest)" \
  env GPULAB_GPU_HOST=1 python3 -m pytest -q -p no:cacheprovider --noconftest --tb=short -rA \
    tests/unit/test_exporter_gpu_host.py
step "3. exporter beside nvidia-smi, idle and under load" \
  python3 -m gpulab_exporter.hostcheck "$@"

printf '\n=== gpu-host-check: summary\n'
printf '  %s\n' "${results[@]}"
exit "$failed"
