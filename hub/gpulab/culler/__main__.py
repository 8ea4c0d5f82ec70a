"""``python -m gpulab.culler``: the GPU culler service (JupyterHub starts it; see
:mod:`gpulab.culler`). JupyterHub passes JUPYTERHUB_API_URL and JUPYTERHUB_API_TOKEN;
GPULAB_PROMETHEUS_URL says where Prometheus is."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal

from gpulab.culler.service import GpuCuller
from gpulab.hubapi import HubApi
from gpulab.prometheus_api import DEFAULT_URL, Prometheus


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m gpulab.culler", description=__doc__)
    p.add_argument("--gpus-file", required=True, help="config/gpus.yaml, read at each check")
    p.add_argument("--notices", required=True,
                   help="the JSON file of warnings and stop notices the hub's home page reads")
    p.add_argument("--prometheus-url",
                   default=os.environ.get("GPULAB_PROMETHEUS_URL", DEFAULT_URL),
                   help="env GPULAB_PROMETHEUS_URL; default: %(default)s")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="[%(levelname).1s %(asctime)s %(name)s] %(message)s")
    try:
        hub = HubApi(os.environ["JUPYTERHUB_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"])
    except KeyError as e:
        raise SystemExit(f"gpulab.culler: {e.args[0]} is not set: JupyterHub sets it for "
                         f"the services it starts (hub config: services)") from None
    culler = GpuCuller(hub, Prometheus(args.prometheus_url), args.gpus_file, args.notices)
    asyncio.run(run_until_stopped(culler))


async def run_until_stopped(culler: GpuCuller) -> None:
    """Run the culler until SIGINT (how JupyterHub stops the services it started) or
    SIGTERM, and stop quietly then: no traceback in the hub's log. The handlers are set
    here, not left to Python's default, which a process started in the background by a
    shell without job control does not get (SIGINT ignored)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await culler.run()
    except asyncio.CancelledError:
        logging.getLogger("gpulab.culler").info("GPU culler: stopping")


if __name__ == "__main__":
    main()
