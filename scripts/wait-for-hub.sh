#!/usr/bin/env bash
# Wait until the hub answers at URL (default http://127.0.0.1:8000), and the GPU dashboard
# with it, up to 120 s.
# Usage: wait-for-hub.sh [URL [CURL ARGS...]]   (e.g. --resolve and --cacert for HTTPS)
set -euo pipefail
url=${1:-http://127.0.0.1:8000}
shift || true
# The hub answers before it has started its managed services; the dashboard's route is
# added once the dashboard runs, a few seconds later. Until then /services/gpus/ falls
# through to the hub, which sends it on to /hub/services/gpus/, a 404 (an operator who
# opened the dashboard as make up ended got that page; CI did).
dashboard_routed() {
  local answer
  answer=$(curl -sS -o /dev/null -w '%{http_code} %{redirect_url}' "$@" "$url/services/gpus/" \
           2>/dev/null) || return 1
  case "$answer" in 5*|404*|*/hub/services/gpus/*) return 1;; esac
}
for i in $(seq 1 240); do
  if curl -fsS -o /dev/null "$@" "$url/hub/api" 2>/dev/null && dashboard_routed "$@"; then
    echo "[gpulab] hub answers at $url (after ~$((i / 2)) s)"
    exit 0
  fi
  # The hub refuses to start on a bad setting or a missing secret, saying so in one
  # "gpulab: ..." line, and Docker restarts it over and over: say it now, not in 120 s.
  if [ $((i % 4)) = 0 ] && [ "$(docker inspect -f '{{.RestartCount}}' gpulab-hub 2>/dev/null || echo 0)" -ge 2 ]; then
    said=$(docker logs --tail 1 gpulab-hub 2>&1 || true)
    case "$said" in gpulab:*)
      echo "[gpulab] the hub does not start: ${said#gpulab: }" >&2
      exit 1;;
    esac
  fi
  sleep 0.5
done
echo "[gpulab] the hub did not answer at $url within 120 s. Its last log lines:" >&2
docker logs --tail 40 gpulab-hub >&2 || true
exit 1
