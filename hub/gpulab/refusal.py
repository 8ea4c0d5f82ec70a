"""A request that is not done: the HTTP status to answer and what the person is told.

Every part's refusals are one of these (the allocator's, an environment's, a booking's,
a lease release's, the members page's, the Docker proxy's), so that a shell turns any of
them into its answer the same way: ``status`` and ``message``."""

from __future__ import annotations


class Refusal(Exception):
    """``status``: the HTTP answer; ``message`` (also ``str(e)``): what she is told, safe
    to show her (never a secret, never a traceback)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message
