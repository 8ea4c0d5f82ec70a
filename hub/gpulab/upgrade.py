"""What an upgrade changes in a lab's configuration (``make upgrade``, scripts/upgrade.sh).

The settings each version knows are read from what its ``gpulab config describe`` prints
(every version since the first has it), so that the version running now needs no code of
this one: the upgrade runs ``describe`` in the image it replaces, and this compares.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

_ENTRY = re.compile(r"^(\S+) \(default: (.*)\)$")


@dataclass(frozen=True)
class Described:
    default: str  # as describe prints it (Python's repr)
    help: str


def parse_describe(text: str) -> dict[str, Described]:
    """``gpulab config describe``'s output -> {key: Described}. A line that is neither an
    entry nor its indented help is an error: the text is not what describe prints."""
    out: dict[str, Described] = {}
    key = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        entry = _ENTRY.match(line)
        if entry:
            key = entry.group(1)
            out[key] = Described(entry.group(2), "")
        elif line.startswith((" ", "\t")) and key is not None:
            before = out[key]
            out[key] = Described(before.default, f"{before.help} {line.strip()}".strip())
        else:
            raise ValueError(f"line {number} is not what `gpulab config describe` prints: "
                             f"{line[:80]!r}")
    return out


def _first_sentence(text: str) -> str:
    sentence = re.split(r"(?<=\.)\s+(?=[A-Z`])", text, maxsplit=1)[0]
    return sentence if len(sentence) <= 160 else sentence[:157] + "..."


def config_changes(old: Mapping[str, Described], new: Mapping[str, Described],
                   set_here: Collection[str]) -> list[str]:
    """What the lab sees change, one line each: settings added (with their default),
    defaults changed (and whether this lab's gpulab.yaml, which sets *set_here*, gets the
    new one) and settings removed. Empty when nothing changed."""
    lines = []
    for key in new:
        if key not in old:
            lines.append(f"new setting {key} (default {new[key].default}): "
                         f"{_first_sentence(new[key].help)}")
    for key in new:
        if key in old and old[key].default != new[key].default:
            where = ("gpulab.yaml sets it: nothing changes here" if key in set_here else
                     f"gpulab.yaml does not set it: this lab now gets {new[key].default}")
            lines.append(f"{key}: the default changes from {old[key].default} to "
                         f"{new[key].default}; {where}")
    for key in old:
        if key not in new:
            lines.append(f"{key} is no longer a setting"
                         + (" (gpulab.yaml still sets it: remove it)" if key in set_here
                            else ""))
    return lines
