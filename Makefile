# gpulab: `make up` brings the lab hub up, `make test` runs the test suite.
# Both work on a fresh Debian/Ubuntu host as root with no Docker and no registry.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# Does this host have NVIDIA GPUs (driver and nvidia-smi installed)?
HAS_NVIDIA := $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo yes)
# Does it have NVIDIA hardware or a loaded NVIDIA driver, even where nvidia-smi fails (a
# driver upgraded but not yet loaded, a library mismatch)? Then it is not a host without
# GPUs by design, and NVML failing there must alert.
NVIDIA_HOST := $(shell { [ -e /proc/driver/nvidia ] || ls /dev/nvidia[0-9]* \
  || lspci -d 10de: | grep -qiE 'vga|3d|display'; } >/dev/null 2>&1 && echo yes)
# cpu | cuda: which PyTorch build the single-user image gets (auto: cuda on NVIDIA hosts).
TORCH_VARIANT ?= $(if $(HAS_NVIDIA),cuda,cpu)
# Debian bookworm image every Dockerfile starts FROM. The default is built locally with
# debootstrap; where a registry is reachable, BASE_IMAGE=debian:bookworm-slim works too.
BASE_IMAGE ?= gpulab/base:bookworm
# A PEM bundle of extra CA certificates (TLS-inspecting networks), copied into images.
EXTRA_CA_BUNDLE ?=
# Extra pip arguments for the wheelhouse downloads (e.g. an index URL for CPU torch).
PIP_ARGS ?=
PYTHON ?= python3
comma := ,
# Where the hub answers: the published address, or loopback when it listens everywhere.
HUB_HOST := $(if $(filter-out 0.0.0.0 127.0.0.1,$(GPULAB_BIND_ADDRESS)),$(GPULAB_BIND_ADDRESS),127.0.0.1)
# HTTPS: `make up GPULAB_HOSTNAME=gpu.lab.example` serves https://gpu.lab.example/ on
# GPULAB_PORT (443) and redirects plain HTTP (GPULAB_HTTP_PORT, 80) to it, with the lab's
# certificate (GPULAB_TLS_CERT and GPULAB_TLS_KEY, PEM) or a local CA's (secrets/tls/).
GPULAB_HOSTNAME ?=
# GPULAB_TLS_REPLACE_CA=yes: replace a local CA that cannot stay (one without name
# constraints, made by an earlier gpulab); members must import the new secrets/tls/ca.crt.
GPULAB_TLS_REPLACE_CA ?=
# With a host name each member's server has an origin of its own, NAME.GPULAB_HOSTNAME
# (wildcard DNS and certificate needed); GPULAB_SUBDOMAINS=no keeps them under the hub's.
GPULAB_SUBDOMAINS ?= yes
export GPULAB_SUBDOMAINS
ifneq ($(GPULAB_HOSTNAME),)
export GPULAB_HOSTNAME
export GPULAB_PORT ?= 443
HUB_URL ?= https://$(GPULAB_HOSTNAME):$(GPULAB_PORT)
# The readiness check reaches the published port whatever the lab's DNS says, and
# verifies the certificate (with the local CA, or the host's trust store for the lab's).
WAIT_CURL_ARGS = --resolve $(GPULAB_HOSTNAME):$(GPULAB_PORT):$(HUB_HOST) \
  $(if $(GPULAB_TLS_CERT),,--cacert secrets/tls/ca.crt)
endif
HUB_URL ?= http://$(HUB_HOST):$(or $(GPULAB_PORT),8000)
# The SSH gateway (gpulab-ssh) listens on GPULAB_BIND_ADDRESS too. Members are told the
# hub's URL when their server is not running, unless it is only a loopback stand-in for
# an address bound everywhere.
SSH_PORT := $(or $(GPULAB_SSH_PORT),2222)
SSH_HOST := $(or $(GPULAB_HOSTNAME),$(HUB_HOST))
SSH_PUBLIC_URL := $(if $(filter 0.0.0.0,$(GPULAB_BIND_ADDRESS)),$(if $(GPULAB_HOSTNAME),$(HUB_URL)),$(HUB_URL))

# The settings folder the stack mounts (config/ of this checkout unless told otherwise).
GPULAB_CONFIG ?= $(CURDIR)/config
# An absolute path: `docker run -v` takes a relative one for a volume's name.
export GPULAB_CONFIG := $(abspath $(GPULAB_CONFIG))
# GPULAB_DEMO=1: a demo on a host WITHOUT GPUs, clearly labelled: two simulated GPUs
# (the exporter's --fake-gpus, the hub finds the same two) and the stand-in GPU runtime
# (tests/gpu_standin: dockerd then starts containers that ask for GPUs; nothing is
# injected), so that a newcomer sees leases, the spawn form, the dashboard and the
# history. Without it, a host without GPUs runs its exporter with --no-gpus: no
# critical "NVML down" alert for GPUs it never had.
export GPULAB_DEMO ?=
export GPULAB_EXPORTER_FLAGS ?= $(if $(filter 1,$(GPULAB_DEMO)),--fake-gpus 2,$(if $(or $(HAS_NVIDIA),$(NVIDIA_HOST)),,--no-gpus))
# Several GPU servers: `make up-swarm` on a Swarm's manager (SWARM=yes; docs/swarm.md).
SWARM ?=
# The users' network: members' servers get addresses from GPULAB_IP_RANGE only, and the
# hub and the proxy sit above it, where Docker (or a Swarm) never hands out an address.
# With another GPULAB_SUBNET, set the other three for it too (`make up` checks them).
export GPULAB_SUBNET ?= 172.30.0.0/24
export GPULAB_IP_RANGE ?= $(or $(GPULAB_SWARM_IP_RANGE),172.30.0.0/25)
export GPULAB_HUB_IP ?= 172.30.0.250
export GPULAB_PROXY_IP ?= 172.30.0.251
# One project name whatever the checkout's folder is called: container names are fixed.
export COMPOSE_PROJECT_NAME := gpulab
COMPOSE_BIN = $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
COMPOSE = $(COMPOSE_BIN) -f docker-compose.yml $(if $(HAS_NVIDIA),-f docker-compose.gpu.yml) \
  $(if $(GPULAB_HOSTNAME),-f docker-compose.https.yml) $(if $(SWARM),-f docker-compose.swarm.yml)
# The Docker socket (the manager's, on a Swarm) that the Docker API filters hold, and its
# group: they run as nobody in that group, not root.
export GPULAB_DOCKER_SOCKET ?= /var/run/docker.sock
export GPULAB_DOCKER_GID = $(shell stat -c %g $(GPULAB_DOCKER_SOCKET) 2>/dev/null || echo 0)
# Backups (gpulab.backup, docs/backups-and-upgrades.md#backups-and-restoring-one): a restic repository in
# GPULAB_BACKUP_DIR (a local path: a disk of its own, or a mounted NAS), encrypted with
# secrets/backup-password. The backup service reads this engine's volumes folder.
export GPULAB_BACKUP_DIR ?= /var/backups/gpulab
export GPULAB_DOCKER_VOLUMES = $(or $(shell docker info --format '{{.DockerRootDir}}' 2>/dev/null),/var/lib/docker)/volumes
# The lab assistant's models (gpulab.yaml assistant.model names a file here; gpulab
# downloads none), mounted read-only into the assistant's container.
export GPULAB_MODELS_DIR ?= /var/lib/gpulab/models
# BUILD_IMAGES=no: use the images already on this engine (built elsewhere and loaded).
BUILD_IMAGES ?= yes
VENV := .venv
GPULAB_SOURCES := pyproject.toml $(shell find hub/gpulab -name '*.py' -o -name '*.html' 2>/dev/null)

.PHONY: backup backups restore upgrade upgrade-back test-upgrade test-packages help up assistant up-swarm demo-host swarm-node swarm-node-up node-exporter down logs images docker secrets tls ssh-key test test-host test-unit test-idp lint venv check-config bench bench-scarcity lock cuda-image test-cuda-image

help:
	@echo "make up            install Docker if needed, build images, start the hub, print how to log in"
	@echo "make up GPULAB_DEMO=1  the same on a host without GPUs, with 2 simulated GPUs (a labelled demo)"
	@echo "make up-swarm      the same on a Docker Swarm's manager: members' servers on its GPU servers"
	@echo "make swarm-node    on each GPU server of that Swarm: gpulab-netguard and its GPU exporter"
	@echo "make down          stop the hub and every user server (volumes and users are kept)"
	@echo "make logs          follow the hub's log"
	@echo "make assistant     after editing assistant.gpus: hand the lab assistant its GPUs (only its container restarts)"
	@echo "make backup        back up the running lab now (restic, into GPULAB_BACKUP_DIR=$(GPULAB_BACKUP_DIR))"
	@echo "make backups       list the backups;  make restore [SNAPSHOT=id]: put one back, the lab stopped"
	@echo "make upgrade       after git pull --autostash: back up, migrate and start this version; make upgrade-back: the one before"
	@echo "make images        build the base, hub, singleuser (TORCH_VARIANT=$(TORCH_VARIANT)), exporter and prometheus images"
	@echo "make test-cuda-image  build the CUDA single-user image beside the CPU one and check it (no GPU needed)"
	@echo "make lock          after editing an image's requirements*.txt: resolve them again into its lock file"
	@echo "make test          run the whole test suite, on Docker engines and stacks of its own (this lab is left as it is)"
	@echo "make test-unit     only the tests that need no Docker"
	@echo "make lint          ruff over the Python code"
	@echo "make check-config  validate config/gpulab.yaml and config/gpus.yaml"
	@echo "make bench         spawn latency (gpulab vs vanilla DockerSpawner, phase by phase) and sign-in to JupyterLab in Chromium"
	@echo "make bench-scarcity  a simulated month of 30 members on 8 GPUs: retry on 409 vs the line (no stack needed)"

docker:
	@scripts/ensure-docker.sh

secrets:
	@install -d -m 700 secrets
	@for name in api-token metrics-token proxy-token exporter-token ssh-gateway-token backup-password crypt-key assistant-key; do \
	  if [ ! -s secrets/$$name ]; then \
	    (umask 077; $(PYTHON) -c 'import secrets; print(secrets.token_hex(32))' > secrets/$$name); \
	    echo "[gpulab] generated secrets/$$name"; fi; \
	done
	@# Prometheus, the proxy and the SSH gateway run as unprivileged users and must read
	@# their token (mounted file by file; the secrets/ folder itself stays 0700).
	@chmod 644 secrets/metrics-token secrets/proxy-token secrets/exporter-token \
	  secrets/ssh-gateway-token secrets/assistant-key

# The certificate HTTPS serves (gpulab.login.tls, run in the hub image): the lab's, checked and
# copied, or one signed by a local CA that is made once and kept in secrets/tls/.
tls: images secrets
	@install -d -m 755 secrets/tls
	@set -o pipefail; docker run --rm --network none -v "$(CURDIR)/secrets/tls:$(CURDIR)/secrets/tls" \
	  $(foreach f,$(GPULAB_TLS_CERT) $(GPULAB_TLS_KEY),-v "$(abspath $(f)):$(abspath $(f)):ro") \
	  gpulab/hub:latest gpulab tls --hostname "$(GPULAB_HOSTNAME)" --dir "$(CURDIR)/secrets/tls" \
	  $(if $(GPULAB_TLS_CERT),--cert "$(abspath $(GPULAB_TLS_CERT))") \
	  $(if $(GPULAB_TLS_KEY),--key "$(abspath $(GPULAB_TLS_KEY))") \
	  $(if $(GPULAB_TLS_REPLACE_CA),--replace-ca) \
	  $(if $(filter no false 0 off,$(GPULAB_SUBDOMAINS)),,--subdomains) | sed 's/^/[gpulab] /'

# The SSH gateway's host key (gpulab.ssh.hostkey): made once in secrets/ssh/, then kept,
# so that members' known_hosts stay valid; readable by the gateway's user (nobody) only.
# Made (or its owner and mode put right) in the hub image; a key that is already the
# gateway's and 0600, with its public half beside it, needs no container.
ssh-key: images secrets
	@install -d -m 755 secrets/ssh
	@key=secrets/ssh/ssh_host_ed25519_key; \
	 [ "$$(stat -c '%u:%g %a' $$key 2>/dev/null)" = "65534:65534 600" ] && [ -s $$key.pub ] \
	 || { set -o pipefail; docker run --rm --network none -v "$(CURDIR)/secrets/ssh:$(CURDIR)/secrets/ssh" \
	  gpulab/hub:latest gpulab-ssh keygen --dir "$(CURDIR)/secrets/ssh" --owner 65534:65534 \
	  | sed 's/^/[gpulab] /'; }

# Compose pulls a service's image from Docker Hub when this engine lacks it, and gpulab/*
# there is anyone's to push: every image is checked here first, never pulled.
require_images = for image in $(1); do docker image inspect $$image >/dev/null 2>&1 || { \
	  echo "[gpulab] $$image is not on this Docker engine: $(strip $(2))" >&2; exit 1; }; done

images: docker
ifeq ($(BUILD_IMAGES),no)
	@$(call require_images,gpulab/hub:latest gpulab/exporter:latest gpulab/prometheus:latest,\
	  BUILD_IMAGES=no; load it (docker save | docker load) or build it (make images))
else
	@scripts/build-images.sh "$(BASE_IMAGE)" "$(TORCH_VARIANT)" "$(EXTRA_CA_BUNDLE)" $(PIP_ARGS)
endif

# Each image's lock: every Python package it installs, dependencies included, pinned with
# its wheel's hash (scripts/lock.py). Builds install only what the locks list; run this after
# editing a requirements file (a build refuses a lock older than its requirements).
LOCKS = images/hub/requirements.lock:images/hub/requirements.txt \
  images/singleuser/requirements-cpu.lock:images/singleuser/requirements.txt,images/singleuser/requirements-cpu.txt \
  images/singleuser/requirements-cuda.lock:images/singleuser/requirements.txt,images/singleuser/requirements-cuda.txt \
  monitoring/exporter/requirements.lock:monitoring/exporter/requirements.txt
lock:
	@set -e; $(foreach l,$(LOCKS),$(PYTHON) scripts/lock.py $(subst $(comma), ,$(subst :, ,$(l))) -- $(PIP_ARGS);)

# The lab assistant's GPUs (gpulab.yaml's assistant.gpus, those no member's server holds
# now): sets $$gpus for the rest of the recipe's line, and says which; the Compose file
# that hands them to its container goes with them.
ASSISTANT_GPUS = gpus=$$(scripts/assistant-gpus.sh) || { echo "$$gpus" | sed "s/^/[gpulab] /" >&2; exit 1; }; \
  [ -z "$$gpus" ] || echo "[gpulab] the lab assistant holds GPU(s) $$gpus (assistant.gpus)"
ASSISTANT_GPU_FILE = -f docker-compose.assistant-gpu.yml

up: $(if $(filter 1,$(GPULAB_DEMO)),demo-host) images secrets ssh-key $(if $(GPULAB_HOSTNAME),tls)
	@scripts/preflight.sh $(if $(SWARM),swarm,single)
	@docker volume create gpulab-datasets >/dev/null
	@install -d -m 755 "$(GPULAB_MODELS_DIR)"
	@install -d -m 700 "$(GPULAB_BACKUP_DIR)"
	@echo "[gpulab] starting the hub ($(COMPOSE)) ..."
	@# Containers that read files only at start are labelled with the files' hashes, so
	@# that Compose recreates them when the files change: Prometheus (config and rules),
	@# Alertmanager, with HTTPS the proxy (a renewed certificate, another host name), and
	@# the hub for gpulab.yaml's login: section and the provider's client secret (the rest
	@# of gpulab.yaml it reads again at every spawn).
	@$(ASSISTANT_GPUS); \
	 GPULAB_ASSISTANT_GPUS=$$gpus \
	 GPULAB_PROMETHEUS_CONFIG=$$(cat monitoring/prometheus/*.yml | sha256sum | cut -c1-16) \
	 GPULAB_HUB_START_CONFIG=$$({ awk '/^[^ #]/ {keep = ($$1 == "login:")} keep' \
	   "$(GPULAB_CONFIG)/gpulab.yaml"; cat secrets/oidc-client-secret 2>/dev/null; } | sha256sum | cut -c1-16) \
	 GPULAB_ALERTMANAGER_CONFIG=$$(sha256sum "$(GPULAB_CONFIG)/alertmanager.yml" | cut -c1-16) \
	 $(if $(GPULAB_HOSTNAME),GPULAB_TLS_FINGERPRINT=$$(sha256sum secrets/tls/server.crt | cut -c1-16)) \
	 GPULAB_SSH_PUBLIC_URL=$(SSH_PUBLIC_URL) \
	  $(COMPOSE) $${gpus:+$(ASSISTANT_GPU_FILE)} up -d --remove-orphans
	@scripts/wait-for-hub.sh $(HUB_URL) $(WAIT_CURL_ARGS)
	@docker exec gpulab-netguard gpulab-netguard status | sed 's/^/[gpulab] /' || true
	@docker exec gpulab-hub gpulab bootstrap-admin --config /srv/gpulab/config/gpulab.yaml
	@# which version runs, for make upgrade's way back
	@git rev-parse --short HEAD > .gpulab-running 2>/dev/null || rm -f .gpulab-running
	@echo "[gpulab] JupyterHub is up at $(HUB_URL)/  (log in with the username and token above)"
	@echo "[gpulab] SSH into one's running server: ssh -p $(SSH_PORT) <member>@$(SSH_HOST), the login token as password (host key $$(docker exec gpulab-ssh gpulab-ssh fingerprint))"
	@[ "$(GPULAB_DEMO)" != 1 ] || echo "[gpulab] DEMO: 2 SIMULATED GPUs and the stand-in GPU runtime, not hardware (make up without GPULAB_DEMO=1 ends it)"

# The demo's host: no NVIDIA GPU (the demo would hide real ones), and gpulab's dockerd
# with the stand-in GPU runtime on its PATH.
demo-host: docker
	@[ "$(GPULAB_DEMO)" = 1 ] || { echo "[gpulab] GPULAB_DEMO=1 runs the demo; got GPULAB_DEMO=$(GPULAB_DEMO)" >&2; exit 1; }
	@[ -z "$(HAS_NVIDIA)$(NVIDIA_HOST)" ] || { echo "[gpulab] this host has NVIDIA GPUs: run make up without GPULAB_DEMO=1 and the lab uses them" >&2; exit 1; }
	@case " $(GPULAB_EXPORTER_FLAGS) " in *" --fake-gpus 2 "*) ;; *) echo "[gpulab] the demo's exporter needs --fake-gpus 2, and GPULAB_EXPORTER_FLAGS is set to '$(GPULAB_EXPORTER_FLAGS)': unset it" >&2; exit 1;; esac
	@[ -z "$(SWARM)" ] || { echo "[gpulab] the demo runs on one host (make up GPULAB_DEMO=1), not on a Swarm" >&2; exit 1; }
	@scripts/standin-gpus.sh

up-swarm:
	@$(MAKE) --no-print-directory up SWARM=yes

# On each GPU server of a Swarm: gpulab-netguard, which closes the users' overlay here, and
# the GPU exporter, for the manager's Prometheus (node-exporter: its earlier name).
swarm-node node-exporter:
	@$(MAKE) --no-print-directory swarm-node-up SWARM=yes

swarm-node-up: docker
	@$(call require_images,gpulab/hub:latest gpulab/exporter:latest,\
	  load it from the manager (docker save gpulab/hub:latest gpulab/exporter:latest | \
	  ssh THIS-MACHINE docker load); Compose would pull it from Docker Hub)
	@[ -s secrets/exporter-token ] || { echo "[gpulab] secrets/exporter-token is missing: copy \
	  it from the manager (scp MANAGER:$(CURDIR)/secrets/exporter-token secrets/; chmod 644 \
	  secrets/exporter-token); only the manager's Prometheus may read this machine's \
	  exporter" >&2; exit 1; }
	@$(if $(HAS_NVIDIA),scripts/gpu-preflight.sh)
	@$(COMPOSE_BIN) -f docker-compose.node.yml up -d --remove-orphans
	@echo "[gpulab] this machine's GPU exporter is up on $(or $(GPULAB_NODE_ADDRESS),every address):9445"
	@docker exec gpulab-netguard gpulab-netguard status | sed 's/^/[gpulab] /' || true

# After an edit of gpulab.yaml's assistant.gpus, on a running lab: the lab assistant's
# container gets its GPUs (the hub holds them for it within seconds of the edit anyway);
# nothing else restarts. `make up` does the same, with everything else it checks.
assistant: secrets
	@export GPULAB_SAY_REFUSED=1; $(ASSISTANT_GPUS); \
	 GPULAB_ASSISTANT_GPUS=$$gpus $(COMPOSE) $${gpus:+$(ASSISTANT_GPU_FILE)} up -d --no-deps assistant

# The hub stops first: its line service, seeing the GPUs of the servers removed here come
# free, would start waiting members' servers as the lab goes down, and they would come
# back after make up out of the line ("could not be started when it was your turn").
# Members' servers get a SIGTERM first (docker stop, 10 s), as when they stop one: her
# kernels shut down, and a job says it was stopped, before the container is removed.
down:
	@if docker info >/dev/null 2>&1; then \
	  docker stop gpulab-hub >/dev/null 2>&1 || true; \
	  ids=$$(docker ps -aq --filter label=org.gpulab.managed=true); \
	  if [ -n "$$ids" ]; then echo "[gpulab] stopping and removing user containers"; \
	    docker stop -t 10 $$ids >/dev/null 2>&1 || true; docker rm -f $$ids >/dev/null; fi; \
	  if [ "$$(docker info --format '{{.Swarm.ControlAvailable}}')" = true ]; then \
	    ids=$$(docker service ls -q --filter label=org.gpulab.managed=true); \
	    if [ -n "$$ids" ]; then echo "[gpulab] removing members' servers (Swarm services)"; \
	      docker service rm $$ids >/dev/null; fi; fi; \
	  $(COMPOSE) down --remove-orphans; \
	  docker rm -f gpulab-hub >/dev/null 2>&1 || true; \
	fi
	@# gpulab-netguard leaves its firewall rules in place when it stops (stopping must not
	@# open the users' network); they are removed here. On a Swarm, those inside the
	@# overlay's namespaces go with the namespaces.
	@if command -v iptables >/dev/null && iptables -S 2>/dev/null | grep -q gpulab-netguard; then \
	  iptables -S | grep 'comment gpulab-netguard' | sed 's/^-A /-D /' \
	    | while read -r rule; do iptables $$rule; done; \
	  echo "[gpulab] removed gpulab-netguard's firewall rules"; fi

logs:
	@$(COMPOSE) logs -f hub

# One backup now (the scheduled ones: gpulab.yaml backup.every), of the running lab.
backup:
	@[ "$$(docker inspect -f '{{.State.Running}}' gpulab-backup 2>/dev/null)" = true ] || { \
	  echo "[gpulab] gpulab-backup is not running: make up first (a backup is made of the running lab)" >&2; exit 1; }
	@set -o pipefail; docker exec gpulab-backup gpulab-backup now | sed 's/^/[gpulab] /'
	@echo "[gpulab] in $(GPULAB_BACKUP_DIR); keep a copy of secrets/backup-password away from this machine: no backup can be read without it"

# Put a backup back (SNAPSHOT=latest or an ID from `make backups`), the lab stopped; then
# `make up`. CONFIRM=yes replaces volumes that hold data.
restore: images
	@scripts/restore.sh "$(or $(SNAPSHOT),latest)" "$(CONFIRM)"

backups:
	@scripts/restore.sh --list

# After git pull --autostash: back up, migrate and start this version, keeping everything
# (docs/backups-and-upgrades.md#upgrading); upgrade-back: the version before, as it was.
upgrade:
	@COMPOSE="$(COMPOSE)" scripts/upgrade.sh

upgrade-back:
	@COMPOSE="$(COMPOSE)" scripts/upgrade.sh --back

check-config: venv
	@$(VENV)/bin/gpulab config check config/gpulab.yaml config/gpus.yaml

$(VENV)/.installed: pyproject.toml monitoring/exporter/pyproject.toml
	@echo "[gpulab] creating the test environment in $(VENV) ..."
	@$(PYTHON) -m venv $(VENV)
	@$(VENV)/bin/pip install --quiet --disable-pip-version-check \
	  -e '.[test]' -e monitoring/exporter 2> >(grep -v 'is ignored: it is neither' >&2)
	@touch $@

venv: $(VENV)/.installed

lint: venv
	$(VENV)/bin/ruff check hub tests bench monitoring images

test-unit: venv test-idp
	@PYTEST=$(VENV)/bin/pytest scripts/test-unit.sh

# The identity providers the single sign-on tests sign in through (tests/idp.py): npm's
# oidc-provider, pinned by tests/idp/package-lock.json, run with Node (Debian's nodejs where
# no node is installed), and Debian's OpenLDAP (slapd, ldap-utils; its own system
# directory is not configured: the tests run throwaway ones).
test-idp: tests/idp/node_modules/.installed
	@command -v slapd >/dev/null 2>&1 || [ -x /usr/sbin/slapd ] || { \
	  echo "[gpulab] installing OpenLDAP (slapd) for the directory sign-in tests ..."; \
	  echo "slapd slapd/no_configuration boolean true" | debconf-set-selections; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slapd ldap-utils >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	         --no-install-recommends slapd ldap-utils >/dev/null; }; }
tests/idp/node_modules/.installed: tests/idp/package.json tests/idp/package-lock.json
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { \
	  echo "[gpulab] installing Node.js for the test identity provider ..."; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm >/dev/null; }
	@npm ci --prefix tests/idp --no-audit --no-fund --loglevel=error >/dev/null
	@touch $@

# Unit tests first (a failure shows within a minute), then the integration tests
# (scripts/test.sh, scripts/test-integration.sh), each lane on a Docker engine and a stack
# of its own in a network namespace: this engine's own stack (the lab's), its config/,
# members' servers and leases are left as they are. On hosts without GPUs the tests'
# exporters run with two FAKE GPUs (logged and labelled as fake) so that the monitoring
# path is exercised end to end.
# The test stacks also run Prometheus at GPULAB_SCRAPE_SECONDS=2 (a lab's: 15) and the
# exporter's polls at 1 s, so that what waits on samples waits seconds, not minutes (the
# unit tests run with neither: they test a lab's values). Their backups go to
# repositories of their own.
TEST_STACK = GPULAB_EXPORTER_FLAGS="$(if $(HAS_NVIDIA),,--fake-gpus 2) --interval 1 --process-interval 2" \
  GPULAB_SCRAPE_SECONDS=2 GPULAB_BACKUP_DIR=$(CURDIR)/.test-backups \
  GPULAB_MODELS_DIR=$(CURDIR)/.test-models
test: venv lint test-idp test-packages images
	@$(TEST_STACK) scripts/test.sh

# The CUDA single-user image, built and checked on any host, GPU or not (tests/cuda): its
# torch is a CUDA build matching NVIDIA's runtime wheels, cuDNN, cuBLAS and NCCL load, and
# without a GPU it says why and computes on the CPU. Built beside the stack's image (its
# :latest stays); about 4 minutes and 8 GB of disk (wheels and image) on a fresh host.
cuda-image: docker
	@IMAGES=singleuser TAG_LATEST=no scripts/build-images.sh "$(BASE_IMAGE)" cuda "$(EXTRA_CA_BUNDLE)" $(PIP_ARGS)
test-cuda-image: venv cuda-image
	@$(VENV)/bin/pytest -q -p no:cacheprovider tests/cuda

# make upgrade from an older gpulab (GPULAB_UPGRADE_FROM, a commit) to this checkout's
# HEAD, in a clone on this engine; it takes the engine's stack (make up brings it back).
test-upgrade: venv docker
	@GPULAB_TEST_TAKES_THE_STACK=yes $(VENV)/bin/pytest -q -p no:cacheprovider tests/upgrade

# Chromium and promtool for the tests; on hosts without a GPU, a dockerd with the stand-in
# nvidia hook (restarted if gpulab started it without; see scripts/test-host.sh), for
# running tests or benchmarks against this engine's own stack.
test-host: docker
	@scripts/test-host.sh
# What make test needs on this host, this engine left as it is (its lanes' engines get
# the stand-in hook themselves).
test-packages: docker
	@scripts/test-host.sh --packages-only

# Spawn latency (gpulab vs stock DockerSpawner), then what a member feels in Chromium.
bench: venv test-host up
	$(VENV)/bin/python -m bench.spawn
	$(VENV)/bin/python -m bench.member

# The line against retry-on-409, a month in simulated time (gpulab's own allocator and line).
bench-scarcity: venv
	$(VENV)/bin/python -m bench.scarcity
