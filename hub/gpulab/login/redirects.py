"""Where a user may be sent after signing in.

JupyterHub's ``BaseHandler._validate_next_url`` already refuses most external
redirects; :func:`safe_next_url` is a second, stricter line that the login handler
applies to the URL JupyterHub chose. It accepts only a plain path under the hub's
``base_url`` and falls back to the hub's home page for anything else.
"""

from __future__ import annotations

import unicodedata
from urllib.parse import unquote, urlsplit


def home_url(base_url: str) -> str:
    return base_url.rstrip("/") + "/hub/home"


def _has_unsafe_char(url: str) -> bool:
    # Browsers drop tabs and newlines inside URLs and treat "\" as "/", so
    # "/\t/evil" and "/\evil" both become "//evil": refuse every such character
    # rather than guess what a browser will make of it.
    for ch in url:
        if ch == "\\" or ch.isspace():
            return True
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            return True
    return False


def safe_next_url(next_url: str | None, base_url: str = "/", default: str | None = None) -> str:
    """*next_url* if it is a path on this hub, else *default* (the hub's home page).

    Accepted: a path that starts with exactly one "/", lies under *base_url* (the
    JupyterHub ``base_url``, e.g. "/" or "/lab/"), has no "." or ".." segments (also
    not percent-encoded) and no control, whitespace or backslash characters. The
    accepted URL is returned unchanged, query and fragment included.

    Refused (returns *default*): ``https://evil``, ``//evil``, ``///evil``,
    ``\\\\evil``, ``/\\evil``, ``javascript:...``, ``relative/path``, anything with a
    scheme or host, and paths outside *base_url*.
    """
    if default is None:
        default = home_url(base_url)
    if not next_url or not isinstance(next_url, str):
        return default
    if _has_unsafe_char(next_url):
        return default
    if not next_url.startswith("/") or next_url.startswith("//"):
        return default
    parts = urlsplit(next_url)
    if parts.scheme or parts.netloc:
        return default
    path = unquote(parts.path)
    if path.startswith("//") or any(
        ch == "\\" or unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in path
    ):
        # percent-encoded tricks: "/%2F/evil", "/%09/evil", "/%5Cevil" (a plain
        # encoded space, "/gpu%20box", is fine)
        return default
    if any(segment in (".", "..") for segment in path.split("/")):
        return default
    prefix = "/" + base_url.strip("/")
    if prefix != "/" and not (path == prefix or path.startswith(prefix + "/")):
        return default
    return next_url
