"""Bring a database to the current schema: ``core/sql/schema.sql`` on a new one, the migrations it lacks on another.

``core/sql/schema.sql`` is the schema as it is now (every table, index and SQL function, in one
file): where each thing is read and changed. The versioned migrations in ``judgequeue.core.migrations``
are the changes since the baseline, version :data:`BASELINE`: the schema the history before it built
one migration at a time (0001 to 0016, each function written again whole at every change) was folded
into the schema file before the first release, so each function has one home. A new database is given
the schema file in one go and recorded at the baseline and every later migration; an existing one at
the baseline (by either road) runs, in file-name order, the later migrations it has not recorded. A
database that stopped partway through the folded history is refused, naming the commit whose
``judgequeue migrate`` takes it to the baseline. ``tests/integration/test_schema.py`` checks that a
database that lived through that history and a new one end in the same catalog. Migrations are
recorded with a checksum in ``judgequeue.schema_migrations``; an applied one that changed is refused.

One run is one transaction holding a transaction-level advisory lock, so concurrent runs (several
pods starting at once) are safe: the second waits, then finds nothing left to do. Nothing outlives
the transaction (no session lock, no session setting), so ``migrate`` works the same directly and
through a transaction pooler such as PgBouncer, and a run that fails leaves the schema as it was.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from importlib import resources

import asyncpg

from .errors import JudgeQueueError

# Any fixed 64-bit number works; it only has to be the same for every judgequeue process.
_MIGRATE_LOCK_KEY = 0x6A7175657565_01

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

#: The version the schema file stands for without any later migration: the last of the folded history.
BASELINE = 16
#: The last commit that carries the folded history's migrations one by one (0001 to 0016).
HISTORY_COMMIT = "919463e07f9eef3e62d4bf4931783106b28dd65f"


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


class MigrationHistoryGap(JudgeQueueError):
    """The database stopped partway through the history folded into the schema file."""


def history_gap(applied: Collection[int]) -> str | None:
    """Why a database with these versions recorded cannot be migrated by this version, or ``None``.

    A new database (nothing recorded) takes the schema file; one at the baseline or after takes the
    later migrations; one that recorded some of the folded history but not its end has no road here.
    """
    if not applied or BASELINE in applied:
        return None
    return (
        f"the database's schema stopped at migration {max(applied):04d}, before {BASELINE:04d}, the "
        f"baseline this version upgrades from: run `judgequeue migrate` of commit {HISTORY_COMMIT[:12]} "
        "on it first (it applies the migrations up to the baseline), then this version's"
    )


def current_schema() -> str:
    """The text of ``core/sql/schema.sql``: the schema as it is now."""
    return resources.files("judgequeue.core.sql").joinpath("schema.sql").read_text()


def available_migrations() -> list[Migration]:
    """The migrations after the baseline shipped with this version, in the order they apply."""
    found = []
    for entry in resources.files("judgequeue.core.migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise JudgeQueueError(f"duplicate migration versions in {versions}")
    if versions and versions[0] <= BASELINE:
        raise JudgeQueueError(f"migration {versions[0]:04d} is not after the baseline {BASELINE:04d}")
    return found


def current_versions(migrations: Sequence[Migration] | None = None) -> list[int]:
    """What a database migrated by this version records: the baseline and every later migration."""
    later = available_migrations() if migrations is None else migrations
    return [BASELINE, *(m.version for m in later)]


async def migrate(conn: asyncpg.Connection, migrations: Sequence[Migration] | None = None) -> list[int]:
    """Apply every migration not yet recorded, in one transaction; return the versions applied.

    On a new database that is the current schema file, in one statement, recorded as the baseline
    and every later migration. ``migrations``: the later migrations (this version's by default).
    """
    later = available_migrations() if migrations is None else list(migrations)
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
        gap = history_gap(applied)
        if gap is not None:
            raise MigrationHistoryGap(gap)
        # A new database takes the schema as it is now; its migrations are then only recorded.
        new = not applied
        if new:
            schema = current_schema()
            await conn.execute(schema)
            await _record(conn, Migration(BASELINE, "baseline", schema))
            applied_now.append(BASELINE)
        for migration in later:
            if migration.version in applied:
                if applied[migration.version] != migration.checksum:
                    raise MigrationChecksumMismatch(
                        f"migration {migration.version:04d}_{migration.name} was changed after it "
                        "was applied; add a new migration instead of editing an applied one"
                    )
                continue
            if not new:
                await conn.execute(migration.sql)
            await _record(conn, migration)
            applied_now.append(migration.version)
    return applied_now


async def _record(conn: asyncpg.Connection, migration: Migration) -> None:
    await conn.execute(
        "INSERT INTO judgequeue.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
        migration.version,
        migration.name,
        migration.checksum,
    )


async def applied_versions(conn: asyncpg.Connection) -> list[int]:
    """Versions recorded as applied (empty before the first migrate)."""
    exists = await conn.fetchval("SELECT to_regclass('judgequeue.schema_migrations') IS NOT NULL")
    if not exists:
        return []
    return [r["version"] for r in await conn.fetch("SELECT version FROM judgequeue.schema_migrations ORDER BY 1")]
