#!/usr/bin/env bash
# make test: the unit tests, then the integration lanes (scripts/test-integration.sh),
# every lane on a Docker engine and a stack of its own, in network namespaces
# (tests/lane_engine.py, tests/swarm): this host's own gpulab stack, its config/, its
# members' servers and its leases are never touched, whatever the lab is doing. The
# engine of the gpus and members lanes comes up while the unit tests run.
# GPULAB_LANES=main: the old way, on this engine's own stack (for a host without
# network namespaces): `make up` first, with the tests' settings.
set -uo pipefail
cd "$(dirname "$0")/.."
say() { echo "[gpulab] $*"; }
nvidia=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)

if [ "${GPULAB_LANES:-own-engine}" = main ]; then
  say "GPULAB_LANES=main: the tests run on THIS engine's gpulab stack: make up restarts it" \
      "with the tests' settings, and they edit its config/ and start and stop servers"
  scripts/standin-gpus.sh && make --no-print-directory up || exit 1
  env -u GPULAB_EXPORTER_FLAGS -u GPULAB_SCRAPE_SECONDS -u GPULAB_BACKUP_DIR \
    -u GPULAB_MODELS_DIR scripts/test-unit.sh || exit 1
  exec scripts/test-integration.sh
fi

say "make test leaves this lab as it is: its stack, config/, members' servers and leases" \
    "on this engine are not touched. It builds the images here (gpulab/*:latest, what" \
    "make up would build) and runs every lane on Docker engines and stacks of its own," \
    "in network namespaces gpulab-lane* and the simulated Swarm's, under /tmp."
if [ "${nvidia:-0}" -gt 0 ]; then
  say "This host has $nvidia NVIDIA GPU(s): test_gpu_host.py starts servers on them (a few" \
      "seconds each, on the tests' own engine, unknown to the lab's lease table); run" \
      "make test when no member needs them. Tests of stand-in GPUs are skipped here."
fi

engine_log=$(mktemp /tmp/gpulab-lane-stack.XXXXXX.log)
GPULAB_LANE_ENGINE=gpulab-lane-stack .venv/bin/python -m tests.lane_engine up \
  >"$engine_log" 2>&1 &
engine_pid=$!
# the unit tests test a lab's values, not the test stacks' (Makefile TEST_STACK)
env -u GPULAB_EXPORTER_FLAGS -u GPULAB_SCRAPE_SECONDS -u GPULAB_BACKUP_DIR \
  -u GPULAB_MODELS_DIR scripts/test-unit.sh
unit=$?
wait "$engine_pid"
engine=$?
if [ "$engine" != 0 ]; then
  say "the engine of the gpus and members lanes did not start:"; cat "$engine_log"
fi
rm -f "$engine_log"
if [ "$unit" != 0 ] || [ "$engine" != 0 ]; then
  GPULAB_LANE_ENGINE=gpulab-lane-stack .venv/bin/python -m tests.lane_engine down
  exit 1
fi
GPULAB_LANE_STACK_UP=yes exec scripts/test-integration.sh
