"""The lab assistant's door in the hub: ``/hub/api/gpulab/assistant``.

Members' servers reach the hub's port 8081 and nothing else (gpulab-netguard); the
inference server (:mod:`gpulab.assistant.serve`) is on a network with the hub alone.
So every request goes through these handlers, which take OpenAI's chat API:

* ``GET  /hub/api/gpulab/assistant``: whether the assistant is on, ready, and open to
  the caller (``{"on", "ready", "model", "may_ask", "reason"}``); any token of hers;
* ``GET  /hub/api/gpulab/assistant/v1/models``: the lab's one model;
* ``POST /hub/api/gpulab/assistant/v1/chat/completions``: forwarded, streamed or not.

The ``/v1`` routes need :data:`~gpulab.assistant.rules.ASSISTANT_SCOPE`, which her
server's own token (``JUPYTERHUB_API_TOKEN``) carries: a notebook asks with
``base_url=$JUPYTERHUB_API_URL/gpulab/assistant/v1`` and that token as the API key,
as its member, with no secret of the lab's in the image. Each request is checked
against gpulab.yaml as it is now (:func:`~gpulab.assistant.rules.refusal`), counted in
``gpulab_assistant_requests_total{user, outcome}`` on the hub's /hub/metrics, and
limited per member (``assistant.requests_per_minute``, in the hub's memory: a hub
restart forgets the last minute).

Where a lab runs an OpenAI-compatible server already (``assistant.endpoint``: vLLM on a
GPU machine, Ollama, ...), the same routes forward there instead, through the same door:
its key (``secrets/assistant-endpoint-key``, if the file exists) goes with each request,
and the model is gpulab.yaml's ``assistant.model``, whatever the member sent.

The hub's config puts what these handlers need in ``tornado_settings["gpulab-assistant"]``:
``{"settings_file": gpulab.yaml, "url": the inference server, "key_file": its key,
"endpoint_key_file": the key of assistant.endpoint's server}``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from jupyterhub.apihandlers.base import APIHandler
from prometheus_client import Counter
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpulab import live_config
from gpulab.assistant.rules import ASSISTANT_SCOPE, RateWindow, Refused, chat_request, refusal
from gpulab.settings import ConfigError

REQUESTS = Counter("gpulab_assistant_requests_total",
                   "Requests members sent the lab assistant, by member and outcome: ok, "
                   "refused (no access, bad request), limited (over "
                   "assistant.requests_per_minute), off, unavailable (the inference "
                   "server did not answer), error (it answered with an error)",
                   ["user", "outcome"])
# Seconds to wait for the inference server: its answer to a long question on a CPU.
ANSWER_TIMEOUT = 600
_window = RateWindow()


def not_answering(e: Exception) -> Refused:
    return Refused(503, f"The lab assistant is not answering ({e}): it may be loading its "
                        "model, or could not load it (an admin sees why in `docker logs "
                        "gpulab-assistant`).")


class AssistantAPIBase(APIHandler):
    @property
    def assistant(self) -> dict[str, Any]:
        config = self.settings.get("gpulab-assistant")
        if not config:
            raise web.HTTPError(404, "This hub has no lab assistant.")
        return config

    def lab_settings(self):
        try:
            return live_config.settings_file.load(self.assistant["settings_file"])
        except ConfigError as e:
            raise Refused(503, f"The lab's gpulab.yaml is invalid: {e}") from None

    def member(self):
        """Who asks: a member, by a token of hers (a service has no one to ask for)."""
        user = self.current_user
        if user is None:
            raise Refused(403, "Ask the lab assistant with a token of yours (in a notebook, "
                               "JUPYTERHUB_API_TOKEN) as the API key.")
        if getattr(user, "kind", "") != "user":
            raise Refused(403, "Only lab members ask the lab assistant; this is the token "
                               f"of the service {user.name}.")
        return user

    def refused_here(self, settings) -> Refused | None:
        user = self.member()
        return refusal(settings, [g.name for g in user.groups], user.admin)

    def upstream(self, path: str, settings, **kwargs) -> HTTPRequest:
        """A request to the inference server for *path* (``/v1/...``, or ``/health``):
        the stack's own, or assistant.endpoint's (whose readiness is its model list)."""
        endpoint = settings["assistant.endpoint"]
        if endpoint:
            url = endpoint + (path.removeprefix("/v1") if path != "/health" else "/models")
            key_file = Path(self.assistant["endpoint_key_file"])
            try:
                key = key_file.read_text().strip() if key_file.exists() else ""
            except OSError as e:
                raise Refused(503, f"The hub cannot read the key of assistant.endpoint "
                                   f"(secrets/{key_file.name}: {e.strerror}); an admin "
                                   f"fixes its owner or mode.") from None
        else:
            url = self.assistant["url"].rstrip("/") + path
            try:
                key = Path(self.assistant["key_file"]).read_text().strip()
            except OSError as e:
                raise Refused(503, f"The hub has no key for the lab assistant ({e}); an "
                                   "admin runs `make up`, which writes "
                                   "secrets/assistant-key.") from None
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return HTTPRequest(url, headers=headers, **kwargs)

    def answer_refusal(self, r: Refused) -> None:
        """Refused, in JupyterHub's error form and OpenAI's (which OpenAI's clients,
        and so JupyterLab's assistant, show to the member)."""
        self.set_status(r.status)
        if r.retry_after:
            self.set_header("Retry-After", str(r.retry_after))
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": r.status, "message": r.reason,
                                "error": {"message": r.reason, "type": "gpulab",
                                          "code": r.status}}))

    def count(self, outcome: str) -> None:
        REQUESTS.labels(self.current_user.name, outcome).inc()


class AssistantStatusHandler(AssistantAPIBase):
    async def get(self):
        try:
            self.member()
            settings = self.lab_settings()
        except Refused as r:
            return self.answer_refusal(r)
        why = self.refused_here(settings)
        ready = False
        if settings["assistant.model"]:
            try:
                reply = await AsyncHTTPClient().fetch(
                    self.upstream("/health", settings, request_timeout=5), raise_error=False)
                ready = reply.code == 200
            except (OSError, HTTPClientError, Refused):  # not answering (a timeout): not ready
                pass
        self.finish({"on": bool(settings["assistant.model"]), "ready": ready,
                     "model": settings["assistant.model"], "may_ask": why is None,
                     "reason": why.reason if why else ""})


class AssistantV1Base(AssistantAPIBase):
    """The OpenAI routes: a token with ASSISTANT_SCOPE, a member who may ask, within her
    rate; the refusals counted under her name."""

    def admit(self):
        self.member()
        if ASSISTANT_SCOPE not in self.expanded_scopes:
            self.count("refused")
            raise Refused(403, "This token may not ask the lab assistant (it lacks the "
                               f"scope {ASSISTANT_SCOPE}): use your server's own token, "
                               "JUPYTERHUB_API_TOKEN, or a token made with that scope.")
        settings = self.lab_settings()
        why = self.refused_here(settings)
        if why:
            self.count("off" if why.status == 503 else "refused")
            raise why
        limited = _window.take(self.current_user.name, time.monotonic(),
                               settings["assistant.requests_per_minute"])
        if limited:
            self.count("limited")
            raise limited
        return settings

    async def forward(self, request: HTTPRequest) -> None:
        try:
            reply = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (OSError, HTTPClientError) as e:  # refused, reset, or a timeout (599)
            self.count("unavailable")
            raise not_answering(e) from None
        self.count("ok" if reply.code < 400 else "error")
        self.set_status(reply.code)
        self.set_header("Content-Type", reply.headers.get("Content-Type", "application/json"))
        self.finish(reply.body)


class ModelsHandler(AssistantV1Base):
    async def get(self):
        try:
            settings = self.admit()
            await self.forward(self.upstream("/v1/models", settings, request_timeout=10))
        except Refused as r:
            self.answer_refusal(r)


class ChatCompletionsHandler(AssistantV1Base):
    async def post(self):
        try:
            settings = self.admit()
            # an endpoint of the lab's may serve several models: the lab's one, by name
            model = settings["assistant.model"] if settings["assistant.endpoint"] else None
            try:
                fwd = chat_request(self.request.body, settings["assistant.max_tokens"], model)
            except Refused:
                self.count("refused")
                raise
            if not fwd.stream:
                return await self.forward(self.upstream(
                    "/v1/chat/completions", settings, method="POST", body=fwd.body,
                    request_timeout=ANSWER_TIMEOUT))
            await self.stream(fwd.body, settings)
        except Refused as r:
            self.answer_refusal(r)

    async def stream(self, body: bytes, settings) -> None:
        """Server-sent events, passed on as they come (the member sees the answer
        being written); the inference server's status and type go first."""
        head: dict[str, Any] = {}

        def on_header(line: str) -> None:
            if line.startswith("HTTP/"):
                head["code"] = int(line.split()[1])
            elif line.lower().startswith("content-type:"):
                head["type"] = line.split(":", 1)[1].strip()

        def on_chunk(chunk: bytes) -> None:
            if not head.get("sent"):
                self.set_status(head.get("code", 200))
                self.set_header("Content-Type", head.get("type", "text/event-stream"))
                self.set_header("Cache-Control", "no-cache")
                head["sent"] = True
            self.write(chunk)
            self.flush()

        request = self.upstream("/v1/chat/completions", settings, method="POST", body=body,
                                request_timeout=ANSWER_TIMEOUT, header_callback=on_header,
                                streaming_callback=on_chunk)
        try:
            await AsyncHTTPClient().fetch(request)
        except HTTPClientError as e:
            if not head.get("sent"):
                if e.code == 599:  # no answer in time, or the connection dropped
                    self.count("unavailable")
                    raise not_answering(e) from None
                self.count("error")
                raise Refused(e.code, f"The lab assistant answered {e.code}: {e.message}") from None
        except OSError as e:
            if not head.get("sent"):
                self.count("unavailable")
                raise not_answering(e) from None
        self.count("ok" if head.get("code", 200) < 400 else "error")
        self.finish()


def api_handlers() -> list[tuple[str, type]]:
    return [
        (r"/api/gpulab/assistant", AssistantStatusHandler),
        (r"/api/gpulab/assistant/v1/models", ModelsHandler),
        (r"/api/gpulab/assistant/v1/chat/completions", ChatCompletionsHandler),
    ]
