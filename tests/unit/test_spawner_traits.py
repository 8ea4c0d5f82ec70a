"""gpulab.yaml's settings on DockerSpawner's traits (gpulab.spawn.traits): every trait the
spawner sets is declared, an admin's own config-file trait is honoured (the config file
wins, gpulab.yaml's value is ignored and the log says so) or refused with what to set
instead, and never silently overwritten; on the real GpulabSpawner."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from tornado import web
from traitlets.config import Config

from gpulab.settings import SETTINGS, defaults, parse_bytes
from gpulab.spawn.containers import container_options
from gpulab.spawn.spawner import GpulabSpawner
from gpulab.spawn.swarm_spawner import GpulabSwarmSpawner
from gpulab.spawn.traits import (
    SPAWNER_TRAITS,
    AdminTrait,
    admin_traits,
    apply_admin_traits,
    trait_values,
)

CLASSES = ["GpulabSpawner", "DockerSpawner", "Spawner"]
BY_NAME = {t.name: t for t in SPAWNER_TRAITS}


def config(**sections) -> Config:
    c = Config()
    for cls, traits in sections.items():
        for name, value in traits.items():
            setattr(getattr(c, cls), name, value)
    return c


def test_every_trait_the_spawner_sets_is_declared_with_its_setting():
    values = trait_values(defaults(), container_options(defaults(), "ann"))
    assert set(values) == set(BY_NAME)
    assert {t.setting for t in SPAWNER_TRAITS} <= {s.key for s in SETTINGS}
    assert {t.name for t in SPAWNER_TRAITS if not t.refused} == {
        "mem_limit", "cpu_limit", "start_timeout"}


def test_the_config_files_traits_are_found_on_the_most_specific_class():
    c = config(DockerSpawner={"mem_limit": "16G", "image": "mine", "remove": True},
               GpulabSpawner={"mem_limit": "32G"}, Spawner={"start_timeout": 600})
    assert admin_traits(c, CLASSES) == (
        AdminTrait(BY_NAME["mem_limit"], "c.GpulabSpawner.mem_limit", "32G"),
        AdminTrait(BY_NAME["start_timeout"], "c.Spawner.start_timeout", 600),
        AdminTrait(BY_NAME["image"], "c.DockerSpawner.image", "mine"))
    assert admin_traits(Config(), CLASSES) == ()
    assert "GpulabSpawner" not in Config() and admin_traits(Config(), ["Nowhere"]) == ()


def test_an_honoured_trait_wins_over_gpulab_yaml_and_the_log_names_both():
    settings = defaults()
    admin = admin_traits(config(DockerSpawner={"mem_limit": "16G", "cpu_limit": 2.5}), CLASSES)
    effective, honoured, refused = apply_admin_traits(settings, admin)
    assert effective["spawn.mem_limit"] == parse_bytes("16g")
    assert effective["spawn.cpu_limit"] == 2.5
    assert effective["spawn.image"] == settings["spawn.image"]  # the rest: gpulab.yaml's
    assert refused == []
    assert honoured[0] == (
        "c.DockerSpawner.mem_limit = '16G' in the hub's config file wins over "
        f"spawn.mem_limit = {parse_bytes('8g')!r} in <defaults>, which is ignored for it")
    assert settings["spawn.mem_limit"] == parse_bytes("8g")  # pure: nothing changed in place


@pytest.mark.parametrize("trait, value, words", [
    ("image", "other/image:1", "the Docker proxy lets only spawn.image (or spawn.environments' images) run"),
    ("network_name", "bridge", "allow only spawn.network"),
    ("volumes", {"data": "/data"}, "spawn.home_volume"),
    ("extra_host_config", {"privileged": True}, "DeviceRequest"),
    ("extra_create_kwargs", {"user": "0"}, "lease labels"),
])
def test_a_trait_that_carries_the_lease_or_the_proxys_rules_is_refused(trait, value, words):
    admin = admin_traits(config(DockerSpawner={trait: value}), CLASSES)
    _, honoured, refused = apply_admin_traits(defaults(), admin)
    assert honoured == [] and len(refused) == 1
    assert refused[0].startswith(f"c.DockerSpawner.{trait} is set in the hub's config file, "
                                 f"and gpulab cannot honour it: ")
    assert words in refused[0] and f"set {BY_NAME[trait].setting} in gpulab.yaml" in refused[0]


def test_a_value_gpulab_yaml_would_refuse_is_refused_from_the_config_file_too():
    admin = admin_traits(config(Spawner={"cpu_limit": -1.0}), CLASSES)
    _, honoured, refused = apply_admin_traits(defaults(), admin)
    assert honoured == [] and refused == [
        "c.Spawner.cpu_limit = -1.0 in the hub's config file: expected a positive number, "
        "got -1.0"]


# ---------------------------------------------------------------- on the real spawner


@pytest.fixture
def lab_files(tmp_path):
    settings = tmp_path / "gpulab.yaml"
    settings.write_text("spawn:\n  mem_limit: 4g\n  image: lab/image:1\n  start_timeout: 2m\n")
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("defaults: {gpus: 0}\n")
    return settings, gpus


def spawner(cls, c: Config, lab_files) -> GpulabSpawner:
    settings, gpus = lab_files
    c.GpulabSpawner.settings_file = str(settings)
    c.GpulabSpawner.gpus_file = str(gpus)
    return cls(config=c, user=SimpleNamespace(name="alice", groups=[], admin=False))


@pytest.mark.parametrize("cls", [GpulabSpawner, GpulabSwarmSpawner])
def test_the_spawner_keeps_the_admins_trait_and_says_so_when_it_starts(cls, lab_files, caplog):
    caplog.set_level(logging.WARNING)
    c = Config()
    c.DockerSpawner.mem_limit = "16G"
    c.Spawner.start_timeout = 600
    s = spawner(cls, c, lab_files)
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("c.DockerSpawner.mem_limit = '16G' in the hub's config file wins "
                            "over spawn.mem_limit = 4294967296 in ") for m in said), said
    settings, _ = s._read_lab_config()
    s.apply_settings(settings)
    assert s.mem_limit == parse_bytes("16g") and s.start_timeout == 600  # the admin's
    assert s.image == "lab/image:1" and s.cpu_limit == 4.0  # gpulab.yaml's
    s.apply_settings(settings)  # at every spawn: still the admin's
    assert s.mem_limit == parse_bytes("16g")


def test_without_the_admins_traits_gpulab_yaml_sets_them(lab_files):
    s = spawner(GpulabSpawner, Config(), lab_files)
    settings, _ = s._read_lab_config()
    s.apply_settings(settings)
    assert s.mem_limit == parse_bytes("4g") and s.image == "lab/image:1"
    assert settings["spawn.start_timeout"] == 120


def test_a_refused_trait_stops_spawns_with_what_to_do(lab_files, caplog):
    c = Config()
    c.GpulabSpawner.image = "someone/else:latest"
    s = spawner(GpulabSpawner, c, lab_files)
    with pytest.raises(web.HTTPError) as e:
        s._read_lab_config()
    assert e.value.status_code == 503
    assert "c.GpulabSpawner.image is set in the hub's config file" in e.value.jupyterhub_message
    assert "set spawn.image in gpulab.yaml" in e.value.jupyterhub_message
    assert any("Servers cannot start: c.GpulabSpawner.image" in r.getMessage()
               for r in caplog.records)
