"""A new database and one that lived through the history folded into core/sql/schema.sql end alike.

A new database is given ``core/sql/schema.sql`` in one go; one made before the fold went through the
migrations 0001 to 0016 one by one, as the commit that last carried them runs them (its own runner,
from git). Both must end in the same catalog, compared object by object (tables and their kind,
columns with types, defaults and identity, constraints, indexes, sequences, functions' whole
definitions, triggers). A database that stopped partway through that history is refused with
what to run, and that advice is followed here to the end.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from judgequeue.core.migrate import (
    BASELINE,
    HISTORY_COMMIT,
    MigrationHistoryGap,
    applied_versions,
    current_versions,
    migrate,
)
from tests.support.databases import connection, create_database, drop_database
from tests.support.revisions import migrate_as, ref_tree

#: What the catalog says of every object in the judgequeue schema, one query per kind of object.
CATALOG: dict[str, str] = {
    "relations": """
        SELECT c.relname, c.relkind::text, c.relpersistence::text, c.reloptions::text
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'judgequeue' ORDER BY 1""",
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               a.attidentity::text, a.attgenerated::text, pg_get_expr(d.adbin, d.adrelid)
          FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE n.nspname = 'judgequeue' AND a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p')
         ORDER BY 1, 2""",
    "constraints": """
        SELECT c.relname, k.conname, k.contype::text, pg_get_constraintdef(k.oid)
          FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'judgequeue' ORDER BY 1, 2""",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'judgequeue' ORDER BY 1, 2",
    "sequences": """
        SELECT sequencename, data_type::text, start_value, increment_by, max_value, cycle
          FROM pg_sequences WHERE schemaname = 'judgequeue' ORDER BY 1""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'judgequeue' ORDER BY 1, 2""",
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid)
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'judgequeue' AND NOT t.tgisinternal ORDER BY 1, 2""",
}


async def catalog(conn: asyncpg.Connection) -> dict[str, list[tuple[object, ...]]]:
    return {kind: [tuple(r) for r in await conn.fetch(query)] for kind, query in CATALOG.items()}


@pytest.fixture
async def two_new_databases() -> AsyncIterator[tuple[str, str]]:
    dsns = (await create_database("jq_t", migrated=False), await create_database("jq_t", migrated=False))
    yield dsns
    for dsn in dsns:
        await drop_database(dsn)


def assert_same_catalog(ours: dict[str, list[tuple[object, ...]]], theirs: dict[str, list[tuple[object, ...]]]) -> None:
    assert ours["functions"] and ours["columns"] and ours["triggers"], "the catalog queries must find the schema"
    for kind in CATALOG:
        only_file = sorted(set(ours[kind]) - set(theirs[kind]), key=repr)
        only_history = sorted(set(theirs[kind]) - set(ours[kind]), key=repr)
        assert (only_file, only_history) == ([], []), (
            f"{kind} differ between core/sql/schema.sql (first) and the migrations (second): "
            "write a change in both, the schema file and a new migration"
        )


async def test_the_folded_history_and_the_schema_file_give_the_same_database(
    two_new_databases: tuple[str, str],
) -> None:
    from_file, lived = two_new_databases
    migrate_as(lived, ref_tree(HISTORY_COMMIT), replay=True)  # 0001, 0002, ... 0016, each in turn
    async with connection(from_file) as a, connection(lived) as b:
        assert await applied_versions(b) == list(range(1, BASELINE + 1))
        assert await migrate(a) == current_versions()
        assert await migrate(b) == current_versions()[1:]  # the baseline is reached: only what came after
        assert await applied_versions(a) == current_versions()
        assert_same_catalog(await catalog(a), await catalog(b))


async def test_a_database_partway_through_the_history_is_refused_then_takes_the_advice(
    two_new_databases: tuple[str, str], tmp_path: Path
) -> None:
    from_file, partway = two_new_databases
    history = tmp_path / "history"
    shutil.copytree(ref_tree(HISTORY_COMMIT), history)
    for later in (history / "judgequeue" / "core" / "migrations").glob("001[0-6]_*.sql"):
        later.unlink()
    migrate_as(partway, str(history), replay=True)  # a database made before migration 0010 existed
    async with connection(partway) as conn:
        before = await catalog(conn)
        with pytest.raises(MigrationHistoryGap) as refused:
            await migrate(conn)
        assert await catalog(conn) == before and await applied_versions(conn) == list(range(1, 10))
    assert "migration 0009" in str(refused.value) and HISTORY_COMMIT[:12] in str(refused.value)
    migrate_as(partway, ref_tree(HISTORY_COMMIT))  # `judgequeue migrate` of that commit, as the error says
    async with connection(from_file) as a, connection(partway) as b:
        await migrate(a)
        assert await migrate(b) == current_versions()[1:]
        assert_same_catalog(await catalog(a), await catalog(b))
