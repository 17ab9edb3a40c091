"""Migrations: fresh database, idempotent re-run, two concurrent runs, and the next migration a version ships."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from judgequeue.core.store.migrate import (
    Migration,
    MigrationChecksumMismatch,
    applied_versions,
    available_migrations,
    current_versions,
    migrate,
)
from tests.support.databases import connection


async def test_fresh_then_rerun_is_a_noop(fresh_db: str) -> None:
    async with connection(fresh_db) as conn:
        assert await applied_versions(conn) == []
        first = await migrate(conn)
        assert first == current_versions()
        assert await migrate(conn) == []
        assert await applied_versions(conn) == first
        assert await conn.fetchval("SELECT to_regproc('judgequeue.submit') IS NOT NULL")


async def test_two_concurrent_runs_apply_each_migration_once(fresh_db: str) -> None:
    conns = [await asyncpg.connect(fresh_db) for _ in range(2)]
    try:
        results = await asyncio.gather(*(migrate(c) for c in conns))
        applied = sorted(v for result in results for v in result)
        assert applied == current_versions()
        assert [] in results
    finally:
        for c in conns:
            await c.close()


#: The migrations of a version that ships one more, as the next schema change will.
FILES = available_migrations()
PROBE = Migration(FILES[-1].version + 1, "probe", "CREATE TABLE judgequeue.probe (x integer)")
WITH_PROBE = [*FILES, PROBE]


async def probe_exists(conn: asyncpg.Connection) -> bool:
    return bool(await conn.fetchval("SELECT to_regclass('judgequeue.probe') IS NOT NULL"))


async def test_a_later_migration_runs_on_an_existing_database_and_is_only_recorded_on_a_new_one(
    fresh_db: str,
) -> None:
    async with connection(fresh_db) as conn:
        assert await migrate(conn) == current_versions()  # an existing database, at this version
        assert await migrate(conn, WITH_PROBE) == [PROBE.version]
        assert await probe_exists(conn)
        assert await migrate(conn, WITH_PROBE) == []
        await conn.execute("DROP SCHEMA judgequeue CASCADE")
        # A new database: the schema file is the schema with every migration in it, so the
        # migration is recorded, not run (the probe is not in the schema file, so it stays absent).
        assert await migrate(conn, WITH_PROBE) == current_versions(WITH_PROBE)
        assert not await probe_exists(conn)


async def test_an_edited_migration_is_refused_and_nothing_changes(fresh_db: str) -> None:
    async with connection(fresh_db) as conn:
        await migrate(conn, WITH_PROBE)
        edited = Migration(PROBE.version, PROBE.name, PROBE.sql + "; CREATE TABLE judgequeue.probe2 (x integer)")
        later = Migration(PROBE.version + 1, "later", "CREATE TABLE judgequeue.later (x integer)")
        recorded = f"migration {PROBE.label} with checksum {PROBE.checksum[:12]}"
        with pytest.raises(MigrationChecksumMismatch, match=recorded):
            await migrate(conn, [*FILES, edited, later])
        assert await applied_versions(conn) == current_versions(WITH_PROBE)
        assert not await conn.fetchval("SELECT to_regclass('judgequeue.later') IS NOT NULL")
