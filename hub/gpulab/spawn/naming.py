"""Docker-safe, collision-free names for users' containers and volumes.

Docker names allow ``[a-zA-Z0-9][a-zA-Z0-9_.-]*``; volume and container names must be
unique per host. JupyterHub usernames can be anything (unicode, dots, ``--``), so a
name that is already a plain lowercase slug is kept as it is (``alice`` ->
``alice``), and any other is reduced to a readable slug plus ``---`` and a hash of the
original (``Zoë.K`` -> ``zo-k---1b2c3d4e``). Plain slugs never contain ``--``, so a
hashed name can never equal a plain one, and two different usernames never share a
name (up to a 32-bit hash prefix collision, which is checked by the tests' table).
"""

from __future__ import annotations

import hashlib
import re

from gpulab.contract import USER_CONTAINER_PREFIX

_PLAIN = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?!-))*")
MAX_SLUG = 48  # leaves room for prefixes/suffixes within docker's and DNS's limits
MAX_NAME = 63  # a Swarm service's name, and a DNS label: the longest a container's may be


def _hash(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]


def safe_slug(name: str, max_length: int = MAX_SLUG) -> str:
    """A lowercase DNS-label-safe slug for *name*, unique per distinct *name*."""
    if len(name) <= max_length and _PLAIN.fullmatch(name) and not name.endswith("-"):
        return name
    readable = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    readable = re.sub(r"-+", "-", readable)[: max_length - 11].strip("-") or "x"
    return f"{readable}---{_hash(name)}"


def container_name(username: str, servername: str = "") -> str:
    """``gpulab-user-alice``, or ``gpulab-user-alice--train`` for alice's named server
    'train'. The prefix keeps every username clear of the stack's own container names
    (a user called ``hub`` must not become ``gpulab-hub``)."""
    name = f"{USER_CONTAINER_PREFIX}{safe_slug(username)}"
    if servername:
        name += f"--{safe_slug(servername)}"
    if len(name) > MAX_NAME:  # a long username with a named server: both parts shortened
        room = (MAX_NAME - len(USER_CONTAINER_PREFIX) - 2) // 2
        name = f"{USER_CONTAINER_PREFIX}{safe_slug(username, room)}--{safe_slug(servername, room)}"
    return name


def volume_name(template: str, username: str, servername: str = "") -> str:
    """Render a volume name template (``gpulab-home-{username}``) with safe slugs."""
    return template.format(
        username=safe_slug(username),
        servername=safe_slug(servername) if servername else "",
    )


_SLUG = r"[a-z0-9][a-z0-9-]*"  # what safe_slug can return, plain or hashed


def home_volume_pattern(template: str) -> re.Pattern:
    """Every name :func:`volume_name` can give *template*, and no other (the Docker
    proxy lets the hub create only those volumes)."""
    parts = re.split(r"(\{username\}|\{servername\})", template)
    return re.compile("".join(
        _SLUG if p == "{username}" else f"(?:{_SLUG})?" if p == "{servername}"
        else re.escape(p) for p in parts))
