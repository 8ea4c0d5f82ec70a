#!/usr/bin/env bash
# Download the wheels an image installs into a folder inside its build context, on the
# host: exactly those its lock file lists (scripts/lock.py, `make lock`), each checked
# against the lock's hash. Images then `pip install --require-hashes --no-index` from it:
# builds need no HTTPS from inside a container (which fails behind TLS-inspecting proxies)
# and no registry at all once the wheels are here.
#
# Usage: scripts/wheelhouse.sh DEST LOCK REQUIREMENTS... [-- EXTRA PIP ARGS]
# A lock older than an edit of its REQUIREMENTS is refused (run `make lock`). Re-running
# with the same lock is a no-op (a stamp holds its checksum).
set -euo pipefail
dest=${1:?usage: $0 DEST LOCK REQUIREMENTS... [-- PIP ARGS]}; lock=${2:?lock file}; shift 2
reqs=(); extra=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; extra=("$@"); break; fi
  reqs+=("$1"); shift
done
PYTHON=${PYTHON:-python3}
IMAGE_PYTHON_VERSION=${IMAGE_PYTHON_VERSION:-3.11.2}

"$PYTHON" "$(dirname "$0")/lock.py" --check "$lock" "${reqs[@]}"
stamp="$dest/.stamp"
want=$(sha256sum "$lock" | cut -d' ' -f1)-${IMAGE_PYTHON_VERSION}-${extra[*]:-}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "[gpulab] wheelhouse $dest is up to date"
  exit 0
fi
mkdir -p "$dest"
rm -f "$dest"/*.whl "$stamp"
echo "[gpulab] downloading the wheels $lock lists into $dest (Python $IMAGE_PYTHON_VERSION) ..."
# --require-hashes: a wheel whose hash is not the lock's is refused, whoever serves it
"$PYTHON" -m pip download --quiet --progress-bar off --disable-pip-version-check \
  --require-hashes --no-deps --only-binary=:all: --python-version "$IMAGE_PYTHON_VERSION" \
  --dest "$dest" -r "$lock" ${extra[@]+"${extra[@]}"} \
  2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
echo "$want" >"$stamp"
echo "[gpulab] $(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest"
