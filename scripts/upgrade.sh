#!/usr/bin/env bash
# make upgrade: from the gpulab that runs on this engine to this checkout's (git pull --autostash
# first). Nothing that runs changes until the new images are built and the new version
# accepts the lab's config/; then the hub and Prometheus stop (members' servers keep
# running), everything is backed up, JupyterHub's database is migrated, and make up
# starts the new version. Every step that fails says so and how to go back
# (scripts/upgrade.sh --back, docs/backups-and-upgrades.md#upgrading).
#   scripts/upgrade.sh          upgrade (make upgrade)
#   scripts/upgrade.sh --back   the older version's images, and the lab's state as it was
#                               before the last upgrade (the hub's database, config/,
#                               secrets/); members' homes, the datasets and Prometheus'
#                               history stay as they are now (make upgrade-back); then
#                               git checkout it and make up BUILD_IMAGES=no
# Needs from make: COMPOSE (the compose command with its files), GPULAB_CONFIG,
# GPULAB_BACKUP_DIR; make's command-line variables reach the makes it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "[gpulab] $*"; }
die() { echo "[gpulab] $*" >&2; exit 1; }
: "${COMPOSE:?run through make upgrade}"
config=${GPULAB_CONFIG:-$PWD/config}
record=.gpulab-upgrade  # the last upgrade: the revision before it, its backup
images=(hub exporter prometheus singleuser)

docker info >/dev/null 2>&1 || die "the Docker engine is not answering (scripts/ensure-docker.sh starts it)"

image_of() {  # the image the container $1 runs, else what gpulab/$2:latest is now
  local id
  id=$(docker container inspect -f '{{.Image}}' "$1" 2>/dev/null) \
    || id=$(docker image inspect -f '{{.Id}}' "gpulab/$2:latest" 2>/dev/null) || id=
  echo "$id"
}
tag_all() {  # tag_all FROM TO: gpulab/NAME:FROM -> gpulab/NAME:TO for each image there
  for name in "${images[@]}"; do
    if docker image inspect "gpulab/$name:$1" >/dev/null 2>&1; then docker tag "gpulab/$name:$1" "gpulab/$name:$2"; fi
  done
}
revision() { git rev-parse --short HEAD 2>/dev/null || echo unknown; }

if [ "${1:-}" = --back ]; then
  # Run in this (the new) checkout: the restore needs this version's tools, the older
  # version's Makefile and compose file start it afterwards.
  [ -f "$record" ] || die "no upgrade is recorded here ($record): nothing to go back to"
  # shellcheck source=/dev/null
  . "./$record"
  docker image inspect gpulab/hub:previous >/dev/null 2>&1 || die "gpulab/hub:previous is gone: git checkout -m $before && make images builds its images; then make restore SNAPSHOT=$snapshot CONFIRM=yes and make up"
  say "back to $before and its images. Put back as backup $snapshot holds them (made just before the upgrade): the hub's database (members, login tokens, the line, bookings, GPU-hours), config/ and secrets/; what changed there since the upgrade is lost (members added, tokens issued, settings edited). Kept as they are now: members' homes (files written since the upgrade stay), the datasets and Prometheus' history"
  docker tag gpulab/hub:latest gpulab/hub:upgraded  # the restore's tools are this version's
  make -s down
  GPULAB_HUB_IMAGE=gpulab/hub:upgraded scripts/restore.sh "$snapshot" yes stack
  tag_all previous latest
  rm -f "$record" .gpulab-running
  say "the hub's data are as they were before the upgrade, members' homes as they are now, and $before's images are gpulab/*:latest again; start it: git checkout -m $before && make up BUILD_IMAGES=no"
  exit 0
fi

before=$(cat .gpulab-running 2>/dev/null || true)  # written by make up since this version
if [ -z "$before" ]; then
  before=$(git rev-parse --short ORIG_HEAD 2>/dev/null || true)
  [ -n "$before" ] && say "the running version is not recorded (a gpulab before make upgrade): taking ORIG_HEAD, $before, where git pull started from"
fi
before=${before:-unknown}
now=$(revision)
running=$(docker ps -q --filter name='^gpulab-hub$')
say "upgrading from ${before} to ${now}$([ -n "$running" ] || echo ' (the lab is stopped)')"

# 1. The images that run now are kept as :previous, for the way back.
for pair in gpulab-hub:hub gpulab-exporter:exporter gpulab-prometheus:prometheus -:singleuser; do
  id=$(image_of "${pair%%:*}" "${pair##*:}")
  if [ -n "$id" ]; then docker tag "$id" "gpulab/${pair##*:}:previous"; fi
done
docker image inspect gpulab/hub:previous >/dev/null 2>&1 || die "no gpulab image on this engine: nothing to upgrade (make up starts this version)"
restore_images() { tag_all previous latest; }
old_settings=$(mktemp); trap 'rm -f "$old_settings"' EXIT
docker run --rm --network none --entrypoint gpulab gpulab/hub:previous config describe >"$old_settings"

# 2. The new images, and the new version's word on the lab's config/, while the old runs.
if ! make -s images BUILD_IMAGES=yes; then
  restore_images; die "building the new images failed (above): the old version still runs, unchanged"
fi
new_gpulab() {  # the new version's gpulab CLI, with the lab's config/ (stdin: the caller's)
  docker run --rm -i --network none -v "$config:/srv/gpulab/config:ro" gpulab/hub:latest gpulab "$@"
}
if ! new_gpulab config check /srv/gpulab/config/gpulab.yaml /srv/gpulab/config/gpus.yaml </dev/null \
     | sed 's/^/[gpulab] /'; then
  restore_images
  die "$now refuses this lab's configuration (above): fix it, then make upgrade again; the old version still runs, unchanged"
fi
say "what changes in configuration:"
new_gpulab config changes --from - /srv/gpulab/config/gpulab.yaml <"$old_settings" \
  | sed 's/^/[gpulab]   /'

# 3. The hub and Prometheus stop (members' servers and their routes stay), then a backup
#    of everything, Prometheus' volume as it lies (an older gpulab's has no snapshot API).
make -s secrets
install -d -m 700 "$GPULAB_BACKUP_DIR"
say "stopping the hub and Prometheus for the upgrade (members' running servers go on)"
docker stop gpulab-hub gpulab-prometheus gpulab-backup >/dev/null 2>&1 || true
restart_old() { restore_images; [ -z "$running" ] || docker start gpulab-prometheus gpulab-hub >/dev/null || true; }
say "backing up the lab before anything changes ..."
if ! out=$($COMPOSE run --rm --no-deps --entrypoint gpulab-backup backup now --prometheus-stopped 2>&1); then
  echo "$out" | sed 's/^/[gpulab] /' >&2
  restart_old
  die "the backup before the upgrade failed (above): the old version runs again, unchanged"
fi
echo "$out" | grep -v '^Creating\|^Starting\|^Removing\|variable is not set' | sed 's/^/[gpulab] /'
snapshot=$(echo "$out" | sed -n 's/^backup \([0-9a-f]\{8,\}\):.*/\1/p' | tail -1)
printf 'before=%s\nsnapshot=%s\n' "$before" "$snapshot" >"$record"
way_back="the way back: make upgrade-back, then git checkout -m $before && make up BUILD_IMAGES=no (its images are kept as gpulab/*:previous, the lab as backup $snapshot)"

# 4. JupyterHub's own database migration (a copy of the file is kept beside it first).
say "migrating the hub's database (jupyterhub upgrade-db) ..."
if ! docker run --rm --network none -v gpulab-hub-data:/srv/jupyterhub -w /srv/jupyterhub \
     gpulab/hub:latest jupyterhub upgrade-db --db=sqlite:////srv/jupyterhub/jupyterhub.sqlite \
     2>&1 | sed 's/^/[gpulab]   /'; then
  die "the hub's database migration failed (above); nothing runs the new version yet. $way_back"
fi

# 5. The new version.
if ! make -s up BUILD_IMAGES=no; then
  die "$now did not start (above). $way_back"
fi
say "upgraded from $before to $now; $way_back"
