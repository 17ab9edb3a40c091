"""The bounds an archive reader holds a package to (docs/judges.md, "What a package may hold").

Readers take any object with these attributes: the roles' ``config.ArchiveSettings``, read from the
``JUDGEQUEUE_ARCHIVE_*`` variables, is one. The judge's layer sits below the roles' settings, so the
readers describe what they read (:class:`ArchiveBounds`) instead of importing it, and hold the same
defaults (:data:`DEFAULT_BOUNDS`, checked equal to ``ArchiveSettings()`` by a unit test) for a
caller that gives none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

_MIB = 1024 * 1024


class ArchiveBounds(Protocol):
    """What a reader reads of its bounds: the largest file, the most a package stores (and a zip
    expands to), and how far a zip entry may expand past its first MiB."""

    @property
    def max_file_mb(self) -> int: ...
    @property
    def max_file_bytes(self) -> int: ...
    @property
    def max_package_mb(self) -> int: ...
    @property
    def max_package_bytes(self) -> int: ...
    @property
    def max_ratio(self) -> int: ...


@dataclass(frozen=True)
class Defaults:
    """The bounds of a read whose caller gives none."""

    max_file_mb: int = 256
    max_package_mb: int = 512  # half the judge's problem cache (JUDGEQUEUE_PROBLEM_CACHE_MB) by default
    max_ratio: int = 1100

    @property
    def max_file_bytes(self) -> int:
        return self.max_file_mb * _MIB

    @property
    def max_package_bytes(self) -> int:
        return self.max_package_mb * _MIB


DEFAULT_BOUNDS: ArchiveBounds = Defaults()
