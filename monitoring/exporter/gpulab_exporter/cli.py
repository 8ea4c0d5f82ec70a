"""``gpulab-exporter``: the command line."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from gpulab_exporter import __version__
from gpulab_exporter.attribution import DockerContainerDirectory
from gpulab_exporter.server import make_app, make_registry, serve
from gpulab_exporter.snapshot import Poller

log = logging.getLogger("gpulab_exporter")

# Where --fake-gpus looks for its control file unless told otherwise: the container's
# own /dev/shm, the one place a read-only container can be written to (docker exec).
FAKE_CONTROL = "/dev/shm/gpulab-fake-nvml.json"


def _uuid_list(text: str) -> tuple[str, ...]:
    uuids = tuple(u.strip() for u in text.split(","))
    if not all(uuids):
        raise argparse.ArgumentTypeError(f"expected UUID,UUID,... without empty ones, got "
                                         f"{text!r}")
    return uuids


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpulab-exporter",
        description="Export NVML GPU metrics, with each GPU's hub users, to Prometheus. "
                    "Run with the host's PID namespace (--pid=host) so NVML's PIDs can be "
                    "mapped to containers, and the Docker socket mounted read-only.",
    )
    p.add_argument("--listen", default="0.0.0.0:9445", metavar="HOST:PORT",
                   help="address to serve /metrics, /api/gpus and /healthz on "
                        "(default: %(default)s)")
    p.add_argument("--interval", type=float, default=5.0, metavar="SECONDS",
                   help="seconds between NVML polls (default: %(default)s)")
    p.add_argument("--process-interval", type=float, default=15.0, metavar="SECONDS",
                   help="seconds between process-list and container-list refreshes, the "
                        "costlier calls (default: %(default)s)")
    p.add_argument("--process-info", action="store_true",
                   help="also export gpulab_gpu_process_info with one series per GPU "
                        "process (pid label: unbounded cardinality; off by default)")
    p.add_argument("--docker-url", default="unix:///var/run/docker.sock", metavar="URL",
                   help="Docker API for the container labels that name hub users; 'none' "
                        "to attribute nothing (default: %(default)s)")
    p.add_argument("--proc", default="/proc", metavar="DIR",
                   help="the host's /proc, for PID -> container (default: %(default)s)")
    p.add_argument("--fake-gpus", type=int, default=0, metavar="N",
                   help="simulate N GPUs instead of NVML, for demos and CPU-only stacks "
                        "(reported as backend=\"fake\" in gpulab_exporter_info)")
    p.add_argument("--no-gpus", action="store_true",
                   help="this host has no GPUs by design (make up passes it on a host "
                        "without an NVIDIA GPU): NVML is not loaded, and "
                        "gpulab_exporter_gpus_expected 0 keeps GpulabNvmlDown quiet")
    p.add_argument("--fake-uuids", type=_uuid_list, default=(), metavar="UUID,...",
                   help="with --fake-gpus N: the N fake GPUs' UUIDs, comma-separated "
                        "(default: GPU-fa4e0000-0000-4000-8000-<index>, the same on every "
                        "machine; fakes on several nodes of one Swarm need their own)")
    p.add_argument("--fake-control", default=FAKE_CONTROL, metavar="FILE",
                   help="with --fake-gpus: a JSON file, re-read at every poll, that puts "
                        "host processes on the fake GPUs, marks fake GPUs lost and holds "
                        "their utilization, e.g. {\"processes\": {\"0\": [[PID, BYTES]]}, "
                        "\"lost\": [1], \"utilization\": {\"0\": 0}} "
                        "(the integration tests write it with docker exec); '' for none "
                        "(default: %(default)s, inside the exporter's container)")
    p.add_argument("--auth-token-file", metavar="FILE",
                   help="require 'Authorization: Bearer <the file's token>' on every path "
                        "but /healthz (a Swarm's GPU server, whose published port the lab's "
                        "network reaches: only the manager's Prometheus holds the token)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="(default: %(default)s)")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.interval <= 0 or args.process_interval < args.interval:
        raise SystemExit("gpulab-exporter: need --interval > 0 and "
                         "--process-interval >= --interval")
    if args.fake_uuids and not args.fake_gpus:
        raise SystemExit("gpulab-exporter: --fake-uuids needs --fake-gpus")
    if args.no_gpus and args.fake_gpus:
        raise SystemExit("gpulab-exporter: --no-gpus and --fake-gpus exclude each other")
    if args.fake_gpus:
        from gpulab_exporter.fake_nvml import FakeNvml

        try:
            nvml = FakeNvml.demo(args.fake_gpus, animate=True,
                                 control=args.fake_control or None, uuids=args.fake_uuids)
        except ValueError as e:
            raise SystemExit(f"gpulab-exporter: --fake-uuids: {e}") from None
        log.warning("FAKE NVML: serving %d simulated GPUs (--fake-gpus); these numbers "
                    "are not real hardware%s", args.fake_gpus,
                    f"; processes and lost GPUs from {args.fake_control}"
                    if args.fake_control else "")
    else:
        from gpulab_exporter.nvml import Nvml

        nvml = Nvml()
    directory = None if args.docker_url == "none" else DockerContainerDirectory(args.docker_url)
    poller = Poller(nvml, directory=directory, proc=args.proc, interval=args.interval,
                    process_interval=args.process_interval, expects_gpus=not args.no_gpus)
    poller.poll()  # the first snapshot before the first scrape
    poller.start()
    token = None
    if args.auth_token_file:
        try:
            token = open(args.auth_token_file).read().strip()
        except OSError as e:
            raise SystemExit(f"gpulab-exporter: --auth-token-file: {e}") from None
        if len(token) < 32:
            raise SystemExit(f"gpulab-exporter: --auth-token-file {args.auth_token_file}: "
                             f"the token must have at least 32 characters")
    app = make_app(poller, make_registry(poller, process_info=args.process_info), token=token)
    server, _ = serve(app, args.listen)
    log.info("gpulab-exporter %s listening on %s (poll %ss, processes %ss)", __version__,
             args.listen, args.interval, args.process_interval)

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("stopping")
    server.shutdown()
    poller.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
