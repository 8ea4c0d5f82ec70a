"""``python -m gpulab.culler``: the GPU culler service (JupyterHub starts it; see
:mod:`gpulab.culler`). JupyterHub passes JUPYTERHUB_API_URL and JUPYTERHUB_API_TOKEN;
GPULAB_PROMETHEUS_URL says where Prometheus is."""

from __future__ import annotations

import argparse
import asyncio
import os

from gpulab.culler.service import GpuCuller
from gpulab.prometheus_api import DEFAULT_URL, Prometheus
from gpulab.service_loop import hub_api_from_environment, run_until_stopped


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m gpulab.culler", description=__doc__)
    p.add_argument("--gpus-file", required=True, help="config/gpus.yaml, read at each check")
    p.add_argument("--notices", required=True,
                   help="the JSON file of warnings and stop notices the hub's home page reads")
    p.add_argument("--bookings-file", default=None,
                   help="the SQLite file of members' bookings (gpulab.bookings); a server "
                        "holding GPUs another member booked is warned, then stopped")
    p.add_argument("--idle-timeout", type=int, default=0, metavar="SECONDS",
                   help="the hub's idle culler's timeout (hub.idle_timeout): servers whose "
                        "GPUs work are reported active to the hub, and members are warned "
                        "ahead of that culler's stops; 0: it is off")
    p.add_argument("--prometheus-url",
                   default=os.environ.get("GPULAB_PROMETHEUS_URL", DEFAULT_URL),
                   help="env GPULAB_PROMETHEUS_URL; default: %(default)s")
    args = p.parse_args(argv)
    hub = hub_api_from_environment("gpulab.culler")
    culler = GpuCuller(hub, Prometheus(args.prometheus_url), args.gpus_file, args.notices,
                       args.bookings_file, args.idle_timeout)
    asyncio.run(run_until_stopped(culler.run, "GPU culler"))


if __name__ == "__main__":
    main()
