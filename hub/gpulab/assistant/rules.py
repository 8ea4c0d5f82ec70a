"""The lab assistant's decisions, pure: who may ask, how often, and what is forwarded.

The gateway (:mod:`gpulab.assistant.gateway`) calls these with the live settings; they
touch no network and no clock of their own.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The JupyterHub scope a token needs to ask the assistant: members hold it (the `user`
# role), and their servers' own tokens carry it (Spawner.server_token_scopes), so a
# notebook asks as its member with no key of its own. A token a member made with fewer
# scopes cannot.
ASSISTANT_SCOPE = "custom:gpulab:assistant"
ASSISTANT_SCOPE_HELP = "ask the lab assistant (gpulab.yaml assistant.*) as oneself"
WINDOW_SECONDS = 60.0
# What a chat request may say (OpenAI's chat API, as JupyterLab's assistant and OpenAI's
# clients send it); anything else is dropped, so that no option of the inference
# server's own (llama.cpp's n_predict, grammar, slot ids ...) gets past the lab's caps.
CHAT_KEYS = frozenset({
    "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "stop", "presence_penalty", "frequency_penalty", "seed", "n",
    "response_format", "tools", "tool_choice", "logprobs", "top_logprobs", "user"})


class Refused(Exception):
    """A request the gateway answers itself: *status* and the reason, for the member."""

    def __init__(self, status: int, reason: str, retry_after: int | None = None):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after


def refusal(settings: Mapping[str, Any], groups: Iterable[str], is_admin: bool) -> Refused | None:
    """Why this member may not ask the assistant now (None: she may)."""
    if not settings["assistant.model"]:
        return Refused(503, "The lab assistant is off: this lab's gpulab.yaml names no "
                            "model (assistant.model). Ask an admin.")
    allowed = settings["assistant.groups"]
    if allowed and not is_admin and not set(groups) & set(allowed):
        return Refused(403, "The lab assistant is open to the groups "
                            f"{', '.join(allowed)} only, and you are in none of them. "
                            "Ask an admin to add you.")
    return None


class RateWindow:
    """At most *limit* requests per member in any WINDOW_SECONDS (a sliding window of
    the times of her admitted requests), in this process's memory."""

    def __init__(self) -> None:
        self._times: dict[str, deque[float]] = {}

    def take(self, user: str, now: float, limit: int) -> Refused | None:
        times = self._times.setdefault(user, deque())
        while times and times[0] <= now - WINDOW_SECONDS:
            times.popleft()
        if len(times) >= limit:
            wait = max(1, math.ceil(times[0] + WINDOW_SECONDS - now))
            return Refused(429, f"You have sent the lab assistant {limit} requests in the "
                                f"last minute, this lab's limit "
                                f"(assistant.requests_per_minute): try again in {wait} s.",
                           retry_after=wait)
        times.append(now)
        return None


@dataclass(frozen=True)
class Forward:
    """What goes to the inference server: the body, and whether the answer streams."""
    body: bytes
    stream: bool


def chat_request(raw: bytes, max_tokens: int, model: str | None = None) -> Forward:
    """A member's chat completion request, checked, its answer's length capped at
    *max_tokens* (asked for more, or for no limit: the cap), one answer per request,
    only OpenAI's keys (:data:`CHAT_KEYS`); the model name is the lab's, whatever she
    sent: *model* (an endpoint of the lab's that may serve several), or none (the
    stack's own server has one)."""
    try:
        body = json.loads(raw or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Refused(400, f"The request body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise Refused(400, "Expected a JSON object such as "
                           '{"messages": [{"role": "user", "content": "..."}]}')
    messages = body.get("messages")
    if (not isinstance(messages, list) or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)):
        raise Refused(400, "Expected \"messages\": a non-empty list of "
                           '{"role": ..., "content": ...} objects')
    body = {k: v for k, v in body.items() if k in CHAT_KEYS}
    if body.get("n", 1) != 1:
        raise Refused(400, f"\"n\" must be 1: the lab assistant gives one answer per "
                           f"request, got {body['n']!r}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise Refused(400, f"\"stream\" must be true or false, got {stream!r}")
    for key in ("max_tokens", "max_completion_tokens"):
        asked = body.pop(key, None)
        if asked is not None and (isinstance(asked, bool) or not isinstance(asked, int)
                                  or asked <= 0):
            raise Refused(400, f"\"{key}\" must be a positive whole number, got {asked!r}")
        if asked is not None:
            max_tokens = min(max_tokens, asked)
    body["max_tokens"] = max_tokens
    if model:
        body["model"] = model
    return Forward(json.dumps(body).encode(), stream)
