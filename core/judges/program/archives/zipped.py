"""Packages as zip archives (how Polygon exports a package; Kattis packages zipped), extracted into a
private directory under the rules a package directory is read by, before any reader looks at them.

An entry is refused, and the whole archive with it, when its name climbs out (``..``), is absolute
(``/etc/x``, ``C:``) or holds a backslash or NUL; when it is a symbolic link or any other special
file (its Unix mode); when it is encrypted; when its name appears twice (or as a file and a
directory). While an entry is decompressed its bytes are counted, never taken from the headers:
past its first MiB it may not grow beyond ``max_ratio`` times the compressed bytes read for it,
nor beyond the per-file bound, and the whole archive may not expand beyond the package bound. A
header that lies about a size fails the entry's CRC and is refused. The extracted tree is then a
package directory like any other: :func:`~.rules.survey` and the readers see only what was written.
"""

from __future__ import annotations

import io
import os
import re
import stat
import zipfile
import zlib
from pathlib import Path

from .bounds import ArchiveBounds
from .common import CHUNK, InvalidPackage, kind_of, mib, within
from .rules import MAX_ENTRIES, SYSTEM_TREES

#: An entry's ratio is checked once it has written this much (a small file compresses as it likes).
RATIO_FLOOR = 1024 * 1024
#: The Unix host system in a zip's "version made by": only its entries carry a file mode.
UNIX = 3
MARKERS = ("problem.xml", "problem.yaml")


class _Counting(io.BufferedReader):
    """The archive file, counting the bytes the decompressor is handed (what an entry really took)."""

    consumed = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.consumed += len(data)
        return data


def is_zip(path: Path) -> bool:
    """Whether ``path`` names a file, which is read as a zip archive (a directory is read as it is;
    a link to either is followed: the uploader names it)."""
    return Path(os.path.realpath(path)).is_file()


def entry_parts(name: str, archive: str) -> tuple[str, ...]:
    """The path an entry names, as parts under the package (pure); InvalidPackage when it leaves it."""
    if "\x00" in name or "\\" in name:
        raise InvalidPackage(f"{archive}: entry {name!r} holds a backslash or NUL: a zip names its files with '/'")
    if name.startswith("/") or re.match(r"[A-Za-z]:", name):
        raise InvalidPackage(f"{archive}: entry {name!r} is an absolute name: an entry names a file inside the package")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise InvalidPackage(f"{archive}: entry {name!r} climbs out of the package ('..'), refused")
    if not parts:
        raise InvalidPackage(f"{archive}: an entry has no name ({name!r})")
    return parts


def _kind(info: zipfile.ZipInfo) -> str | None:
    """What a special entry is (a Unix mode that is no file or directory), for the refusal."""
    mode = info.external_attr >> 16
    if info.create_system != UNIX or stat.S_IFMT(mode) == 0:  # permissions alone (Python's writestr): a file
        return None
    return kind_of(mode)


def _plan(infos: list[zipfile.ZipInfo], archive: str) -> list[tuple[zipfile.ZipInfo, tuple[str, ...]]]:
    """The entries to write, each checked (name, type, encryption, duplicates) before any is."""
    if len(infos) > MAX_ENTRIES:
        raise InvalidPackage(f"{archive}: more than {MAX_ENTRIES} entries")
    files: set[tuple[str, ...]] = set()
    dirs: set[tuple[str, ...]] = set()
    plan = []
    for info in infos:
        parts = entry_parts(info.filename, archive)
        kind = _kind(info)
        if kind is not None:
            raise InvalidPackage(
                f"{archive}: entry {info.filename!r} is {kind}: a package holds only regular files and directories"
            )
        if info.flag_bits & 0x1:
            raise InvalidPackage(f"{archive}: entry {info.filename!r} is encrypted")
        parents = {parts[:i] for i in range(1, len(parts))}
        if info.is_dir():
            if parts in files:
                raise InvalidPackage(f"{archive}: {'/'.join(parts)!r} is both a file and a directory")
            dirs.add(parts)
        else:
            if parts in files:
                raise InvalidPackage(f"{archive}: entry {'/'.join(parts)!r} appears twice")
            if parts in dirs:
                raise InvalidPackage(f"{archive}: {'/'.join(parts)!r} is both a file and a directory")
            files.add(parts)
        clash = parents & files
        if clash:
            raise InvalidPackage(f"{archive}: {'/'.join(min(clash))!r} is both a file and a directory")
        dirs |= parents
        plan.append((info, parts))
    return plan


def extract(archive: Path, into: Path, bounds: ArchiveBounds) -> Path:
    """Write the package in the zip ``archive`` under the empty directory ``into``, by the rules;
    the package's root there (the archive's single top directory when it holds one and nothing
    else, else a directory named after the archive, so a Kattis package's id is its name)."""
    shown = archive.name
    real = os.path.realpath(archive)
    if any(within(real, tree) for tree in SYSTEM_TREES):
        raise InvalidPackage(f"{archive}: a package is never read from {', '.join(SYSTEM_TREES)}")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidPackage(f"cannot read {archive}: {exc.strerror}") from None
    with os.fdopen(fd, "rb", buffering=0) as raw:
        kind = kind_of(os.fstat(fd).st_mode)
        if kind is not None:
            raise InvalidPackage(f"{archive} is {kind}, not a directory or a zip archive")
        stem = Path(shown).stem
        root = into / (stem if stem not in ("", ".", "..") else "package")
        root.mkdir(mode=0o700)
        counting = _Counting(raw)
        try:
            with zipfile.ZipFile(counting) as zf:
                _write(zf, _plan(zf.infolist(), shown), root, counting, bounds, shown)
        except InvalidPackage:
            raise
        except zipfile.BadZipFile as exc:
            raise InvalidPackage(f"{shown} is not a readable zip archive: {exc}") from None
        except (zlib.error, EOFError, NotImplementedError, RuntimeError, OSError, ValueError) as exc:
            raise InvalidPackage(f"{shown} cannot be extracted: {exc}") from None
    listing = list(root.iterdir())
    if len(listing) == 1 and listing[0].is_dir() and not any((root / m).exists() for m in MARKERS):
        return listing[0]
    return root


def _write(
    zf: zipfile.ZipFile,
    plan: list[tuple[zipfile.ZipInfo, tuple[str, ...]]],
    root: Path,
    counting: _Counting,
    bounds: ArchiveBounds,
    shown: str,
) -> None:
    total = 0
    for info, parts in plan:
        target = root.joinpath(*parts)
        if info.is_dir():
            target.mkdir(mode=0o700, parents=True, exist_ok=True)
            continue
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = "/".join(parts)
        out_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(out_fd, "wb") as out, zf.open(info) as source:
            start = counting.consumed
            size = 0
            while block := source.read(CHUNK):
                size += len(block)
                total += len(block)
                _bound(size, total, counting.consumed - start, bounds, name, shown)
                out.write(block)


def _bound(size: int, total: int, compressed: int, bounds: ArchiveBounds, name: str, shown: str) -> None:
    """Refuse an entry that has grown past a bound (checked on every block written)."""
    if size > bounds.max_file_bytes:
        raise InvalidPackage(
            f"{shown}: {name} expands to more than the {bounds.max_file_mb} MiB a file of a package may be "
            "(JUDGEQUEUE_ARCHIVE_MAX_FILE_MB)"
        )
    if total > bounds.max_package_bytes:
        raise InvalidPackage(
            f"{shown} expands to more than the {bounds.max_package_mb} MiB a package may be (at {name}; "
            "JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB)"
        )
    if size > RATIO_FLOOR and size > bounds.max_ratio * max(1, compressed):
        raise InvalidPackage(
            f"{shown}: {name} expands more than {bounds.max_ratio} times ({mib(size)} from {compressed} bytes read), "
            "refused as a zip bomb (JUDGEQUEUE_ARCHIVE_MAX_RATIO)"
        )


__all__ = ["entry_parts", "extract", "is_zip"]
