"""The distribution holds every module of the source tree: an editable install finds a new package
by its folder, a wheel (the image's) only if pyproject.toml lists it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_in_the_distribution() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for prefix, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((prefix, *relative)))
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
