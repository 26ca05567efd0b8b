"""The wheel's package list names every package in the source tree.

setuptools takes an explicit list (migrations/ is mapped into router.migrations), so a new
subpackage missing from it would install without that code; the wheel test would only see
it on the import paths it happens to exercise.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_source_package_ships_in_the_wheel() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in (REPO / "router").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    on_disk.add("router.migrations")
    assert on_disk == listed
    assert config["package-dir"]["router.migrations"] == "migrations"
    assert (REPO / "migrations" / "__init__.py").exists()
