"""Problem archives as organisers have them: read a package directory in its own format into the
manifest judgequeue stores (layer 2: a format, no I/O but reading the directory).

A package is a directory, or a zip archive of one (:mod:`.zipped`). Formats, recognised by what
the directory holds:

- **Polygon** (``problem.xml``): :mod:`.polygon`;
- **judgequeue** (``problem.yaml`` with an ``id`` and ``tests/``): :mod:`.native`;
- **ICPC/Kattis** (``problem.yaml`` and ``data/``): :mod:`.kattis`.

Every reader returns a :class:`PackageDir`: the manifest (``format`` names the format, whose
verdict rules the judge then applies) and the files it names by sha256. Before any reader looks at
a package, :func:`.rules.survey` holds it to what a package may be (no link out of it, no special
files, no file over the bound: docs/judges.md, "What a package may hold"), and a reader takes every
file it stores through :class:`.common.Files`, which holds each file and the package to their bounds.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from ..formats import FORMATS
from . import kattis, native, polygon, zipped
from .bounds import DEFAULT_BOUNDS, ArchiveBounds
from .common import CHUNK, Files, InvalidPackage, PackageDir, PackageFile, named_files
from .rules import survey

#: How each format is told apart, in the order they are tried (a Polygon package may also hold a
#: problem.yaml; a judgequeue package is a problem.yaml with an id and tests/).
_DETECTORS: tuple[tuple[str, Callable[[Path], bool]], ...] = (
    ("polygon", polygon.is_polygon), ("judgequeue", native.is_native), ("kattis", kattis.is_kattis),
)


def detect(root: Path) -> str:
    """The format of the package in ``root``; InvalidPackage when it is none of them."""
    if not root.is_dir():
        raise InvalidPackage(f"cannot read {root}: not a directory")
    for name, looks_like in _DETECTORS:
        if looks_like(root):
            return name
    raise InvalidPackage(
        f"{root}: not a problem package (judgequeue: problem.yaml with an id and tests/; "
        "ICPC/Kattis: problem.yaml and data/; Polygon: problem.xml)"
    )


def read_package(
    root: Path,
    *,
    problem_id: str | None = None,
    time_limit: float | None = None,
    fmt: str | None = None,
    bounds: ArchiveBounds | None = None,
) -> PackageDir:
    """Validate the package in ``root`` in its format (or ``fmt``), within ``bounds`` (the
    default ones when None). ``problem_id`` and ``time_limit`` fill in what a Kattis package may leave out
    (its id is its directory's name)."""
    bounds = bounds or DEFAULT_BOUNDS
    real = survey(root, bounds)
    found = fmt or detect(real)
    if found == "polygon":
        return polygon.read(real, problem_id=problem_id, bounds=bounds)
    if found == "kattis":
        return kattis.read(real, problem_id=problem_id, time_limit=time_limit, bounds=bounds)
    if found == "judgequeue":
        return native.read(real, bounds=bounds)
    raise InvalidPackage(f"format must be one of {', '.join(FORMATS)}, got {found!r}")


@contextlib.contextmanager
def open_package(
    path: Path,
    *,
    problem_id: str | None = None,
    time_limit: float | None = None,
    fmt: str | None = None,
    bounds: ArchiveBounds | None = None,
) -> Iterator[PackageDir]:
    """The package at ``path``, a directory or a zip archive (:mod:`.zipped`: extracted by the same
    rules into a private temporary directory, removed when the block ends, so its files are only
    readable inside it); options as :func:`read_package`'s. A refusal of a file inside a zip names
    it as ``archive.zip/inside/the/archive``."""
    bounds = bounds or DEFAULT_BOUNDS
    if not zipped.is_zip(path):
        yield read_package(path, problem_id=problem_id, time_limit=time_limit, fmt=fmt, bounds=bounds)
        return
    with tempfile.TemporaryDirectory(prefix="judgequeue-archive-") as staging:
        root = zipped.extract(path, Path(staging), bounds)
        try:
            package = read_package(root, problem_id=problem_id, time_limit=time_limit, fmt=fmt, bounds=bounds)
        except InvalidPackage as exc:
            shown = str(exc).replace(f"{root}/", f"{path.name}/").replace(str(root), path.name)
            raise InvalidPackage(shown.replace(f"{staging}/", "")) from None
        yield package


__all__ = [
    "CHUNK", "FORMATS", "Files", "InvalidPackage", "PackageDir", "PackageFile", "detect", "named_files", "open_package",
    "read_package",
]
