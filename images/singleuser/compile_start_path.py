"""Byte-compile what a member's server imports when it starts, by starting one (image build).

/opt/venv is root's and members run as uid 1000, so Python can never cache bytecode for
them: whatever is not compiled in the image is compiled from source at every start of
every server (2-3 s of a spawn on a 2-core host). Compiling all of site-packages costs
about 210 MB, most of it torch and sympy code that no start touches; this compiles what
a start touches, about 55 MB:

* the server: `jupyter lab` with the image's server extensions (the same ones
  jupyterhub-singleuser loads, jupyter-server-proxy among them), asked for the pages and
  APIs JupyterLab requests when it opens, plus the jupyterhub.singleuser extension itself;
  then again with the lab assistant on (jupyter-ai, as the hub turns it on);
* the launcher's TensorBoard and GPU panel, opened through that server's proxy (each is
  a process of its own, started on first use, that members would otherwise wait for);
* the first cells: a kernel that imports torch and numpy and runs one backward pass,
  then draws a matplotlib plot, makes a widget and a TensorBoard summary writer.

Python writes the bytecode of each module it imports next to the source
(__pycache__, readable by everyone). Run as root during `docker build`; exits non-zero,
failing the build, when the server or the kernel does not work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import jupyterhub.singleuser  # noqa: F401  (the hub's extension, not loaded by `jupyter lab`)
from jupyter_client.manager import start_new_kernel

PORT = 8899
# Where the hub points JUPYTER_CONFIG_PATH while the lab assistant is on (the Dockerfile).
ASSISTANT_ON = "/opt/venv/share/gpulab/assistant-on"
# ... and what jupyter-ai's parts ask of the server then.
ASSISTANT_PAGES = ["/api/ai/config", "/api/ai/providers", "/api/ai/chats/slash_commands",
                   "/api/ai/chats/autocomplete_options"]
URL = f"http://127.0.0.1:{PORT}"
# What JupyterLab asks of its server when a member opens it.
PAGES = ["/lab", "/lab/tree", "/lab/api/settings", "/lab/api/translations",
         "/lab/api/workspaces", "/api/me", "/api/status", "/api/kernelspecs",
         "/api/contents", "/api/sessions", "/api/terminals", "/api/kernels",
         "/server-proxy/servers-info"]
# What the launcher's TensorBoard and GPUs cards open (jupyter_server_config.py), and
# what those pages then ask for.
PROXIED = ["/tensorboard/", "/tensorboard/data/environment", "/tensorboard/data/plugins_listing",
           "/tensorboard/data/runs", "/gpus/", "/gpus/gpus.json"]
FIRST_CELL = "import torch, numpy\ntorch.ones(2, requires_grad=True).sum().backward()"
LAB_CELL = """
import matplotlib.pyplot as plt, ipywidgets
from torch.utils.tensorboard import SummaryWriter
plt.plot([1, 2, 3]); plt.show()
ipywidgets.IntSlider()
"""


def request(path: str, body: bytes | None = None) -> bytes:
    req = urllib.request.Request(URL + path, data=body, method="POST" if body else "GET",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as response:
        return response.read()


def warm_server(env: dict | None = None, pages: list[str] = PAGES + PROXIED) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser",
         "--ip=127.0.0.1", f"--port={PORT}", "--ServerApp.root_dir=/tmp",
         "--IdentityProvider.token=", "--ServerApp.disable_check_xsrf=True"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                request("/api")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("compile_start_path: jupyter lab did not start") from None
                time.sleep(0.3)
        for page in pages:
            request(page)
        kernel = json.loads(request("/api/kernels", b"{}"))  # the server's kernel machinery
        time.sleep(2)
        request(f"/api/kernels/{kernel['id']}")
    finally:
        server.terminate()
        server.wait(60)


def warm_first_cell() -> None:
    manager, client = start_new_kernel(startup_timeout=120)
    try:
        for cell in (FIRST_CELL, LAB_CELL):
            reply = client.execute_interactive(cell, timeout=300, output_hook=lambda msg: None)
            if reply["content"]["status"] != "ok":
                raise SystemExit(f"compile_start_path: a first cell failed: {reply['content']}")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


if __name__ == "__main__":
    warm_server()
    # a hub-started server with the assistant on (its config reads these two)
    warm_server({"JUPYTER_CONFIG_PATH": ASSISTANT_ON, "JUPYTER_RUNTIME_DIR": "/tmp/warm-runtime",
                 "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api",
                 "JUPYTERHUB_API_TOKEN": "image-build"}, PAGES + ASSISTANT_PAGES)
    warm_first_cell()
