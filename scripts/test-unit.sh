#!/usr/bin/env bash
# The unit tests of `make test` (everything not marked integration or upgrade), in four
# lanes side by side: the modules that start a real JupyterHub (they mostly wait for it),
# the single sign-on ones, one lane each (a real hub beside a real OpenID Connect provider,
# or a real OpenLDAP, waiting on their checks), and all the others, which keep a core busy
# (measured on 2 cores: 50 s in
# one process).
# Usage: scripts/test-unit.sh [PYTEST ARGS...]   (from the checkout)
set -uo pipefail
cd "$(dirname "$0")/.."
real_hub=(tests/unit/test_login_hub.py tests/unit/test_ssh_keys_hub.py)
sso=(tests/unit/test_sso_hub.py)
ldap=(tests/unit/test_ldap_hub.py)
others=(); for m in "${real_hub[@]}" "${sso[@]}" "${ldap[@]}"; do others+=(--ignore "$m"); done
# shellcheck source=scripts/lanes.sh
. scripts/lanes.sh

marks="not integration and not upgrade and not cuda_image"
lane real-hub -m "$marks" "$@" "${real_hub[@]}"
real_hub_pid=$!
lane sso -m "$marks" "$@" "${sso[@]}"
sso_pid=$!
lane ldap -m "$marks" "$@" "${ldap[@]}"
ldap_pid=$!
lane unit -m "$marks" "$@" tests "${others[@]}"
unit_pid=$!
wait "$real_hub_pid"; show real-hub
wait "$sso_pid"; show sso
wait "$ldap_pid"; show ldap
wait "$unit_pid"; show unit
finish "unit tests"
