#!/usr/bin/env bash
# Before `make up` (single) or `make up-swarm` (swarm): are the lab's settings valid (or is
# there a last good version the lab goes on with), is config/gpulab.yaml's hub.swarm what
# this command starts, do the network's addresses fit together, and, for a Swarm, is this
# engine its manager and which machines and GPUs will the hub see. Prints what an admin
# must do, never a traceback.
# Usage: scripts/preflight.sh single|swarm   (GPULAB_CONFIG: the config folder)
set -euo pipefail
mode=${1:?single or swarm}
config=${GPULAB_CONFIG:-$(cd "$(dirname "$0")/.." && pwd)/config}
say() { echo "[gpulab] $*"; }
die() { echo "[gpulab] $*" >&2; exit 1; }

# shellcheck source=scripts/hub-cli.sh
source "$(dirname "$0")/hub-cli.sh"

# An invalid file with a last good version: the lab goes on with that version (say so);
# without one (a fresh install): refuse, as the hub would.
files=(/srv/gpulab/config/gpulab.yaml)
[ -e "$config/gpus.yaml" ] && files+=(/srv/gpulab/config/gpus.yaml)
checked=$(gpulab config check "${last_good[@]}" "${files[@]}") \
  || die "$checked
[gpulab] The lab's settings are not valid (above), and no earlier version of them was ever
[gpulab] in force here: fix the file (make check-config), then run make up again."
grep -v ': OK$' <<<"$checked" | sed 's/^/[gpulab] /' || true

# Alertmanager reads config/alertmanager.yml at its start, and starts on the last good
# version it kept (in its volume) when the file is not valid (docker-compose.yml).
alertmanager=$(docker run --rm --network none -v "$config:/srv/gpulab/config:ro" --entrypoint amtool \
  gpulab/prometheus:latest check-config /srv/gpulab/config/alertmanager.yml 2>&1 \
  | sed 's|/srv/gpulab/config/|config/|g') || {
  if docker volume inspect gpulab-alertmanager-data >/dev/null 2>&1 && docker run --rm --network none \
       -v gpulab-alertmanager-data:/alertmanager:ro --entrypoint test gpulab/prometheus:latest \
       -s /alertmanager/last-good.yml; then
    echo "$alertmanager" | sed 's/^/[gpulab] /'
    say "warning: config/alertmanager.yml is not valid (above): this edit is refused, and"
    say "Alertmanager goes on with its last good version until the file is fixed."
  else
    die "$alertmanager
[gpulab] config/alertmanager.yml is not valid (above): fix it, then run make up again."
  fi
}

swarm=$(gpulab config get "${last_good[@]}" hub.swarm /srv/gpulab/config/gpulab.yaml) || die "$swarm"
if [ "$mode" = single ]; then
  [ "$swarm" = false ] || die "config/gpulab.yaml sets hub.swarm: true: on the Swarm's manager, \
start gpulab with make up-swarm (docs/swarm.md); on one host, set it to false."
else
  [ "$swarm" = true ] || die "make up-swarm runs gpulab across a Swarm's machines: set hub.swarm: true \
in config/gpulab.yaml first (docs/swarm.md); on one host, use make up."
fi

# spawn.home_size and spawn.project_size: Docker's local driver gives a volume a size only
# where its volumes folder is on XFS mounted with project quotas, and says so when a volume
# is created. Try it once here rather than let every new member's first spawn fail.
for sized in home_size:homes project_size:"project folders"; do
  setting=spawn.${sized%%:*} what=${sized#*:}
  size=$(gpulab config get "${last_good[@]}" "$setting" /srv/gpulab/config/gpulab.yaml) \
    || die "$size"
  [ "$size" != 0 ] || continue
  probe=gpulab-size-probe
  made=$(docker volume create --opt size="$size" "$probe" 2>&1) \
    || die "config/gpulab.yaml sets $setting, and this Docker engine cannot give a volume a \
size: $made. Put Docker's volumes folder ($(docker info --format '{{.DockerRootDir}}')/volumes) on \
XFS mounted with pquota, or remove $setting (docs/backups-and-upgrades.md, Home sizes)."
  docker volume rm "$probe" >/dev/null
  say "new $what hold at most $size bytes ($setting)"
done

# Containers that Docker says have exited while containerd still runs them (dockerd lost
# track of them as it restarted): they could not start again.
"$(dirname "$0")/lost-tasks.sh"

# The hub's and the proxy's fixed addresses: in the subnet, outside the range Docker (or the
# Swarm) hands out to members' servers (else a member's server could be given one of them,
# and gpulab-netguard trusts those two; a container asking for a taken address fails).
subnet=${GPULAB_SUBNET:-172.30.0.0/24}; range=${GPULAB_IP_RANGE:-172.30.0.0/25}
addresses=$(python3 - "$subnet" "$range" \
  "${GPULAB_HUB_IP:-172.30.0.250}" "${GPULAB_PROXY_IP:-172.30.0.251}" 2>&1 <<'EOF'
import ipaddress, sys
try:
    net, pool = ipaddress.ip_network(sys.argv[1]), ipaddress.ip_network(sys.argv[2])
    hub, proxy = ipaddress.ip_address(sys.argv[3]), ipaddress.ip_address(sys.argv[4])
except ValueError as e:
    sys.exit(str(e))
if not pool.subnet_of(net):
    sys.exit(f"GPULAB_IP_RANGE {pool} is not inside GPULAB_SUBNET {net}")
for name, ip in (("GPULAB_HUB_IP", hub), ("GPULAB_PROXY_IP", proxy)):
    if ip not in net or ip in pool:
        sys.exit(f"{name} {ip} must be in GPULAB_SUBNET {net} and outside "
                 f"GPULAB_IP_RANGE {pool}, which members' servers are given")
EOF
) || die "$addresses"

# A users' network made by an older gpulab (no range, the hub at .2): Docker could give a
# member's server the hub's or the proxy's address. Only a new network fixes that.
ipam=$(docker network inspect -f '{{range .IPAM.Config}}{{.Subnet}} {{.IPRange}}{{end}}' gpulab 2>/dev/null || true)
if [ -n "$ipam" ] && [ "$ipam" != "$subnet $range" ]; then
  die "the users' network gpulab has subnet and range '$ipam', not '$subnet $range': it was \
made by an older gpulab or with other settings, and members' servers could be given the hub's \
address. Run make down, then make up again (members' servers stop; their files are kept)."
fi
# On a host with NVIDIA GPUs: can Docker give a container one, and is the driver new
# enough for spawn.image's CUDA (scripts/gpu-preflight.sh says what to install)?
if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  image=$(gpulab config get "${last_good[@]}" spawn.image /srv/gpulab/config/gpulab.yaml) || die "$image"
  "$(dirname "$0")/gpu-preflight.sh" "$image"
fi
[ "$mode" = single ] && exit 0

[ "$(docker info --format '{{.Swarm.ControlAvailable}}' 2>/dev/null)" = true ] \
  || die "this Docker engine is not a Swarm manager: run 'docker swarm init' on this machine and \
'docker swarm join ...' on each GPU server first (docs/swarm.md)."

driver=$(docker network inspect -f '{{.Driver}}' gpulab 2>/dev/null || true)
if [ -n "$driver" ] && [ "$driver" != overlay ]; then
  die "the network gpulab is a $driver network from a single-host 'make up': run 'make down' \
and 'docker network rm gpulab', then make up-swarm again."
fi

say "machines in this Swarm (the hub places members' servers on those with GPUs):"
gpus_total=0
while read -r id; do
  line=$(docker node inspect -f '{{.Description.Hostname}}|{{.Status.State}}|{{.Spec.Availability}}|{{index .Description.Engine.Labels "gpulab.gpus"}}|{{index .Spec.Labels "gpulab.exporter"}}' "$id")
  IFS='|' read -r host state availability gpus exporter <<<"$line"
  count=0
  [ -n "$gpus" ] && count=$(tr ',' '\n' <<<"$gpus" | grep -c .)
  gpus_total=$((gpus_total + count))
  printf '[gpulab]   %-24s %-6s %-7s %s GPU(s)\n' "$host" "$state" "$availability" "$count"
  # Prometheus scrapes an exporter on every machine not labelled gpulab.exporter=false:
  # a machine without GPUs runs none (make swarm-node is for GPU servers).
  if [ "$count" = 0 ] && [ -z "$exporter" ]; then
    docker node update --label-add gpulab.exporter=false "$id" >/dev/null
    say "  (no GPUs: labelled gpulab.exporter=false, so Prometheus does not expect an exporter there)"
  fi
done < <(docker node ls -q)
if [ "$gpus_total" = 0 ]; then
  say "warning: no machine lists GPUs. On each GPU server, add its GPU UUIDs to the engine's"
  say "labels in /etc/docker/daemon.json and restart Docker (docs/swarm.md)."
fi
# Members' services name spawn.image by the ID it has here (a name would make every machine
# ask a registry first), so each GPU server needs this very build.
image=$(gpulab config get "${last_good[@]}" spawn.image /srv/gpulab/config/gpulab.yaml) || die "$image"
if id=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null); then
  say "spawn.image $image is ${id:0:19} here; each GPU server needs this very build (the hub"
  say "runs it by that ID), and for its exporter (make swarm-node there) gpulab/exporter and"
  say "gpulab/hub: docker save $image gpulab/hub:latest gpulab/exporter:latest | ssh GPU-SERVER docker load"
else
  say "warning: spawn.image $image is not on this manager, and the hub runs it by the ID it"
  say "has here: members' servers cannot start until it is (build it: make images, or load it)."
fi
