# Baseline for bench/spawn.py: a stock DockerSpawner hub on the same image (its own network),
# configured the way DockerSpawner's documentation shows, with none of gpulab's code.
import os

c = get_config()  # noqa: F821
c.JupyterHub.bind_url = "http://:8000"
c.JupyterHub.hub_ip = "0.0.0.0"
c.JupyterHub.hub_connect_ip = "gpulab-bench-vanilla"
c.JupyterHub.db_url = "sqlite:////tmp/vanilla.sqlite"
c.JupyterHub.authenticator_class = "null"
c.JupyterHub.spawner_class = "dockerspawner.DockerSpawner"
c.DockerSpawner.image = "gpulab/singleuser:latest"
c.DockerSpawner.network_name = "gpulab-bench"
c.DockerSpawner.remove = True
c.DockerSpawner.pull_policy = "never"
c.DockerSpawner.prefix = "bench-vanilla"
c.JupyterHub.services = [{"name": "bench", "api_token": os.environ["BENCH_API_TOKEN"]}]
c.JupyterHub.load_roles = [
    {"name": "bench", "scopes": ["admin:users", "admin:servers", "tokens"], "services": ["bench"]}
]
