"""Migrations: fresh database, idempotent re-run, and two concurrent runs."""

from __future__ import annotations

import asyncio

import asyncpg

from judgequeue.core.migrate import applied_versions, available_migrations, migrate
from tests.support.databases import connection


async def test_fresh_then_rerun_is_a_noop(fresh_db: str) -> None:
    async with connection(fresh_db) as conn:
        assert await applied_versions(conn) == []
        first = await migrate(conn)
        assert first == [m.version for m in available_migrations()]
        assert await migrate(conn) == []
        assert await applied_versions(conn) == first
        assert await conn.fetchval("SELECT to_regproc('judgequeue.submit') IS NOT NULL")


async def test_two_concurrent_runs_apply_each_migration_once(fresh_db: str) -> None:
    conns = [await asyncpg.connect(fresh_db) for _ in range(2)]
    try:
        results = await asyncio.gather(*(migrate(c) for c in conns))
        applied = sorted(v for result in results for v in result)
        assert applied == [m.version for m in available_migrations()]
        assert [] in results
    finally:
        for c in conns:
            await c.close()


async def test_edited_migration_is_detected(fresh_db: str) -> None:
    async with connection(fresh_db) as conn:
        await migrate(conn)
        await conn.execute("UPDATE judgequeue.schema_migrations SET checksum = 'x' WHERE version = 1")
        try:
            await migrate(conn)
        except Exception as exc:
            assert "was changed after it was applied" in str(exc)
        else:
            raise AssertionError("an edited migration must be refused")
