#!/usr/bin/env bash
# Build the Debian bookworm base image that every gpulab image starts FROM when no
# container registry is reachable (air-gapped labs, CI). debootstrap fetches .deb
# packages from the Debian mirror over plain HTTP, and `docker import` turns the
# root filesystem into an image. An imported image has an empty config: each
# Dockerfile sets ENV PATH and friends itself.
#
# The image is labelled with this script's checksum: an image built by another version
# of it is built again (and the images FROM it with it, through Docker's cache).
#
# Usage: images/base/build.sh IMAGE:TAG
set -euo pipefail
image=${1:?usage: $0 IMAGE:TAG}
recipe=$(sha256sum "$0" | cut -c1-16)

if [ "$(docker image inspect -f '{{index .Config.Labels "org.gpulab.base-recipe"}}' "$image" 2>/dev/null)" = "$recipe" ]; then
  echo "[gpulab] base image $image already present"
  exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  echo "[gpulab] installing debootstrap ..."
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null; }
fi

rootfs=$(mktemp -d /tmp/gpulab-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "[gpulab] debootstrap bookworm into $rootfs (about a minute) ..."
debootstrap --variant=minbase \
  --include=python3,python3-venv,python3-pip,ca-certificates \
  bookworm "$rootfs" >/tmp/gpulab-debootstrap.log 2>&1 \
  || { tail -n 30 /tmp/gpulab-debootstrap.log >&2; exit 1; }
# Keep the image small and free of host-specific state.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
# No documentation, manual pages or translations (about 50 MB): nobody reads them in a
# container, and messages stay in English (LANG=C.UTF-8). Licences stay. dpkg skips
# them from now on too, in the packages images install later (as debian:*-slim does).
printf 'path-exclude %s\n' /usr/share/doc/\* /usr/share/man/\* /usr/share/info/\* \
  /usr/share/locale/\* /usr/share/groff/\* /usr/share/lintian/\* \
  >"$rootfs/etc/dpkg/dpkg.cfg.d/gpulab-slim"
echo 'path-include /usr/share/doc/*/copyright' >>"$rootfs/etc/dpkg/dpkg.cfg.d/gpulab-slim"
find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
  "$rootfs"/usr/share/groff/* "$rootfs"/usr/share/lintian/*
echo "[gpulab] importing as $image ..."
tar -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL org.gpulab.base-recipe=$recipe" \
  - "$image" >/dev/null
echo "[gpulab] base image $image built"
