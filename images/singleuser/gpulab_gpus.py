"""The GPU panel in a member's JupyterLab: their server's own GPUs, memory and utilization.

JupyterLab's launcher has a "GPUs" card (jupyter_server_config.py): jupyter-server-proxy
starts this small server on first use and shows its page in a JupyterLab tab, proxied
at /user/NAME/gpus/. The page asks for gpus.json every two seconds.

NVML inside the container sees only the GPUs the hub gave this server: the NVIDIA
container runtime injects those devices alone. Which ones the hub gave it, the panel reads
from GPULAB_GPUS (set by gpulab's spawner: their UUIDs, comma-separated, empty for none),
not from NVIDIA_VISIBLE_DEVICES: with the NVIDIA container toolkit in CDI mode, the CDI
spec's edits set NVIDIA_VISIBLE_DEVICES=void inside a container that does have GPUs.
Where NVML sees no GPU, the panel says why in words (no GPU assigned, or assigned but not
reachable) instead of an empty chart or an error.

    python -m gpulab_gpus --port 8123              # serve the panel
    python -m gpulab_gpus --json                   # print one snapshot
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# gpulab's spawner sets this in every server it starts (gpulab.spawn.containers): the leased
# GPUs' UUIDs, comma-separated; empty for none.
GPULAB_GPUS = "GPULAB_GPUS"
# NVIDIA's values for "no GPU", for a server started without gpulab's spawner (no GPULAB_GPUS).
NO_DEVICES = {"", "void", "none"}
NO_GPU_ASSIGNED = "No GPU assigned to this server."
HOW_TO_GET_ONE = ("To use one, stop your server (File > Hub Control Panel > Stop My Server) "
                  "and start it again with GPUs chosen on the start page.")


def assigned_devices(env: Mapping[str, str]) -> list[str]:
    """The GPUs the hub gave this server (UUIDs), from GPULAB_GPUS. Only where that is
    not set at all (the image run without gpulab's spawner) from NVIDIA_VISIBLE_DEVICES,
    which under CDI reads "void" even where the container has GPUs."""
    if GPULAB_GPUS in env:
        value = env[GPULAB_GPUS].strip()
    else:
        value = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
        if value.lower() in NO_DEVICES:
            return []
    return [device.strip() for device in value.split(",") if device.strip()]


def _field(read: Callable[[], Any]) -> Any:
    """One NVML reading; None when this GPU or driver does not give it (fail soft)."""
    try:
        return read()
    except Exception:  # NVMLError_NotSupported, NoPermission, GpuIsLost, ...
        return None


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def snapshot(nvml: Any = None, env: Mapping[str, str] | None = None) -> dict:
    """What the panel shows: {"gpus": [...], "assigned": [...], "message": str | None}.

    Each GPU is {"index", "mig", "name", "uuid", "memory_used_bytes",
    "memory_total_bytes", "utilization_percent"}; a value NVML cannot give is None. A
    MIG device's index is "GPU:SLOT", and only the MIG devices the hub assigned are
    listed. *nvml* is the pynvml module (nvidia-ml-py), injectable for tests.
    """
    env = os.environ if env is None else env
    assigned = assigned_devices(env)
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as e:
            return _no_gpus(assigned, f"nvidia-ml-py is not installed ({e})")
    try:
        nvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return _no_gpus(assigned, str(e) or type(e).__name__)
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            mig = _mig_devices(nvml, handle)
            # A GPU in MIG mode: the server was given MIG devices of it, not it. Only
            # those the hub assigned are hers, whatever else NVML may show here.
            devices = [_device(nvml, h, f"{index}:{slot}") for slot, h in mig]
            gpus += [d for d in devices if not assigned or d["uuid"] in assigned]
            if not mig:
                gpus.append(_device(nvml, handle, index))
    except Exception as e:
        return _no_gpus(assigned, str(e) or type(e).__name__)
    finally:
        _field(nvml.nvmlShutdown)
    if not gpus:
        return _no_gpus(assigned, "NVML found no GPU in this container")
    return {"gpus": gpus, "assigned": assigned, "message": None}


def _device(nvml: Any, handle: Any, index: int | str) -> dict:
    """One GPU or MIG device ("1:0": MIG device 0 of GPU 1). Under MIG NVML gives no
    utilization: it is None, and the page says why."""
    memory = _field(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    return {
        "index": index,
        "mig": isinstance(index, str),
        "name": _field(lambda: _text(nvml.nvmlDeviceGetName(handle))),
        "uuid": _field(lambda: _text(nvml.nvmlDeviceGetUUID(handle))),
        "memory_used_bytes": getattr(memory, "used", None),
        "memory_total_bytes": getattr(memory, "total", None),
        "utilization_percent": _field(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
    }


def _mig_devices(nvml: Any, handle: Any) -> list[tuple[int, Any]]:
    """(slot, handle) of the MIG devices NVML shows of a GPU in MIG mode; [] otherwise."""
    mode = _field(lambda: nvml.nvmlDeviceGetMigMode(handle))
    if not mode or mode[0] != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return []
    devices = []
    for slot in range(_field(lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0):
        device = _field(lambda s=slot: nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, s))
        if device is not None:  # an empty slot, or one not given to this server
            devices.append((slot, device))
    return devices


def _no_gpus(assigned: list[str], reason: str) -> dict:
    if not assigned:
        message = f"{NO_GPU_ASSIGNED} {HOW_TO_GET_ONE}"
    else:
        message = (f"No GPU is reachable from this server, although the hub assigned it "
                   f"{', '.join(assigned)}: the NVIDIA driver could not be used inside "
                   f"the container (NVML: {reason}). Please tell the lab's admins.")
    return {"gpus": [], "assigned": assigned, "message": message, "reason": reason}


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>GPUs</title>
<style>
  body { font: 14px/1.5 system-ui, sans-serif; margin: 1.5em; color: #222; }
  h1 { font-size: 1.3em; margin: 0 0 .8em; }
  .message { font-size: 1.1em; padding: .8em 1em; background: #f4f4f4;
             border-left: 4px solid #888; max-width: 48em; }
  .gpu { border: 1px solid #ddd; border-radius: 6px; padding: .8em 1em; margin: 0 0 1em;
         max-width: 48em; }
  .gpu h2 { font-size: 1.05em; margin: 0 0 .5em; }
  .uuid { color: #666; font-size: .85em; font-weight: normal; }
  .row { display: flex; align-items: center; gap: .8em; margin: .3em 0; }
  .row span:first-child { width: 7em; }
  .bar { flex: 1; height: 14px; background: #eee; border-radius: 3px; overflow: hidden; }
  .bar div { height: 100%; background: #76b900; }
  .value { width: 12em; text-align: right; font-variant-numeric: tabular-nums; }
  footer { color: #777; font-size: .85em; }
</style></head>
<body>
<h1>Your GPUs</h1>
<div id="gpus"><p>Reading the GPUs ...</p></div>
<footer>Only this server's GPUs; updated every 2 seconds.</footer>
<script>
const GiB = 1024 ** 3;
function el(tag, attrs, ...children) {
  const node = Object.assign(document.createElement(tag), attrs);
  node.append(...children);
  return node;
}
function row(label, fraction, text) {
  const fill = el("div");
  fill.style.width = fraction === null ? "0" : `${Math.min(100, fraction * 100)}%`;
  return el("div", {className: "row"}, el("span", {}, label),
            el("div", {className: "bar"}, fill), el("span", {className: "value"}, text));
}
function show(data) {
  const root = document.getElementById("gpus");
  if (data.message) {
    root.replaceChildren(el("p", {className: "message", id: "gpulab-gpu-message"}, data.message));
    return;
  }
  root.replaceChildren(...data.gpus.map(g => {
    const used = g.memory_used_bytes, total = g.memory_total_bytes, util = g.utilization_percent;
    const memory = used === null || total === null ? null : used / total;
    return el("div", {className: "gpu"},
      el("h2", {}, `${g.mig ? "MIG device" : "GPU"} ${g.index}: ${g.name ?? "unknown"} `,
         el("span", {className: "uuid"}, g.uuid ?? "")),
      row("Memory", memory, memory === null ? "n/a"
          : `${(used / GiB).toFixed(1)} / ${(total / GiB).toFixed(1)} GiB`),
      row("Utilization", util === null ? null : util / 100,
          util !== null ? `${util} %` : g.mig ? "not reported under MIG" : "n/a"));
  }));
}
async function refresh() {
  try {
    const response = await fetch("gpus.json", {cache: "no-store"});
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    show(await response.json());
  } catch (e) {
    show({message: `The GPU panel's server does not answer (${e.message}): `
                   + "reopen it from the launcher."});
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body></html>
"""


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send(200, "text/html; charset=utf-8", PAGE.encode())
        elif path == "/gpus.json":
            self._send(200, "application/json", json.dumps(snapshot()).encode())
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # two requests a second per open panel: nothing worth a log line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpulab_gpus", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, help="serve the panel on 127.0.0.1:PORT")
    parser.add_argument("--json", action="store_true", help="print one snapshot and exit")
    args = parser.parse_args(argv)
    if args.json or args.port is None:
        print(json.dumps(snapshot(), indent=2))
        return
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
