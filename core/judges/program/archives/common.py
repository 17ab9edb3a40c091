"""What every package format reader shares: the validated package, its files, content digests, and
how a program of a package (checker, interactor, validator, solution) is described in a manifest."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ....base.errors import JudgeQueueError
from ..languages import LANGUAGES as LANGUAGE_TABLE
from ..languages import UNAVAILABLE, parse_standard
from .bounds import DEFAULT_BOUNDS, ArchiveBounds

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
    """One file of a package as read: where it is on disk, its digest (the name it is stored and
    cached under) and its size."""

    path: Path
    sha256: str
    size: int


@dataclass(frozen=True)
class Timing:
    """How a package's time limit relates to its solutions' times, as problemtools defines it (only
    ``judgequeue problem verify`` uses it): the limit is the slowest accepted solution's time times
    ``ac_to_time_limit``, rounded up to ``resolution`` seconds; a solution is also judged at the
    limit times ``time_limit_to_tle``."""

    ac_to_time_limit: float = 2.0
    time_limit_to_tle: float = 1.5
    resolution: float = 1.0


#: A legacy Kattis package's defaults (``time_multiplier`` 5, ``time_safety_margin`` 2).
LEGACY_TIMING = Timing(5.0, 2.0, 1.0)


def default_timing(manifest: dict[str, Any]) -> Timing:
    """The timing of a package that gives none of its own: a legacy Kattis package's, else
    problemtools' current defaults (2023-07's, which Polygon and judgequeue packages get too)."""
    legacy = manifest.get("format") == "kattis" and manifest.get("format_version") == "legacy"
    return LEGACY_TIMING if legacy else Timing()


def timing_of(manifest: dict[str, Any]) -> Timing:
    """A manifest's timing: its ``timing`` (a package that gives its own multipliers), else its
    format's defaults (:func:`default_timing`)."""
    given = manifest.get("timing")
    if isinstance(given, dict):
        return Timing(**{k: float(v) for k, v in given.items() if k in Timing.__dataclass_fields__})
    return default_timing(manifest)


@dataclass(frozen=True)
class PackageDir:
    """A validated package directory: the manifest to store and the files it names."""

    id: str
    version: int | None
    manifest: dict[str, Any]  # without id/version/digest
    files: dict[str, PackageFile]  # sha256 -> file
    notes: list[str] = field(default_factory=list)  # what the reader assumed, for the person uploading
    #: What the package leaves to be made before it can be stored (a Polygon package's generated
    #: tests, answers made by its main solution); None when every test's files are in it.
    generation: Generation | None = None


@dataclass(frozen=True)
class Made:
    """One test whose files a package leaves to be made: its input by a generator command (when
    ``cmd`` is given) and its answer by the package's main solution (when ``answer``)."""

    test: int  # 1-based, the manifest's order
    cmd: str | None = None  # the command as the package gives it (``gen 10 20``)
    generator: str | None = None  # the executable it names
    args: tuple[str, ...] = ()
    from_file: str | None = None  # the generator writes several tests to files; this test is this one
    answer: bool = False


@dataclass(frozen=True)
class Generation:
    """What :mod:`..generation` makes before a package is stored: the tests, the generators by
    name and the main solution (manifest program entries), where each file they name is, and the
    package's :class:`Files`, which the made files are taken into under the package's bounds."""

    tests: tuple[Made, ...]
    generators: dict[str, dict[str, Any]]
    main: dict[str, Any] | None
    paths: dict[str, Path]  # sha256 -> path, of every file the programs name
    files: Files


class _AliasRefused(Exception):
    def __init__(self, name: str, line: int) -> None:
        super().__init__(name)
        self.name, self.line = name, line


class _NoAliases(yaml.SafeLoader):
    """yaml.safe_load's loader without aliases: ``*name`` nine levels deep is a billion values once
    anything walks the document (a manifest is stored as JSON), from a problem.yaml of a few lines."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise _AliasRefused(str(event.anchor), event.start_mark.line + 1)
        return super().compose_node(parent, index)


def read_yaml(path: Path, *, empty_ok: bool = False) -> dict[str, Any]:
    """``path`` read as a YAML mapping, or one InvalidPackage naming the file when it cannot be read,
    is not YAML or is no mapping. An empty file is ``{}`` where the format allows it (``empty_ok``:
    a Kattis package's optional files), else no mapping."""
    try:
        loaded = yaml.load(path.read_text(), Loader=_NoAliases)  # a SafeLoader, aliases refused
    except OSError as exc:
        raise InvalidPackage(f"cannot read {path}: {exc.strerror}") from None
    except _AliasRefused as exc:
        raise InvalidPackage(
            f"{path}: YAML aliases are refused in a package (line {exc.line}: *{exc.name}; they can expand "
            "without bound)"
        ) from None
    except yaml.YAMLError as exc:
        raise InvalidPackage(f"{path} is not YAML: {exc}") from None
    if loaded is None and empty_ok:
        return {}
    if not isinstance(loaded, dict):
        raise InvalidPackage(f"{path} must be a mapping")
    return loaded


def mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"


def kind_of(mode: int) -> str | None:
    """What an entry that is neither a regular file nor a directory is, for a refusal (None: it is one)."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def within(path: str, root: str) -> bool:
    """Whether the absolute ``path`` is ``root`` or under it (both resolved, pure)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def name_in(path: Path | str, root: Path) -> str:
    """``path`` as the package names it: relative to its root."""
    try:
        return str(Path(os.path.abspath(path)).relative_to(root)) or "."
    except ValueError:
        return str(path)


class Files(dict[str, PackageFile]):
    """The files a package stores, by sha256, taken in through :meth:`take` only: the one door by
    which a reader reads a file into a package (see :mod:`.rules` for what comes before)."""

    def __init__(self, root: Path, bounds: ArchiveBounds | None = None) -> None:
        super().__init__()
        self.root = Path(os.path.realpath(root))
        self.bounds = bounds or DEFAULT_BOUNDS
        self.total = 0

    def take(self, path: Path) -> PackageFile:
        """Hash ``path`` into the package, refused unless it resolves to a regular file inside the
        package (opened without following a link) no larger than the per-file bound, counted while it
        is read whatever its size said, and the package's files together stay within their bound."""
        name = name_in(path, self.root)
        real = os.path.realpath(path)
        if not within(real, str(self.root)):
            raise InvalidPackage(f"{name} is not a file inside the package")
        return self._take(real, name)

    def take_made(self, path: Path, name: str) -> PackageFile:
        """Hash a file made for the package (a generated test, an answer its main solution wrote,
        in a private directory of the upload's) into it under the same bounds; ``name`` is how a
        refusal names it."""
        return self._take(os.path.realpath(path), name)

    def _take(self, real: str, name: str) -> PackageFile:
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidPackage(f"cannot read {name}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            kind = kind_of(os.fstat(fd).st_mode)
            if kind is not None:
                raise InvalidPackage(f"{name} is {kind}: a package holds only regular files and directories")
            h = hashlib.sha256()
            size = 0
            while block := f.read(CHUNK):
                size += len(block)
                if size > self.bounds.max_file_bytes:
                    raise InvalidPackage(
                        f"{name} is more than the {self.bounds.max_file_mb} MiB a file of a package may be "
                        "(JUDGEQUEUE_ARCHIVE_MAX_FILE_MB)"
                    )
                h.update(block)
        found = PackageFile(Path(real), h.hexdigest(), size)
        if found.sha256 not in self:
            if self.total + size > self.bounds.max_package_bytes:
                raise InvalidPackage(
                    f"the package's files come to more than the {self.bounds.max_package_mb} MiB a package may "
                    f"store (at {name}; JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB)"
                )
            self.total += size
            self[found.sha256] = found
        return found


def add(path: Path, files: Files) -> str:
    """Take ``path`` into the package's ``files``; its sha256."""
    return files.take(path).sha256


def inside(root: Path, relative: str, where: str) -> Path:
    """``root/relative`` if it is a file inside ``root`` (no ``..`` or symlink escapes)."""
    path = (root / relative).resolve()
    if root.resolve() not in path.parents or not path.is_file():
        raise InvalidPackage(f"{where} {relative!r} is not a file inside the package")
    return path


def program(
    main: Path,
    language: str,
    files: Files,
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


def named_files(manifest: dict[str, Any]) -> set[str]:
    """Every file a manifest names: tests, and each program's source and the files beside it (its
    checker, interactor, input validators and solutions)."""
    found = {t[k] for t in manifest.get("tests", []) for k in ("input", "answer") if k in t}
    programs = [
        manifest.get("checker"), manifest.get("interactor"), *manifest.get("validators", []),
        *manifest.get("solutions", []),
    ]  # fmt: skip
    for entry in programs:
        if isinstance(entry, dict) and "file" in entry:
            found.add(entry["file"])
            found.update((entry.get("files") or {}).values())
    return found


def total_bytes(manifest: dict[str, Any], files: Files) -> dict[str, Any]:
    """The finished manifest: ``files`` keeps only what it names (a file read but then left out is
    never stored), and ``total_bytes`` is what they come to."""
    for sha in set(files) - named_files(manifest):
        files.total -= files.pop(sha).size
    manifest["total_bytes"] = sum(f.size for f in files.values())
    return manifest
