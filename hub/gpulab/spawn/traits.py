"""gpulab.yaml's settings on DockerSpawner's traits, and what an admin's own trait does.

At every spawn the spawner sets the DockerSpawner traits below from ``config/gpulab.yaml``
(read again at each spawn). An admin may also set one of them in the hub's config file,
as JupyterHub's documentation teaches (``c.DockerSpawner.mem_limit = "16G"``, or on
``GpulabSpawner``, ``GpulabSwarmSpawner`` or ``Spawner``). gpulab never overwrites such a
trait silently:

* **honoured**: the config file wins. Its value is checked as gpulab.yaml's would be and
  takes the setting's place for everything (the container, a Swarm service, the start
  timeout), gpulab.yaml's value is ignored, and the hub's log says so, naming both;
* **refused**, for a trait that carries what the Docker proxy or the lease needs (the
  image and network it allows, the GPUs' DeviceRequest, the lease labels, the
  hardening): a server cannot start (503, for an admin), and the message names the
  trait and the gpulab.yaml setting to use instead.

:data:`SPAWNER_TRAITS` is the mapping, as data (:func:`trait_values` gives each trait its
value); :func:`admin_traits` finds what the config file sets and
:func:`apply_admin_traits` decides. All pure. docs/architecture.md
says why the config file wins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulab.settings import SETTINGS, Settings
from gpulab.spawn.containers import ContainerOptions

__all__ = ["SPAWNER_TRAITS", "AdminTrait", "SpawnerTrait", "admin_traits", "apply_admin_traits",
           "trait_values"]


@dataclass(frozen=True)
class SpawnerTrait:
    name: str  # the trait gpulab sets at each spawn
    setting: str  # the gpulab.yaml setting it comes from
    refused: str = ""  # why an admin's own value cannot be used ("": it is, and wins)


SPAWNER_TRAITS: tuple[SpawnerTrait, ...] = (
    SpawnerTrait("mem_limit", "spawn.mem_limit"),
    SpawnerTrait("cpu_limit", "spawn.cpu_limit"),
    SpawnerTrait("start_timeout", "spawn.start_timeout"),
    SpawnerTrait("image", "spawn.image",
                 "the Docker proxy lets only spawn.image (or spawn.environments' images) "
                 "run, and reads them from gpulab.yaml"),
    SpawnerTrait("network_name", "spawn.network",
                 "the Docker proxy and gpulab-netguard allow only spawn.network, read from "
                 "gpulab.yaml"),
    SpawnerTrait("volumes", "spawn.home_volume",
                 "gpulab names each member's home volume and mounts the datasets read-only "
                 "(spawn.home_volume, spawn.home_path, spawn.datasets_volume, "
                 "spawn.datasets_path)"),
    SpawnerTrait("extra_host_config", "spawn.shm_size",
                 "it carries the leased GPUs' DeviceRequest and the hardening the Docker "
                 "proxy requires (spawn.shm_size and spawn.pids_limit set its sizes)"),
    SpawnerTrait("extra_create_kwargs", "spawn.image",
                 "it carries the lease labels and the user the server runs as"),
)
_SETTINGS = {s.key: s for s in SETTINGS}


def trait_values(settings: Settings, opts: ContainerOptions) -> dict[str, Any]:
    """What gpulab gives each trait of :data:`SPAWNER_TRAITS` at a spawn, from the
    spawn's settings (gpulab.yaml's, with the honoured traits in place) and the
    container options decided from them."""
    return {
        "mem_limit": opts.mem_limit,
        "cpu_limit": opts.cpu_limit,
        "start_timeout": settings["spawn.start_timeout"],
        "image": opts.image,
        "network_name": settings["spawn.network"],
        "volumes": opts.volumes,
        "extra_host_config": opts.host_config,
        "extra_create_kwargs": opts.create_kwargs,
    }


@dataclass(frozen=True)
class AdminTrait:
    trait: SpawnerTrait
    where: str  # "c.DockerSpawner.mem_limit": the most specific class that sets it
    value: Any  # as the config file gives it


def admin_traits(config: Mapping[str, Any], classes: Sequence[str]) -> tuple[AdminTrait, ...]:
    """The traits of :data:`SPAWNER_TRAITS` that *config* (the hub's traitlets config)
    sets for any of *classes* (the spawner's, most specific first, as traitlets reads
    them)."""
    found = []
    for trait in SPAWNER_TRAITS:
        for cls in classes:
            if cls in config and trait.name in config[cls]:
                found.append(AdminTrait(trait, f"c.{cls}.{trait.name}", config[cls][trait.name]))
                break
    return tuple(found)


def apply_admin_traits(settings: Settings, admin: Sequence[AdminTrait]
                       ) -> tuple[Settings, list[str], list[str]]:
    """``(settings, honoured, refused)``: *settings* with the honoured traits' values in
    place of gpulab.yaml's, and what the hub's log (or the refused spawn) says of each."""
    values = dict(settings)
    honoured, refused = [], []
    for a in admin:
        setting = _SETTINGS[a.trait.setting]
        if a.trait.refused:
            refused.append(f"{a.where} is set in the hub's config file, and gpulab cannot "
                           f"honour it: {a.trait.refused}. Remove it from the config file "
                           f"and set {setting.key} in gpulab.yaml instead")
            continue
        try:
            values[setting.key] = setting.parse(a.value)
        except ValueError as e:
            refused.append(f"{a.where} = {a.value!r} in the hub's config file: {e}")
            continue
        honoured.append(f"{a.where} = {a.value!r} in the hub's config file wins over "
                        f"{setting.key} = {settings[setting.key]!r} in {settings.source}, "
                        f"which is ignored for it")
    return Settings(values, settings.source), honoured, refused
