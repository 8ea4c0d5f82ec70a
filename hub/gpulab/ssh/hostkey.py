"""The gateway's SSH host key: made once, kept, and shown by its fingerprint.

``gpulab-ssh keygen --dir secrets/ssh`` (which ``make up`` runs in the hub image) makes
an Ed25519 key the first time and keeps it afterwards, so members' ``known_hosts``
entries stay valid across restarts and image rebuilds. The private key is mode 0600,
owned by the gateway's user (``--owner``; the folder it lies in, the host's
``secrets/``, is root's and 0700); the public key beside it is 0644, for admins who
hand members a ``known_hosts`` line.
"""

from __future__ import annotations

import os
from pathlib import Path

import asyncssh

KEY_FILE = "ssh_host_ed25519_key"


def ensure(directory: Path, owner: tuple[int, int] | None = None) -> tuple[str, str]:
    """``(what was done, SHA-256 fingerprint)`` after making sure the key exists."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / KEY_FILE
    if path.exists():
        key = asyncssh.read_private_key(str(path))
        done = "kept"
    else:
        key = asyncssh.generate_private_key("ssh-ed25519", comment="gpulab-ssh")
        tmp = path.with_name(path.name + ".new")
        fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.export_private_key())
        tmp.replace(path)
        done = "made"
    pub = path.with_name(path.name + ".pub")
    pub.write_bytes(key.export_public_key())
    os.chmod(pub, 0o644)
    if owner is not None:
        os.chown(path, *owner)
    os.chmod(path, 0o600)
    return done, key.get_fingerprint("sha256")


def known_hosts_line(public_key: str, host: str, port: int) -> str:
    """The ``known_hosts`` line for *public_key* (``ssh-ed25519 AAAA... comment``)."""
    kind, data = public_key.split()[:2]
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {kind} {data}\n"
