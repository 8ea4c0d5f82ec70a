"""``python -m gpulab.line``: the line service (JupyterHub starts it; see
:mod:`gpulab.line.service`). JupyterHub passes JUPYTERHUB_API_URL and
JUPYTERHUB_API_TOKEN."""

from __future__ import annotations

import argparse
import asyncio
import os

from gpulab.line.service import LineService
from gpulab.mail import MailSettings
from gpulab.prometheus_api import DEFAULT_URL, Prometheus
from gpulab.service_loop import hub_api_from_environment, run_until_stopped


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m gpulab.line", description=__doc__)
    p.add_argument("--gpus-file", required=True,
                   help="config/gpus.yaml (line.claim_window), read at each round")
    p.add_argument("--notices", required=True,
                   help="the JSON file of notices the hub's home page reads")
    p.add_argument("--interval", type=float, default=5.0,
                   help="seconds between rounds (default: %(default)s)")
    p.add_argument("--usage-file", default=None,
                   help="where members' recent GPU-hours go, for line.order: fair_share "
                        "(the hub reads them there)")
    p.add_argument("--prometheus-url",
                   default=os.environ.get("GPULAB_PROMETHEUS_URL", DEFAULT_URL),
                   help="where those GPU-hours come from; env GPULAB_PROMETHEUS_URL; "
                        "default: %(default)s")
    p.add_argument("--settings-file", default=None,
                   help="config/gpulab.yaml: how to e-mail a member whose turn came "
                        "(mail.*), read at each e-mail; without it, no e-mail")
    p.add_argument("--secrets-dir", default="",
                   help="the folder of secrets/smtp-password (with mail.username)")
    p.add_argument("--hub-url", default=os.environ.get("GPULAB_MEMBER_URL", ""),
                   help="the hub's URL as members open it, for the link in the e-mail; "
                        "env GPULAB_MEMBER_URL; default: none (no link)")
    args = p.parse_args(argv)
    hub = hub_api_from_environment("gpulab.line")
    mail = (MailSettings(args.settings_file, args.secrets_dir, args.hub_url)
            if args.settings_file else None)
    line = LineService(hub, args.gpus_file, args.notices, args.interval,
                       Prometheus(args.prometheus_url), args.usage_file, mail)
    asyncio.run(run_until_stopped(line.run, "line"))


if __name__ == "__main__":
    main()
