"""The current schema file and the migrations give the same database (core/sql/schema.sql).

A new database is given ``core/sql/schema.sql`` in one go, an existing one the migrations it lacks
(core/migrate.py): both must end in the same catalog, compared here object by object (tables and
their kind, columns with types, defaults and identity, constraints, indexes, sequences, functions'
whole definitions, triggers), and with the same migrations recorded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from judgequeue.core.migrate import applied_versions, available_migrations, migrate
from tests.support.databases import connection, create_database, drop_database

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
    "migrations recorded": "SELECT version, name, checksum FROM judgequeue.schema_migrations ORDER BY 1",
}


async def catalog(conn: asyncpg.Connection) -> dict[str, list[tuple[object, ...]]]:
    return {kind: [tuple(r) for r in await conn.fetch(query)] for kind, query in CATALOG.items()}


@pytest.fixture
async def two_new_databases() -> AsyncIterator[tuple[str, str]]:
    dsns = (await create_database("jq_t", migrated=False), await create_database("jq_t", migrated=False))
    yield dsns
    for dsn in dsns:
        await drop_database(dsn)


async def test_the_schema_file_and_the_migrations_give_the_same_database(two_new_databases: tuple[str, str]) -> None:
    from_file, replayed = two_new_databases
    async with connection(from_file) as a, connection(replayed) as b:
        assert await migrate(a) == await migrate(b, replay=True) == [m.version for m in available_migrations()]
        ours, theirs = await catalog(a), await catalog(b)
    assert ours["functions"] and ours["columns"] and ours["triggers"], "the catalog queries must find the schema"
    for kind in CATALOG:
        only_file = sorted(set(ours[kind]) - set(theirs[kind]), key=repr)
        only_migrations = sorted(set(theirs[kind]) - set(ours[kind]), key=repr)
        assert (only_file, only_migrations) == ([], []), (
            f"{kind} differ between core/sql/schema.sql (first) and the migrations (second): "
            "write a change in both, the schema file and a new migration"
        )


async def test_a_database_from_the_schema_file_takes_later_migrations(fresh_db: str) -> None:
    """Every migration is recorded on a new database, so an upgrade runs only what comes after."""
    async with connection(fresh_db) as conn:
        assert await migrate(conn) == [m.version for m in available_migrations()]
        assert await migrate(conn) == []
        assert await applied_versions(conn) == [m.version for m in available_migrations()]
