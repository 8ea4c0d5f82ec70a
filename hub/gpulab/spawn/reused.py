"""The options of a member's last start, when JupyterHub starts her server with them
again: pure.

JupyterHub keeps the options of each start and uses them for the next one that gives
none (the spawn page when there is no form, a REST start without a body:
:func:`gpulab.compat.options_reused`). What she could choose then may be gone now: the
lab's GPUs (a driver failure empties the inventory), her GPU access, an environment. With
no form there is nothing to choose again, and she would be refused for good with
"You asked for 1 GPU" for a start in which she asked for nothing. So only what she could
still choose is kept; the rest is dropped, and she is told.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any


def still_choosable(options: Mapping[str, Any], *, gpus_offered: bool,
                    environments: Collection[str]) -> tuple[dict[str, Any], list[str]]:
    """*options* of her last start, with what she cannot choose now dropped, and what
    to tell her about it. *gpus_offered*: whether she could ask for GPUs now (the lab has
    GPUs for her); *environments*: the names open to her now. Waiting in line is never
    carried over: she waits when she asks to."""
    kept = dict(options)
    said = []
    kept.pop("wait", None)
    asked = kept.get("gpus")
    if not gpus_offered and asked not in (None, 0, "0", ""):
        kept["gpus"] = 0
        said.append(f"Starting without GPUs: your last start asked for {asked}, and no "
                    f"GPU is available to you now.")
    env = kept.get("environment")
    if env is not None and env not in environments:
        del kept["environment"]
        said.append(f"Starting in your first environment: {env!r}, which your last start "
                    f"used, is not open to you now.")
    return kept, said
