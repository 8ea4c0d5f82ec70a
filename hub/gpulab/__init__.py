"""gpulab: a multi-user GPU JupyterHub for a lab's own servers.

Its parts (docs/architecture.md is the map; each part's __init__ lists its modules):
    gpus/        which GPUs there are, who may have which, who holds which now
    spawn/       a member's server: GpulabSpawner and GpulabSwarmSpawner
    line/        members waiting for GPUs, served in turn (a hub service and its API)
    bookings/    GPUs booked for a time window (decisions, store, API, pages)
    login/       sign-in (tokens, LDAP, OpenID Connect), the throttle, roles, HTTPS
                 certificates, SSH keys, the log's scrubbing
    dockerapi/   gpulab-docker-proxy: what the hub may ask of Docker
    dashboard/   the GPU dashboard and the admins' pages (a hub service)
    culler/      the GPU culler (a hub service)
    ssh/         gpulab-ssh: SSH into one's own running server
    assistant/   the lab assistant: one language model behind the hub's door
    backup/      restic backups made while the lab runs, and restores
and beside them, used by several parts: contract.py (what the processes agree on),
settings.py, live_config.py and yamlfile.py (config/gpulab.yaml, read again at each use,
errors with file:line), sizes.py (CPUs and memory as the config files write them, and
their checks), environments.py (the images members choose from), hubapi.py and
prometheus_api.py (the hub's and Prometheus' APIs), service_loop.py (how hub services
run), private_db.py (gpulab's sqlite files beside the hub's), notices.py (what a member is
told), refusal.py (a request not done: its status and message), shares.py (a server
shared with a colleague: the sharing page, and shares ended with their server or member),
gpu_hours.py
(GPU-hours from Prometheus), mail.py and email_address.py (e-mail to
members), netguard.py (gpulab-netguard: the users' network closed), upgrade.py
(`make upgrade`'s config changes), compat.py (upstream private names), hubconfig.py (the
hub's wiring), cli.py (`gpulab`).
"""

__version__ = "0.1.0"
