"""Problem packages: uploaded once into Postgres, referenced by ``{"problem": id, "version": N}``.

A package is a directory::

    problem.yaml        id, limits, checker, optional interactor and scoring (see docs/judges.md)
    tests/01.in         inputs, each with its answer beside it: 01.ans (or 01.out)
    tests/01.ans
    checker.py          a custom checker or interactor, when problem.yaml names one

:func:`upload` stores every file content-addressed (sha256) in 1 MiB chunks, one transaction per
file, then the package row naming them, so a reader never sees half a package and 500 MiB of
tests go in bounded statements. A version is immutable: uploading it again must give the same
manifest digest. Workers keep a local copy of each package they judge in a :class:`ProblemCache`
bounded in bytes, evicting the least recently used package no running judge holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import yaml

from . import metrics, sql
from .connect import STATEMENT_TIMEOUT
from .errors import JudgeQueueError
from .judges.checkers import InvalidChecker, parse_spec
from .judges.languages import LANGUAGES as LANGUAGE_TABLE
from .judges.scoring import InvalidScoring, parse_scoring

CHUNK = 1024 * 1024
MANIFEST_FILE = "problem.yaml"
_ID = re.compile(r"[a-z0-9]([-a-z0-9_.]*[a-z0-9])?")
MAX_TESTS = 10_000
LANGUAGES = tuple(LANGUAGE_TABLE)  # a checker or interactor may be written in any language the judge runs


class InvalidPackage(JudgeQueueError, ValueError):
    """A package directory that does not describe a problem; the message names the file or field."""


class UnknownProblem(JudgeQueueError, LookupError):
    """No package has this id and version."""


class VersionConflict(JudgeQueueError):
    """That version exists with different content (versions are immutable)."""


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


def _digest(path: Path) -> PackageFile:
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
            size += len(block)
    return PackageFile(path, h.hexdigest(), size)


def _program(spec: Any, where: str, root: Path, files: dict[str, PackageFile]) -> dict[str, Any]:
    if not isinstance(spec, dict) or not isinstance(spec.get("source"), str):
        raise InvalidPackage(f"{where} must be an object with a 'source' file (and a 'language')")
    language = spec.get("language", "python")
    if language not in LANGUAGES:
        raise InvalidPackage(f"{where}.language must be one of {', '.join(LANGUAGES)}, got {language!r}")
    path = (root / spec["source"]).resolve()
    if root.resolve() not in path.parents or not path.is_file():
        raise InvalidPackage(f"{where}.source {spec['source']!r} is not a file inside the package")
    found = _digest(path)
    files[found.sha256] = found
    return {"language": language, "file": found.sha256}


def _natural(path: Path) -> list[Any]:
    """Sort key putting test 2 before test 10."""
    return [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", path.stem)]


def _tests(root: Path, files: dict[str, PackageFile]) -> list[dict[str, str]]:
    folder = root / "tests"
    inputs = sorted(folder.glob("*.in"), key=_natural)
    if not inputs:
        raise InvalidPackage(f"{folder} has no tests (NAME.in with NAME.ans or NAME.out beside each)")
    if len(inputs) > MAX_TESTS:
        raise InvalidPackage(f"{len(inputs)} tests is more than {MAX_TESTS}")
    out = []
    for path in inputs:
        answer = next((p for p in (path.with_suffix(".ans"), path.with_suffix(".out")) if p.is_file()), None)
        if answer is None:
            raise InvalidPackage(f"test {path.name} has no answer ({path.stem}.ans or {path.stem}.out)")
        pair = _digest(path), _digest(answer)
        for f in pair:
            files[f.sha256] = f
        out.append({"name": path.stem, "input": pair[0].sha256, "answer": pair[1].sha256})
    return out


def read_package_dir(root: Path) -> PackageDir:
    """Validate a package directory (reads and hashes its files); InvalidPackage names what is wrong."""
    spec_path = root / MANIFEST_FILE
    try:
        spec = yaml.safe_load(spec_path.read_text())
    except OSError as exc:
        raise InvalidPackage(f"cannot read {spec_path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InvalidPackage(f"{spec_path} is not YAML: {exc}") from None
    if not isinstance(spec, dict):
        raise InvalidPackage(f"{spec_path} must be a mapping")
    problem_id = spec.get("id")
    if not isinstance(problem_id, str) or len(problem_id) > 100 or _ID.fullmatch(problem_id) is None:
        raise InvalidPackage(f"id must be lowercase letters, digits, '-', '_' or '.', got {problem_id!r}")
    version = spec.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise InvalidPackage(f"version must be a positive integer, got {version!r}")
    limits = spec.get("limits", {})
    if not isinstance(limits, dict):
        raise InvalidPackage("limits must be a mapping (time, memory_mb, output_kb)")
    files: dict[str, PackageFile] = {}
    tests = _tests(root, files)
    manifest: dict[str, Any] = {"limits": limits, "tests": tests}
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
    manifest["total_bytes"] = sum(f.size for f in files.values())
    return PackageDir(problem_id, version, manifest, files)


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


async def _store_file(conn: asyncpg.Connection, f: PackageFile) -> bool:
    if await conn.fetchval(sql.query("problem_file_exists"), f.sha256):
        return False
    chunks = max(1, -(-f.size // CHUNK))
    async with conn.transaction():
        await conn.execute(sql.query("problem_file_insert"), f.sha256, f.size, chunks)
        with f.path.open("rb") as data:
            for seq in range(chunks):
                await conn.execute(sql.query("problem_chunk_insert"), f.sha256, seq, data.read(CHUNK))
    return True


async def upload(conn: asyncpg.Connection, root: Path, *, version: int | None = None) -> Uploaded:
    """Store the package in ``root`` (idempotent for an identical version); returns what was stored."""
    package = read_package_dir(root)
    new_files = 0
    for f in package.files.values():
        new_files += await _store_file(conn, f)
    async with conn.transaction():
        await conn.execute(sql.query("problem_lock"), package.id)
        number = version or package.version or int(await conn.fetchval(sql.query("problem_next_version"), package.id))
        manifest = {**package.manifest, "id": package.id, "version": number}
        digest = manifest_digest(manifest)
        inserted = await conn.fetchval(sql.query("problem_insert"), package.id, number, json.dumps(manifest), digest)
        if inserted is None:
            existing = await conn.fetchrow(sql.query("problem_get"), package.id, number)
            if existing["sha256"] != digest:
                raise VersionConflict(
                    f"{package.id} version {number} exists with other content; versions never change: "
                    "upload a new version"
                )
    tests, total = len(package.manifest["tests"]), package.manifest["total_bytes"]
    return Uploaded(package.id, number, digest, tests, total, new_files)


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
                for sha in sorted(_files_of(manifest)):
                    await copy_file(conn, sha, staging / sha)
                final = self.root / f"{problem}@{version}-{digest[:16]}"
                staging.rename(final)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        return LocalPackage(problem, version, digest, manifest, final, size)


def _files_of(manifest: dict[str, Any]) -> set[str]:
    found = {t[k] for t in manifest.get("tests", []) for k in ("input", "answer")}
    for name in ("checker", "interactor"):
        program = manifest.get(name)
        if isinstance(program, dict) and "file" in program:
            found.add(program["file"])
    return found
