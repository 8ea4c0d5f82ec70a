"""GpulabSpawner: DockerSpawner with gpulab's settings, names, progress and a fast ready check.

Only what gpulab needs is changed; the Docker work itself stays DockerSpawner's:

* Before each start, ``config/gpulab.yaml`` is read again (an admin's edit takes effect
  at the next spawn; an invalid edit is logged and the last good settings stay in
  force) and :func:`gpulab.containers.container_options` decides image, volumes,
  limits, hardening and GPUs.
* Container names come from :mod:`gpulab.naming` (collision-free for any username).
* ``progress()`` reports each step to the spawn page's progress bar.
* ``start()`` returns only once the server answers HTTP, polling every 0.1 s, so the
  hub's own readiness check (exponential backoff up to 5 s) passes at its first try,
  and a container that exits while starting fails the spawn at once, with the end
  of its log in the message, instead of after the start timeout.
"""

from __future__ import annotations

import asyncio
import time

from dockerspawner import DockerSpawner
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Dict, Float, List, Unicode, default

from .containers import container_options
from .naming import container_name
from .settings import ConfigError, Settings, load_settings

_last_good: dict[str, Settings] = {}


def current_settings(path: str, log) -> Settings:
    """The settings file as it is now, or the last good one if the file became invalid."""
    try:
        settings = load_settings(path)
    except ConfigError as e:
        if path not in _last_good:
            raise
        log.error("Ignoring invalid settings, keeping the last good ones: %s", e)
        return _last_good[path]
    _last_good[path] = settings
    return settings


class SpawnFailed(Exception):
    """A start that cannot succeed, with a message meant for the user.

    JupyterHub shows the message of an exception raised from ``start()`` on the spawn
    page; ``jupyterhub_message`` is what its templates display.
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.jupyterhub_message = message


class GpulabSpawner(DockerSpawner):
    settings_file = Unicode(
        "/srv/gpulab/config/gpulab.yaml",
        config=True,
        help="""Path of gpulab's settings file (see config/gpulab.yaml), read again at
        every spawn. Example: c.GpulabSpawner.settings_file = "/etc/gpulab/gpulab.yaml"
        """,
    )
    ready_poll_interval = Float(
        0.1,
        config=True,
        help="""Seconds between readiness checks of a starting server (default 0.1).""",
    )

    # Per-instance state (traits, so that no two spawners share a list or dict).
    _progress_events = List()
    _gpulab_env = Dict()

    @default("prefix")
    def _default_prefix(self):
        return "gpulab"

    @default("object_name")
    def _object_name_default(self):
        # DockerSpawner re-renders the name through this method when the image changes.
        return container_name(self.prefix, self.user.name, self.name)

    # ------------------------------------------------------------- progress

    def _report(self, progress: int, message: str) -> None:
        self.log.info("%s: %s", self._log_name, message)
        self._progress_events.append({"progress": progress, "message": message})

    async def progress(self):
        sent = 0
        while True:
            while sent < len(self._progress_events):
                yield self._progress_events[sent]
                sent += 1
            if self._spawn_future is not None and self._spawn_future.done():
                return
            await asyncio.sleep(0.1)

    # ------------------------------------------------------------- start

    def apply_settings(self, settings: Settings, gpu_uuids=()) -> None:
        """Copy gpulab's decisions onto DockerSpawner's traits."""
        opts = container_options(settings, self.user.name, self.name, gpu_uuids)
        self.image = opts.image
        self.volumes = opts.volumes
        self.extra_host_config = opts.host_config
        self.extra_create_kwargs = opts.create_kwargs
        self.mem_limit = opts.mem_limit
        self.cpu_limit = opts.cpu_limit
        self.network_name = settings["spawn.network"]
        self._gpulab_env = opts.environment

    def get_env(self):
        env = super().get_env()
        env.update(self._gpulab_env)
        return env

    async def start(self):
        self._progress_events = []
        self._report(5, "Reading the lab's settings")
        settings = current_settings(self.settings_file, self.log)
        self.apply_settings(settings)
        deadline = time.monotonic() + self.start_timeout

        self._report(20, f"Creating your container from {self.image}")
        ip, port = await super().start()
        self._report(60, "Container started; waiting for JupyterLab to answer")
        await self._wait_until_ready(ip, port, deadline)
        self._report(95, "Your server is ready")
        return ip, port

    async def _wait_until_ready(self, ip: str, port: int, deadline: float) -> None:
        url = f"http://{ip}:{port}{self.server.base_url}api"
        client = AsyncHTTPClient()
        while True:
            try:
                await client.fetch(HTTPRequest(url, request_timeout=2, follow_redirects=False))
                return
            except HTTPClientError as e:
                if e.code != 599:  # any HTTP answer means the server is listening
                    return
            except OSError:
                pass  # connection refused: not listening yet
            status = await self.poll()
            if status is not None:
                raise SpawnFailed(
                    f"Your server exited while starting (exit status {status}). "
                    f"Last lines of its log:\n{await self._log_tail()}"
                )
            if time.monotonic() > deadline:
                return  # the hub's own start_timeout handling takes over
            await asyncio.sleep(self.ready_poll_interval)

    async def _log_tail(self, lines: int = 20) -> str:
        try:
            out = await self.docker("logs", self.container_id, tail=lines)
        except Exception as e:  # the container may already be gone
            return f"(log unavailable: {e})"
        return out.decode("utf-8", "replace").strip()
