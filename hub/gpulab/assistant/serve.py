"""``gpulab-assistant``: llama.cpp's server on the model gpulab.yaml names.

Runs in the stack's ``assistant`` container (the hub image, as nobody, read-only, on an
internal network with the hub alone). Every few seconds it reads gpulab.yaml's
``assistant.*`` settings (their last good version, as the hub does) and the model file's
size and time; when they change it stops the server it runs and starts one on the new
model, and with no model it runs none. The server answers OpenAI's chat API on
``--port`` to the key in ``--key-file`` only; members reach it through the hub
(:mod:`gpulab.assistant.gateway`), never directly.

llama.cpp comes from ``xllamacpp`` (its server, in-process); it is imported when a model
is first served, so that the hub's own processes never load it.

GPUs (``assistant.gpus``) reach the container from ``make up``
(docker-compose.assistant-gpu.yml), which also tells this process which it holds
(``GPULAB_ASSISTANT_GPUS``); the model's layers then go to them where this llama.cpp
build has a GPU backend, and the log says when it has none or when gpulab.yaml names
other GPUs than the container holds.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulab import live_config
from gpulab.assistant.gpus import assistant_gpus
from gpulab.settings import ConfigError

log = logging.getLogger("gpulab.assistant")


@dataclass(frozen=True)
class Wanted:
    """The server this process should run: the model file (with its size and time, so
    that a file replaced in place is loaded again) and llama.cpp's parameters."""
    model: Path
    size: int
    mtime: float
    threads: int
    parallel: int
    context: int
    max_tokens: int
    on_gpus: bool = False  # the container holds GPUs: offload every layer


def gpu_note(named: tuple[int | str, ...], held: tuple[str, ...]) -> str:
    """What the log says when gpulab.yaml's assistant.gpus (*named*, while a model is
    set) is not what the container was given (*held*, by `make up`); "" when they agree."""
    if tuple(str(g) for g in named) == held:
        return ""
    now = ", ".join(str(g) for g in named) or "none"
    return (f"gpulab.yaml's assistant.gpus names {now}, this container holds "
            f"{', '.join(held) or 'none'}: the hub holds the named ones for the assistant "
            f"now, and `make assistant` (or make up) gives this container those no member's "
            f"server holds")


def wanted(settings: Any, models: Path, held: tuple[str, ...] = ()
           ) -> tuple[Wanted | None, str]:
    """What to serve by these settings, or None with the reason (for the log)."""
    name = settings["assistant.model"]
    if not name:
        return None, "assistant.model is empty: no assistant"
    if settings["assistant.endpoint"]:
        return None, (f"assistant.endpoint is set: the hub asks {name} at "
                      f"{settings['assistant.endpoint']}, and this server runs nothing")
    path = models / name
    try:
        st = path.stat()
    except OSError as e:
        return None, (f"assistant.model {name!r}: {path} cannot be read ({e.strerror}); "
                      f"put the file in the models folder (GPULAB_MODELS_DIR on the host)")
    return Wanted(path, st.st_size, st.st_mtime, settings["assistant.threads"],
                  settings["assistant.parallel"], settings["assistant.context"],
                  settings["assistant.max_tokens"], bool(held)), ""


def start_server(want: Wanted, port: int, key: str) -> Any:
    import xllamacpp  # noqa: PLC0415 (only this process, only once a model is named)

    p = xllamacpp.CommonParams()
    p.model.path = str(want.model)
    p.model_alias = {want.model.name}  # what answers call it: not the container's path
    p.hostnames = ["0.0.0.0"]
    p.port = port
    p.api_keys = [key]
    p.cpuparams.n_threads = want.threads
    p.cpuparams_batch.n_threads = want.threads
    p.n_parallel = want.parallel
    p.n_ctx = want.context * want.parallel  # split among the slots
    p.n_predict = want.max_tokens
    p.endpoint_metrics = True
    p.ui = False  # no web page: members use JupyterLab, through the hub
    p.offline = True  # never download anything
    if want.on_gpus:
        p.n_gpu_layers = 999  # all of them, on the GPUs the container holds
        # each {"name", "description", "type": ggml_backend_dev_type...CPU/GPU, ...}
        devices = [f"{d.get('name')} ({d.get('description')})"
                   for d in xllamacpp.get_device_info()
                   if not getattr(d.get("type"), "name", "CPU").endswith("CPU")]
        log.info("GPU devices this llama.cpp build sees: %s", devices or
                 "none (a build without a GPU backend, such as xllamacpp's from PyPI, "
                 "computes on the CPU: docs/assistant.md)")
    return xllamacpp.Server(p)


class Assistant:
    """The running server, if any, and what it serves."""

    def __init__(self, settings_file: str, models: Path, port: int, key: str,
                 gpus: tuple[str, ...] = ()):
        self.settings_file, self.models, self.port, self.key = settings_file, models, port, key
        self.gpus = gpus  # what make up gave the container (GPULAB_ASSISTANT_GPUS)
        self.gpus_said = ""
        self.serving: Wanted | None = None
        self.server: Any = None
        self.said = ""

    def say(self, text: str) -> None:
        if text != self.said:  # once per change, not every poll
            log.info("%s", text)
            self.said = text

    def check(self) -> None:
        try:
            settings = live_config.settings_file.load(self.settings_file)
        except ConfigError as e:  # never a good version: nothing to serve
            self.say(f"{e}")
            settings = None
        want, why = wanted(settings, self.models, self.gpus) if settings else (None, "")
        note = gpu_note(assistant_gpus(settings), self.gpus) if settings else ""
        if note != self.gpus_said:
            if note:
                log.warning("%s", note)
            self.gpus_said = note
        if want == self.serving:
            if why:
                self.say(why)
            return
        self.stop()
        if want is None:
            self.say(why)
            return
        self.say(f"loading {want.model} ({want.size / 2**20:.1f} MiB; {want.threads} "
                 f"threads, {want.parallel} at once, {want.context} tokens each)")
        try:
            self.server = start_server(want, self.port, self.key)
        except Exception as e:  # a file llama.cpp cannot load: say so, try at its next change
            self.say(f"llama.cpp could not load {want.model}: {e}")
            self.server = None
        else:
            self.say(f"serving {want.model.name} on port {self.port}")
        self.serving = want

    def stop(self) -> None:
        if self.server is not None:
            log.info("stopping the server of %s", self.serving.model.name)
            self.server = None  # xllamacpp stops its server when the object goes
        self.serving = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpulab-assistant", description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings-file", required=True, help="gpulab.yaml")
    parser.add_argument("--models", required=True, type=Path,
                        help="the models folder (assistant.model names a file in it)")
    parser.add_argument("--key-file", required=True,
                        help="the key the hub sends; the server answers no other")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--interval", type=float, default=2.0,
                        help="seconds between reads of the settings")
    parser.add_argument("--gpus", default=os.environ.get("GPULAB_ASSISTANT_GPUS", ""),
                        help="the GPUs the container holds, comma-separated, as `make up` "
                             "gave them (default: GPULAB_ASSISTANT_GPUS)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[gpulab-assistant] %(message)s")
    key = Path(args.key_file).read_text().strip()
    if not key:
        parser.error(f"{args.key_file} is empty (make up writes it)")
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    gpus = tuple(g.strip() for g in args.gpus.split(",") if g.strip())
    assistant = Assistant(args.settings_file, args.models, args.port, key, gpus)
    while not done.is_set():
        assistant.check()
        done.wait(args.interval)
    assistant.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
