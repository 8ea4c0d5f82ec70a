"""Wire gpulab into a JupyterHub config object.

``hub/jupyterhub_config.py`` calls :func:`configure` and nothing else: every decision
is here or in the settings file, so the config file holds no logic.
"""

from __future__ import annotations

import os
from pathlib import Path

from .settings import load_settings

# Paths inside the hub container (docker-compose.yml mounts them).
CONFIG_DIR = Path(os.environ.get("GPULAB_CONFIG_DIR", "/srv/gpulab/config"))
SECRETS_DIR = Path(os.environ.get("GPULAB_SECRETS_DIR", "/srv/gpulab/secrets"))
DATA_DIR = Path(os.environ.get("GPULAB_DATA_DIR", "/srv/jupyterhub"))

# The service that `gpulab` commands and the test suite use to manage users and tokens.
ADMIN_SERVICE = "gpulab-admin"
ADMIN_SERVICE_SCOPES = [
    "admin:users",
    "admin:servers",
    "tokens",
    "list:users",
    "read:hub",
    "read:metrics",
]


def read_secret(name: str) -> str:
    path = SECRETS_DIR / name
    try:
        value = path.read_text().strip()
    except FileNotFoundError:
        raise SystemExit(
            f"gpulab: secret {path} is missing. `make up` creates it; "
            f"or write a random value there: python3 -c 'import secrets; print(secrets.token_hex(32))'"
        ) from None
    if len(value) < 32:
        raise SystemExit(f"gpulab: secret {path} is too short (at least 32 characters)")
    return value


def configure(c) -> None:
    settings_file = CONFIG_DIR / "gpulab.yaml"
    settings = load_settings(settings_file)  # refuse to start on a bad file, with file:line

    # The hub and proxy listen inside the hub container; compose publishes the proxy.
    c.JupyterHub.bind_url = "http://:8000"
    c.JupyterHub.hub_ip = "0.0.0.0"
    c.JupyterHub.hub_connect_ip = os.environ.get("GPULAB_HUB_HOSTNAME", "gpulab-hub")
    c.JupyterHub.db_url = f"sqlite:///{DATA_DIR}/jupyterhub.sqlite"
    c.JupyterHub.cookie_secret_file = str(DATA_DIR / "jupyterhub_cookie_secret")
    c.JupyterHub.cleanup_servers = False  # servers keep running across hub restarts

    c.JupyterHub.authenticator_class = "gpulab-token"
    c.Authenticator.admin_users = set(settings["hub.admins"])

    c.JupyterHub.spawner_class = "gpulab"
    c.GpulabSpawner.settings_file = str(settings_file)
    c.GpulabSpawner.remove = True  # each spawn gets current settings; home persists
    c.GpulabSpawner.pull_policy = "never"  # images are built locally; no registry
    c.GpulabSpawner.start_timeout = settings["spawn.start_timeout"]
    c.GpulabSpawner.http_timeout = 60

    c.JupyterHub.services = [
        {"name": ADMIN_SERVICE, "api_token": read_secret("api-token")},
    ]
    c.JupyterHub.load_roles = [
        {
            "name": ADMIN_SERVICE,
            "description": "gpulab's own CLI: manage users, servers and login tokens",
            "scopes": ADMIN_SERVICE_SCOPES,
            "services": [ADMIN_SERVICE],
        },
    ]
