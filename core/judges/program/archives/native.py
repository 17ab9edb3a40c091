"""judgequeue's own package format: ``problem.yaml`` (id, limits, checker, interactor, scoring) and
``tests/NAME.in`` with ``NAME.ans`` (or ``NAME.out``) beside each (see docs/judges.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..checkers import InvalidChecker, parse_spec
from ..formats import KINDS
from ..scoring import InvalidScoring, parse_scoring
from .bounds import ArchiveBounds
from .common import (
    MAX_TESTS,
    Files,
    InvalidPackage,
    PackageDir,
    add,
    check_id,
    inside,
    natural,
    program,
    read_yaml,
    siblings,
    total_bytes,
)

MANIFEST_FILE = "problem.yaml"
PROTOCOLS = ("testlib", "kattis")


def is_native(root: Path) -> bool:
    """A judgequeue package: ``problem.yaml`` with an ``id`` and a ``tests`` directory."""
    if not (root / MANIFEST_FILE).is_file() or not (root / "tests").is_dir():
        return False
    try:
        spec = yaml.safe_load((root / MANIFEST_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return True  # let the reader name the error
    return isinstance(spec, dict) and "id" in spec


def _program(spec: Any, where: str, root: Path, files: Files) -> dict[str, Any]:
    if not isinstance(spec, dict) or not isinstance(spec.get("source"), str):
        raise InvalidPackage(f"{where} must be an object with a 'source' file (and a 'language')")
    main = inside(root, spec["source"], f"{where}.source")
    listed = spec.get("files")
    if listed is None:
        beside = siblings(main, skip=(MANIFEST_FILE,))
    elif isinstance(listed, list) and all(isinstance(f, str) for f in listed):
        beside = [inside(root, f, f"{where}.files") for f in listed]
    else:
        raise InvalidPackage(f"{where}.files must be a list of file names")
    protocol = spec.get("protocol", "testlib")
    if protocol not in PROTOCOLS:
        raise InvalidPackage(f"{where}.protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    language = spec.get("language", "python")
    return program(main, language, files, beside=beside, protocol=protocol, std=spec.get("std"), where=where)


def _tests(root: Path, files: Files) -> list[dict[str, Any]]:
    folder = root / "tests"
    inputs = sorted(folder.glob("*.in"), key=lambda p: natural(p.stem))
    if not inputs:
        raise InvalidPackage(f"{folder} has no tests (NAME.in with NAME.ans or NAME.out beside each)")
    if len(inputs) > MAX_TESTS:
        raise InvalidPackage(f"{len(inputs)} tests is more than {MAX_TESTS}")
    out = []
    for path in inputs:
        answer = next((p for p in (path.with_suffix(".ans"), path.with_suffix(".out")) if p.is_file()), None)
        if answer is None:
            raise InvalidPackage(f"test {path.name} has no answer ({path.stem}.ans or {path.stem}.out)")
        out.append({"name": path.stem, "input": add(path, files), "answer": add(answer, files)})
    return out


def read(root: Path, *, bounds: ArchiveBounds | None = None) -> PackageDir:
    """Validate a judgequeue package directory (reads and hashes its files)."""
    spec = read_yaml(root / MANIFEST_FILE)
    problem_id = check_id(spec.get("id"), "id")
    version = spec.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise InvalidPackage(f"version must be a positive integer, got {version!r}")
    limits = spec.get("limits", {})
    if not isinstance(limits, dict):
        raise InvalidPackage("limits must be a mapping (time, memory_mb, output_kb)")
    files = Files(root, bounds)
    tests = _tests(root, files)
    manifest: dict[str, Any] = {"format": "judgequeue", "limits": limits, "tests": tests}
    try:
        checker = spec.get("checker", "lines")
        kind = parse_spec(checker).kind
        manifest["checker"] = checker if isinstance(checker, dict) else {"type": checker}
        if kind == "custom":
            manifest["checker"] = {"type": "custom", **_program(checker, "checker", root, files)}
        manifest["scoring"] = spec.get("scoring") or {}
        parse_scoring(spec.get("scoring"), len(tests))
    except (InvalidChecker, InvalidScoring) as exc:
        raise InvalidPackage(str(exc)) from None
    if spec.get("interactor") is not None:
        manifest["interactor"] = _program(spec["interactor"], "interactor", root, files)
    kind_of = spec.get("type", "interactive" if "interactor" in manifest else "batch")
    if kind_of not in KINDS:
        raise InvalidPackage(f"type must be one of {', '.join(KINDS)}, got {kind_of!r}")
    if kind_of == "interactive" and "interactor" not in manifest:
        raise InvalidPackage("type: interactive needs an interactor")
    if kind_of != "interactive" and "interactor" in manifest:
        raise InvalidPackage(f"type: {kind_of} problems have no interactor")
    manifest["type"] = kind_of
    return PackageDir(problem_id, version, total_bytes(manifest, files), files)
