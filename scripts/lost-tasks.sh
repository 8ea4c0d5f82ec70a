#!/usr/bin/env bash
# Container processes that dockerd lost track of, ended (run by scripts/preflight.sh, so by
# every `make up`).
#
# dockerd 20.10 runs with --live-restore here. When a container's processes die while
# dockerd is stopped and its containerd shim lives on (an OOM kill during a dockerd
# upgrade), the shim reports the death only once dockerd is back, and dockerd has been seen
# to take that late report for the exit of the container it had just restarted: it marks
# the container exited, while containerd goes on running it. Every later start of that
# container then fails with "id already in use" (seen in CI on the stack's netguard,
# Prometheus and exporter), and a member's server left running that way would hold its GPU
# behind the hub's back. Only containerd can end such a task; this does, for each container
# that Docker says is not running while containerd runs it, and names it.
# Usage: scripts/lost-tasks.sh   (needs root for containerd's socket; silent without it)
set -uo pipefail
say() { echo "[gpulab] $*"; }

command -v ctr >/dev/null 2>&1 || exit 0
for socket in /var/run/docker/containerd/containerd.sock /run/containerd/containerd.sock; do
  [ -S "$socket" ] && [ -w "$socket" ] && break
  socket=
done
[ -n "$socket" ] || exit 0
ctr=(ctr --address "$socket" --namespace moby)

"${ctr[@]}" task ls 2>/dev/null | awk '$3 == "RUNNING" {print $1}' | while read -r id; do
  status=$(docker inspect -f '{{.State.Status}} {{.Name}}' "$id" 2>/dev/null) || continue
  read -r state name <<<"$status"; name=${name#/}
  case "$state" in exited|dead) ;; *) continue ;; esac
  say "$name: Docker says it has $state, but its processes still run (dockerd lost track of"
  say "  them while it restarted): ending them, so that it can start again."
  "${ctr[@]}" task kill --signal SIGKILL "$id" >/dev/null 2>&1
  for _ in $(seq 50); do
    "${ctr[@]}" task ls 2>/dev/null | awk -v id="$id" '$1 == id && $3 == "RUNNING" {f=1} END {exit !f}' \
      || break
    sleep 0.1
  done
  "${ctr[@]}" task delete "$id" >/dev/null 2>&1
  "${ctr[@]}" container delete "$id" >/dev/null 2>&1
  "${ctr[@]}" task ls 2>/dev/null | awk -v id="$id" '$1 == id {f=1} END {exit !f}' \
    && say "  could not end them: restart the Docker engine, then run make up again."
done
exit 0
