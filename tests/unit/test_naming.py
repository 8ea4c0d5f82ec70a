import re

import pytest

from gpulab.contract import INFRA_CONTAINERS, INFRA_VOLUMES
from gpulab.spawn.naming import (
    MAX_SLUG,
    container_name,
    home_volume_pattern,
    safe_slug,
    volume_name,
)

DOCKER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")


@pytest.mark.parametrize(
    "name, expected",
    [
        ("alice", "alice"),
        ("bob-smith", "bob-smith"),
        ("user1", "user1"),
        ("a", "a"),
    ],
)
def test_plain_names_are_kept(name, expected):
    assert safe_slug(name) == expected


@pytest.mark.parametrize(
    "name",
    ["Alice", "zoë", "a--b", "a.b", "a_b", "-lead", "trail-", "", "用户", "a b", "x" * 49, "ALICE"],
)
def test_other_names_get_a_readable_slug_and_hash(name):
    slug = safe_slug(name)
    assert re.fullmatch(r"[a-z0-9-]+---[0-9a-f]{8}", slug), slug
    assert len(slug) <= MAX_SLUG
    assert DOCKER_NAME.fullmatch(container_name(name))


def test_distinct_usernames_never_share_a_name():
    names = [
        "alice", "Alice", "ALICE", "alice-", "alice--", "a.lice", "a-lice", "a_lice", "alicé",
        "alice" + "x" * 60, "alice" + "x" * 61, "", "-", "--", "用户", "用戶", "a--b", "a-b",
        "a-b---1234abcd", "x" * 48, "x" * 49,
    ]
    slugs = [safe_slug(n) for n in names]
    assert len(set(slugs)) == len(names), dict(zip(names, slugs, strict=True))


def test_hashed_slug_never_equals_a_plain_one():
    # A plain name cannot contain "--", every hashed slug does.
    assert "--" in safe_slug("Alice")
    assert safe_slug("alice") != safe_slug("Alice")


def test_container_and_volume_names():
    assert container_name("alice") == "gpulab-user-alice"
    assert container_name("alice", "train") == "gpulab-user-alice--train"
    assert volume_name("gpulab-home-{username}", "alice") == "gpulab-home-alice"
    assert volume_name("home-{username}--{servername}", "alice", "Big Run").startswith(
        "home-alice--big-run---"
    )


def test_a_named_servers_container_name_fits_a_swarm_service_name_and_stays_unique():
    longest = "x" * 80, "y" * 48, "a" * 48
    names = {container_name(u, s) for u in (*longest, "alice") for s in ("", "train", "s" * 30)}
    assert len(names) == 12 and all(len(n) <= 63 for n in names), names
    assert container_name("alice", "s" * 30) == "gpulab-user-alice--" + "s" * 30  # fits: kept


@pytest.mark.parametrize("username", [
    "hub", "proxy", "exporter", "prometheus", "docker-proxy", "docker-proxy-ro", "gpulab-hub",
    "user-hub", "", "-", "datasets", "home",
])
@pytest.mark.parametrize("servername", ["", "x", "hub"])
def test_no_username_takes_an_infrastructure_containers_name(username, servername):
    name = container_name(username, servername)
    assert name not in INFRA_CONTAINERS
    assert name.startswith("gpulab-user-")
    # ... nor a name that Docker would resolve as one of them on a shared network
    assert not any(name.startswith(infra + "-") or infra.startswith(name)
                   for infra in INFRA_CONTAINERS), name


@pytest.mark.parametrize("template", ["gpulab-home-{username}", "home-{username}--{servername}",
                                      "lab.{username}--{servername}.home"])
def test_the_home_pattern_matches_every_home_name_and_no_other(template):
    pattern = home_volume_pattern(template)
    for username, servername in [("alice", ""), ("Zoë.K", ""), ("bob", "Big Run"),
                                 ("x" * 80, "train"), ("a--b", "")]:
        assert pattern.fullmatch(volume_name(template, username, servername))
    assert not any(pattern.fullmatch(v) for v in INFRA_VOLUMES)
    assert not pattern.fullmatch(template.replace("{username}", "Alice"))  # not a slug
    assert not pattern.fullmatch("other-" + volume_name(template, "alice"))
