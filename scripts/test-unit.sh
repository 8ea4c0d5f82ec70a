#!/usr/bin/env bash
# The unit tests of `make test` (everything not marked integration or upgrade), in lanes
# side by side: the modules that start a real JupyterHub (they mostly wait for it); the
# single sign-on ones (a real hub beside a real OpenID Connect provider, or a real
# OpenLDAP, waiting on their checks), the OpenID Connect tests that wait out a token's
# life or the provider's grace in a lane of their own; and all the others, which keep a
# core busy, in two lanes (one process: 48 s, 34 s of it in tests, on 2 cores whose
# four lanes left them 58 % busy; the sign-on lane took 50 s).
# Usage: scripts/test-unit.sh [PYTEST ARGS...]   (from the checkout)
set -uo pipefail
cd "$(dirname "$0")/.."
real_hub=(tests/unit/test_login_hub.py tests/unit/test_ssh_keys_hub.py)
sso=(tests/unit/test_sso_hub.py)
sso_clocks="refreshed or grace"  # -k: the tests that wait out a token's life or the grace
ldap=(tests/unit/test_ldap_hub.py)
# the costliest of the others (about half of their time), in a lane of their own
heavy=(tests/unit/test_exporter_http.py tests/unit/test_lock.py
       tests/unit/test_dashboard_sources.py tests/unit/test_exporter_gpu_host_rules.py)
others=(); for m in "${real_hub[@]}" "${sso[@]}" "${ldap[@]}" "${heavy[@]}"; do
  others+=(--ignore "$m"); done
# shellcheck source=scripts/lanes.sh
. scripts/lanes.sh

marks="not integration and not upgrade and not cuda_image"
lane real-hub -m "$marks" "$@" "${real_hub[@]}"
real_hub_pid=$!
lane sso -m "$marks" -k "not ($sso_clocks)" "$@" "${sso[@]}"
sso_pid=$!
lane sso-clocks -m "$marks" -k "$sso_clocks" "$@" "${sso[@]}"
sso_clocks_pid=$!
lane ldap -m "$marks" "$@" "${ldap[@]}"
ldap_pid=$!
lane unit-heavy -m "$marks" "$@" "${heavy[@]}"
heavy_pid=$!
lane unit -m "$marks" "$@" tests "${others[@]}"
unit_pid=$!
wait "$real_hub_pid"; show real-hub
wait "$sso_pid"; show sso
wait "$sso_clocks_pid"; show sso-clocks
wait "$ldap_pid"; show ldap
wait "$heavy_pid"; show unit-heavy
wait "$unit_pid"; show unit
finish "unit tests"
