"""A small client for Prometheus' HTTP API (``/api/v1/query`` and ``query_range``).

Every failure, whether no answer, an HTTP error, or a query Prometheus refuses, is one
:class:`PrometheusUnavailable` whose message says what happened, for a log line or a
page.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

DEFAULT_URL = "http://prometheus:9090"


class PrometheusUnavailable(Exception):
    """Prometheus gave no usable answer; ``str(e)`` says why."""


class Prometheus:
    def __init__(self, url: str = DEFAULT_URL, timeout: float = 10.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    async def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant vector: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        return await self._get("query", params, expr)

    async def query_range(self, expr: str, start: float, end: float,
                          step: float) -> list[dict[str, Any]]:
        """A range matrix: ``[{"metric": {...}, "values": [[t, "v"], ...]}, ...]``."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                  "step": f"{step:g}"}
        return await self._get("query_range", params, expr)

    async def _get(self, endpoint: str, params: dict[str, str], expr: str) -> list[dict]:
        request = HTTPRequest(f"{self.url}/api/v1/{endpoint}?{urlencode(params)}",
                              request_timeout=self.timeout, connect_timeout=self.timeout,
                              headers={"Accept": "application/json"})
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as e:
            if e.code == 599:  # tornado's own: timed out or the connection dropped
                raise PrometheusUnavailable(f"Prometheus at {self.url} did not answer "
                                            f"within {self.timeout:g}s ({e})") from None
            reason = _error(e.response.body) if e.response is not None else None
            raise PrometheusUnavailable(
                f"Prometheus at {self.url} answered {e.code} to {expr!r}"
                + (f": {reason}" if reason else "")) from None
        except OSError as e:
            raise PrometheusUnavailable(f"Prometheus at {self.url} did not answer: {e}") from None
        try:
            data = json.loads(response.body)
            if data.get("status") != "success":
                raise PrometheusUnavailable(f"Prometheus could not run {expr!r}: "
                                            f"{data.get('error') or 'no status'}")
            result = data["data"]["result"]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise PrometheusUnavailable(f"Prometheus at {self.url}: not an API answer ({e})"
                                        ) from None
        if not isinstance(result, list):
            raise PrometheusUnavailable(f"Prometheus: {expr!r} is not a vector or matrix")
        return result


def _error(body: bytes) -> str | None:
    try:
        return str(json.loads(body).get("error"))
    except (ValueError, AttributeError):
        return None
