"""The last good version of each settings file, in memory and across restarts.

A restarted hub, Docker proxy, culler or dashboard (a crash, an OOM kill, a reboot) must
start on the last good version while an admin's edit is invalid, and refuse only when
no good version was ever seen (a fresh install with an invalid file)."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from gpulab.gpus.config import GpusConfig, parse_gpus_config
from gpulab.live_config import LastGood, _parse_settings, file_kind
from gpulab.settings import ConfigError

GOOD = "spawn:\n  mem_limit: 3g\n"
BAD = "spawn:\n  mem_limit: plenty\n"


def settings_reader(store=None) -> LastGood:
    return LastGood(_parse_settings, store=store)


def test_an_invalid_edit_keeps_the_last_good_version_in_this_process(tmp_path):
    path = tmp_path / "gpulab.yaml"
    path.write_text(GOOD)
    reader = settings_reader()
    assert reader.load(path)["spawn.mem_limit"] == 3 * 2**30
    path.write_text(BAD)
    assert reader.load(path)["spawn.mem_limit"] == 3 * 2**30
    assert "gpulab.yaml:2" in reader.errors[str(path)]
    assert "stays in force" in reader.errors[str(path)]
    path.write_text(GOOD.replace("3g", "4g"))
    assert reader.load(path)["spawn.mem_limit"] == 4 * 2**30
    assert reader.errors == {}


def test_without_any_good_version_the_error_is_raised(tmp_path):
    path = tmp_path / "gpulab.yaml"
    path.write_text(BAD)
    with pytest.raises(ConfigError, match="gpulab.yaml:2"):
        settings_reader(store=tmp_path / "store").load(path)


def test_a_new_process_starts_on_the_last_good_version_kept_in_the_store(tmp_path, caplog):
    store = tmp_path / "last-good"
    store.mkdir()
    path = tmp_path / "config" / "gpulab.yaml"
    path.parent.mkdir()
    path.write_text(GOOD)
    settings_reader(store).load(path)  # the hub, before the crash
    saved = store / "gpulab.yaml"
    assert saved.read_text() == GOOD
    assert oct(saved.stat().st_mode & 0o777) == "0o644"  # the proxy (nobody) reads it

    path.write_text(BAD)  # the admin's typo, then a restart: a process with no memory
    restarted = settings_reader(store)
    with caplog.at_level(logging.ERROR):
        assert restarted.load(path)["spawn.mem_limit"] == 3 * 2**30
    assert "last good version, saved 20" in restarted.errors[str(path)]
    assert "gpulab.yaml:2" in caplog.text
    assert saved.read_text() == GOOD  # an invalid edit never replaces it


def load_as_nobody(store: Path, path: Path) -> tuple[str, str]:
    """Load *path* in a forked child running as nobody (uid 65534), as the Docker proxy
    does; returns (the memory limit it read or the error, what it logged)."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.close(read_end)
        handler = logging.StreamHandler(io.StringIO())
        logging.getLogger("gpulab").addHandler(handler)
        try:
            os.setgid(65534)
            os.setuid(65534)
            result = str(LastGood(_parse_settings, store=store).load(path)["spawn.mem_limit"])
        except BaseException as e:  # noqa: BLE001 - anything goes back to the test
            result = f"error: {e!r}"
        os.write(write_end, json.dumps([result, handler.stream.getvalue()]).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        answer = json.loads(f.read() or '["no answer", ""]')
    os.waitpid(child, 0)
    return answer[0], answer[1]


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to become nobody, as the proxy is")
def test_the_docker_proxys_user_reads_the_store_it_cannot_write():
    """The Docker proxy runs as nobody and mounts the store read-only: it starts on the
    last good version the hub saved, and not being able to save is no error for it."""
    top = Path(tempfile.mkdtemp(prefix="gpulab-last-good-"))
    try:
        top.chmod(0o755)
        store = top / "last-good"
        store.mkdir()
        path = top / "gpulab.yaml"
        path.write_text(GOOD)
        settings_reader(store).load(path)  # the hub saves it (as root)
        path.write_text(GOOD.replace("3g", "5g"))
        value, logged = load_as_nobody(store, path)
        assert value == str(5 * 2**30)  # a good edit, which nobody cannot save: no error
        assert logged == ""
        path.write_text(BAD)
        value, logged = load_as_nobody(store, path)
        assert value == str(3 * 2**30)  # the hub's last good version
        assert "gpulab.yaml:2" in logged and "saved 20" in logged
    finally:
        shutil.rmtree(top)


def test_a_saved_version_this_gpulab_no_longer_accepts_is_not_used(tmp_path):
    store = tmp_path / "last-good"
    store.mkdir()
    (store / "gpulab.yaml").write_text("spawn:\n  retired_setting: 1\n")
    path = tmp_path / "gpulab.yaml"
    path.write_text(BAD)
    with pytest.raises(ConfigError, match="gpulab.yaml:2"):
        settings_reader(store).load(path)


def test_an_absent_gpus_yaml_is_the_defaults_and_clears_the_saved_version(tmp_path):
    from gpulab.gpus.config import parse_gpus_config
    from gpulab.live_config import _default_gpus

    store = tmp_path / "last-good"
    store.mkdir()
    path = tmp_path / "gpus.yaml"
    path.write_text("inventory: auto\ndefaults:\n  gpus: 0\n")
    reader = LastGood(parse_gpus_config, missing=_default_gpus, store=store)
    reader.load(path)
    assert (store / "gpus.yaml").exists()
    path.unlink()
    reader.load(path)
    assert not (store / "gpus.yaml").exists()


def test_config_check_warns_instead_of_failing_when_a_last_good_version_is_kept(
        tmp_path, capsys):
    from gpulab.cli import main

    store = tmp_path / "last-good"
    store.mkdir()
    path = tmp_path / "gpulab.yaml"
    path.write_text(GOOD)
    file_kind(path, store).load(path)
    path.write_text(BAD)
    assert main(["config", "check", "--last-good", str(store), str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "gpulab.yaml:2" in err and "last good version" in err
    # without a kept version (a fresh install), the same file is an error
    assert main(["config", "check", "--last-good", str(tmp_path / "empty"), str(path)]) == 1
    assert main(["config", "check", str(path)]) == 1
    # and `config get` answers with what the running lab uses
    assert main(["config", "get", "--last-good", str(store), "spawn.mem_limit",
                 str(path)]) == 0
    assert capsys.readouterr().out.strip() == str(3 * 2**30)


def test_a_file_read_while_an_editor_saves_it_in_place_is_not_taken_as_emptied(
        tmp_path, monkeypatch):
    """An editor saving in place truncates, then writes: the hub's next spawn may read
    the file empty in between, which is valid (all defaults: no reserved GPU, no pin).
    Read again a moment later it has the edit; emptied for good, it is the defaults."""
    import threading

    from gpulab import live_config

    monkeypatch.setattr(live_config, "EMPTY_AGAIN_AFTER", 0.5)  # slack for a loaded machine
    path = tmp_path / "gpus.yaml"
    path.write_text("defaults: {max_gpus: 1}\n")
    kind = LastGood(lambda text, p: parse_gpus_config(text, p))
    assert kind.load(path).default_max_gpus == 1
    saved = threading.Event()

    def save_in_place():
        with open(path, "w") as f:  # truncated now
            saved.set()
            time.sleep(0.01)
            f.write("defaults: {max_gpus: 2}\n")

    writer = threading.Thread(target=save_in_place)
    writer.start()
    saved.wait()
    assert kind.load(path).default_max_gpus == 2  # not the defaults' 1 of an empty file
    writer.join()
    path.write_text("")  # an admin empties it: the defaults
    assert kind.load(path).default_max_gpus == GpusConfig().default_max_gpus


def test_an_emptied_file_is_read_again_only_once(tmp_path, monkeypatch):
    """Once the empty version is in force, later loads take it at once: the hub, the
    Docker proxy and the line load these files on every spawn, request and round."""
    from gpulab import live_config

    slept = []
    monkeypatch.setattr(live_config.time, "sleep", slept.append)
    path = tmp_path / "gpus.yaml"
    path.write_text("defaults: {max_gpus: 2}\n")
    kind = LastGood(lambda text, p: parse_gpus_config(text, p))
    kind.load(path)
    path.write_text("")
    for _ in range(3):
        assert kind.load(path).default_max_gpus == GpusConfig().default_max_gpus
    assert len(slept) == 1


class CountingReader(LastGood):
    """The settings reader, counting how often it parses."""

    def __init__(self):
        self.parsed = 0

        def parse(text, path):
            self.parsed += 1
            return _parse_settings(text, path)

        super().__init__(parse)


@pytest.fixture
def settled(monkeypatch):
    """settled(path, seconds): the reader's clock put *seconds* after *path*'s last change
    (ctime cannot be set back; the cache trusts a file's times only once that change is
    SETTLED seconds old)."""
    import gpulab.live_config as live_config

    def settle(path: Path, seconds: float = 10) -> None:
        monkeypatch.setattr(live_config.time, "time", lambda: os.stat(path).st_ctime + seconds)

    return settle


def test_an_unchanged_settled_file_is_parsed_once_and_any_change_is_seen(tmp_path, settled):
    path = tmp_path / "gpulab.yaml"
    path.write_text(GOOD)
    settled(path)
    reader = CountingReader()
    for _ in range(3):
        assert reader.load(path)["spawn.mem_limit"] == 3 * 2**30
    assert reader.parsed == 1
    path.write_text(GOOD.replace("3g", "4g"))  # same size: seen by its times
    assert reader.load(path)["spawn.mem_limit"] == 4 * 2**30
    settled(path)
    reader.load(path)
    # a copy that keeps the old file's times (cp -p, rsync -t): same inode, size and
    # mtime; only its ctime tells
    before = os.stat(path)
    path.write_text(GOOD.replace("3g", "5g"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns
    assert reader.load(path)["spawn.mem_limit"] == 5 * 2**30
    renamed = tmp_path / "new"
    renamed.write_text(GOOD)
    os.replace(renamed, path)  # an editor's save: another inode
    assert reader.load(path)["spawn.mem_limit"] == 3 * 2**30


def test_a_file_changed_within_the_last_seconds_is_read_at_every_load(tmp_path, settled):
    """Two writes of the same size within one tick of the kernel's file clock leave the
    same times: until its last change is SETTLED seconds old, a file is always read."""
    path = tmp_path / "gpulab.yaml"
    path.write_text(GOOD)
    settled(path, seconds=0.5)
    reader = CountingReader()
    for _ in range(3):
        reader.load(path)
    assert reader.parsed == 3


def test_an_invalid_edit_is_reported_at_every_load_not_cached(tmp_path, settled):
    path = tmp_path / "gpulab.yaml"
    path.write_text(GOOD)
    settled(path)
    reader = CountingReader()
    reader.load(path)
    path.write_text(BAD)
    settled(path)
    for _ in range(2):
        assert reader.load(path)["spawn.mem_limit"] == 3 * 2**30
        assert "gpulab.yaml:2" in reader.errors[str(path)]
    assert reader.parsed == 3
