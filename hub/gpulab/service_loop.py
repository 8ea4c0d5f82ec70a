"""How gpulab's hub services (the GPU culler, the line) run until JupyterHub stops them."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable

from gpulab.hubapi import HubApi


def hub_api_from_environment(prog: str) -> HubApi:
    """Log as gpulab's services do, and the hub's API with the URL and token JupyterHub
    passes to the services it starts; *prog* names the service if they are missing."""
    logging.basicConfig(level=logging.INFO,
                        format="[%(levelname).1s %(asctime)s %(name)s] %(message)s")
    try:
        return HubApi(os.environ["JUPYTERHUB_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"])
    except KeyError as e:
        raise SystemExit(f"{prog}: {e.args[0]} is not set: JupyterHub sets it for the "
                         f"services it starts (hub config: services)") from None


async def run_until_stopped(run: Callable[[], Awaitable[None]], name: str) -> None:
    """Run *run()* until SIGINT (how JupyterHub stops the services it started) or
    SIGTERM, and stop quietly then: no traceback in the hub's log. The handlers are set
    here, not left to Python's default, which a process started in the background by a
    shell without job control does not get (SIGINT ignored)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await run()
    except asyncio.CancelledError:
        logging.getLogger("gpulab").info("%s: stopping", name)
