#!/usr/bin/env bash
# The unit tests of `make test` (everything not marked integration or upgrade), in two
# lanes side by side: the modules that start a real JupyterHub (they mostly wait for it;
# test_sso_hub.py beside a real OpenID Connect provider)
# beside all the others, which keep a core busy (measured on 2 cores: 50 s in one process).
# Usage: scripts/test-unit.sh [PYTEST ARGS...]   (from the checkout)
set -uo pipefail
cd "$(dirname "$0")/.."
real_hub=(tests/unit/test_login_hub.py tests/unit/test_ssh_keys_hub.py tests/unit/test_sso_hub.py)
not_real_hub=(); for m in "${real_hub[@]}"; do not_real_hub+=(--ignore "$m"); done
# shellcheck source=scripts/lanes.sh
. scripts/lanes.sh

lane real-hub -m "not integration and not upgrade and not cuda_image" "$@" "${real_hub[@]}"
real_hub_pid=$!
lane unit -m "not integration and not upgrade and not cuda_image" "$@" tests "${not_real_hub[@]}"
unit_pid=$!
wait "$real_hub_pid"; show real-hub
wait "$unit_pid"; show unit
finish "unit tests"
