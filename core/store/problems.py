"""Problem packages: uploaded once into Postgres, referenced by ``{"problem": id, "version": N}``.

A package is a directory in one of the formats :mod:`.archives` reads (judgequeue's own, an
ICPC/Kattis package, a Polygon package); what is stored is its manifest and its files.

:func:`upload` reads and checks the whole package first (:mod:`.archives`: nothing outside it,
nothing over its bounds), then stores it in one transaction: every file the manifest names,
content-addressed (sha256) in 1 MiB chunks so 500 MiB of tests go in bounded statements, then the
package row. A reader never sees half a package, and a refused upload stores nothing. A version
is immutable: uploading it again must give the same manifest digest. Workers keep a local copy of
each package they judge in a :class:`ProblemCache` bounded in bytes, evicting the least recently
used package no running judge holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from ..base import metrics
from ..base.errors import ConfigError, JudgeQueueError
from ..config import ArchiveSettings
from ..judges import BuildsHelpers, Judge, UsesPackages
from ..judges.program.archives import (
    CHUNK,
    InvalidPackage,
    PackageDir,
    PackageFile,
    named_files,
    open_package,
    read_package,
)
from ..transport.connect import STATEMENT_TIMEOUT
from . import sql

MANIFEST_FILE = "problem.yaml"


class UnknownProblem(JudgeQueueError, LookupError):
    """No package has this id and version."""


class VersionConflict(JudgeQueueError):
    """That version exists with different content (versions are immutable)."""


#: Validate a package directory in any format judgequeue reads (see :mod:`.archives`): the archives'
#: :func:`read_package`, under the name the store has always given it.
read_package_dir = read_package


def manifest_digest(manifest: dict[str, Any]) -> str:
    """The digest of a stored manifest (canonical JSON): the identity of a package version."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Uploaded:
    id: str
    version: int
    sha256: str
    tests: int
    total_bytes: int
    new_files: int
    format: str = "judgequeue"
    notes: tuple[str, ...] = ()


async def _store_file(conn: asyncpg.Connection, f: PackageFile) -> bool:
    """Store one file (in the caller's transaction) unless it is stored already; whether it was new.
    What is stored is checked again as it is read: the bytes hashed when the package was read, no
    more (a file changed since is refused, and the transaction with it)."""
    if await conn.fetchval(sql.query("problem_file_exists"), f.sha256):
        return False
    chunks = max(1, -(-f.size // CHUNK))
    if await conn.fetchval(sql.query("problem_file_insert"), f.sha256, f.size, chunks) is None:
        return False  # another upload stored it first (it committed while this one waited on the row)
    h = hashlib.sha256()
    fd = os.open(f.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as data:
        for seq in range(chunks):
            block = data.read(CHUNK)
            h.update(block)
            await conn.execute(sql.query("problem_chunk_insert"), f.sha256, seq, block)
        if data.read(1) or h.hexdigest() != f.sha256:
            raise InvalidPackage(f"{f.path.name} changed while the package was uploaded: upload it again")
    return True


def has_helpers(manifest: dict[str, Any]) -> bool:
    """Whether a manifest names a program the judge builds: a custom checker, an interactor or an
    input validator."""
    checker = manifest.get("checker")
    custom = isinstance(checker, dict) and checker.get("type") == "custom"
    return custom or isinstance(manifest.get("interactor"), dict) or bool(manifest.get("validators"))


def _helper_entry(manifest: dict[str, Any], kind: str) -> tuple[str, dict[str, Any]]:
    """What a build failure ``kind`` (as the judge names it) is called, and its manifest entry."""
    if kind.startswith("validator "):
        return "input validator", manifest["validators"][int(kind.split()[1]) - 1]
    return kind, manifest[kind]


@contextlib.contextmanager
def _judge_of(judge: BuildsHelpers | None, env: Mapping[str, str] | None, what: str) -> Iterator[BuildsHelpers]:
    """``judge``, or a program judge of its own with the settings in ``env`` (this process's
    environment when None) for the block, given back after it; ``what`` says why one is needed."""
    if judge is not None:
        yield judge
        return
    from ..judges.program import ProgramJudge
    from ..judges.sandbox.isolation import load_judge_settings

    try:
        own = ProgramJudge(settings=load_judge_settings(os.environ if env is None else env))
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    try:
        yield own
    finally:
        own.close()


async def build_helpers(
    package: PackageDir, judge: BuildsHelpers | None = None, env: Mapping[str, str] | None = None
) -> None:
    """Build the package's checker, interactor and input validators, or refuse it with the
    compiler's words: a package whose checker does not build would make every submission
    SYSTEM_ERROR, and one whose validator does not build cannot be verified. Without ``judge``, a
    program judge with the settings in ``env`` (its sandbox: a host that cannot isolate refuses,
    unless JUDGEQUEUE_SANDBOX=trusted says the package is trusted)."""
    if not has_helpers(package.manifest):
        return
    with _judge_of(judge, env, "a package's checker and interactor are built before it is stored") as builder:
        failed = await builder.build_helpers(package.manifest, lambda sha: package.files[sha].path)
    for kind, output in failed.items():
        called, entry = _helper_entry(package.manifest, kind)
        what = f"{entry.get('language')}" + (f", {entry['std']}" if entry.get("std") else "")
        raise InvalidPackage(f"the {called} {entry.get('name')} does not build ({what}), so the package is refused:\n"
                             f"{output.rstrip()}")  # fmt: skip


async def make_tests(
    package: PackageDir, staging: Path, judge: BuildsHelpers | None = None, env: Mapping[str, str] | None = None
) -> PackageDir:
    """The package with the tests it leaves to be made (a Polygon package's generated tests and
    the answers of its main solution) made in the program judge's sandbox
    (:mod:`..judges.program.generation`), their files in ``staging``; the package itself when it
    leaves none. Without ``judge``, one made as :func:`build_helpers` makes it."""
    if package.generation is None:
        return package
    from ..judges.program import ProgramJudge
    from ..judges.program.generation import make_tests as make

    with _judge_of(judge, env, "a package's generated tests are made before it is stored") as maker:
        if not isinstance(maker, ProgramJudge):
            raise ConfigError("a package's generated tests are made by the program judge")
        return await make(maker, package, staging)


async def upload(
    conn: asyncpg.Connection,
    root: Path,
    *,
    version: int | None = None,
    problem_id: str | None = None,
    time_limit: float | None = None,
    fmt: str | None = None,
    bounds: ArchiveSettings | None = None,
    judge: BuildsHelpers | None = None,
    judge_env: Mapping[str, str] | None = None,
) -> Uploaded:
    """Store the package in ``root``, a directory or a zip archive of one (idempotent for an identical
    version); returns what was stored. ``bounds``: what the archive may hold (config.ArchiveSettings;
    its defaults when None).

    The package is read and checked whole before anything is written: the tests it leaves to be
    made are made (:func:`make_tests`), its checker and interactor built by ``judge`` (by default
    a program judge set up from ``judge_env``, this process's environment when None, made only
    when there is something to build or make) in the sandbox judging builds them in, then it is
    stored in one transaction: its version decided and checked against a stored one (a conflict
    stores nothing), its new files, then its row. A refused upload leaves nothing behind, and only
    what the manifest names is stored."""
    with (
        open_package(root, problem_id=problem_id, time_limit=time_limit, fmt=fmt, bounds=bounds) as read,
        tempfile.TemporaryDirectory(prefix="judgequeue-made-") as staging,
    ):
        package = await make_tests(read, Path(staging), judge, judge_env)
        await build_helpers(package, judge, judge_env)
        return await _store(conn, package, version)


async def _store(conn: asyncpg.Connection, package: PackageDir, version: int | None) -> Uploaded:
    new_files = 0
    async with conn.transaction():
        await conn.execute(sql.query("problem_lock"), package.id)
        number = version or package.version or int(await conn.fetchval(sql.query("problem_next_version"), package.id))
        manifest = {**package.manifest, "id": package.id, "version": number}
        digest = manifest_digest(manifest)
        existing = await conn.fetchrow(sql.query("problem_get"), package.id, number)
        if existing is not None and existing["sha256"] != digest:
            raise VersionConflict(
                f"{package.id} version {number} exists with other content; versions never change: upload a new version"
            )
        if existing is None:
            # In digest order: two uploads sharing files take their rows in the same order, never a deadlock.
            for sha in sorted(package.files):
                new_files += await _store_file(conn, package.files[sha])
            row = json.dumps(manifest)
            if await conn.fetchval(sql.query("problem_insert"), package.id, number, row, digest) is None:
                raise VersionConflict(f"{package.id} version {number} was stored by another upload meanwhile")
    tests, total = len(package.manifest["tests"]), package.manifest["total_bytes"]
    fmt_of = str(package.manifest.get("format", "judgequeue"))
    return Uploaded(package.id, number, digest, tests, total, new_files, fmt_of, tuple(package.notes))


async def manifest_of(conn: asyncpg.Connection, problem: str, version: int) -> tuple[dict[str, Any], str]:
    """The stored manifest and its digest; UnknownProblem if there is no such version."""
    row = await conn.fetchrow(sql.query("problem_get"), problem, version)
    if row is None:
        raise UnknownProblem(f"no problem package {problem!r} version {version} (upload it first)")
    return json.loads(row["manifest"]), str(row["sha256"])


async def list_problems(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    return [dict(r) for r in await conn.fetch(sql.query("problem_list"))]


async def copy_file(conn: asyncpg.Connection, sha256: str, dest: Path, *, batch: int = 16) -> int:
    """Write a stored file to ``dest`` chunk batch by chunk batch, checking its digest; returns its size."""
    h = hashlib.sha256()
    size = 0
    seq = 0
    with dest.open("wb") as out:
        while True:
            rows = await conn.fetch(sql.query("problem_chunks"), sha256, seq, batch)
            for row in rows:
                out.write(row["data"])
                h.update(row["data"])
                size += len(row["data"])
            seq += len(rows)
            if len(rows) < batch:
                break
    if h.hexdigest() != sha256:
        raise JudgeQueueError(f"stored file {sha256} is corrupt or incomplete (digest {h.hexdigest()})")
    return size


@dataclass
class LocalPackage:
    """A package on this worker's disk: its manifest and where each of its files is."""

    id: str
    version: int
    sha256: str
    manifest: dict[str, Any]
    root: Path
    size: int
    pins: int = 0
    last_used: float = field(default_factory=time.monotonic)

    def path(self, sha256: str) -> Path:
        return self.root / sha256


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class ProblemCache:
    """Packages on local disk, keyed by (id, version, manifest digest), at most ``max_bytes`` in all.

    A package in use (:meth:`package`) is pinned: eviction takes the least recently used package
    nobody holds, so a new version never disturbs a judge still running on the old one. Copies are
    made in a temporary directory and renamed into place, and leftovers of a crashed worker are
    removed when the cache opens.
    """

    def __init__(self, root: Path, max_bytes: int, pool: asyncpg.Pool) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.pool = pool
        self.stats = CacheStats()
        self._entries: dict[tuple[str, int], LocalPackage] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        # Nothing on disk is trusted across a restart (a crash may have left a copy half made):
        # remove what this cache names, never anything else someone pointed it at.
        for leftover in [*root.glob(".incoming-*"), *root.glob("*@*-*")]:
            shutil.rmtree(leftover, ignore_errors=True)

    @property
    def used_bytes(self) -> int:
        return sum(e.size for e in self._entries.values())

    @contextlib.asynccontextmanager
    async def package(self, problem: str, version: int) -> AsyncIterator[LocalPackage]:
        """The package, fetched on a miss, pinned while the caller uses it."""
        key = (problem, version)
        async with self._locks.setdefault(key, asyncio.Lock()):
            entry = self._entries.get(key)
            if entry is not None:
                self.stats.hits += 1
                metrics.PROBLEM_CACHE.labels("hit").inc()
            else:
                self.stats.misses += 1
                metrics.PROBLEM_CACHE.labels("miss").inc()
                entry = await self._fetch(problem, version)
                self._entries[key] = entry
            entry.pins += 1
            entry.last_used = time.monotonic()
        try:
            yield entry
        finally:
            entry.pins -= 1
            entry.last_used = time.monotonic()

    def _evict_for(self, incoming: int) -> None:
        while self.used_bytes + incoming > self.max_bytes:
            idle = [e for e in self._entries.values() if e.pins == 0]
            if not idle:
                return  # everything is in use: go over the bound rather than fail a judge
            victim = min(idle, key=lambda e: e.last_used)
            del self._entries[(victim.id, victim.version)]
            shutil.rmtree(victim.root, ignore_errors=True)
            self.stats.evictions += 1
            metrics.PROBLEM_CACHE.labels("eviction").inc()

    async def _fetch(self, problem: str, version: int) -> LocalPackage:
        async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            manifest, digest = await manifest_of(conn, problem, version)
            size = int(manifest.get("total_bytes", 0))
            if size > self.max_bytes:
                raise JudgeQueueError(
                    f"problem {problem} version {version} is {size} bytes, more than the cache's {self.max_bytes}"
                )
            self._evict_for(size)
            staging = self.root / f".incoming-{uuid.uuid4().hex}"
            staging.mkdir(mode=0o700)
            try:
                for sha in sorted(named_files(manifest)):
                    await copy_file(conn, sha, staging / sha)
                final = self.root / f"{problem}@{version}-{digest[:16]}"
                staging.rename(final)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        return LocalPackage(problem, version, digest, manifest, final, size)


__all__ = [
    "CHUNK",
    "InvalidPackage",
    "PackageDir",
    "PackageFile",
    "ProblemCache",
    "UnknownProblem",
    "VersionConflict",
    "attach_package_cache",
    "list_problems",
    "make_tests",
    "manifest_of",
    "read_package_dir",
    "upload",
]


def attach_package_cache(judge: Judge, pool: asyncpg.Pool) -> ProblemCache | None:
    """Give a judge that judges problem packages by reference its cache of them (judges never
    connect to Postgres themselves); None for judges that need none."""
    if not isinstance(judge, UsesPackages):
        return None
    directory, max_bytes = judge.package_cache()
    cache = ProblemCache(Path(directory), max_bytes, pool)
    judge.attach_packages(cache)
    return cache
