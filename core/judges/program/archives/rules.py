"""What an archive may hold, enforced before any reader looks at it: an archive is untrusted
input, and reading it must never read anything outside it.

:func:`survey` walks a package directory once, without following a link, and refuses:

- a symbolic link that leaves the package, dangles, loops or names a directory (a link to a
  directory is how a package repeats or contains itself); a link to a regular file inside the
  package is read as that file;
- a FIFO, socket or device, and a package under ``/proc``, ``/sys`` or ``/dev``;
- more than :data:`MAX_ENTRIES` entries, and any file over the per-file bound.

What a reader then takes into the package goes through :class:`~.common.Files`, which checks
again, file by file, while it reads (inside, regular, opened without following a link, counted
while hashed). Every refusal is one :class:`~.common.InvalidPackage` naming the file (relative to
the package) and the rule.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .bounds import ArchiveBounds
from .common import InvalidPackage, kind_of, mib, name_in, within

#: Entries (files and directories) a package may have, wherever they are in it.
MAX_ENTRIES = 100_000
#: Where no package is read from: kernel interfaces, whose "files" are the reading process's own
#: state (``/proc/self/environ``), not content anybody packaged.
SYSTEM_TREES = ("/proc", "/sys", "/dev")


def package_root(root: Path) -> Path:
    """``root`` resolved (the uploader names it, so a link to it is followed), refused when it is
    no directory or lies in a kernel interface."""
    real = Path(os.path.realpath(root))
    if any(within(str(real), tree) for tree in SYSTEM_TREES):
        raise InvalidPackage(f"{root}: a package is never read from {', '.join(SYSTEM_TREES)}")
    if not real.is_dir():
        raise InvalidPackage(f"cannot read {root}: not a directory or a zip archive")
    return real


def survey(root: Path, bounds: ArchiveBounds) -> Path:
    """Check every entry of the package in ``root`` against the rules above, reading no file; the
    package's real root. Raises InvalidPackage naming the first entry (by name) that breaks one."""
    real = package_root(root)
    entries = 0
    pending = [real]
    while pending:
        folder = pending.pop()
        try:
            listing = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            raise InvalidPackage(f"cannot read {name_in(folder, real)}/: {exc.strerror}") from None
        for entry in listing:
            entries += 1
            if entries > MAX_ENTRIES:
                raise InvalidPackage(f"{root}: more than {MAX_ENTRIES} files and directories in the package")
            path = Path(entry.path)
            name = name_in(path, real)
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                info = _link_target(path, name, str(real))
            if stat.S_ISDIR(info.st_mode):
                pending.append(path)
                continue
            kind = kind_of(info.st_mode)
            if kind is not None:
                raise InvalidPackage(f"{name} is {kind}: a package holds only regular files and directories")
            if info.st_size > bounds.max_file_bytes:
                raise InvalidPackage(
                    f"{name} is {mib(info.st_size)}, more than the {bounds.max_file_mb} MiB a file of a package may "
                    "be (JUDGEQUEUE_ARCHIVE_MAX_FILE_MB)"
                )
    return real


def _link_target(path: Path, name: str, top: str) -> os.stat_result:
    """What the symbolic link ``path`` names, when the rules allow the link: it resolves (no loop,
    nothing missing) to a regular file inside the package."""
    written = os.readlink(path)
    target = os.path.realpath(path)
    if not within(target, top):
        raise InvalidPackage(
            f"{name} is a symbolic link to {written!r}, outside the package: a link may only name a file inside it"
        )
    try:
        target = os.path.realpath(path, strict=True)
    except OSError as exc:
        why = "loops" if exc.errno == errno.ELOOP else "names nothing"
        raise InvalidPackage(f"{name} is a symbolic link to {written!r}, which {why}") from None
    info = os.stat(target, follow_symlinks=False)
    if stat.S_ISDIR(info.st_mode):
        raise InvalidPackage(
            f"{name} is a symbolic link to the directory {written!r}: links to directories are refused "
            "(they make a package repeat or contain itself)"
        )
    return info
