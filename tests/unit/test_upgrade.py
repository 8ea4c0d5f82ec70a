"""What make upgrade says changed in configuration (gpulab.upgrade), from the text that
each version's ``gpulab config describe`` prints."""

from __future__ import annotations

import pytest

from gpulab.cli import main
from gpulab.settings import SETTINGS, describe
from gpulab.upgrade import Described, config_changes, parse_describe

OLD = """\
hub.admins (default: ())
    Usernames with hub admin rights. The first one gets a login token.
hub.idle_timeout (default: 7200)
    Stop servers that have been idle this long.
spawn.mem_limit (default: '8G')
    Memory limit.
hub.retired (default: 5)
    A setting this version dropped.
"""


def test_describe_is_read_back_whole():
    described = parse_describe(describe())
    assert list(described) == [s.key for s in SETTINGS]
    assert described["hub.admins"] == Described("()", described["hub.admins"].help)
    assert described["hub.admins"].help.startswith("Usernames with hub admin rights.")
    assert described["spawn.image"].default == "'gpulab/singleuser:latest'"


def test_the_same_version_changes_nothing():
    same = parse_describe(describe())
    assert config_changes(same, same, set()) == []


@pytest.mark.parametrize("set_here, expected", [
    (set(), "hub.idle_timeout: the default changes from 7200 to 3600; gpulab.yaml does not "
            "set it: this lab now gets 3600"),
    ({"hub.idle_timeout"}, "hub.idle_timeout: the default changes from 7200 to 3600; "
                           "gpulab.yaml sets it: nothing changes here"),
])
def test_a_changed_default_says_whether_it_reaches_this_lab(set_here, expected):
    old = parse_describe(OLD)
    new = {**old, "hub.idle_timeout": Described("3600", "Stop idle servers.")}
    assert config_changes(old, new, set_here) == [expected]


def test_added_and_removed_settings():
    old = parse_describe(OLD)
    new = {k: v for k, v in old.items() if k != "hub.retired"}
    new["backup.every"] = Described("86400", "How often to back up. Example: 12h")
    assert config_changes(old, new, set()) == [
        "new setting backup.every (default 86400): How often to back up.",
        "hub.retired is no longer a setting"]
    assert config_changes(old, new, {"hub.retired"})[-1] == (
        "hub.retired is no longer a setting (gpulab.yaml still sets it: remove it)")


def test_text_that_is_not_describe_output_is_refused():
    with pytest.raises(ValueError, match="line 2 is not what `gpulab config describe`"):
        parse_describe("hub.admins (default: ())\nTraceback (most recent call last):\n")


def test_the_command_reads_the_old_version_and_the_labs_file(tmp_path, capsys):
    old = tmp_path / "old.txt"
    old.write_text(OLD)
    lab = tmp_path / "gpulab.yaml"
    lab.write_text("hub:\n  idle_timeout: 2h\n")
    assert main(["config", "changes", "--from", str(old), str(lab)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "hub.retired is no longer a setting" in out
    assert any(line.startswith("new setting backup.every (default 86400)") for line in out)
    # the lab sets idle_timeout: whatever the default did, it does not reach this lab
    assert not any("this lab now gets" in line and "idle_timeout" in line for line in out)
