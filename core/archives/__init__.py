"""Problem archives as organisers have them: read a package directory in its own format into the
manifest judgequeue stores (layer 2: a format, no I/O but reading the directory).

Formats, recognised by what the directory holds:

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

from pathlib import Path

from ..config import ArchiveSettings
from . import kattis, native, polygon
from .common import CHUNK, Files, InvalidPackage, PackageDir, PackageFile, named_files
from .rules import survey

FORMATS = ("judgequeue", "kattis", "polygon")


def detect(root: Path) -> str:
    """The format of the package in ``root``; InvalidPackage when it is none of them."""
    if not root.is_dir():
        raise InvalidPackage(f"cannot read {root}: not a directory")
    if polygon.is_polygon(root):
        return "polygon"
    if native.is_native(root):
        return "judgequeue"
    if kattis.is_kattis(root):
        return "kattis"
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
    bounds: ArchiveSettings | None = None,
) -> PackageDir:
    """Validate the package in ``root`` in its format (or ``fmt``), within ``bounds`` (the
    default ones when None). ``problem_id`` and ``time_limit`` fill in what a Kattis package may leave out
    (its id is its directory's name)."""
    bounds = bounds or ArchiveSettings()
    real = survey(root, bounds)
    found = fmt or detect(real)
    if found == "polygon":
        return polygon.read(real, problem_id=problem_id, bounds=bounds)
    if found == "kattis":
        return kattis.read(real, problem_id=problem_id, time_limit=time_limit, bounds=bounds)
    if found == "judgequeue":
        return native.read(real, bounds=bounds)
    raise InvalidPackage(f"format must be one of {', '.join(FORMATS)}, got {found!r}")


__all__ = [
    "CHUNK", "FORMATS", "Files", "InvalidPackage", "PackageDir", "PackageFile", "detect", "named_files", "read_package",
]
