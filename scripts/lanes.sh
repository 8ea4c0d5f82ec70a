# Lanes: pytest processes side by side, each one's output printed whole when it ends, with
# its slowest tests. Sourced by scripts/test-unit.sh and scripts/test-integration.sh:
#   lane NAME PYTEST-ARGS...   start one in the background (its PID in $!)
#   show NAME                  after `wait`: print its output; a failure goes into $failed
#   finish WHAT                say how long WHAT took and how busy the machine's CPUs were
#                              then; exit 1 if a lane failed
# The CPU figures tell a slow machine from a slower suite: the lanes are CPU-bound on a
# 2-core machine (measured: 80-100 % busy), so their time follows the CPU time they use
# and how fast the CPUs were that day, which the probe (a fixed single-core loop, timed
# before the lanes start) shows.
pytest=${PYTEST:-.venv/bin/pytest}
logs=$(mktemp -d /tmp/gpulab-test-lanes.XXXXXX)
trap 'rm -rf "$logs"' EXIT
started=$SECONDS
failed=()
# /proc/stat's first line: busy and steal jiffies (USER_HZ, 100 a second) of all CPUs
cpu_jiffies() { awk '/^cpu /{print $2+$3+$4+$7+$8, $9}' /proc/stat; }
cpu_probe=$(python3 -c 'import hashlib, time
t = time.perf_counter(); h = b""
for _ in range(500_000): h = hashlib.sha256(h).digest()
print(f"{time.perf_counter() - t:.2f}")')
read -r cpu_busy0 cpu_steal0 < <(cpu_jiffies)

lane() {
  local name=$1; shift
  ( "$pytest" -p no:cacheprovider --durations=10 "$@" >"$logs/$name" 2>&1;
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
  local busy steal wall=$((SECONDS - started))
  read -r busy steal < <(cpu_jiffies)
  echo "[gpulab] $1 took $wall s; $(awk -v b=$((busy - cpu_busy0)) -v s=$((steal - cpu_steal0)) \
    -v w="$wall" -v n="$(nproc)" -v p="$cpu_probe" 'BEGIN { printf "CPU: %.0f s used of %d" \
    " (%d CPUs, %.0f %% busy, %.0f s stolen); probe before: %s s (a fixed loop on one core)",
    b / 100, w * n, n, w ? b / w / n : 0, s / 100, p }')"
  if [ ${#failed[@]} -gt 0 ]; then
    echo "[gpulab] failed: ${failed[*]}" >&2
    exit 1
  fi
}
