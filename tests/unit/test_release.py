"""One version that moves: pyproject.toml's ``version`` is the only source, and every place a user
reads a version from says the same (``judgequeue --version``, the ``judgequeue_build_info`` metric).
A bump in one place without the others fails here; ``scripts/release VERSION`` bumps them together."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest

from judgequeue.core import metrics
from judgequeue.core.cli import build_parser
from judgequeue.core.version import VERSION

ROOT = Path(__file__).resolve().parents[2]


def pyproject_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


def test_the_installed_version_is_pyprojects() -> None:
    """An editable install records the version when it is installed; after a bump it is stale until
    installed again (``scripts/release`` does)."""
    assert pyproject_version() == VERSION, (
        f"installed judgequeue says {VERSION}, pyproject.toml {pyproject_version()}: "
        "run .venv/bin/pip install --no-deps -e . (scripts/release does)")


def test_cli_version_is_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"judgequeue {pyproject_version()}"


def test_build_info_metric_carries_the_version() -> None:
    assert metrics.BUILD_INFO is not None
    lines = generate_latest(REGISTRY).decode().splitlines()
    assert f'judgequeue_build_info{{version="{pyproject_version()}"}} 1.0' in lines
