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
#     every field off by more than its tolerance; times are printed, not judged);
#  4. the GPU panel in members' JupyterLab (images/singleuser/gpulab_gpus.py) given this
#     GPU's UUID as the spawner gives it: the GPU, its name and memory as nvidia-smi says;
#  5. make up's driver rule (gpulab.gpus.host.driver_problems) on this driver, GPU and
#     torch's CUDA, against what torch finds: no problem if and only if CUDA works;
#  6. two members on one GPU (bench/gpu_share.py): compute shares, one member taking the
#     memory, and the limits torch and MPS offer, measured (figures, not judged).
# Needs only python3 with torch (CUDA), nvidia-ml-py, prometheus-client and pytest: no
# Docker, no JupyterHub, no package registry. Step 2 runs pytest with --noconftest, so the
# unit tests' conftest (JupyterHub's ORM) is never imported; of the hub's own package only
# gpulab.gpus.host, which imports nothing of JupyterHub, is used (step 5).
# Every step runs, whatever the one before did; a summary follows,
# and the exit status is 1 if any step failed (2 if there is no GPU to check at all).
# Usage: scripts/gpu-host-check.sh [--runs N]   (from anywhere; prints what it measured;
#   --runs: scrapes timed per method in step 3, 20 by default)
#   GPU_HOST_CHECK_STEP_TIMEOUT: seconds each step may take (300 by default).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/monitoring/exporter:$PWD:$PWD/images/singleuser:$PWD/hub${PYTHONPATH:+:$PYTHONPATH}"
STEP_TIMEOUT=${GPU_HOST_CHECK_STEP_TIMEOUT:-300}
stop() { printf 'gpu-host-check: %s\n' "$*" >&2; exit 2; }
command -v nvidia-smi >/dev/null 2>&1 \
  || stop "no nvidia-smi on this host: these checks need an NVIDIA GPU and its driver"
nvidia-smi -L || stop "nvidia-smi -L failed (above): the NVIDIA driver does not answer"
nvidia-smi

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

PANEL_ON_THIS_GPU=$(cat <<'PY'
import json
import subprocess

from gpulab_gpus import snapshot

rows = subprocess.run(["nvidia-smi", "--query-gpu=uuid,name,memory.total",
                       "--format=csv,noheader,nounits"], capture_output=True, text=True,
                      check=True).stdout.splitlines()
uuid, name, total_mib = (x.strip() for x in rows[0].split(","))
panel = snapshot(env={"GPULAB_GPUS": uuid})
print(json.dumps(panel, indent=1))
assert panel["message"] is None, panel["message"]
mine = [g for g in panel["gpus"] if g["uuid"] == uuid]
assert mine, f"the panel does not show {uuid}"
g = mine[0]
assert g["name"] == name, (g["name"], name)
assert abs(g["memory_total_bytes"] / 2**20 - float(total_mib)) <= 1, (g, total_mib)
assert g["utilization_percent"] is not None and g["memory_used_bytes"] is not None, g
print(f"the panel shows {uuid} ({name}, {total_mib} MiB) as nvidia-smi does")
PY
)
DRIVER_RULE=$(cat <<'PY'
import subprocess

import torch

from gpulab.gpus.host import Observed, driver_problems


def query(field):
    out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout
    return tuple(line.strip() for line in out.splitlines() if line.strip())


assert torch.version.cuda, f"torch {torch.__version__} here is a CPU build"
seen = Observed(driver=query("driver_version")[0], gpus=query("uuid"), probe_status=0,
                probe_output="", probe_gpu="", image_cuda=torch.version.cuda,
                compute_caps=query("compute_cap"))
problems = driver_problems(seen)
works = torch.cuda.is_available()
print(f"driver {seen.driver}, compute capability {', '.join(seen.compute_caps)}, torch "
      f"{torch.__version__} built for CUDA {torch.version.cuda}: the rule says "
      f"{problems or 'no problem'}; torch.cuda.is_available() is {works}")
assert (not problems) == works, "make up's driver rule and torch disagree on this host"
PY
)

step "4. the members' GPU panel given this GPU" python3 -c "$PANEL_ON_THIS_GPU"
step "5. make up's driver rule on this driver, beside torch" python3 -c "$DRIVER_RULE"
step "6. two members on one GPU (bench/gpu_share.py)" python3 bench/gpu_share.py

printf '\n=== gpu-host-check: summary\n'
printf '  %s\n' "${results[@]}"
exit "$failed"
