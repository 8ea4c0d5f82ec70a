"""HTTP: ``/metrics`` (Prometheus), ``/api/gpus`` (the snapshot as JSON, for the
operators' dashboard) and ``/healthz``. Every answer is rendered from the latest
snapshot; none calls NVML, so a failing NVML never turns into an HTTP 500."""

from __future__ import annotations

import gzip
import hmac
import json
import threading
import time
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gpulab_exporter.collector import GpuCollector
from gpulab_exporter.snapshot import Poller


def make_registry(poller: Poller, process_info: bool = False) -> CollectorRegistry:
    """A registry holding only the GPU collector (no process/platform/GC metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(lambda: poller.latest, process_info=process_info))
    return registry


def make_app(poller: Poller, registry: CollectorRegistry, stale_after: float | None = None,
             token: str | None = None):
    """The WSGI app. ``/healthz`` answers 503 only when the poller itself is stuck (no
    snapshot for ``stale_after`` seconds, default 3 intervals + 10 s), not when NVML
    is down: that is reported in the metrics.

    With *token* (a GPU server of a Swarm, whose port the lab's network can reach), every
    path but ``/healthz`` needs ``Authorization: Bearer <token>``: only the manager's
    Prometheus, which holds it, reads who holds which GPU."""
    metrics = _cached_metrics_app(poller, registry)
    if stale_after is None:
        stale_after = 3 * poller.interval + 10
    expected = f"Bearer {token}".encode() if token else None

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if expected is not None and path != "/healthz" and not hmac.compare_digest(
                environ.get("HTTP_AUTHORIZATION", "").encode(), expected):
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Bearer realm="gpulab"'),
                                                ("Content-Length", "0")])
            return [b""]
        if path in ("/metrics", "/metrics/"):
            return metrics(environ, start_response)
        if path in ("/api/gpus", "/api/gpus/"):
            return _json(start_response, "200 OK", poller.latest.to_json())
        if path == "/healthz":
            snap = poller.latest
            age = time.time() - snap.timestamp
            ok = age <= stale_after
            body = {"status": "ok" if ok else "stale", "snapshot_age_seconds": round(age, 3),
                    "nvml_up": snap.nvml_up, "nvml_error": snap.nvml_error, "fake": snap.fake}
            return _json(start_response, "200 OK" if ok else "503 Service Unavailable", body)
        if path == "/":
            body = (b"gpulab-exporter: <a href='/metrics'>/metrics</a> "
                    b"<a href='/api/gpus'>/api/gpus</a> <a href='/healthz'>/healthz</a>\n")
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"),
                                      ("Content-Length", str(len(body)))])
            return [body]
        return _json(start_response, "404 Not Found", {"error": f"no such path: {path}"})

    return app


def _cached_metrics_app(poller: Poller, registry: CollectorRegistry):
    """``/metrics`` with prometheus_client's encoders (text or OpenMetrics, by the
    Accept header; gzip when asked). The exposition is a pure function of the snapshot,
    which changes once per poll, so each encoding is rendered once per snapshot and
    repeated scrapes (several Prometheus servers, dashboards) cost only the send."""
    lock = threading.Lock()
    cache: dict = {"snapshot": None, "bodies": {}}

    def app(environ, start_response):
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT"))
        use_gzip = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
        key = (content_type, use_gzip)
        snap = poller.latest
        with lock:
            if cache["snapshot"] is not snap:
                cache["snapshot"], cache["bodies"] = snap, {}
            body = cache["bodies"].get(key)
        if body is None:
            body = encoder(registry)  # the collector reads poller.latest itself
            if use_gzip:
                body = gzip.compress(body, compresslevel=6)
            with lock:
                if cache["snapshot"] is snap:
                    cache["bodies"][key] = body
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        if use_gzip:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    return app


def _json(start_response, status: str, data) -> list[bytes]:
    body = json.dumps(data, separators=(",", ":")).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(body))),
                            ("Cache-Control", "no-store")])
    return [body]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - signature from the base class
        pass


def parse_listen(listen: str) -> tuple[str, int]:
    """``"0.0.0.0:9445"``, ``"[::]:9445"`` or ``":9445"`` -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT, e.g. 0.0.0.0:9445")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def serve(app, listen: str) -> tuple[WSGIServer, threading.Thread]:
    """Start serving ``app`` on a daemon thread; port 0 picks a free port
    (``server.server_port`` tells which)."""
    host, port = parse_listen(listen)
    server_class = _ThreadingServer
    if ":" in host:
        import socket

        server_class = type("_ThreadingServer6", (_ThreadingServer,),
                            {"address_family": socket.AF_INET6})
    server = make_server(host, port, app, server_class, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="gpulab-http", daemon=True)
    thread.start()
    return server, thread
