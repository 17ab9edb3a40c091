"""One version that moves: pyproject.toml's ``version`` is the only source, and every place a user
reads a version from says the same (``judgequeue --version``, the ``judgequeue_build_info`` metric).
A bump in one place without the others fails here; ``scripts/release VERSION`` bumps them together."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import shutil
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from prometheus_client import REGISTRY, generate_latest

from judgequeue.core.base import metrics
from judgequeue.core.base.version import VERSION
from judgequeue.core.cli import build_parser

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


# --- every copy of the version agrees --------------------------------------------------------------


def load_release_script() -> ModuleType:
    path = ROOT / "scripts" / "release"
    loader = importlib.machinery.SourceFileLoader("release_script", str(path))
    spec = importlib.util.spec_from_loader("release_script", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


release = load_release_script()


def test_every_copy_of_the_version_is_pyprojects() -> None:
    """The chart's version and appVersion, the Dockerfile's VERSION default, the examples' image tags
    and CHANGELOG.md's newest heading: each is pyproject's version (``scripts/release --check``)."""
    assert release.disagreements(ROOT) == []
    places = {name for name, _line, _version in release.copies(ROOT)}
    assert {"pyproject.toml", "charts/judgequeue/Chart.yaml", "Dockerfile", "README.md"} <= places


def test_chart_version_and_app_version_are_the_release() -> None:
    chart = yaml.safe_load((ROOT / "charts" / "judgequeue" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == pyproject_version()


def test_the_charts_default_image_is_the_release() -> None:
    """image.tag stays empty in the values, which the chart reads as appVersion: the default image
    moves with the chart, with no copy of its own to forget."""
    from tests.unit.test_chart import render_docs

    values = yaml.safe_load((ROOT / "charts" / "judgequeue" / "values.yaml").read_text())
    assert values["image"]["tag"] == ""
    images = {c["image"] for doc in render_docs({}) if doc["kind"] in ("Deployment", "Job")
              for c in doc["spec"]["template"]["spec"]["containers"]}
    assert images == {f"{values['image']['repository']}:{pyproject_version()}"}


def test_the_image_is_labelled_with_the_version_it_holds() -> None:
    """The Dockerfile labels the image with its VERSION argument and refuses to build when the
    installed package says another; build-image passes pyproject's version and tags with it."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    runtime = dockerfile[dockerfile.index("AS runtime"):]
    assert f"ARG VERSION={pyproject_version()}" in runtime
    assert 'org.opencontainers.image.version="${VERSION}"' in runtime
    assert 'if [ "$installed" != "judgequeue ${VERSION}" ]' in runtime
    build_image = (ROOT / "scripts" / "build-image").read_text()
    assert '--build-arg VERSION="$VERSION"' in build_image
    assert "TAG=$VERSION-$image_key" in build_image
    assert "org.opencontainers.image.version" in build_image  # checked after the build


def test_release_bumps_every_copy_at_once(tmp_path: Path) -> None:
    """``scripts/release`` on a copy of the files it edits: afterwards every copy says the new
    version, and CHANGELOG.md has its heading; a bump of pyproject alone is caught."""
    names = {name for name, _pattern in release.COPIES} | {release.CHANGELOG}
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    alone = tmp_path / "pyproject.toml"
    alone.write_text(alone.read_text().replace(f'version = "{pyproject_version()}"', 'version = "9.8.7"', 1))
    wrong = release.disagreements(tmp_path)
    assert any(w.startswith("charts/judgequeue/Chart.yaml") for w in wrong)
    assert any(w.startswith("Dockerfile") for w in wrong) and any(w.startswith("CHANGELOG.md") for w in wrong)
    changed = release.bump("9.8.7", tmp_path)
    assert "CHANGELOG.md" in changed and "Dockerfile" in changed
    assert release.disagreements(tmp_path) == []
    assert {found for _name, _line, found in release.copies(tmp_path)} == {"9.8.7"}
    assert "## [9.8.7] - Unreleased" in (tmp_path / "CHANGELOG.md").read_text()
    with pytest.raises(ValueError, match="not a version"):
        release.bump("1.2.3-rc.1", tmp_path)  # pip would print 1.2.3rc1: the copies would disagree


# --- CHANGELOG.md ------------------------------------------------------------------------------------

CHANGELOG = ROOT / "CHANGELOG.md"
VERSION_HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\] - (?P<status>.+)$", re.M)


def test_changelog_newest_heading_is_the_package_version() -> None:
    headings = list(VERSION_HEADING.finditer(CHANGELOG.read_text()))
    assert headings, "CHANGELOG.md has no '## [VERSION] - DATE' heading"
    assert headings[0]["version"] == pyproject_version() == VERSION
    # Released entries carry their date; the newest may still be Unreleased until it is merged.
    for heading in headings[1:]:
        assert re.match(r"\d{4}-\d{2}-\d{2}\b", heading["status"]), heading.group(0)
    assert re.match(r"Unreleased$|\d{4}-\d{2}-\d{2}\b", headings[0]["status"]), headings[0].group(0)


def test_changelog_keeps_its_shape() -> None:
    """Keep a Changelog's sections, upgrade notes for the newest release, and 0.1.0 pinned to the
    commit it was recorded at."""
    text = CHANGELOG.read_text()
    newest = text[text.index("\n## [") : text.index("\n## [", text.index("\n## [") + 1)]
    assert "### Upgrade notes" in newest and "helm upgrade" in newest and "judgequeue migrate" in newest
    for section in re.findall(r"^### (.+)$", text, re.M):
        assert section in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security", "Upgrade notes",
                           "Delivery", "Judges", "Cutover and GitOps", "Kubernetes", "Operating it"}, section
    first = text[text.index("## [0.1.0]") :]
    assert "Recorded at commit 3d16a5f" in first
