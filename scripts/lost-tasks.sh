#!/usr/bin/env bash
# Containers that dockerd lost track of, ended and started again. Run by every `make up`
# (scripts/preflight.sh) and, with --watch, in the background for a minute after
# scripts/ensure-docker.sh starts dockerd itself (a host without an init system).
#
# dockerd 20.10 runs with --live-restore here. When a container's process exits while
# dockerd is down (the Docker API filter does so when its socket goes stale; an OOM kill
# during a dockerd upgrade), its shim reports the exit only once dockerd is back, and
# dockerd has been seen to take that late report for the exit of the container it had
# just restarted: it marks the container exited while containerd goes on running it, and
# every later start fails with "id already in use" (seen in CI: the Docker API filter
# after a dockerd restart, so every spawn got 503; netguard, Prometheus and the exporter
# after a simulated reboot). A member's server left so would hold its GPU behind the
# hub's back. Only containerd can end such a task; this does, for each container that
# Docker says has exited while containerd runs it, seen so twice a second apart (a
# container being started is, for a moment, both), names it, and starts it again if its
# restart policy says it should run (always, unless-stopped).
# Usage: scripts/lost-tasks.sh [--watch SECONDS]   (root, for containerd's socket;
#        without it, or without ctr, it does nothing)
set -uo pipefail
say() { echo "[gpulab] $*"; }
watch=0
[ "${1:-}" = --watch ] && watch=${2:?--watch needs seconds}

command -v ctr >/dev/null 2>&1 || exit 0
# GPULAB_CONTAINERD_SOCKET: the containerd of another engine (tests/lane_engine.py's, with
# DOCKER_HOST naming that engine's socket).
for socket in ${GPULAB_CONTAINERD_SOCKET:-} /var/run/docker/containerd/containerd.sock \
              /run/containerd/containerd.sock; do
  [ -S "$socket" ] && [ -w "$socket" ] && break
  socket=
done
[ -n "$socket" ] || exit 0
ctr=(ctr --address "$socket" --namespace moby)

lost() {  # the IDs of containers Docker says have exited while containerd runs them
  "${ctr[@]}" task ls 2>/dev/null | awk '$3 == "RUNNING" {print $1}' | while read -r id; do
    case "$(docker inspect -f '{{.State.Status}}' "$id" 2>/dev/null)" in
      exited|dead) echo "$id" ;;
    esac
  done
}

end() {  # end() ID: end the task, then start the container if its policy says it runs
  local id=$1 name policy
  name=$(docker inspect -f '{{.Name}}' "$id" 2>/dev/null) || return 0
  name=${name#/}
  say "$name: Docker says it has exited, but its processes still run (dockerd lost track of"
  say "  them while it restarted): ending them, so that it can start again."
  "${ctr[@]}" task kill --signal SIGKILL "$id" >/dev/null 2>&1
  for _ in $(seq 50); do
    "${ctr[@]}" task ls 2>/dev/null | awk -v id="$id" '$1 == id && $3 == "RUNNING" {f=1} END {exit !f}' \
      || break
    sleep 0.1
  done
  "${ctr[@]}" task delete "$id" >/dev/null 2>&1
  "${ctr[@]}" container delete "$id" >/dev/null 2>&1
  if "${ctr[@]}" task ls 2>/dev/null | awk -v id="$id" '$1 == id {f=1} END {exit !f}'; then
    say "  could not end them: restart the Docker engine, then run make up again."
    return 0
  fi
  policy=$(docker inspect -f '{{.HostConfig.RestartPolicy.Name}}' "$id" 2>/dev/null)
  case "$policy" in
    always|unless-stopped)
      if docker start "$id" >/dev/null 2>&1; then
        say "  $name started again (restart policy $policy)."
      else
        say "  $name could not be started again: run make up."
      fi ;;
  esac
}

deadline=$((SECONDS + watch))
before=$(lost)
while :; do
  if [ -n "$before" ] || [ "$watch" -gt 0 ]; then
    sleep 1
    now=$(lost)
    for id in $before; do
      grep -qx "$id" <<<"$now" && end "$id"
    done
    before=$now  # those just ended are no longer lost at the next look
  fi
  [ "$SECONDS" -lt "$deadline" ] || break
done
exit 0
