"""Docker API bodies read the way dockerd reads them: the pieces the Docker proxy's
policies share (:mod:`gpulab.dockerapi.policy` for containers, :mod:`gpulab.dockerapi.swarm_policy`
for Swarm services). Pure: no I/O.

dockerd decodes bodies with Go's ``encoding/json``, which merges duplicated objects and
matches field names case-insensitively (with Unicode folding), so :func:`strict_json`
refuses anything but strict JSON, and a :data:`Check` built with :func:`obj` allows only
keys spelled exactly as listed, at every level, with their JSON types checked. A check
takes ``(value, where)`` and returns the reasons it refuses the value (``[]``: fine).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

INT64_MAX = 2**63 - 1

NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"  # Docker's container, volume and network names
REF = re.compile(NAME)
_USER = re.compile(r"[1-9][0-9]{0,9}(:[1-9][0-9]{0,9})?")
BIND = re.compile(rf"({NAME}):(/[^:]*)(?::(ro|rw))?")
SIGNAL = re.compile(r"[A-Za-z0-9+]{1,16}")
# An image reference: an optional registry (host[:port]/, e.g. a lab-local registry's),
# the repository, a tag, a digest.
REGISTRY = r"[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?/"
IMAGE = re.compile(rf"({REGISTRY})?[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?"
                   r"(@sha256:[0-9a-f]{64})?")
IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")  # what Docker calls an image's "Id"
# With the NVIDIA toolkit's volume-mount strategy a mount here selects GPUs.
_GPU_SELECTING_PATHS = ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices")


class BodyError(ValueError):
    """The body is not strict JSON (dockerd might read it differently than we do)."""


# ---------------------------------------------------------------- strict JSON


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BodyError(f"duplicate key {key!r} (dockerd would merge or override them)")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise BodyError(f"{name} is not a JSON number")


def _valid_strings(value: Any) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BodyError(f"string {value!r} holds a lone surrogate") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _valid_strings(k)
            _valid_strings(v)
    elif isinstance(value, list):
        for v in value:
            _valid_strings(v)


def strict_json(body: bytes) -> Any:
    """Parse *body* as strict JSON or raise :class:`BodyError` saying why."""
    try:
        value = json.loads(body.decode("utf-8"), object_pairs_hook=_no_duplicates,
                           parse_constant=_no_constant)
    except BodyError:
        raise
    except RecursionError:
        raise BodyError("nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise BodyError(f"not valid JSON: {e}") from None
    _valid_strings(value)
    return value


# ---------------------------------------------------------------- value checks
# A check takes (value, where) and returns the reasons it refuses the value ([] = fine).

Check = Callable[[Any, str], list[str]]


def _json_type(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object", type(None): "null"}.get(type(value), "?")


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def obj(fields: Mapping[str, Check], required: Iterable[str] = (),
        unknown: str = "gpulab's containers never need it") -> Check:
    """A JSON object whose keys are exactly (by spelling) among *fields*; *unknown* says
    why any other key is refused."""
    required = tuple(required)

    def check(value: Any, where: str) -> list[str]:
        if not isinstance(value, dict):
            return [f"{where or 'body'}: expected an object, got {_json_type(value)}"]
        reasons = []
        for key, item in value.items():
            if key in fields:
                reasons += fields[key](item, _at(where, key))
                continue
            near = [k for k in fields if k.casefold() == key.casefold()]
            hint = (f"keys are matched exactly; did you mean {near[0]!r}?" if near
                    else unknown)
            reasons.append(f"{where or 'body'}: key {key!r} is not allowed ({hint})")
        reasons += [f"{where or 'body'}: {key!r} is required" for key in required
                    if key not in value]
        return reasons

    check.fields = fields  # for the tests and the docs
    return check


def mapping(key: re.Pattern, key_means: str, value: Check) -> Check:
    """A free-form map (Docker's type is a map): keys matching *key*, values *value*."""
    def check(v: Any, where: str) -> list[str]:
        if not isinstance(v, dict):
            return [f"{where}: expected an object, got {_json_type(v)}"]
        reasons = []
        for k, item in v.items():
            if not key.fullmatch(k):
                reasons.append(f"{where}: key {k!r} is not {key_means}")
            reasons += value(item, f"{where}[{k!r}]")
        return reasons
    return check


def array(item: Check, min_items: int = 0, max_items: int = 1000) -> Check:
    def check(v: Any, where: str) -> list[str]:
        if not isinstance(v, list):
            return [f"{where}: expected a list, got {_json_type(v)}"]
        if not min_items <= len(v) <= max_items:
            return [f"{where}: expected {min_items} to {max_items} items, got {len(v)}"]
        return [r for i, x in enumerate(v) for r in item(x, f"{where}[{i}]")]
    return check


def text(pattern: re.Pattern | None = None, means: str = "", max_len: int = 65536) -> Check:
    def check(v: Any, where: str) -> list[str]:
        if not isinstance(v, str):
            return [f"{where}: expected a string, got {_json_type(v)}"]
        if len(v) > max_len or (pattern is not None and not pattern.fullmatch(v)):
            return [f"{where}: {v[:200]!r} is not {means}"]
        return []
    return check


def integer(minimum: int, maximum: int = INT64_MAX) -> Check:
    def check(v: Any, where: str) -> list[str]:
        if type(v) is not int:
            return [f"{where}: expected an integer, got {_json_type(v)}"]
        if not minimum <= v <= maximum:
            return [f"{where}: {v} is out of range ({minimum} to {maximum})"]
        return []
    return check


def boolean(v: Any, where: str) -> list[str]:
    return [] if type(v) is bool else [f"{where}: expected a boolean, got {_json_type(v)}"]


def _canonical(v: Any) -> str:
    return json.dumps(v, sort_keys=True)


def exactly(*choices: Any, why: str = "") -> Check:
    """One of *choices*, compared as JSON (so ``false`` is not ``0``)."""
    allowed = {_canonical(c) for c in choices}
    expected = " or ".join(_canonical(c) for c in choices)

    def check(v: Any, where: str) -> list[str]:
        if _canonical(v) in allowed:
            return []
        return [f"{where}: {why + ': ' if why else ''}must be {expected}, "
                f"got {_canonical(v)[:200]}"]
    return check


def either(*checks: Check) -> Check:
    def check(v: Any, where: str) -> list[str]:
        results = [c(v, where) for c in checks]
        return [] if any(not r for r in results) else results[-1]
    return check


def abs_path(v: Any, where: str) -> list[str]:
    if not isinstance(v, str):
        return [f"{where}: expected a path, got {_json_type(v)}"]
    parts = v.split("/")
    if (not v.startswith("/") or v == "/" or ":" in v or "\x00" in v or len(v) > 4096
            or any(p in (".", "..") for p in parts)):
        return [f"{where}: {v[:200]!r} is not an absolute path inside the container"]
    if any(v == p or v.startswith(p + "/") for p in _GPU_SELECTING_PATHS):
        return [f"{where}: {v!r} would select GPUs through the NVIDIA runtime"]
    return []


def user(v: Any, where: str) -> list[str]:
    if isinstance(v, str) and _USER.fullmatch(v) and all(
            int(x) < 2**31 for x in v.split(":")):
        return []
    return [f"{where}: containers must run as a numeric non-root user uid[:gid] (not 0, "
            f"no leading zeros), got {v!r}"]


def bind(v: Any, where: str) -> list[str]:
    m = BIND.fullmatch(v) if isinstance(v, str) else None
    if not m:
        return [f"{where}: {v!r} is not a named volume 'name:/path[:ro|:rw]' (host paths "
                f"and other options are not allowed)"]
    return abs_path(m.group(2), where)


COUNT = integer(0)
SIZE = integer(1)
STRINGS = array(text())
HEALTHCHECK = obj({
    "Test": STRINGS, "Interval": COUNT, "Timeout": COUNT, "StartPeriod": COUNT,
    "Retries": COUNT,
})


def normal_image(ref: str) -> str:
    """``gpulab/singleuser`` -> ``gpulab/singleuser:latest``; ``docker.io/library/x`` -> ``x``."""
    name, at, digest = ref.partition("@")
    for prefix in ("docker.io/", "library/"):
        name = name.removeprefix(prefix)
    if not at and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name + at + digest
