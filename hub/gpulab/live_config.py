"""Config files that are read again at every use, where an invalid edit never hurts.

Admins edit config/gpulab.yaml and config/gpus.yaml while the hub runs; the next spawn
uses the edit. An edit that does not validate is refused: the error (file:line) goes to
the hub's log and the admins' GPU page, and the last good version stays in force.

The last good version also outlives the process that read it: each good version is kept
in a folder (``GPULAB_LAST_GOOD_DIR``, the ``gpulab-last-good`` volume in the stack), so
a hub, Docker proxy, culler or dashboard that starts while the file is invalid starts on
it instead of refusing to (a crash, an OOM kill or a reboot must not turn an admin's
typo into a lab that answers 503). With no good version anywhere (a fresh install with
an invalid file), loading raises the file's error, as it always did.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from gpulab.gpus.config import GpusConfig, parse_gpus_config
from gpulab.settings import ConfigError, Settings, settings_from_yaml
from gpulab.yamlfile import parse_yaml

T = TypeVar("T")
log = logging.getLogger(__name__)

LAST_GOOD_DIR_ENV = "GPULAB_LAST_GOOD_DIR"
# An editor that saves in place truncates the file, then writes it: read in between, it
# is empty, which is valid (all defaults). A file that held something and is empty now
# is read again this long after, and only then taken as emptied.
EMPTY_AGAIN_AFTER = 0.05
# A file whose inode, size, mtime and ctime are what they were at its last good read is
# not read and parsed again (gpus.yaml costs 7 ms to parse, and the culler, the line, the
# hub's metrics and every spawn load it), but only once its last change (ctime) is this
# many seconds older than that read: the kernel's file clock moves in ticks of a few ms,
# so two writes of the same size within one tick have the same times, and the second
# must still be seen. A change after that read has a later ctime (utime() cannot set it).
SETTLED = 2.0


class LastGood(Generic[T]):
    """One kind of config file (a parser), read again at every :meth:`load`.

    *store*: the folder that keeps each file's last good text under its base name
    (None: this process's memory only). A process that cannot write there (the Docker
    proxy mounts it read-only) still reads it."""

    def __init__(self, parse: Callable[[str, str], T],
                 missing: Callable[[str], T] | None = None,
                 store: str | Path | None = None):
        self._parse = parse
        self._missing = missing  # the value of an absent file; None: absent is an error
        self.store = Path(store) if store else None
        self._good: dict[str, T] = {}
        self._had_text: dict[str, bool] = {}  # path -> whether its last good text had any
        self.errors: dict[str, str] = {}  # path -> the error that is being ignored now
        # path -> its (inode, size, mtime, ctime) when read and accepted after it settled
        self._unchanged: dict[str, tuple[int, int, int, int]] = {}

    def load(self, path: str | Path) -> T:
        path = str(path)
        try:
            seen = os.stat(path)
            key = (seen.st_ino, seen.st_size, seen.st_mtime_ns, seen.st_ctime_ns)
            if self._unchanged.get(path) == key and path in self._good \
                    and path not in self.errors:
                return self._good[path]
            text = Path(path).read_text(encoding="utf-8")
            if not text and self._had_text.get(path):  # being saved in place, or emptied?
                time.sleep(EMPTY_AGAIN_AFTER)
                text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            if self._missing is None:
                return self._refused(path, ConfigError(path, None, "", "file not found"))
            value = self._missing(path)
            self._accepted(path, value, None)
            return value
        except OSError as e:
            return self._refused(path, ConfigError(path, None, "", f"cannot read: {e}"))
        try:
            value = self._parse(text, path)
        except ConfigError as e:
            return self._refused(path, e)
        self._accepted(path, value, text)
        if time.time() - seen.st_ctime > SETTLED:  # read after it settled: key is its text's
            self._unchanged[path] = key
        return value

    def saved(self, path: str | Path) -> Path | None:
        """Where the last good version of *path* is kept, if anywhere."""
        return self.store / Path(path).name if self.store else None

    def _accepted(self, path: str, value: T, text: str | None) -> None:
        self._good[path] = value
        self._had_text[path] = bool(text)
        if self.errors.pop(path, None) is not None:
            log.info("%s is valid again and in force", path)
        self._save(path, text)

    def _refused(self, path: str, error: ConfigError) -> T:
        good = self._good.get(path)
        if good is None:
            kept = self.saved_version(path)
            if kept is None:
                raise error
            good, when = kept
            self._good[path] = good
            where = f"the last good version, saved {when}"
        else:
            where = "the last good version"
        message = f"{error} ({where}, stays in force)"
        if self.errors.get(path) != message:
            log.error("Ignoring an invalid edit: %s", message)
        self.errors[path] = message
        return good

    def saved_version(self, path: str | Path) -> tuple[T, str] | None:
        """The last good version of *path* kept in the store and when it was saved (UTC),
        if there is one that this gpulab still accepts."""
        saved = self.saved(path)
        if saved is None:
            return None
        try:
            text = saved.read_text(encoding="utf-8")
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(saved.stat().st_mtime))
        except FileNotFoundError:
            return None
        except OSError as e:
            log.error("cannot read the last good version of %s at %s: %s", path, saved, e)
            return None
        try:
            return self._parse(text, str(path)), when
        except ConfigError as e:  # valid for an older gpulab, not for this one
            log.error("the last good version of %s (%s) is not valid either: %s",
                      path, saved, e)
            return None

    def _save(self, path: str, text: str | None) -> None:
        saved = self.saved(path)
        if saved is None:
            return
        try:
            if text is None:  # an absent file (defaults) is the good version now
                saved.unlink(missing_ok=True)
                return
            if saved.exists() and saved.read_text(encoding="utf-8") == text:
                return
            # Written whole or not at all: a crash mid-write must not leave half a file.
            fd, tmp = tempfile.mkstemp(dir=saved.parent, prefix=f".{saved.name}.")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o644)  # the Docker proxy (nobody) reads it
            os.replace(tmp, saved)
        except OSError as e:  # a read-only mount (the Docker proxy): reading is its part
            if e.errno not in (30, 13):  # EROFS, EACCES
                log.warning("cannot keep the last good version of %s in %s: %s",
                            path, saved.parent, e)


def _parse_settings(text: str, path: str) -> Settings:
    return settings_from_yaml(parse_yaml(text, path))


def _default_gpus(path: str) -> GpusConfig:
    return GpusConfig(filename=path)


def _store() -> str | None:
    return os.environ.get(LAST_GOOD_DIR_ENV) or None


settings_file: LastGood[Settings] = LastGood(_parse_settings, store=_store())
gpus_file: LastGood[GpusConfig] = LastGood(parse_gpus_config, missing=_default_gpus,
                                           store=_store())


def gpus_or_defaults(path: str | Path) -> GpusConfig:
    """The last good gpus.yaml at *path*, or the defaults while it never had a good
    version: for pages and metrics, which show what they can rather than fail."""
    try:
        return gpus_file.load(path)
    except ConfigError:
        return _default_gpus(str(path))


def file_kind(path: str | Path, store: str | Path | None = None) -> LastGood:
    """A reader for *path* by its name (gpus*.yaml or settings), keeping nothing in
    memory between uses: for ``gpulab config check``."""
    if Path(path).name.startswith("gpus"):
        return LastGood(parse_gpus_config, store=store)
    return LastGood(_parse_settings, store=store)


def current_errors() -> list[str]:
    return list(settings_file.errors.values()) + list(gpus_file.errors.values())
