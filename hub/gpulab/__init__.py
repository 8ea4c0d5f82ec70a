"""gpulab: a multi-user GPU JupyterHub for a lab's own servers.

Its parts (docs/architecture.md is the map; each part's __init__ lists its modules):
    gpus/        which GPUs there are, who may have which, who holds which now
    spawn/       a member's server: GpulabSpawner and GpulabSwarmSpawner
    login/       token login, login tokens, the throttle, roles, HTTPS certificates
    dockerapi/   gpulab-docker-proxy: what the hub may ask of Docker
    dashboard/   the GPU dashboard and the admins' pages (a hub service)
    culler/      the GPU culler (a hub service)
    ssh/         gpulab-ssh: SSH into one's own running server
and beside them: contract.py (what the processes agree on), settings.py and
live_config.py (config/gpulab.yaml), hubapi.py (the hub's REST API), notices.py,
compat.py (upstream private names), hubconfig.py (the hub's wiring), cli.py (`gpulab`).
"""

__version__ = "0.1.0"
