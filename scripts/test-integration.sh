#!/usr/bin/env bash
# The integration tests of `make test`, in four lanes side by side (each lane's tests one
# after another), none on this engine's own gpulab stack (the lab's):
#     gpus        tests that use the stand-in GPUs and the exporter's fake ones (marked
#                 from their fixtures: they edit gpus.yaml and the fake GPUs' control
#                 file), and the modules tests/integration/conftest.py adds to them
#                 (marked gpus_lane), on a Docker engine and a stack of their own, in a
#                 network namespace (tests/lane_engine.py, GPULAB_LANE_ENGINE=
#                 gpulab-lane-stack: scripts/test.sh brings it up while the unit tests
#                 run, else it comes up here), with their own copy of config/;
#     members     the other tests of that stack, whose members' servers hold no GPU;
#     disruptive  the tests that restart the hub, the proxy, dockerd or the whole stack,
#                 edit gpulab.yaml or hold GPUs behind the hub's back (marked so): on a
#                 Docker engine and a stack of their own, in a network namespace
#                 (tests/lane_engine.py), the stack restarts last;
#     swarm       the simulated-Swarm modules: engines, a Swarm and a stack of their own in
#                 network namespaces (they copy the main engine's images);
#     backups     after the swarm lane, in its spare time: the assistant's tests (members'
#                 tests, moved out of the longest lane), then the backup tests, disruptive
#                 too, on a second engine and stack of their own (GPULAB_LANE_ENGINE).
#
# Each lane's output is printed whole when it ends, with its slowest tests (--durations);
# the run fails if any lane failed. GPULAB_LANES=main runs the gpus and members lanes on
# this engine's own stack (make up first) and the disruptive lane there after them (for
# a host without network namespaces).
# Usage: scripts/test-integration.sh [PYTEST ARGS...]   (from the checkout)
set -uo pipefail
cd "$(dirname "$0")/.."
swarm=(tests/integration/test_swarm_harness.py tests/integration/test_docker_proxy_swarm.py
       tests/integration/test_swarm_hub.py)
not_swarm=(); for m in "${swarm[@]}"; do not_swarm+=(--ignore "$m"); done
backups=(tests/integration/test_backup_restore.py)
not_backups=(); for m in "${backups[@]}"; do not_backups+=(--ignore "$m"); done
# Members' tests that run in the backups lane's spare time (on its engine, before the
# backups), not in the members lane, the longest: the assistant's (about a fifth of it)
late=(tests/integration/test_assistant.py)
not_late=(); for m in "${late[@]}"; do not_late+=(--ignore "$m"); done
# shellcheck source=scripts/lanes.sh
. scripts/lanes.sh

disruptive=(-m "integration and disruptive" "$@" tests/integration "${not_swarm[@]}")
if [ "${GPULAB_LANES:-own-engine}" = main ]; then
  echo "[gpulab] integration tests in lanes: gpus beside members, then disruptive beside" \
       "swarm (each lane's output follows when it ends)"
  lane gpus -m "integration and gpus_lane and not disruptive" "$@" tests/integration "${not_swarm[@]}"
  gpus_pid=$!
  lane members -m "integration and not gpus_lane and not disruptive" "$@" tests/integration \
    "${not_swarm[@]}"
  members_pid=$!
  wait "$gpus_pid"; show gpus
  wait "$members_pid"; show members
  lane swarm -m integration "$@" "${swarm[@]}"
  swarm_pid=$!
  lane disruptive "${disruptive[@]}"
  disruptive_pid=$!
  wait "$disruptive_pid"; show disruptive
  wait "$swarm_pid"; show swarm
  finish "integration tests"
  exit 0
fi

echo "[gpulab] integration tests in four lanes side by side: gpus and members (on an engine" \
     "of their own), disruptive (on another) and swarm, then backups (on another) (each" \
     "lane's output follows when it ends)"
stack_engine() { GPULAB_LANE_ENGINE=gpulab-lane-stack .venv/bin/python -m tests.lane_engine "$@"; }
trap 'stack_engine down; rm -rf "$logs"' EXIT
lane swarm -m integration "$@" "${swarm[@]}"
swarm_pid=$!
pytest_main=$pytest
pytest=scripts/own-engine-pytest
lane disruptive "${disruptive[@]}" "${not_backups[@]}"
disruptive_pid=$!
export GPULAB_LANE_ENGINE=gpulab-lane-backups
lane_after swarm backups -m "integration" "$@" "${late[@]}" "${backups[@]}"
backups_pid=$!
unset GPULAB_LANE_ENGINE
if [ "${GPULAB_LANE_STACK_UP:-}" != yes ]; then
  stack_engine up || { echo "[gpulab] the gpus and members lanes' engine did not start" >&2
                       exit 1; }
fi
pytest=scripts/stack-engine-pytest
lane gpus -m "integration and gpus_lane and not disruptive" "$@" tests/integration "${not_swarm[@]}"
gpus_pid=$!
lane members -m "integration and not gpus_lane and not disruptive" "$@" tests/integration \
  "${not_swarm[@]}" "${not_late[@]}"
members_pid=$!
pytest=$pytest_main
wait "$gpus_pid"; show gpus
wait "$members_pid"; show members
wait "$disruptive_pid"; show disruptive
wait "$swarm_pid"; show swarm
wait "$backups_pid"; show backups
finish "integration tests"
