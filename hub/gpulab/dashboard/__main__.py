"""``python -m gpulab.dashboard``: the command line.

JupyterHub starts it as a managed service and passes JUPYTERHUB_SERVICE_URL (where to
listen), JUPYTERHUB_SERVICE_PREFIX, JUPYTERHUB_API_TOKEN, JUPYTERHUB_API_URL,
JUPYTERHUB_CLIENT_ID and JUPYTERHUB_OAUTH_ACCESS_SCOPES; HubOAuth reads those itself.
GPULAB_EXPORTER_URL and GPULAB_PROMETHEUS_URL set the data sources' defaults;
GPULAB_CONFIG_DIR is where gpus.yaml is (the admins' lease page reads it).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import signal
from pathlib import Path
from urllib.parse import urlsplit

from jupyterhub.services.auth import HubOAuth

from gpulab.bookings.view import bookings_for_dashboard
from gpulab.dashboard.app import DashboardConfig, make_app
from gpulab.dashboard.history import PrometheusHistory
from gpulab.dashboard.leases import (
    DockerContainers,
    LeaseAdmin,
    SwarmServices,
    default_gpus_path,
    default_settings_path,
)
from gpulab.dashboard.members import HubMembers
from gpulab.dashboard.sources import (
    DEFAULT_ALERTMANAGER_URL,
    DEFAULT_EXPORTER_URL,
    DEFAULT_PROMETHEUS_URL,
    AlertmanagerAlerts,
    ExporterSource,
    PrometheusSource,
    SnapshotReader,
)
from gpulab.dashboard.usage import PrometheusUsage
from gpulab.hubapi import HubApi
from gpulab.line.view import line_in_order

log = logging.getLogger("gpulab.dashboard")


def listen_address(service_url: str | None) -> tuple[str, int]:
    """Where to listen, from JUPYTERHUB_SERVICE_URL: its IP (all interfaces for a host
    name, which other containers resolve to us) and port (default 10101)."""
    if not service_url:
        return "127.0.0.1", 10101
    parts = urlsplit(service_url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if host == "localhost":
        return "127.0.0.1", port
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return "0.0.0.0", port
    return host, port


def build_parser(environ: dict[str, str] | None = None) -> argparse.ArgumentParser:
    env = os.environ if environ is None else environ
    ip, port = listen_address(env.get("JUPYTERHUB_SERVICE_URL"))
    p = argparse.ArgumentParser(
        prog="python -m gpulab.dashboard",
        description="The operators' nvidia-smi-style GPU page, as the JupyterHub service "
                    "'gpus'. Reads the exporter's /api/gpus, or Prometheus when the "
                    "exporter does not answer.")
    p.add_argument("--ip", default=ip,
                   help="address to listen on (default: from JUPYTERHUB_SERVICE_URL: "
                        "%(default)s)")
    p.add_argument("--port", type=int, default=port,
                   help="port to listen on (default: from JUPYTERHUB_SERVICE_URL: "
                        "%(default)s)")
    p.add_argument("--exporter-url", default=env.get("GPULAB_EXPORTER_URL")
                   or DEFAULT_EXPORTER_URL, metavar="URL",
                   help="gpulab-exporter, primary source; 'none' to read the table from "
                        "Prometheus only, as on a Swarm of several GPU nodes, where one "
                        "exporter sees one node (env GPULAB_EXPORTER_URL; default: "
                        "%(default)s)")
    p.add_argument("--prometheus-url", default=env.get("GPULAB_PROMETHEUS_URL")
                   or DEFAULT_PROMETHEUS_URL, metavar="URL",
                   help="Prometheus: the GPUs' history, the usage page, and the table's data "
                        "when the exporter is unreachable; 'none' for none of them (env "
                        "GPULAB_PROMETHEUS_URL; default: %(default)s)")
    p.add_argument("--alertmanager-url", default=env.get("GPULAB_ALERTMANAGER_URL")
                   or DEFAULT_ALERTMANAGER_URL, metavar="URL",
                   help="Alertmanager, whose active alerts the page shows; 'none' for no "
                        "alerts (env GPULAB_ALERTMANAGER_URL; default: %(default)s)")
    p.add_argument("--gpus-file", default=str(default_gpus_path(env)), metavar="PATH",
                   help="gpus.yaml, for the admins' lease page (default: from "
                        "GPULAB_CONFIG_DIR: %(default)s)")
    p.add_argument("--settings-file", default=str(default_settings_path(env)), metavar="PATH",
                   help="gpulab.yaml, whose refused edits the lease page shows (default: "
                        "from GPULAB_CONFIG_DIR: %(default)s)")
    p.add_argument("--culler-notices", default=None, metavar="PATH",
                   help="the GPU culler's notices file, whose standing warnings the table "
                        "shows beside the leases they will end (default: none)")
    p.add_argument("--bookings-file", default=None, metavar="PATH",
                   help="members' bookings (gpulab.bookings), listed under the table")
    p.add_argument("--line-file", default=None, metavar="PATH",
                   help="the line's store (gpulab.line): who waits, under the table, and "
                        "the GPUs kept for them, on the lease page (default: none)")
    p.add_argument("--no-leases", action="store_true",
                   help="leave out the admins' lease page (no Docker socket here)")
    p.add_argument("--swarm", action="store_true",
                   help="the hub runs members' servers as Swarm services (hub.swarm): the "
                        "lease page lists and releases services, and every machine's GPUs")
    p.add_argument("--refresh-seconds", type=float, default=5.0, metavar="SECONDS",
                   help="how often the page refreshes its table (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=3.0, metavar="SECONDS",
                   help="per-request timeout towards each source (default: %(default)s)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="(default: %(default)s)")
    return p


async def serve(args: argparse.Namespace) -> None:
    sources: list[ExporterSource | PrometheusSource] = []
    if args.exporter_url.lower() != "none":
        sources.append(ExporterSource(args.exporter_url, timeout=args.timeout))
    if args.prometheus_url.lower() != "none":
        sources.append(PrometheusSource(args.prometheus_url, timeout=args.timeout))
    hub_auth = HubOAuth.instance()
    if not hub_auth.api_token:
        log.warning("JUPYTERHUB_API_TOKEN is not set: run this as a JupyterHub service, "
                    "or nobody can sign in")
    # refreshes are shared: one source read per second at most, whatever the viewers
    alerts = None
    if args.alertmanager_url.lower() != "none":
        alerts = AlertmanagerAlerts(args.alertmanager_url, timeout=args.timeout)
    reader = SnapshotReader(sources, max_age=min(1.0, args.refresh_seconds / 2), alerts=alerts,
                            culler_notices=Path(args.culler_notices)
                            if args.culler_notices else None,
                            line=line_in_order(args.line_file, args.gpus_file)
                            if args.line_file else None,
                            bookings=bookings_for_dashboard(args.bookings_file)
                            if args.bookings_file else None)
    leases = None
    if not args.no_leases:
        store = SwarmServices() if args.swarm else DockerContainers()
        leases = LeaseAdmin(store, HubApi(hub_auth.api_url, hub_auth.api_token, timeout=5),
                            args.gpus_file, settings_path=args.settings_file,
                            line_path=args.line_file)
    usage = history = None
    if args.prometheus_url.lower() != "none":
        usage = PrometheusUsage(args.prometheus_url)
        # the page waits for these: a hung Prometheus delays it by at most a few seconds
        history = PrometheusHistory(args.prometheus_url, usage=usage,
                                    timeout=max(args.timeout, 5.0))
    app = make_app(hub_auth, reader, DashboardConfig(refresh_seconds=args.refresh_seconds),
                   leases=leases, members=HubMembers(HubApi(hub_auth.api_url, timeout=10)),
                   usage=usage,
                   history=history)
    server = app.listen(args.port, address=args.ip, xheaders=True)
    log.info("gpulab GPU dashboard on http://%s:%s%s (sources: %s)", args.ip, args.port,
             hub_auth.base_url, ", ".join(f"{s.name} {s.url}" for s in sources))
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    await done.wait()
    log.info("stopping")
    server.stop()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.refresh_seconds < 1:
        raise SystemExit("--refresh-seconds must be at least 1")
    if args.exporter_url.lower() == args.prometheus_url.lower() == "none":
        raise SystemExit("--exporter-url and --prometheus-url are both 'none': the table "
                         "would have no data source")
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
