"""What every package format reader shares: the validated package, its files, content digests, and
how a program of a package (checker, interactor, validator, solution) is described in a manifest."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import JudgeQueueError
from ..judges.languages import LANGUAGES as LANGUAGE_TABLE
from ..judges.languages import UNAVAILABLE, parse_standard

CHUNK = 1024 * 1024
MAX_TESTS = 10_000
#: Files shipped beside one program (testlib.h, a validator's header...): at most this many, this big.
MAX_BESIDE_FILES = 64
MAX_BESIDE_BYTES = 16 * 1024 * 1024
ID = re.compile(r"[a-z0-9]([-a-z0-9_.]*[a-z0-9])?")
LANGUAGES = tuple(LANGUAGE_TABLE)  # a checker or interactor may be written in any language the judge runs


class InvalidPackage(JudgeQueueError, ValueError):
    """A package directory that does not describe a problem; the message names the file or field."""


@dataclass(frozen=True)
class PackageFile:
    path: Path
    sha256: str
    size: int


@dataclass(frozen=True)
class PackageDir:
    """A validated package directory: the manifest to store and the files it names."""

    id: str
    version: int | None
    manifest: dict[str, Any]  # without id/version/digest
    files: dict[str, PackageFile]  # sha256 -> file
    notes: list[str] = field(default_factory=list)  # what the reader assumed, for the person uploading


def read_yaml(path: Path, *, empty_ok: bool = False) -> dict[str, Any]:
    """``path`` read as a YAML mapping, or one InvalidPackage naming the file when it cannot be read,
    is not YAML or is no mapping. An empty file is ``{}`` where the format allows it (``empty_ok``:
    a Kattis package's optional files), else no mapping."""
    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidPackage(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InvalidPackage(f"{path} is not YAML: {exc}") from None
    if loaded is None and empty_ok:
        return {}
    if not isinstance(loaded, dict):
        raise InvalidPackage(f"{path} must be a mapping")
    return loaded


def digest(path: Path) -> PackageFile:
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
            size += len(block)
    return PackageFile(path, h.hexdigest(), size)


def add(path: Path, files: dict[str, PackageFile]) -> str:
    """Hash ``path`` into ``files``; its sha256."""
    found = digest(path)
    files[found.sha256] = found
    return found.sha256


def inside(root: Path, relative: str, where: str) -> Path:
    """``root/relative`` if it is a file inside ``root`` (no ``..`` or symlink escapes)."""
    path = (root / relative).resolve()
    if root.resolve() not in path.parents or not path.is_file():
        raise InvalidPackage(f"{where} {relative!r} is not a file inside the package")
    return path


def program(
    main: Path,
    language: str,
    files: dict[str, PackageFile],
    *,
    beside: list[Path] | None = None,
    protocol: str | None = None,
    std: str | None = None,
    where: str,
) -> dict[str, Any]:
    """A program's manifest entry: its main source, the files shipped beside it (by name), its
    language (a row of the judge's table) and standard (C, C++; None: the row's default) and, for
    checkers and interactors, the protocol it speaks (testlib or kattis)."""
    if language in UNAVAILABLE:
        raise InvalidPackage(f"{where}: language {language!r} is not offered here: {UNAVAILABLE[language]}")
    if language not in LANGUAGES:
        raise InvalidPackage(f"{where}: language must be one of {', '.join(LANGUAGES)}, got {language!r}")
    try:
        std = parse_standard(LANGUAGE_TABLE[language], std)
    except ValueError as exc:
        raise InvalidPackage(f"{where}: {exc}") from None
    entry: dict[str, Any] = {"language": language, "file": add(main, files), "name": main.name}
    if std is not None:
        entry["std"] = std
    others = [p for p in (beside or []) if p != main]
    if len(others) > MAX_BESIDE_FILES or sum(p.stat().st_size for p in others) > MAX_BESIDE_BYTES:
        raise InvalidPackage(
            f"{where}: more than {MAX_BESIDE_FILES} files or {MAX_BESIDE_BYTES >> 20} MiB beside {main.name} "
            "(give the program a directory of its own)"
        )
    if others:
        entry["files"] = {p.name: add(p, files) for p in sorted(others)}
    if protocol is not None:
        entry["protocol"] = protocol
    return entry


def siblings(main: Path, *, skip: tuple[str, ...] = ()) -> list[Path]:
    """Every regular file in ``main``'s directory (what a package ships beside a program), but ``skip``."""
    return sorted(p for p in main.parent.iterdir() if p.is_file() and not p.name.startswith(".") and p.name not in skip)


def natural(name: str) -> list[Any]:
    """Sort key putting test 2 before test 10."""
    return [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", name)]


def check_id(problem_id: Any, where: str) -> str:
    if not isinstance(problem_id, str) or len(problem_id) > 100 or ID.fullmatch(problem_id) is None:
        raise InvalidPackage(f"{where} must be lowercase letters, digits, '-', '_' or '.', got {problem_id!r}")
    return problem_id


def total_bytes(manifest: dict[str, Any], files: dict[str, PackageFile]) -> dict[str, Any]:
    manifest["total_bytes"] = sum(f.size for f in files.values())
    return manifest
