from pathlib import Path

import pytest

from gpulab.cli import main
from gpulab.settings import (
    ConfigError,
    bytes_text,
    load_settings,
    parse_bytes,
    parse_duration,
    settings_from_yaml,
)
from gpulab.yamlfile import parse_yaml

REPO = Path(__file__).resolve().parents[2]


def load_text(text: str):
    return settings_from_yaml(parse_yaml(text, "gpulab.yaml"))


def test_shipped_settings_file_is_valid():
    s = load_settings(REPO / "config" / "gpulab.yaml")
    assert s["hub.admins"] == ("admin",)
    assert s["spawn.shm_size"] == 2 * 1024**3
    assert s["spawn.start_timeout"] == 180


def test_empty_file_gives_defaults():
    assert load_text("")["spawn.image"] == "gpulab/singleuser:latest"


@pytest.mark.parametrize(
    "text, where, words",
    [
        ("spawn:\n  shm_size: lots\n", "gpulab.yaml:2: spawn.shm_size", "expected a size"),
        ("spawn:\n  shm_sise: 1g\n", "gpulab.yaml:2: spawn.shm_sise", "did you mean spawn.shm_size"),
        ("hub:\n  admins: alice\n", "gpulab.yaml:2: hub.admins", "list of usernames"),
        ("spawn:\n  cpu_limit: -1\n", "gpulab.yaml:2: spawn.cpu_limit", "positive number"),
        ("spawn:\n  cpu_limit: true\n", "gpulab.yaml:2: spawn.cpu_limit", "positive number"),
        ("spawn:\n  home_volume: shared-home\n", "gpulab.yaml:2: spawn.home_volume", "{username}"),
        ("spawn:\n  home_volume: 'gpulab-{username}'\n", "gpulab.yaml:2: spawn.home_volume",
         "a user could get the volume gpulab-hub-data (gpulab's own)"),
        ("spawn:\n  home_volume: 'gpulab-proj{username}'\n", "gpulab.yaml:2: spawn.home_volume",
         "a group's project folder (gpulab-project-NAME) as their home"),
        ("spawn:\n  home_volume: 'gpulab-project-home-{username}'\n",
         "gpulab.yaml:2: spawn.home_volume", "a group's project folder"),
        ("spawn:\n  home_volume: '{username}-home'\n", "gpulab.yaml:2: spawn.home_volume",
         "a group's project folder"),
        ("spawn:\n  home_volume: 'home-{username}-{servername}'\n",
         "gpulab.yaml:2: spawn.home_volume", "{servername} must follow {username}--"),
        ("hub:\n  trusted_proxies: [10.0.0.300]\n", "gpulab.yaml:2: hub.trusted_proxies",
         "not an IP address or network"),
        ("network:\n  allow: [10.0.5.20:99999]\n", "gpulab.yaml:2: network.allow",
         "'10.0.5.20:99999': the port must be a number from 1 to 65535"),
        ("network:\n  allow: [8.8.8.8:53]\n", "gpulab.yaml:2: network.allow",
         "'8.8.8.8:53' is not inside the ranges gpulab closes to members"),
        ("network:\n  allow: [0.0.0.0/0]\n", "gpulab.yaml:2: network.allow",
         "spans more than one of them"),
        ("network:\n  allow: [10.0.5.20/16]\n", "gpulab.yaml:2: network.allow",
         "write 10.0.5.20 for the one machine, or 10.0.0.0/16 for the network"),
        ("network:\n  allow: [nas_1.lab:22]\n", "gpulab.yaml:2: network.allow",
         "is not an address, network or host name"),
        ("network:\n  allow: 10.0.5.20\n", "gpulab.yaml:2: network.allow",
         "expected a list such as"),
        ("network:\n  allow: [10.0.5.20, 10.0.5.20/32]\n", "gpulab.yaml:2: network.allow",
         "listed twice"),
        ("hub:\n  trusted_proxies: 10.0.0.1\n", "gpulab.yaml:2: hub.trusted_proxies",
         "expected a list"),
        ("spawn:\n  home_size: plenty\n", "gpulab.yaml:2: spawn.home_size", "expected a size"),
        ("hub:\n  swarm: true\nspawn:\n  home_size: 10g\n", "gpulab.yaml:4: spawn.home_size",
         "not applied with hub.swarm"),
        ("spawn:\n  project_size: -1g\n", "gpulab.yaml:2: spawn.project_size", "size"),
        ("hub:\n  swarm: true\nspawn:\n  project_size: 1t\n",
         "gpulab.yaml:4: spawn.project_size", "not applied with hub.swarm"),
        ("spawn:\n  home_path: home\n", "gpulab.yaml:2: spawn.home_path", "absolute path"),
        ("spawn:\n  start_timeout: soon\n", "gpulab.yaml:2: spawn.start_timeout", "duration"),
        ("spawn:\n  image: a\n  image: b\n", "gpulab.yaml:3", "duplicate key 'image' (first on line 2)"),
        ("spawn: [1, 2]\n", "gpulab.yaml:1: spawn", "expected a mapping"),
        ("- a\n- b\n", "gpulab.yaml:1", "mapping of sections"),
        ("spawn:\n  image: [unclosed\n", "gpulab.yaml:3", "invalid YAML"),
        ("\n\nnope:\n  x: 1\n", "gpulab.yaml:4: nope.x", "unknown setting"),
    ],
)
def test_bad_settings_name_file_line_and_key(text, where, words):
    with pytest.raises(ConfigError) as e:
        load_text(text)
    assert str(e.value).startswith(where), str(e.value)
    assert words in str(e.value)


@pytest.mark.parametrize("value, expected", [
    ("0", 0), (0, 0), ('""', 0), ("null", 0), ("50g", 50 * 1024**3), ("512m", 512 * 1024**2),
])
def test_home_and_project_sizes_are_a_size_or_no_limit(value, expected):
    assert load_text(f"spawn:\n  home_size: {value}\n")["spawn.home_size"] == expected
    assert load_text(f"spawn:\n  project_size: {value}\n")["spawn.project_size"] == expected


@pytest.mark.parametrize("size, text", [
    (2 * 1024**3, "2g"), (1536 * 1024**2, "1536m"), (3 * 1024**4, "3t"), (1000, "1000"),
])
def test_bytes_text_is_the_largest_whole_unit(size, text):
    assert bytes_text(size) == text
    assert parse_bytes(text) == size


@pytest.mark.parametrize("entry, host, port", [
    ("10.0.5.20/32:2049", "10.0.5.20/32", 2049), ("10.0.5.20:2049", "10.0.5.20/32", 2049),
    ("10.0.5.0/24", "10.0.5.0/24", None), ("LDAP.Lab.Example.:636", "ldap.lab.example", 636),
    ("nas.lab.example", "nas.lab.example", None), ("[fd00::5]:2049", "fd00::5/128", 2049),
    ("fd00::/8", "fd00::/8", None), ("169.254.169.254:80", "169.254.169.254/32", 80),
])
def test_network_allow_takes_networks_and_names_with_or_without_a_port(entry, host, port):
    [d] = load_text(f"network:\n  allow: ['{entry}']\n")["network.allow"]
    assert (d.host, d.port) == (host, port)


def test_missing_file_says_where_it_looked(tmp_path):
    with pytest.raises(ConfigError, match=r"nothere\.yaml: file not found"):
        load_settings(tmp_path / "nothere.yaml")


@pytest.mark.parametrize(
    "value, expected",
    [("2g", 2 * 1024**3), ("512m", 512 * 1024**2), ("1.5G", int(1.5 * 1024**3)), (4096, 4096),
     ("64MiB", 64 * 1024**2), ("100", 100)],
)
def test_parse_bytes(value, expected):
    assert parse_bytes(value) == expected


@pytest.mark.parametrize("value", ["0", "-1g", "lots", True, 0, "1x", None])
def test_parse_bytes_rejects(value):
    with pytest.raises(ValueError):
        parse_bytes(value)


@pytest.mark.parametrize("value, expected", [("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), (0, 0)])
def test_parse_duration(value, expected):
    assert parse_duration(value) == expected


def test_cli_config_check_exit_codes(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("spawn:\n  shm_size: 4g\n")
    assert main(["config", "check", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("spawn:\n\n  mem_limit: plenty\n")
    assert main(["config", "check", str(bad)]) == 1
    assert f"{bad}:3: spawn.mem_limit: expected a size" in capsys.readouterr().err
