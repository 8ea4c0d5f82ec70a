# Lanes: pytest processes side by side, each one's output printed whole when it ends, with
# its slowest tests. Sourced by scripts/test-unit.sh and scripts/test-integration.sh:
#   lane NAME PYTEST-ARGS...   start one in the background (its PID in $!)
#   lane_after LANE NAME PYTEST-ARGS...
#                              the same, to begin once lane LANE has ended (a lane that
#                              fills a shorter one's spare time)
#   show NAME                  after `wait`: print its output; a failure goes into $failed
#   finish WHAT                say how long WHAT took and how busy the machine's CPUs were
#                              then; exit 1 if a lane failed
# The CPU figures tell a slow machine from a slower suite (bench/machine.py says how).
pytest=${PYTEST:-.venv/bin/pytest}
logs=$(mktemp -d /tmp/gpulab-test-lanes.XXXXXX)
trap 'rm -rf "$logs"' EXIT
started=$SECONDS
failed=()
# How busy the CPUs are and how fast one is, now (bench/machine.py; the lanes' closing line)
machine() { "$(dirname "$pytest")/python" -m bench.machine "$@"; }
read -r cpu_busy0 cpu_steal0 cpu_probe < <(machine start)

lane() {
  local name=$1; shift
  ( "$pytest" -p no:cacheprovider --durations=10 "$@" >"$logs/$name" 2>&1;
    echo $? >"$logs/$name.status" ) &
}
lane_after() {
  local after=$1 name=$2; shift 2
  ( while [ ! -e "$logs/$after.status" ]; do sleep 1; done
    "$pytest" -p no:cacheprovider --durations=10 "$@" >"$logs/$name" 2>&1
    echo $? >"$logs/$name.status" ) &
}
show() {
  local name=$1 status
  status=$(cat "$logs/$name.status" 2>/dev/null || echo "?")
  echo
  echo "================ lane '$name' (exit $status, done at $((SECONDS - started)) s) ================"
  cat "$logs/$name"
  [ "$status" = 0 ] || failed+=("$name")
}
finish() {
  echo
  echo "[gpulab] $(machine since "$1" $((SECONDS - started)) "$cpu_busy0" "$cpu_steal0" \
    "$cpu_probe")"
  if [ ${#failed[@]} -gt 0 ]; then
    echo "[gpulab] failed: ${failed[*]}" >&2
    exit 1
  fi
}
