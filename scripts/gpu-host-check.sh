#!/usr/bin/env bash
# The GPU checks that need a real NVIDIA GPU but no Docker engine, in one short run (for
# a lent GPU machine with PyTorch and nvidia-ml-py, or any lab GPU host):
#  1. the seed's autograd walkthroughs on CUDA, with the exact expected gradients
#     (the same cell the integration test runs inside a spawned container);
#  2. the exporter against the real driver: the device's real memory total, and a
#     utilization that rises under a matmul load (tests/unit/test_exporter_gpu_host.py);
#  3. the exporter beside nvidia-smi, field by field per GPU, idle and under a matmul
#     load, and what a scrape costs each way (python3 -m gpulab_exporter.hostcheck: exit
#     1 names every field off by more than its tolerance; times are printed, not judged).
# Usage: scripts/gpu-host-check.sh [--runs N]   (from anywhere; prints what it measured;
#   --runs: scrapes timed per method in step 3, 20 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/hub:$PWD/monitoring/exporter:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fail() { printf 'gpu-host-check: %s\n' "$*" >&2; exit 1; }
command -v nvidia-smi >/dev/null 2>&1 \
  || fail "no nvidia-smi on this host: these checks need an NVIDIA GPU and its driver"
nvidia-smi -L || fail "nvidia-smi -L failed (above): the NVIDIA driver does not answer"
python3 - <<'PY'
import json
from tests.integration.autograd_cell import AUTOGRAD_CELL, chain_grads, close
import contextlib, io
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
python3 -m pytest -q -p no:cacheprovider tests/unit/test_exporter_gpu_host.py -rA
python3 -m gpulab_exporter.hostcheck "$@"
