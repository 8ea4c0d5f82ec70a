#!/usr/bin/env bash
# Keep users' containers apart: on the `gpulab` bridge (interface gpulab0) only traffic
# to or from the hub passes; one user's container cannot open a connection to another's
# (their Jupyter server, or anything else they run). Installed in Docker's DOCKER-USER
# chain, which Docker evaluates before its own rules and keeps across its restarts.
#
# Usage: scripts/isolate-users.sh up HUB_IP | down     (root; idempotent)
set -euo pipefail
action=${1:?usage: $0 up HUB_IP | down}
bridge=gpulab0
tag=gpulab-isolate-users

if ! command -v iptables >/dev/null 2>&1 || ! iptables -S DOCKER-USER >/dev/null 2>&1; then
  echo "[gpulab] WARNING: no iptables DOCKER-USER chain here: user containers are NOT isolated" \
       "from each other (their servers still require the owner's credentials)." >&2
  exit 0
fi

# Remove our rules (by their comment), whatever their order.
while read -r rule; do
  # shellcheck disable=SC2086
  iptables ${rule/-A /-D }
done < <(iptables -S DOCKER-USER | grep -- "--comment $tag" || true)

if [ "$action" = up ]; then
  hub=${2:?hub IP}
  iptables -I DOCKER-USER 1 -i $bridge -o $bridge -j DROP -m comment --comment $tag
  iptables -I DOCKER-USER 1 -i $bridge -o $bridge -d "$hub" -j RETURN -m comment --comment $tag
  iptables -I DOCKER-USER 1 -i $bridge -o $bridge -s "$hub" -j RETURN -m comment --comment $tag
  echo "[gpulab] user containers isolated from each other (only the hub, $hub, reaches them)"
fi
