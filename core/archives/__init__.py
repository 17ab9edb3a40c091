"""Problem archives as organisers have them: read a package directory in its own format into the
manifest judgequeue stores (layer 2: a format, no I/O but reading the directory).

Formats, recognised by what the directory holds:

- **Polygon** (``problem.xml``): :mod:`.polygon`;
- **judgequeue** (``problem.yaml`` with an ``id`` and ``tests/``): :mod:`.native`;
- **ICPC/Kattis** (``problem.yaml`` and ``data/``): :mod:`.kattis`.

Every reader returns a :class:`PackageDir`: the manifest (``format`` names the format, whose
verdict rules the judge then applies) and the files it names by sha256.
"""

from __future__ import annotations

from pathlib import Path

from . import kattis, native, polygon
from .common import CHUNK, InvalidPackage, PackageDir, PackageFile, digest

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
    root: Path, *, problem_id: str | None = None, time_limit: float | None = None, fmt: str | None = None
) -> PackageDir:
    """Validate the package in ``root`` in its format (or ``fmt``). ``problem_id`` and ``time_limit``
    fill in what a Kattis package may leave out (its id is its directory's name)."""
    found = fmt or detect(root)
    if found == "polygon":
        return polygon.read(root, problem_id=problem_id)
    if found == "kattis":
        return kattis.read(root, problem_id=problem_id, time_limit=time_limit)
    if found == "judgequeue":
        return native.read(root)
    raise InvalidPackage(f"format must be one of {', '.join(FORMATS)}, got {found!r}")


__all__ = ["CHUNK", "FORMATS", "InvalidPackage", "PackageDir", "PackageFile", "detect", "digest", "read_package"]
