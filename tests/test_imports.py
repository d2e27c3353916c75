"""Every module of ncpsim imports: the tasks import their packages lazily, so a name that moved (a merge, a
refactor) would otherwise surface only when a user runs that one command."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

PACKAGES = ("tasks", "bench", "scenarios", "clusters", "sim", "dns", "certs")


def modules() -> list[str]:
    found = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        found.append(package)
        found += [m.name for m in pkgutil.walk_packages(root.__path__, f"{package}.")]
    return sorted(found)


@pytest.mark.parametrize("module", modules())
def test_module_imports(module: str) -> None:
    importlib.import_module(module)
