"""Environments members choose from (``spawn.environments``): pure decisions.

An admin lists them in gpulab.yaml (``spawn.environments``: name, image, description,
whether GPUs may be asked for, which JupyterHub groups may use it, and optionally the
CPUs and memory of its servers, with gpus.yaml's keys: ``cpus``, ``memory``, their
``_per_gpu`` and ``max_``, which replace gpus.yaml's for its servers within her own caps:
gpulab.gpus.policy.in_environment); without the list the
lab has one, ``spawn.image``. A member picks one on the spawn form or with
``{"environment": NAME}`` through the REST API; the hub starts her server from its image,
and the Docker proxy lets exactly the listed images run (:func:`lab_images`). The image is
read at each start, so a changed image takes effect at a member's next start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpulab.refusal import Refusal
from gpulab.sizes import RESOURCE_CHECKS, RESOURCE_KEYS, base_above_cap

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,39}")
KEYS = ("name", "image", "description", "gpus", "groups", *RESOURCE_KEYS)


@dataclass(frozen=True)
class Environment:
    name: str
    image: str
    description: str = ""
    gpus: bool = True  # whether a server of it may have GPUs
    groups: tuple[str, ...] = ()  # JupyterHub groups that may use it; () = every member
    # CPUs and memory of its servers (gpulab.sizes.RESOURCE_KEYS), as (key, value) pairs;
    # () = gpus.yaml's
    resources: tuple[tuple[str, float], ...] = ()

    def label(self) -> str:
        """How the spawn form names it."""
        words = self.name + (f": {self.description}" if self.description else "")
        return words if self.gpus else f"{words} (no GPU)"


class EnvironmentError_(ValueError):  # noqa: N801 (OSError's EnvironmentError is a builtin)
    """A bad ``spawn.environments`` entry; *where* is its index and key, for file:line."""

    def __init__(self, where: tuple, message: str):
        super().__init__(message)
        self.where = where


class EnvironmentRefused(Refusal):
    """A member's choice refused; ``str(e)`` is safe to show her."""


def parse_environments(value: Any) -> tuple[Environment, ...]:
    """The ``spawn.environments`` list from YAML, checked entry by entry."""
    if value in (None, []):
        return ()
    if not isinstance(value, list):
        raise ValueError("expected a list of environments, each with a name and an image "
                         "(and optionally description, gpus, groups, cpus, memory and "
                         "their _per_gpu and max_)")
    found: list[Environment] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise EnvironmentError_((i,), f"expected a mapping with name and image, got {item!r}")
        unknown = sorted(str(k) for k in item if k not in KEYS)
        if unknown:
            raise EnvironmentError_((i, unknown[0]), f"unknown key {unknown[0]!r}; an "
                                    f"environment has {', '.join(KEYS)}")
        name = item.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise EnvironmentError_((i, "name"), "expected a name of lower-case letters, "
                                    f"digits, '.', '_' or '-' (at most 40), got {name!r}")
        if any(e.name == name for e in found):
            raise EnvironmentError_((i, "name"), f"{name!r} is listed twice")
        image = item.get("image")
        if not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image):
            raise EnvironmentError_((i, "image"), f"expected an image name such as "
                                    f"gpulab/singleuser:latest, got {image!r}")
        description = item.get("description", "")
        if not isinstance(description, str):
            raise EnvironmentError_((i, "description"), f"expected text, got {description!r}")
        gpus = item.get("gpus", True)
        if not isinstance(gpus, bool):
            raise EnvironmentError_((i, "gpus"), f"expected true or false, got {gpus!r}")
        groups = item.get("groups", [])
        if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
            raise EnvironmentError_((i, "groups"), "expected a list of JupyterHub group "
                                    f"names ([] for every member), got {groups!r}")
        sizes = {}
        for key in RESOURCE_KEYS:
            if key in item:
                try:
                    sizes[key] = RESOURCE_CHECKS[key](item[key])
                except ValueError as e:
                    raise EnvironmentError_((i, key), str(e)) from None
        base = base_above_cap(sizes)
        if base is not None:
            raise EnvironmentError_((i, base), f"{base}: {item[base]} is more than "
                                               f"max_{base}: {item[f'max_{base}']} here")
        found.append(Environment(name, image, description.strip(), gpus, tuple(groups),
                                 tuple(sizes.items())))
    return tuple(found)


def lab_environments(settings: Mapping[str, Any]) -> tuple[Environment, ...]:
    """The lab's environments: the list, or the one of ``spawn.image``."""
    listed = settings["spawn.environments"]
    return listed or (Environment("default", settings["spawn.image"]),)


def lab_images(settings: Mapping[str, Any]) -> tuple[str, ...]:
    """Every image a member's server may run (the Docker proxy's list)."""
    return tuple(dict.fromkeys(e.image for e in lab_environments(settings)))


def open_to(envs: Iterable[Environment], groups: Iterable[str],
            is_admin: bool) -> tuple[Environment, ...]:
    """The environments a member may use: those for every member, those of her groups;
    an admin may use all."""
    mine = set(groups)
    return tuple(e for e in envs if is_admin or not e.groups or mine & set(e.groups))


def choose(settings: Mapping[str, Any], options: Any, groups: Iterable[str],
           is_admin: bool) -> Environment:
    """The environment ``user_options`` ask for (the first open to her when they name
    none); :class:`EnvironmentRefused` for anything else, naming what she may choose."""
    envs = open_to(lab_environments(settings), groups, is_admin)
    if not envs:
        raise EnvironmentRefused(403, "No environment of this lab is open to you (each is "
                                      "for some groups only); ask an admin.")
    name = options.get("environment") if isinstance(options, Mapping) else None
    if name is None:
        return envs[0]
    choices = "; ".join(e.label() for e in envs)
    if not isinstance(name, str):
        raise EnvironmentRefused(400, f"\"environment\" must be the name of one, got "
                                      f"{name!r}. Yours: {choices}.")
    for env in envs:
        if env.name == name:
            return env
    raise EnvironmentRefused(400, f"No environment {name!r} is open to you. Yours: "
                                  f"{choices}.")


def gpu_count(env: Environment, count: int | None, from_form: bool) -> int | None:
    """The GPU count for a server of *env*: unchanged for an environment with GPUs; for
    one without, 0 (the spawn form's GPU choice does not apply to it), and a 400 for a
    REST request that asks it for GPUs."""
    if env.gpus:
        return count
    if count and not from_form:
        raise EnvironmentRefused(400, f"The environment {env.name!r} runs without GPUs: "
                                      f"ask for \"gpus\": 0, or choose another environment.")
    return 0


def with_environment(settings: Any, env: Environment) -> Any:
    """*settings* (:class:`gpulab.settings.Settings`, which imports this module to parse
    ``spawn.environments``) as the spawn of a server of *env* reads them: its image."""
    return settings.with_values({"spawn.image": env.image})
