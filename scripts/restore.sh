#!/usr/bin/env bash
# make restore: put a gpulab backup back (gpulab.backup.restore), the lab stopped.
#   scripts/restore.sh SNAPSHOT [CONFIRM] [stack]
#                                           SNAPSHOT: latest or an ID; CONFIRM=yes replaces
#                                           volumes that hold data; stack: only the stack's
#                                           own state, not members' homes, the datasets or
#                                           Prometheus' history (make upgrade-back)
#   scripts/restore.sh --list               the repository's backups
# The repository: GPULAB_BACKUP_DIR (/var/backups/gpulab); its password:
# GPULAB_BACKUP_PASSWORD_FILE (secrets/backup-password of the lab that was backed up).
# Restores the volumes (homes, the hub's data, Prometheus' history, ...), config/ and
# secrets/ of this checkout, in a one-off container of the hub image.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "[gpulab] $*"; }
die() { echo "[gpulab] $*" >&2; exit 1; }

repo=${GPULAB_BACKUP_DIR:-/var/backups/gpulab}
password=${GPULAB_BACKUP_PASSWORD_FILE:-secrets/backup-password}
config=${GPULAB_CONFIG:-$PWD/config}
[ -f "$repo/config" ] || die "no backup repository in $repo (GPULAB_BACKUP_DIR): copy the lab's there first"
[ -s "$password" ] || die "$password is missing: put the lab's secrets/backup-password there (or set GPULAB_BACKUP_PASSWORD_FILE); no backup can be read without it"
image=${GPULAB_HUB_IMAGE:-gpulab/hub:latest}  # make upgrade-back: the newer version's tools
docker image inspect "$image" >/dev/null 2>&1 || die "$image is not on this Docker engine: make images"
volumes_dir="$(docker info --format '{{.DockerRootDir}}')/volumes"
install -d -m 700 secrets

# Root with what restic needs to give files back their owners, modes and times.
in_hub_image() {
  docker run --rm --network none --user 0:0 --cap-drop ALL \
    --cap-add CHOWN --cap-add DAC_OVERRIDE --cap-add FOWNER --security-opt no-new-privileges \
    -e RESTIC_REPOSITORY=/backup -e RESTIC_PASSWORD_FILE=/run/backup-password \
    -e RESTIC_CACHE_DIR=/tmp/restic-cache \
    -v "$repo:/backup" -v "$(realpath "$password"):/run/backup-password:ro" \
    -v "$volumes_dir:/volumes" -v "$config:/srv/gpulab/config" -v "$PWD/secrets:/srv/gpulab/secrets" \
    --entrypoint gpulab-backup "$image" "$@"
}

if [ "${1:-}" = --list ]; then in_hub_image list; exit; fi
snapshot=${1:-latest}
confirm=${2:-}

running=$(docker ps -q --filter label=com.docker.compose.project=gpulab; docker ps -q --filter label=org.gpulab.managed=true)
[ -z "$running" ] || die "the lab is running: make down first (a restore replaces its data)"

volumes=$(in_hub_image volumes --snapshot "$snapshot")
for volume in $volumes gpulab-restore-scratch; do docker volume create "$volume" >/dev/null; done
replace=()
if [ "$confirm" = yes ]; then replace=(--replace); fi
if [ "${3:-}" = stack ]; then replace+=(--stack-only); fi
status=0
in_hub_image restore --snapshot "$snapshot" "${replace[@]}" | sed 's/^/[gpulab] /' || status=$?
docker volume rm gpulab-restore-scratch >/dev/null || true
[ "$status" = 0 ] || exit "$status"
say "restored; make up starts the lab on it"
