"""Config files that are read again at every use, where an invalid edit never hurts.

Admins edit config/gpulab.yaml and config/gpus.yaml while the hub runs; the next spawn
uses the edit. An edit that does not validate is refused: the error (file:line) goes to
the hub's log and the admins' GPU page, and the last good version stays in force.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from .gpus_config import GpusConfig, load_gpus_config
from .settings import ConfigError, Settings, load_settings

T = TypeVar("T")
log = logging.getLogger(__name__)


class LastGood(Generic[T]):
    def __init__(self, loader: Callable[[str], T]):
        self._loader = loader
        self._good: dict[str, T] = {}
        self.errors: dict[str, str] = {}  # path -> the error that is being ignored now

    def load(self, path: str | Path) -> T:
        path = str(path)
        try:
            value = self._loader(path)
        except ConfigError as e:
            if path not in self._good:
                raise
            if self.errors.get(path) != str(e):
                log.error("Ignoring an invalid edit, the last good version stays in force: %s", e)
            self.errors[path] = str(e)
            return self._good[path]
        self._good[path] = value
        self.errors.pop(path, None)
        return value


settings_file: LastGood[Settings] = LastGood(load_settings)
gpus_file: LastGood[GpusConfig] = LastGood(lambda p: load_gpus_config(p, missing_ok=True))


def current_errors() -> list[str]:
    return list(settings_file.errors.values()) + list(gpus_file.errors.values())
