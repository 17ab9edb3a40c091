"""Every road to the current schema ends in the same database: the schema file, the history, and each
database an earlier version of judgequeue left.

A new database is given ``core/store/sql/schema.sql`` in one go; the history (``core/store/migrations/``, every
migration since the first version) replayed from empty must give the same catalog, compared object
by object (tables and their kind and storage options, columns with types, defaults and identity,
constraints, indexes, sequences, functions' whole definitions, triggers) and the same record. Each
database an earlier version left (built here by that commit's own ``judgequeue migrate``, from git)
takes this version's in one run and ends there too. What those versions shipped is read from git:
a migration file or a recorded baseline this version does not know fails here, before a user's
database meets it. A record no version left is refused and nothing changes; a run that waits on
a lock the roles hold gives way and runs again.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import asyncpg
import pytest

from judgequeue.core.store import migrate as migrate_module
from judgequeue.core.store.migrate import (
    SUPERSEDED,
    MigrationChecksumMismatch,
    MigrationHistoryGap,
    MigrationLocked,
    MigrationRefused,
    MigrationUnknownVersion,
    applied_versions,
    available_migrations,
    current_versions,
    migrate,
)
from tests.support.databases import connection, dsn_for
from tests.support.revisions import migrate_as, ref_tree, shipped, shipped_where_absent
from tests.support.waiting import eventually

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
    "record": "SELECT version, name, checksum FROM judgequeue.schema_migrations ORDER BY 1",
}

Catalog = dict[str, list[tuple[object, ...]]]


async def catalog(conn: asyncpg.Connection) -> Catalog:
    return {kind: [tuple(r) for r in await conn.fetch(query)] for kind, query in CATALOG.items()}


@pytest.fixture
async def from_file(template_db: str) -> Catalog:
    """The catalog of a new database given the schema file: the session's template database."""
    async with connection(dsn_for(template_db)) as conn:
        return await catalog(conn)


def assert_same_catalog(ours: Catalog, theirs: Catalog) -> None:
    assert ours["functions"] and ours["columns"] and ours["triggers"], "the catalog queries must find the schema"
    for kind in CATALOG:
        only_file = sorted(set(ours[kind]) - set(theirs[kind]), key=repr)
        only_history = sorted(set(theirs[kind]) - set(ours[kind]), key=repr)
        assert (only_file, only_history) == ([], []), (
            f"{kind} differ between core/store/sql/schema.sql (first) and the migrations (second): "
            "write a change in both, the schema file and a new migration"
        )


async def test_the_history_and_the_schema_file_give_the_same_database(fresh_db: str, from_file: Catalog) -> None:
    async with connection(fresh_db) as conn:
        assert await migrate(conn, replay=True) == current_versions()  # 0001, 0002, ... each in turn
        assert await migrate(conn) == []
        assert_same_catalog(from_file, await catalog(conn))


def checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_every_migration_an_earlier_version_shipped_is_known_here() -> None:
    known = {(m.version, m.checksum) for m in available_migrations()} | {(s.version, s.checksum) for s in SUPERSEDED}
    ever = {
        (int(Path(path).name[:4]), checksum(text))
        for path, texts in {**shipped("core/migrations"), **shipped("core/store/migrations")}.items()
        if path.endswith(".sql")
        for text in texts
    }
    assert ever - known == set(), "a migration file main shipped that migrate would refuse: add it to SUPERSEDED"
    # While the history was folded into the schema file, a new database recorded that file as one
    # version (the commits with a schema file and no 0001).
    files = shipped_where_absent("core/sql/schema.sql", "core/migrations/0001_outbox.sql")
    baselines = {checksum(text) for text in files}
    assert baselines - {s.checksum for s in SUPERSEDED if s.name == "baseline"} == set()


#: Databases as earlier versions left them: ``judgequeue migrate`` of each commit in turn, from empty.
#: 78b3575 is the first whose ``judgequeue`` ran anything (2d16aca's did nothing and exited 0).
ROADS = {
    "0001, the first": ["78b3575"],
    "0001 and 0003 (0003 merged first)": ["1129ecb"],
    "0001-0003, the first with every role": ["c59573f"],
    "0001-0005 and 0007 (0007 merged first)": ["cc312d7"],
    "0001-0007 and 0009 (0009 merged first)": ["8746c18"],
    "0010, through every earlier runner": ["78b3575", "c59573f", "cc312d7", "94f4a53"],
    "0014, the schema file of its day": ["a34d6c5"],
    "unreleased 0015 (submit statements)": ["7ad9275"],
    "unreleased 0015, fillfactor as 0016": ["94f4a53", "7ad9275", "5ae1305"],
    "unreleased 0015 (name check), fillfactor as 0016": ["51ca82b"],
    "fillfactor as 0016 alone": ["ad49259"],
    "fillfactor as 0016, then as 0015": ["a34d6c5", "ad49259", "f750735"],
    "fillfactor as 0015": ["f750735"],
    "0016, the history's last": ["919463e"],
    "0016 as the schema file's baseline": ["3d16a5f"],
}


@pytest.mark.parametrize("commits", ROADS.values(), ids=ROADS.keys())
async def test_a_database_an_earlier_version_left_takes_this_one_in_one_run(
    fresh_db: str, from_file: Catalog, commits: list[str]
) -> None:
    for commit in commits:
        await asyncio.to_thread(migrate_as, fresh_db, ref_tree(commit))
        async with connection(fresh_db) as conn:
            assert await applied_versions(conn), f"{commit}'s judgequeue migrate left no record"
    async with connection(fresh_db) as conn:
        await migrate(conn)
        assert await migrate(conn) == []
        assert_same_catalog(from_file, await catalog(conn))


async def test_a_record_no_version_left_is_refused_and_nothing_changes(fresh_db: str) -> None:
    async with connection(fresh_db) as conn:
        await migrate(conn)
        tamperings = {
            "UPDATE judgequeue.schema_migrations SET checksum = repeat('0', 64) WHERE version = 12": (
                MigrationChecksumMismatch, "migration 0012_shadow_verdicts with checksum 000000000000"),
            "INSERT INTO judgequeue.schema_migrations (version, name, checksum) VALUES (99, 'later', 'x')": (
                MigrationUnknownVersion, "migration 0099"),
            "DELETE FROM judgequeue.schema_migrations WHERE version = 10": (MigrationHistoryGap, "but not 0010"),
        }  # fmt: skip
        for tamper, (error, naming) in tamperings.items():
            tampered = conn.transaction()  # rolled back after each: the next starts from the true record
            await tampered.start()
            try:
                await conn.execute(tamper)
                before = await catalog(conn)
                with pytest.raises(error, match=naming) as refused:
                    await migrate(conn)
                assert isinstance(refused.value, MigrationRefused)
                assert await catalog(conn) == before
            finally:
                await tampered.rollback()


async def _lock_wait_since(observer: asyncpg.Connection, conn: asyncpg.Connection) -> object:
    """When the transaction ``conn`` is in began, while it waits for a lock; None when it does not wait."""
    return await observer.fetchval(
        "SELECT xact_start FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
        conn.get_server_pid(),
    )


async def test_a_run_gives_way_to_a_lock_the_roles_hold_and_runs_again(
    fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migrate_module, "LOCK_TIMEOUT", "200ms")
    files = available_migrations()
    # At 0015: the next migration alters the outbox.
    at = next(i for i, m in enumerate(files) if m.name == "outbox_full_pages")
    async with connection(fresh_db) as conn, connection(fresh_db) as holder, connection(fresh_db) as observer:
        await migrate(conn, files[:at], replay=True)
        await holder.execute("BEGIN; LOCK TABLE judgequeue.outbox IN SHARE MODE")  # as a CREATE INDEX would

        async def waiting_since() -> object:
            return await _lock_wait_since(observer, conn)

        monkeypatch.setattr(migrate_module, "ATTEMPTS", 2)
        with pytest.raises(MigrationLocked, match="gave way 2 times"):
            await migrate(conn)
        assert await applied_versions(conn) == current_versions()[:at]

        monkeypatch.undo()
        monkeypatch.setattr(migrate_module, "LOCK_TIMEOUT", "200ms")
        run = asyncio.create_task(migrate(conn))
        first = await eventually(waiting_since, within=10, what="migrate waiting for the outbox's lock")

        async def waiting_again() -> bool:
            since = await waiting_since()
            return since is not None and since != first

        await eventually(waiting_again, within=10, what="migrate rolled back and waiting again")
        await holder.execute("COMMIT")
        assert await run == [m.version for m in files[at:]]


async def test_a_run_takes_its_tables_before_changing_one_so_a_transaction_holding_one_does_not_deadlock_it(
    fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0015 alters the submissions, then the outbox. A transaction holding the outbox that then
    wants the submissions deadlocked a run that had altered them already (the run, waiting first,
    was failed); a run that locks every table in one order first waits at the outbox, holding
    nothing the transaction wants."""
    monkeypatch.setattr(migrate_module, "DEADLOCK_ATTEMPTS", 1)  # one deadlock fails the run
    monkeypatch.setattr(migrate_module, "LOCK_TIMEOUT", "30s")
    files = available_migrations()
    at = next(i for i, m in enumerate(files) if m.name == "update_room")
    async with connection(fresh_db) as conn, connection(fresh_db) as holder, connection(fresh_db) as observer:
        await migrate(conn, files[:at], replay=True)
        await holder.execute("BEGIN; LOCK TABLE judgequeue.outbox IN SHARE MODE")  # as a CREATE INDEX would
        run = asyncio.create_task(migrate(conn))

        async def waiting() -> bool:
            return await _lock_wait_since(observer, conn) is not None

        await eventually(waiting, within=10, what="migrate waiting for the outbox")
        # Granted at once when the run holds nothing of the submissions; a deadlock otherwise,
        # which the run (waiting first) detects after deadlock_timeout and is failed by.
        await asyncio.wait_for(holder.execute("LOCK TABLE judgequeue.submissions IN SHARE MODE"), 30)
        await holder.execute("COMMIT")
        assert await run == [m.version for m in files[at:]]
