#!/usr/bin/env bash
# Build gpulab/hub, gpulab/singleuser, gpulab/exporter and gpulab/prometheus, with the
# Python packages from host-side wheelhouses.
# Usage: scripts/build-images.sh BASE_IMAGE TORCH_VARIANT [EXTRA_CA_BUNDLE] [PIP ARGS...]
# Unchanged inputs reuse Docker's layer cache: a second run takes seconds. What does not
# depend on each other runs side by side (a fresh machine: 374 s one after another, most
# of it waiting on the network or on one core): gpulab's own base image (BASE_IMAGE
# gpulab/base:bookworm, images/base/build.sh) beside the wheel downloads, and the images'
# builds beside each other.
# IMAGES="singleuser" builds only those (default: all four); TAG_LATEST=no leaves each
# :latest tag where it was (`make cuda-image`: a CUDA image beside the stack's CPU one).
set -euo pipefail
base=${1:?base image}; variant=${2:?torch variant (cpu|cuda)}; ca=${3:-}; shift 3 || shift $#
pip_args=("$@")
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

case "$variant" in cpu|cuda) ;; *) echo "[gpulab] TORCH_VARIANT must be cpu or cuda, not '$variant'" >&2; exit 2;; esac

# Extra CA certificates go into both images' ca/ folders (ignored by git).
for dir in images/hub images/singleuser; do
  rm -f "$dir/ca/"*.crt
  if [ -n "$ca" ]; then
    [ -f "$ca" ] || { echo "[gpulab] EXTRA_CA_BUNDLE=$ca: no such file" >&2; exit 2; }
    cp --preserve=timestamps "$ca" "$dir/ca/extra-ca.crt"  # unchanged: no rebuild
  fi
done

# Each image's wheels as its lock lists them (`make lock` writes the locks).
images=" ${IMAGES:-hub singleuser exporter prometheus} "
wanted() { [[ "$images" == *" $1 "* ]]; }

base_pid=
if [ "$base" = gpulab/base:bookworm ]; then  # no registry needed: debootstrap over HTTP
  images/base/build.sh "$base" &
  base_pid=$!
fi

if wanted hub; then
  scripts/wheelhouse.sh images/hub/wheels images/hub/requirements.lock \
    images/hub/requirements.txt -- "${pip_args[@]}"
fi
if wanted singleuser; then
  # One wheelhouse per variant (the CUDA one is 2.7 GB), so that building one variant
  # does not empty the other's; the build context gets the variant's as wheels/ (hard
  # links), and .dockerignore keeps the wheelhouses themselves out of the context.
  scripts/wheelhouse.sh "images/singleuser/wheels-$variant" \
    "images/singleuser/requirements-$variant.lock" images/singleuser/requirements.txt \
    "images/singleuser/requirements-$variant.txt" -- "${pip_args[@]}"
  rm -rf images/singleuser/wheels
  cp -al "images/singleuser/wheels-$variant" images/singleuser/wheels
fi

# Our own packages as wheels in the wheelhouses; each rebuilt only when its sources
# change (a fresh wheel would otherwise invalidate the image's cache on every run).
# Run after wheelhouse.sh, which empties a wheelhouse whose requirements changed.
local_wheel() {  # local_wheel NAME PROJECT_DIR SOURCE_DIR WHEELHOUSE
  local name=$1 project=$2 src=$3 dest=$4 sum
  sum=$(cat "$project/pyproject.toml" $(find "$src" -type f \( -name '*.py' -o -name '*.html' -o -name '*.js' -o -name '*.css' \) | sort) | sha256sum | cut -c1-16)
  if [ "$(cat "$dest/.$name-src" 2>/dev/null)" != "$sum" ] || ! ls "$dest/${name//-/_}"-*.whl >/dev/null 2>&1; then
    echo "[gpulab] building the $name wheel ..."
    rm -f "$dest/${name//-/_}"-*.whl
    "$PYTHON" -m pip wheel --quiet --no-deps -w "$dest" "$project" >/dev/null
    rm -rf "$project/build"
    echo "$sum" > "$dest/.$name-src"
  fi
}
if wanted exporter; then
  scripts/wheelhouse.sh monitoring/exporter/wheels monitoring/exporter/requirements.lock \
    monitoring/exporter/requirements.txt -- "${pip_args[@]}"
fi
if wanted hub; then local_wheel gpulab . hub/gpulab images/hub/wheels; fi
if wanted exporter; then
  local_wheel gpulab-exporter monitoring/exporter monitoring/exporter/gpulab_exporter monitoring/exporter/wheels
fi

if [ -n "$base_pid" ] && ! wait "$base_pid"; then
  echo "[gpulab] the base image $base could not be built (above)" >&2
  exit 1
fi

# What an image is built from, as a short hash: the base image's ID, the build arguments,
# and each file of its context by path, size and modification time (not content: hashing
# the single-user image's 370 MB of wheels costs what it saves). An image labelled with
# the same hash is up to date and not built again: even from cache, `docker build` sends
# the whole context to dockerd, which checksums every file of each COPY (2.3 CPU-s and
# 1.9 s for the single-user image at every make up, its wheels unchanged).
context_stamp() {  # context_stamp CONTEXT [BUILD ARGS...]
  local context=$1; shift
  { docker image inspect -f '{{.Id}}' "$base" 2>/dev/null || echo "$base"
    printf '%s\n' "$@"
    (cd "$context" && find . -type f -printf '%P %s %T@\n' | LC_ALL=C sort)
  } | sha256sum | cut -c1-16
}
build() {  # build NAME TAG CONTEXT [BUILD ARGS...]
  local name=$1 tag=$2 context=$3; shift 3
  local stamp start=$SECONDS
  stamp=$(context_stamp "$context" "$@")
  if [ "$(docker image inspect -f '{{index .Config.Labels "org.gpulab.context"}}' \
          "gpulab/$name:$tag" 2>/dev/null)" = "$stamp" ]; then
    [ "${TAG_LATEST:-yes}" = no ] || docker tag "gpulab/$name:$tag" "gpulab/$name:latest"
    echo "[gpulab] gpulab/$name:$tag up to date (built from these very files)"
    return
  fi
  echo "[gpulab] building gpulab/$name:$tag (cached layers are reused) ..."
  if ! docker build --quiet --build-arg "BASE_IMAGE=$base" "$@" --label "org.gpulab.context=$stamp" \
       -t "gpulab/$name:$tag" "$context" >/tmp/gpulab-build-$name.log 2>&1; then
    echo "[gpulab] building gpulab/$name failed; last lines of /tmp/gpulab-build-$name.log:" >&2
    tail -n 30 /tmp/gpulab-build-$name.log >&2
    exit 1
  fi
  [ "${TAG_LATEST:-yes}" = no ] || docker tag "gpulab/$name:$tag" "gpulab/$name:latest"
  echo "[gpulab] gpulab/$name:$tag ready ($((SECONDS - start)) s)"
}
builds=()  # side by side; each says when it is ready, or why it failed
if wanted singleuser; then
  build singleuser "$variant" images/singleuser --build-arg "TORCH_VARIANT=$variant" &
  builds+=($!)
fi
if wanted hub; then build hub latest images/hub & builds+=($!); fi
if wanted exporter; then build exporter latest monitoring/exporter & builds+=($!); fi
if wanted prometheus; then build prometheus latest images/prometheus & builds+=($!); fi
failed=0
for pid in "${builds[@]}"; do wait "$pid" || failed=1; done
exit "$failed"
