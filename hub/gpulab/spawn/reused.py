"""The options of a member's last start, when JupyterHub starts her server with them
again: pure.

JupyterHub keeps the options of each start and uses them for the next one that gives
none (the spawn page when there is no form, a REST start without options:
:func:`gpulab.compat.options_reused`). What she could choose then may be gone now: the
lab's GPUs (a driver failure empties the inventory), her GPU access or quota, an
environment. With no form there is nothing to choose again, and she would be refused
for good, "You asked for 1 GPU", for a start in which she asked for nothing. So only what
she could still choose is kept; the rest is brought within what she may have now, and
she is told.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def still_choosable(options: Mapping[str, Any], *, most_gpus: int,
                    environments: Sequence[tuple[str, bool]]
                    ) -> tuple[dict[str, Any], list[str]]:
    """*options* of her last start, brought within what she may choose now, and what to
    tell her about it. *most_gpus*: the most GPUs she could ask for now (0: none for
    her, or none in the lab); *environments*: those open to her now, in order, as
    ``(name, whether its servers may have GPUs)``. Waiting in line is never carried
    over (nor where she is told of her turn): she waits when she asks to. Nor are fewer
    CPUs or less memory: she gets all that her GPUs bring, which the lab may have
    lowered since, so a start in which she asked for nothing is never refused for them.
    Nor is a job's command: a job's server started again is a notebook server, not a
    second run."""
    kept = dict(options)
    said = []
    for once in ("wait", "email", "cpus", "memory", "job"):
        kept.pop(once, None)
    env = kept.get("environment")
    names = [name for name, _ in environments]
    if env is not None and env not in names:
        del kept["environment"]
        said.append(f"Starting in your first environment: {env!r}, which your last start "
                    f"used, is not open to you now.")
    chosen = kept.get("environment", names[0] if names else None)
    if chosen is not None and not dict(environments).get(chosen, True):
        most_gpus = 0  # an environment whose servers run without GPUs
    asked = kept.get("gpus")
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > most_gpus:
        kept["gpus"] = most_gpus
        said.append(f"Starting with {most_gpus or 'no'} GPU{'' if most_gpus == 1 else 's'}: "
                    f"your last start asked for {asked}, and "
                    + ("no GPU is available to you now." if not most_gpus else
                       f"you may have at most {most_gpus} now."))
    return kept, said
