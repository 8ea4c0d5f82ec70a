#!/usr/bin/env bash
# Build gpulab/hub and gpulab/singleuser from host-side wheelhouses.
# Usage: scripts/build-images.sh BASE_IMAGE TORCH_VARIANT [EXTRA_CA_BUNDLE] [PIP ARGS...]
# Unchanged inputs reuse Docker's layer cache: a second run takes seconds.
set -euo pipefail
base=${1:?base image}; variant=${2:?torch variant (cpu|cuda)}; ca=${3:-}; shift 3 || shift $#
pip_args=("$@")
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

case "$variant" in cpu|cuda) ;; *) echo "[gpulab] TORCH_VARIANT must be cpu or cuda, not '$variant'" >&2; exit 2;; esac

# Extra CA certificates go into both images' ca/ folders (ignored by git).
for img in hub singleuser; do
  rm -f "images/$img/ca/"*.crt
  if [ -n "$ca" ]; then
    [ -f "$ca" ] || { echo "[gpulab] EXTRA_CA_BUNDLE=$ca: no such file" >&2; exit 2; }
    cp "$ca" "images/$img/ca/extra-ca.crt"
  fi
done

scripts/wheelhouse.sh images/hub/wheels images/hub/requirements.txt -- "${pip_args[@]}"
scripts/wheelhouse.sh images/singleuser/wheels images/singleuser/requirements.txt \
  "images/singleuser/requirements-$variant.txt" -- "${pip_args[@]}"

# gpulab itself, as a wheel in the hub's wheelhouse; rebuilt only when its sources change
# (a fresh wheel would otherwise invalidate the image's cache on every run).
src_sum=$(cat pyproject.toml $(find hub/gpulab -type f \( -name '*.py' -o -name '*.html' \) | sort) | sha256sum | cut -c1-16)
if [ "$(cat images/hub/wheels/.gpulab-src 2>/dev/null)" != "$src_sum" ]; then
  echo "[gpulab] building the gpulab wheel ..."
  rm -f images/hub/wheels/gpulab-*.whl
  "$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation -w images/hub/wheels . 2>/dev/null \
    || "$PYTHON" -m pip wheel --quiet --no-deps -w images/hub/wheels .
  echo "$src_sum" > images/hub/wheels/.gpulab-src
fi

build() {  # build NAME TAG [BUILD ARGS...]
  local name=$1 tag=$2; shift 2
  echo "[gpulab] building gpulab/$name:$tag (cached layers are reused) ..."
  local start=$SECONDS
  if ! docker build --quiet --build-arg "BASE_IMAGE=$base" "$@" -t "gpulab/$name:$tag" \
       "images/$name" >/tmp/gpulab-build-$name.log 2>&1; then
    echo "[gpulab] building gpulab/$name failed; last lines of /tmp/gpulab-build-$name.log:" >&2
    tail -n 30 /tmp/gpulab-build-$name.log >&2
    exit 1
  fi
  docker tag "gpulab/$name:$tag" "gpulab/$name:latest"
  echo "[gpulab] gpulab/$name:$tag ready ($((SECONDS - start)) s)"
}
build hub latest
build singleuser "$variant" --build-arg "TORCH_VARIANT=$variant"
