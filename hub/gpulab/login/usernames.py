"""Lab usernames: what a valid one looks like and how a typed one is normalised.

Standard library only, so that processes outside the hub (the SSH gateway,
:mod:`gpulab.ssh`) normalise exactly as the hub's login does (:mod:`gpulab.login.auth`).
"""

from __future__ import annotations

import re
import unicodedata

# 1-32 characters: lowercase letters and digits, with single ".", "_" or "-" between
# them. No leading/trailing punctuation, so "." and ".." and "-x" are impossible.
USERNAME_PATTERN = r"^(?=.{1,32}\Z)[a-z0-9]+(?:[._-][a-z0-9]+)*\Z"
USERNAME_RULES = (
    "A username is 1 to 32 characters: lowercase letters a-z and digits, with single "
    "'.', '_' or '-' between them (for example alice or j.smith)."
)
_VALID = re.compile(USERNAME_PATTERN)


def fold(raw: str | None) -> str:
    """``" Ａlice "`` -> ``"Alice"``: compatibility forms (full-width letters) fold to
    their plain letters (NFKC) and surrounding space goes. JupyterHub lowercases next."""
    return unicodedata.normalize("NFKC", raw or "").strip()


def normalize(raw: str | None) -> str:
    """What the hub's login makes of a typed username: folded, then lowercased (as
    JupyterHub's ``Authenticator.normalize_username`` does; gpulab sets no username_map)."""
    return fold(raw).lower()


def is_valid(username: str) -> bool:
    return bool(_VALID.match(username))
