"""The maps are true: the package's docstring names every part and every top-level module,
and each part's docstring names each of its modules, so the next engineer who reads them
finds everything there is (a module added without its line fails here)."""

import importlib
from pathlib import Path

import pytest

import gpulab

PACKAGE = Path(gpulab.__file__).parent
PARTS = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())


def _modules(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.py") if p.name not in ("__init__.py",
                                                                           "__main__.py"))


def test_the_package_names_every_part_and_module():
    doc = gpulab.__doc__
    missing = [f"{part}/" for part in PARTS if f"{part}/" not in doc]
    missing += [m for m in _modules(PACKAGE) if m not in doc]
    assert not missing, f"gpulab/__init__.py's docstring does not name {missing}"


@pytest.mark.parametrize("part", PARTS)
def test_each_part_names_each_of_its_modules(part):
    doc = importlib.import_module(f"gpulab.{part}").__doc__ or ""
    missing = [m for m in _modules(PACKAGE / part)
               if m not in doc and f".{m.removesuffix('.py')}" not in doc]
    assert not missing, f"gpulab/{part}/__init__.py's docstring does not name {missing}"
