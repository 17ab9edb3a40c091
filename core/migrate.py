"""Bring a database to the current schema: ``core/sql/schema.sql`` on a new one, the migrations it lacks on another.

``core/sql/schema.sql`` is the schema as it is now (every table, index and SQL function, in one
file); the versioned migrations in ``judgequeue.core.migrations`` are the history that takes an
existing database there. A database with no migration recorded is given the schema file in one go
and every migration is recorded as applied; any other runs, in file-name order, the migrations it
has not recorded yet. ``tests/integration/test_schema.py`` checks that both ways give the same
catalog. Migrations are recorded with a checksum in ``judgequeue.schema_migrations``.

One run is one transaction holding a transaction-level advisory lock, so concurrent runs (several
pods starting at once) are safe: the second waits, then finds nothing left to do. Nothing outlives
the transaction (no session lock, no session setting), so ``migrate`` works the same directly and
through a transaction pooler such as PgBouncer, and a run that fails leaves the schema as it was.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

from .errors import JudgeQueueError

# Any fixed 64-bit number works; it only has to be the same for every judgequeue process.
_MIGRATE_LOCK_KEY = 0x6A7175657565_01

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


class MigrationChecksumMismatch(JudgeQueueError):
    """An applied migration's file changed after it was applied."""


def current_schema() -> str:
    """The text of ``core/sql/schema.sql``: the schema as it is now."""
    return resources.files("judgequeue.core.sql").joinpath("schema.sql").read_text()


def available_migrations() -> list[Migration]:
    """The migrations shipped with this version, in the order they apply."""
    found = []
    for entry in resources.files("judgequeue.core.migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise JudgeQueueError(f"duplicate migration versions in {versions}")
    return found


async def migrate(conn: asyncpg.Connection, *, replay: bool = False) -> list[int]:
    """Apply every migration not yet recorded, in one transaction; return the versions applied.

    On a new database (no migration recorded) that is the current schema file, in one statement,
    unless ``replay``: then each migration runs, as on a database that has seen every release.
    """
    applied_now: list[int] = []
    async with conn.transaction():
        # Transaction-scoped: a session lock would stay on a pooled server session (or be released
        # on another one) behind a transaction pooler.
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATE_LOCK_KEY)
        await conn.execute(
            """
            CREATE SCHEMA IF NOT EXISTS judgequeue;
            CREATE TABLE IF NOT EXISTS judgequeue.schema_migrations (
                version    integer PRIMARY KEY,
                name       text NOT NULL,
                checksum   text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            );
            """
        )
        rows = await conn.fetch("SELECT version, checksum FROM judgequeue.schema_migrations")
        applied = {r["version"]: r["checksum"] for r in rows}
        # A new database takes the schema as it is now; its migrations are then only recorded.
        baseline = not applied and not replay
        if baseline:
            await conn.execute(current_schema())
        for migration in available_migrations():
            if migration.version in applied:
                if applied[migration.version] != migration.checksum:
                    raise MigrationChecksumMismatch(
                        f"migration {migration.version:04d}_{migration.name} was changed after it "
                        "was applied; add a new migration instead of editing an applied one"
                    )
                continue
            if not baseline:
                await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO judgequeue.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                migration.version,
                migration.name,
                migration.checksum,
            )
            applied_now.append(migration.version)
    return applied_now


async def applied_versions(conn: asyncpg.Connection) -> list[int]:
    """Versions recorded as applied (empty before the first migrate)."""
    exists = await conn.fetchval("SELECT to_regclass('judgequeue.schema_migrations') IS NOT NULL")
    if not exists:
        return []
    return [r["version"] for r in await conn.fetch("SELECT version FROM judgequeue.schema_migrations ORDER BY 1")]
