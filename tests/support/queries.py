"""The reads and small setups tests repeat against a judgequeue database.

One place for "what does submission N look like now", "how many are in state S", "set up a queue
on this DSN", instead of the same ``SELECT ... FROM judgequeue.submissions`` in every test file.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeAlias

import asyncpg

from judgequeue.core.store.queues import create_queue
from tests.support.databases import connection

Db: TypeAlias = "asyncpg.Connection | asyncpg.Pool"


async def submission(db: Db, submission_id: int) -> asyncpg.Record:
    """Submission ``submission_id``'s row as it is now (every column); fails if there is none."""
    row: asyncpg.Record | None = await db.fetchrow("SELECT * FROM judgequeue.submissions WHERE id = $1", submission_id)
    assert row is not None, f"no submission {submission_id}"
    return row


async def status_of(db: Db, submission_id: int) -> str:
    return str((await submission(db, submission_id))["status"])


async def submissions(db: Db, ids: Iterable[int] | None = None) -> dict[int, asyncpg.Record]:
    """Every submission's row (or those of ``ids``), by id."""
    if ids is None:
        rows = await db.fetch("SELECT * FROM judgequeue.submissions ORDER BY id")
    else:
        rows = await db.fetch("SELECT * FROM judgequeue.submissions WHERE id = ANY($1) ORDER BY id", list(ids))
    return {row["id"]: row for row in rows}


async def count_submissions(
    db: Db,
    *,
    ids: Iterable[int] | None = None,
    status: str | None = None,
    not_status: Iterable[str] | None = None,
    generation: int | None = None,
) -> int:
    """How many submissions (of ``ids``, if given) are in ``status`` / not in ``not_status`` / at ``generation``."""
    clauses: list[str] = []
    args: list[Any] = []
    for clause, value in (
        ("id = ANY(${})", None if ids is None else list(ids)),
        ("status = ${}", status),
        ("status <> ALL(${})", None if not_status is None else list(not_status)),
        ("generation = ${}", generation),
    ):
        if value is not None:
            args.append(value)
            clauses.append(clause.format(len(args)))
    where = " WHERE " + " AND ".join(clauses) if clauses else ""
    return int(await db.fetchval("SELECT count(*) FROM judgequeue.submissions" + where, *args))


async def status_counts(db: Db) -> dict[str, int]:
    """How many submissions are in each status."""
    rows = await db.fetch("SELECT status, count(*) AS n FROM judgequeue.submissions GROUP BY status")
    return {r["status"]: int(r["n"]) for r in rows}


async def problem_tables(db: Db) -> dict[str, tuple[int, int]]:
    """What the problem package tables hold: (rows, bytes) of files, chunks and packages. Two equal
    snapshots around a refused upload mean it stored nothing."""
    files = await db.fetchrow("SELECT count(*), coalesce(sum(size), 0) FROM judgequeue.problem_files")
    chunks = await db.fetchrow("SELECT count(*), coalesce(sum(octet_length(data)), 0) FROM judgequeue.problem_chunks")
    packages = await db.fetchrow(
        "SELECT count(*), coalesce(sum(octet_length(manifest::text)), 0) FROM judgequeue.problems"
    )
    return {
        name: (int(row[0]), int(row[1]))
        for name, row in (("problem_files", files), ("problem_chunks", chunks), ("problems", packages))
        if row is not None
    }


async def create_queue_at(dsn: str, queue: str, **options: Any) -> None:
    """Create ``queue`` in the database at ``dsn`` (one short connection)."""
    async with connection(dsn) as conn:
        await create_queue(conn, queue, **options)


async def generic_plan(conn: asyncpg.Connection, name: str, types: list[str], literals: list[str]) -> str:
    """The plan Postgres's plan cache uses for queries.sql's ``name`` once it settles on a generic plan
    (one that cannot know the parameters), executed with ``literals`` (SQL text the test writes).

    Postgres 15 has no ``EXPLAIN (GENERIC_PLAN)``: the statement is prepared with its parameter
    ``types`` under ``plan_cache_mode = force_generic_plan`` (for this transaction only).
    """
    from judgequeue.core.store import sql

    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE generic_plan_probe({', '.join(types)}) AS {sql.QUERIES[name]}")
        try:
            rows = await conn.fetch(f"EXPLAIN EXECUTE generic_plan_probe({', '.join(literals)})")
        finally:
            await conn.execute("DEALLOCATE generic_plan_probe")
    return "\n".join(r[0] for r in rows)
