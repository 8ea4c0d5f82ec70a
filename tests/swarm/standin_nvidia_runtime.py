"""STAND-IN for nvidia-container-runtime, the default runtime of each simulated Swarm node.

usage (from the node's generated ``nvidia-runtime`` wrapper; containerd's shim adds the
runc arguments): standin_nvidia_runtime.py RECORD RUNC [runc arguments...]

On a real GPU server NVIDIA's runtime reads NVIDIA_VISIBLE_DEVICES from the container's OCI
spec and injects those GPUs before handing over to runc. This stand-in injects nothing: on
``create``/``run`` it appends one JSON line to RECORD with the container id and its
NVIDIA_* environment (``{"id": ..., "NVIDIA_VISIBLE_DEVICES": "GPU-..." or null,
"nvidia_env": {...}}``), then execs RUNC with the arguments unchanged. It proves the
plumbing (hub -> Swarm service -> node -> runtime), never CUDA. Standard library only: it
runs with ``python -I -S`` on every runc call.
"""

from __future__ import annotations

import json
import os
import sys


def container_of(args: list[str]) -> tuple[str, str] | None:
    """(container id, bundle dir) when *args* create a container, else None."""
    command = next((a for a in args if a in ("create", "run")), None)
    if command is None:
        return None
    rest = args[args.index(command) + 1:]
    bundle = "."
    for i, arg in enumerate(rest):
        if arg in ("--bundle", "-b") and i + 1 < len(rest):
            bundle = rest[i + 1]
        elif arg.startswith("--bundle="):
            bundle = arg.split("=", 1)[1]
    return (rest[-1] if rest else "", bundle)


def record_line(container: str, spec: dict) -> str:
    env = dict(item.split("=", 1) for item in spec.get("process", {}).get("env", [])
               if "=" in item)
    nvidia = {k: v for k, v in env.items() if k.startswith("NVIDIA_")}
    return json.dumps({"id": container,
                       "NVIDIA_VISIBLE_DEVICES": nvidia.get("NVIDIA_VISIBLE_DEVICES"),
                       "nvidia_env": nvidia}) + "\n"


def main(argv: list[str]) -> None:
    record, runc, args = argv[1], argv[2], argv[3:]
    created = container_of(args)
    if created is not None:
        container, bundle = created
        try:
            with open(os.path.join(bundle, "config.json")) as f:
                line = record_line(container, json.load(f))
        except (OSError, ValueError) as e:
            line = json.dumps({"id": container, "error": str(e)}) + "\n"
        fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write: lines of parallel creates do not mix
        finally:
            os.close(fd)
    os.execv(runc, [runc, *args])


if __name__ == "__main__":
    main(sys.argv)
