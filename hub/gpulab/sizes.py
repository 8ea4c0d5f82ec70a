"""CPUs and memory as gpulab's config files write them: sizes ("8g", "512m"), CPU counts,
and the checks of a server's CPU and memory keys (``cpus``, ``memory``, their
``_per_gpu`` and ``max_``), one set for gpus.yaml (defaults, groups, users) and
gpulab.yaml's environments.

Standard library only, and no gpulab import: settings, the GPU config and the
environments all use it (settings imports the environments, which therefore cannot
import settings).
"""

from __future__ import annotations

import re
from typing import Any

# A server's CPUs and memory: what a server without GPUs gets, what each GPU adds, and
# the most any one server gets.
CPU_KEYS = ("cpus", "cpus_per_gpu", "max_cpus")
MEMORY_KEYS = ("memory", "memory_per_gpu", "max_memory")
RESOURCE_KEYS = (*CPU_KEYS, *MEMORY_KEYS)
MAX_CPUS_LIMIT = 1024  # far above any one machine; catches 4000 for 4

_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_bytes(value: Any) -> int:
    """'2g', '512m', '1.5G', 2147483648 -> bytes (binary units, as docker uses)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 2g or 512m, got {value!r}")
    if isinstance(value, int) and value > 0:
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(value), re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"expected a size such as 2g or 512m, got {value!r}")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def bytes_text(size: int) -> str:
    """2147483648 -> '2g', 1536 * 1024**2 -> '1536m': the largest unit that divides it."""
    for unit in ("t", "g", "m", "k"):
        if size % _SIZE_UNITS[unit] == 0:
            return f"{size // _SIZE_UNITS[unit]}{unit}"
    return str(size)


def check_cpus(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 < value <= MAX_CPUS_LIMIT):
        raise ValueError(f"expected a number of CPUs above 0 and at most {MAX_CPUS_LIMIT} "
                         f"(0.5 is half a core), got {value!r}")
    return float(value)


def check_cpus_per_gpu(value: Any) -> float:
    return 0.0 if value == 0 and not isinstance(value, bool) else check_cpus(value)


def check_memory(value: Any) -> int:
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError(f"expected a size with its unit, such as 8g or 512m, got {value!r}")
    return parse_bytes(value)


def check_memory_per_gpu(value: Any) -> int:
    return 0 if value == 0 and not isinstance(value, bool) else check_memory(value)


RESOURCE_CHECKS = {"cpus": check_cpus, "cpus_per_gpu": check_cpus_per_gpu,
                   "max_cpus": check_cpus, "memory": check_memory,
                   "memory_per_gpu": check_memory_per_gpu, "max_memory": check_memory}


def base_above_cap(values: dict[str, Any]) -> str | None:
    """Which of *values*' bases (cpus, memory) is above its own cap here, if one is."""
    for base, cap in (("cpus", "max_cpus"), ("memory", "max_memory")):
        if base in values and cap in values and values[base] > values[cap]:
            return base
    return None
