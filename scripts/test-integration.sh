#!/usr/bin/env bash
# The integration tests of `make test`, against the stack `make up` started, in two
# processes side by side: the simulated-Swarm modules (engines, a Swarm and a stack of
# their own in network namespaces; they need nothing of the main stack) and everything
# else. Each prints its ten slowest tests (--durations). The Swarm modules' output comes
# after the rest's, whole; the run fails if either failed.
# Usage: scripts/test-integration.sh [PYTEST ARGS...]   (from the checkout)
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=${PYTEST:-.venv/bin/pytest}
swarm=(tests/integration/test_swarm_harness.py tests/integration/test_docker_proxy_swarm.py
       tests/integration/test_swarm_hub.py)
ignore=(); for m in "${swarm[@]}"; do ignore+=(--ignore "$m"); done

log=$(mktemp /tmp/gpulab-swarm-tests.XXXXXX)
trap 'rm -f "$log"' EXIT
echo "[gpulab] the simulated-Swarm modules run beside the rest (their output follows it)"
"$pytest" -m integration -p no:cacheprovider --durations=10 "$@" "${swarm[@]}" >"$log" 2>&1 &
swarm_pid=$!
"$pytest" -m integration --durations=10 "$@" tests/integration "${ignore[@]}"
main=$?
wait "$swarm_pid"
swarm_status=$?
echo
echo "================ the simulated-Swarm modules (run beside the rest) ================"
cat "$log"
if [ "$main" != 0 ] || [ "$swarm_status" != 0 ]; then
  echo "[gpulab] integration tests failed: the rest exited $main, the Swarm modules $swarm_status" >&2
  exit 1
fi
