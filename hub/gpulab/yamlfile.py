"""YAML config files that remember where each value came from.

Admins edit gpulab's config files by hand; a mistake must come back as
``config/gpulab.yaml:14: spawn.shm_size: expected a size such as 2g or 512m, got 'lots'``,
not as a traceback. :func:`read_yaml` parses a file once, keeps the line of every key,
and refuses duplicate keys (which plain YAML loaders silently resolve to the last one).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Path_ = tuple[str | int, ...]


class ConfigError(ValueError):
    """A config file problem, located: ``str(e)`` is ready to show to an admin."""

    def __init__(self, filename: str, line: int | None, key: str, message: str):
        self.filename = filename
        self.line = line
        self.key = key
        self.message = message
        where = f"{filename}:{line}" if line else filename
        super().__init__(f"{where}: {key + ': ' if key else ''}{message}")


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None,
                f"duplicate key {key!r} (first on line {seen[key] + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _line_map(node: yaml.Node | None, path: Path_ = ()) -> dict[Path_, int]:
    """Path of every mapping key and sequence item -> 1-based line number."""
    lines: dict[Path_, int] = {}
    if node is None:
        return lines
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = path + (str(key_node.value),)
            lines[child] = key_node.start_mark.line + 1
            lines.update({k: v for k, v in _line_map(value_node, child).items() if k != child})
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_line_map(item, path + (i,)))
    return lines


def dotted(path: Iterable[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass
class LocatedYaml:
    """A parsed YAML document plus the line of every key in it."""

    filename: str
    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)

    def line_of(self, path: Path_) -> int | None:
        # Fall back to the nearest enclosing key that has a line.
        for n in range(len(path), -1, -1):
            if path[:n] in self.lines:
                return self.lines[path[:n]]
        return None

    def error(self, path: Path_, message: str) -> ConfigError:
        return ConfigError(self.filename, self.line_of(path), dotted(path), message)

    def leaves(self) -> Iterator[tuple[tuple[str, ...], Any]]:
        """(section, key) pairs of a two-level document, in file order."""
        for section, body in self.data.items():
            if not isinstance(body, dict):
                raise self.error((str(section),), f"expected a mapping of settings, got {body!r}")
            for key, value in body.items():
                yield (str(section), str(key)), value

    @staticmethod
    def unknown_key_message(key: str, known: Iterable[str]) -> str:
        known = sorted(known)
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        return f"unknown setting; {hint}known settings: {', '.join(known)}"


def parse_yaml(text: str, filename: str = "<string>") -> LocatedYaml:
    try:
        data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        problem = " ".join(p for p in (e.context, e.problem) if p) or str(e)
        raise ConfigError(filename, line, "", f"invalid YAML: {problem}") from None
    except yaml.YAMLError as e:
        raise ConfigError(filename, None, "", f"invalid YAML: {e}") from None
    return LocatedYaml(filename, data, _line_map(node))


def read_yaml(path: str | Path) -> LocatedYaml:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), None, "", "file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(str(path), None, "", f"cannot read: {e}") from None
    return parse_yaml(text, str(path))
