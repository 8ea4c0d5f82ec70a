"""The GPUs the lab assistant holds (gpulab.yaml's ``assistant.gpus``), as leases.

While ``assistant.model`` names a model, each GPU ``assistant.gpus`` names is held by
:data:`ASSISTANT`: the hub's lease table counts it as taken (so the allocator never
gives it to a member and the spawn form shows it in use), and the admins' lease page
shows it as the lab assistant's, not to be released. The container gets the devices
from ``make up`` (docker-compose.assistant-gpu.yml), which labels it so that the
exporter attributes its memory to the same holder. :func:`assistant_leases` is the
decision, pure; :func:`assistant_holds` reads the setting for a
:class:`~gpulab.gpus.leases.LeaseBook`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpulab import live_config
from gpulab.gpus.allocator import Gpu, Lease, pinned_gpus
from gpulab.gpus.config import Pin
from gpulab.settings import ConfigError

log = logging.getLogger(__name__)

# The holder's name in the lease table, the exporter's user label and the dashboard: no
# member can have it (gpulab.login.usernames: letters, digits and . _ - only).
ASSISTANT = "(lab assistant)"
ASSISTANT_SERVER = "assistant"


def assistant_gpus(settings: Any) -> tuple[int | str, ...]:
    """The GPUs the assistant holds by *settings*: ``assistant.gpus``, while
    ``assistant.model`` is set (an assistant that is off holds none)."""
    return tuple(settings["assistant.gpus"]) if settings["assistant.model"] else ()


def assistant_leases(refs: Sequence[int | str], inventory: Sequence[Gpu]
                     ) -> tuple[list[Lease], list[str]]:
    """A lease of each GPU *refs* names (indexes or UUIDs, as gpulab.yaml has them) that
    is in *inventory*, and a warning for each that is not."""
    leases, missing = [], []
    for ref in refs:
        found = pinned_gpus([Pin(ref)], inventory)
        if not found:
            missing.append(f"assistant.gpus: GPU {ref!r} is not one the hub can lease "
                           f"(not found, or not in config/gpus.yaml's inventory), so it "
                           f"is not held for the lab assistant")
        leases += [Lease(uuid, ASSISTANT, ASSISTANT_SERVER, None) for uuid in found]
    return leases, missing


def held_by_members(refs: Sequence[int | str], inventory: Sequence[Gpu],
                    leases: Sequence[Lease]) -> list[tuple[int | str, Lease]]:
    """Of the GPUs *refs* names, those a member's server holds now (*leases*: its
    container's labels), each with that lease. `make up` hands such a GPU to the
    assistant's container only after that server ends (the hub already holds it for the
    assistant, so it goes to no one else): no GPU is ever in two containers."""
    out: list[tuple[int | str, Lease]] = []
    for ref in refs:
        uuids = pinned_gpus([Pin(ref)], inventory)
        out += [(ref, le) for le in leases if le.gpu_uuid in uuids and le.user != ASSISTANT]
    return out


ServicesHold = Callable[[Sequence[Gpu]], list[Lease]]


def assistant_holds(settings_path: str | Path) -> ServicesHold:
    """The assistant's leases by the gpulab.yaml at *settings_path* (its last good
    version), read at each call; none while it was never valid. Each warning is logged
    once, when it first appears."""
    said: set[str] = set()

    def held(inventory: Sequence[Gpu]) -> list[Lease]:
        try:
            settings = live_config.settings_file.load(settings_path)
        except ConfigError:  # the hub refuses to start on it; others say so themselves
            return []
        leases, warnings = assistant_leases(assistant_gpus(settings), inventory)
        for w in set(warnings) - said:
            log.warning("%s", w)
        said.clear()
        said.update(warnings)
        return leases

    return held
