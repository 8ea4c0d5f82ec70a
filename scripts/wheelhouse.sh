#!/usr/bin/env bash
# Download the wheels an image installs into a folder inside its build context, on the
# host, resolved for the image's Python (Debian bookworm: CPython 3.11.2). Images then
# `pip install --no-index` from it: builds need no HTTPS from inside a container (which
# fails behind TLS-inspecting proxies) and no registry at all once the wheels are here.
#
# Usage: scripts/wheelhouse.sh DEST REQUIREMENTS... [-- EXTRA PIP ARGS]
# Re-running with the same requirements is a no-op (a stamp holds their checksum).
set -euo pipefail
dest=${1:?usage: $0 DEST REQUIREMENTS... [-- PIP ARGS]}; shift
reqs=(); extra=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; extra=("$@"); break; fi
  reqs+=("$1"); shift
done
PYTHON=${PYTHON:-python3}
IMAGE_PYTHON_VERSION=${IMAGE_PYTHON_VERSION:-3.11.2}

stamp="$dest/.stamp"
want=$(cat "${reqs[@]}" | sha256sum | cut -d' ' -f1)-${IMAGE_PYTHON_VERSION}-${extra[*]:-}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "[gpulab] wheelhouse $dest is up to date"
  exit 0
fi
mkdir -p "$dest"
rm -f "$dest"/*.whl "$stamp"
echo "[gpulab] downloading wheels for $dest (Python $IMAGE_PYTHON_VERSION) ..."
args=()
for r in "${reqs[@]}"; do args+=(-r "$r"); done
"$PYTHON" -m pip download --quiet --progress-bar off \
  --only-binary=:all: --python-version "$IMAGE_PYTHON_VERSION" \
  --dest "$dest" "${args[@]}" ${extra[@]+"${extra[@]}"} \
  2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
# A pin to a public version (torch===2.13.0, or torch==2.13.0: PyPI's CUDA build) met by a
# local build of it (torch-2.13.0+cpu, which `==` accepts and a find-links folder in the
# pip configuration may hold) would silently change the image: refuse it, naming both.
shopt -s nocaseglob
while read -r name version; do
  for wheel in "$dest/${name}-${version}+"*.whl; do
    [ -e "$wheel" ] || continue
    echo "[gpulab] the requirements pin $name $version, the build from the package index, but" \
      "pip took the local build $(basename "$wheel") (from a find-links folder or index in pip's" \
      "configuration: '$PYTHON -m pip config list'). Pin it with === ($name===$version), which" \
      "no local build meets, or download with pip --isolated. Not stamped: the next run" \
      "downloads again." >&2
    exit 1
  done
done < <(sed -nE 's/^[[:space:]]*([A-Za-z0-9][A-Za-z0-9_.-]*)[[:space:]]*===?[[:space:]]*([0-9][0-9A-Za-z.!]*)[[:space:]]*(#.*)?$/\1 \2/p' "${reqs[@]}" \
           | awk '{ n = tolower($1); gsub(/[-_.]+/, "_", n); print n, $2 }')
shopt -u nocaseglob
echo "$want" >"$stamp"
echo "[gpulab] $(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest"
