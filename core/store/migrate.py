"""Bring a database to the current schema: ``sql/schema.sql`` on a new one, the migrations it lacks on another.

``core/store/sql/schema.sql`` is the schema as it is now (every table, index and SQL function, in one
file): where each thing is read and changed. The versioned migrations in ``core/store/migrations/``
are every change since the first version, frozen: the road an existing database takes (a change is
written as a new file there and in the schema file; an applied file is never edited). A new
database is given the schema file in one go and recorded at every migration; an existing one runs,
in version order, the migrations its record does not hold. ``tests/integration/test_schema.py``
checks that the two roads end in the same catalog, and that every database an earlier version of
judgequeue could leave gets here in one run. Migrations are recorded with a checksum in
``judgequeue.schema_migrations``.

A record is read against the files and :data:`SUPERSEDED`, the records earlier versions wrote that
are no file of this one (an unreleased migration that was replaced, a migration renumbered, the
schema file once recorded as one version). Each says which migrations' effects a database with it
holds, and what to run to take back an effect no file has; the run then records the files it holds
in their place, so a migrated database's record is the same whatever road it came by. A record
with a hole no version left (:data:`OUT_OF_ORDER`), a version this judgequeue does not have, or a
checksum no version shipped is refused, naming the version, and nothing changes.

One run is one transaction holding a transaction-level advisory lock, so concurrent runs (several
pods starting at once) are safe: the second waits, then finds nothing left to do. Nothing outlives
the transaction (no session lock, no session setting), so ``migrate`` works the same directly and
through a transaction pooler such as PgBouncer, and a run that fails leaves the schema as it was.
It runs beside the roles. A run with migrations to apply first locks every table of the schema, one
after another in name order, before any statement changes one: a roles' transaction that holds one
table and waits for another could otherwise deadlock with a run that altered the second several
migrations earlier, and every such run would be lost whole (an old version's roles under load made
five in a row). A lock it waits for longer than :data:`LOCK_TIMEOUT` rolls the run back and starts
it again (:data:`ATTEMPTS` in all); a deadlock, which Postgres ends at once by failing one side,
does too, up to :data:`DEADLOCK_ATTEMPTS` times.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

import asyncpg

from ..base.errors import JudgeQueueError
from .privileges import ensure_roles, install
from .sql import QUERIES

log = logging.getLogger("judgequeue.store")

# Any fixed 64-bit number works; it only has to be the same for every judgequeue process.
_MIGRATE_LOCK_KEY = 0x6A7175657565_01

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

#: How long one run waits for a table lock the roles hold before it rolls back and starts again:
#: while it waits, their statements on that table queue behind it.
LOCK_TIMEOUT = "2s"
#: Runs that timed out on a lock before it is reported: a transaction held a table that long.
ATTEMPTS = 5
#: Runs that deadlocked before it is reported: each is over within Postgres's deadlock_timeout
#: (1 s by default), and under the roles' load one deadlock says nothing of the next run.
DEADLOCK_ATTEMPTS = 20
#: Every table of the schema locked as the migrations' statements will lock them, in one order.
_LOCK_TABLES = """
DO $$
DECLARE
    t regclass;
BEGIN
    FOR t IN SELECT c.oid::regclass FROM pg_class c
              WHERE c.relnamespace = 'judgequeue'::regnamespace AND c.relkind IN ('r', 'p')
              ORDER BY c.relname
    LOOP
        EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', t);
    END LOOP;
END $$
"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@dataclass(frozen=True)
class Superseded:
    """A record an earlier version of judgequeue wrote that is no file of this one.

    ``holds``: the migrations whose effects a database with this record holds; ``restore``, as
    ``(version, head)``: the end of that migration's file from its line starting ``head``, run again
    before anything else to take back the effect the record holds beyond them.
    """

    version: int
    name: str
    checksum: str
    holds: tuple[int, ...] = ()
    restore: tuple[int, str] | None = None


#: 0014's submit(), the function the unreleased 0015s replaced and every later version kept.
_SUBMIT_OF_0014 = (14, "CREATE OR REPLACE FUNCTION judgequeue.submit(")

#: Every record earlier versions wrote that is not a file here (``git log -- core/store/migrations``).
SUPERSEDED: tuple[Superseded, ...] = (
    # An unreleased 0015 that rewrote submit() (the waiters check in the queue check), then its
    # successor (only the name's check on a miss); both dropped for 0014's function within hours.
    Superseded(15, "submit_statements", "30229316cf07f7a3361270661982677f696b5a6a2d34b968214eea90da2a8482",
               restore=_SUBMIT_OF_0014),
    Superseded(15, "submit_name_check", "951a613ca4d85a870a45fb0209a3f25ea361683ff02afb2c155cd8e18f31c5d1",
               restore=_SUBMIT_OF_0014),
    # The fillfactor change 0015 makes, numbered 0016 while the unreleased 0015 existed.
    Superseded(16, "update_room", "bba206543596a11a9af28d93b282f003d2ecab39407ff68f79ab6168906d901a", holds=(15,)),
    # The schema file recorded as one version, 0016, while the history was folded into it.
    Superseded(16, "baseline", "a54f822b9234ba8a9b5a3c69ec75ddbdd1f0b2bedcf8ffd480b41d8c137198ae",
               holds=tuple(range(1, 17))),
)  # fmt: skip

#: Records with a hole that earlier versions left: a migration that came before a lower number did
#: (0003 before 0002 on main; 0007 and 0009 on branches merged before 0006 and 0008 reached them).
#: The later version that brought the missing one ran it after the higher one; so does this one.
OUT_OF_ORDER: frozenset[frozenset[int]] = frozenset(
    {frozenset({1, 3}), frozenset({1, 2, 3, 4, 5, 7}), frozenset({1, 2, 3, 4, 5, 6, 7, 9})}
)


class MigrationRefused(JudgeQueueError):
    """The database's record of migrations is not one this version can upgrade; nothing was changed."""


class MigrationChecksumMismatch(MigrationRefused):
    """A recorded migration's checksum is neither its file's nor one an earlier version shipped."""


class MigrationUnknownVersion(MigrationRefused):
    """The database records a migration this version does not have (a later version migrated it)."""


class MigrationHistoryGap(MigrationRefused):
    """The record has a hole no version of judgequeue left."""


class MigrationLocked(JudgeQueueError):
    """Every run timed out on a lock or deadlocked with the roles' transactions; nothing was changed."""


@dataclass(frozen=True)
class Plan:
    """What one run does to an existing database, in order."""

    #: Statements taking back effects of superseded records that no file has.
    restore: tuple[str, ...] = ()
    #: Migrations to run, then record.
    apply: tuple[Migration, ...] = ()
    #: Migrations the database holds already whose file is not what it records: recorded as the file.
    relabel: tuple[Migration, ...] = ()


def _spans(versions: Sequence[int]) -> str:
    """``1, 2, 3, 5`` as ``0001-0003, 0005``."""
    spans: list[list[int]] = []
    for v in sorted(versions):
        if spans and spans[-1][1] == v - 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ", ".join(f"{a:04d}" if a == b else f"{a:04d}-{b:04d}" for a, b in spans)


def statement_from(migration: Migration, head: str) -> str:
    """The end of ``migration``'s file from its line that starts with ``head`` (a frozen file: always the same)."""
    at = re.search(rf"^{re.escape(head)}", migration.sql, re.MULTILINE)
    if at is None:
        raise JudgeQueueError(f"migration {migration.label} has no line starting {head!r}")
    return migration.sql[at.start() :]


def plan(recorded: Mapping[int, str], migrations: Sequence[Migration]) -> Plan:
    """What takes a database that records ``recorded`` (version -> checksum) to ``migrations``.

    Raises :class:`MigrationRefused` for a record no version of judgequeue left. An empty record
    gets every migration in turn (``migrate`` gives a new database the schema file instead).
    """
    files = {m.version: m for m in migrations}
    superseded = {(s.version, s.checksum): s for s in SUPERSEDED}
    latest = max(files, default=0)
    holds: set[int] = set()
    restores: list[tuple[int, str]] = []
    for version, checksum in sorted(recorded.items()):
        file = files.get(version)
        earlier = superseded.get((version, checksum))
        if file is not None and checksum == file.checksum:
            holds.add(version)
        elif earlier is not None:
            holds.update(earlier.holds)
            if earlier.restore is not None:
                restores.append(earlier.restore)
        elif file is not None:
            raise MigrationChecksumMismatch(
                f"the database records migration {file.label} with checksum {checksum[:12]}, which no version "
                f"of judgequeue shipped (the file's is {file.checksum[:12]}): was it changed after it was "
                "applied? Add a new migration instead of editing an applied one; nothing was changed"
            )
        else:
            where = (
                "a later version migrated it: run that version's roles, or a later one's"
                if version > latest
                else "no version of judgequeue has it"
            )
            raise MigrationUnknownVersion(
                f"the database records migration {version:04d}, which this judgequeue does not have (it knows "
                f"{_spans(list(files)) or 'none'}): {where}; nothing was changed"
            )
    beyond = sorted(holds - files.keys())
    if beyond:
        raise MigrationUnknownVersion(
            f"the database holds migration {beyond[0]:04d}, which this judgequeue does not have (it knows "
            f"{_spans(list(files)) or 'none'}); nothing was changed"
        )
    top = max(holds, default=0)
    missing = sorted(set(range(1, top + 1)) - holds)
    unheld = [version for version, _ in restores if version not in holds]
    if (missing and frozenset(holds) not in OUT_OF_ORDER) or unheld or (recorded and not holds):
        lacking = sorted({*missing, *unheld}) or [1]
        raise MigrationHistoryGap(
            f"the database records migrations {_spans(list(recorded))} but not {_spans(lacking)}, which no "
            "version of judgequeue left: its schema cannot be told from its record, so migrate will not "
            f"change it (this version takes databases at any version it knows, up to {latest:04d}); "
            "nothing was changed"
        )
    return Plan(
        restore=tuple(statement_from(files[version], head) for version, head in restores),
        apply=tuple(m for m in migrations if m.version not in holds),
        relabel=tuple(m for m in migrations if m.version in holds and recorded.get(m.version) != m.checksum),
    )


def current_schema() -> str:
    """The text of ``core/store/sql/schema.sql``: the schema as it is now."""
    return resources.files("judgequeue.core.store.sql").joinpath("schema.sql").read_text()


def available_migrations() -> list[Migration]:
    """Every migration shipped with this version, in the order they apply."""
    found = []
    for entry in resources.files("judgequeue.core.store").joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(versions) + 1)):
        raise JudgeQueueError(f"the migrations must be numbered 0001 up without a gap or a repeat: {versions}")
    return found


def current_versions(migrations: Sequence[Migration] | None = None) -> list[int]:
    """What a database migrated by this version records: every migration."""
    return [m.version for m in (available_migrations() if migrations is None else migrations)]


async def migrate(
    conn: asyncpg.Connection, migrations: Sequence[Migration] | None = None, *, replay: bool = False
) -> list[int]:
    """Bring the database to ``migrations`` (this version's by default) in one transaction; the versions applied.

    A new database gets the current schema file in one statement, recorded as every migration (all
    returned), unless ``replay``: then each migration runs in turn, as on a database that lived
    through every version. Raises :class:`MigrationRefused` (nothing changed) for a record no
    version left, :class:`MigrationLocked` when every run gave way to the roles' locks.
    """
    files = available_migrations() if migrations is None else list(migrations)
    if migrations is None:
        # Cluster-wide, so outside the run's transaction: the components' group roles.
        for warning in await ensure_roles(conn):
            log.warning("migrate: %s", warning, extra={"event": "migrate_privileges"})
    timeouts = deadlocks = 0
    while True:
        try:
            return await _migrate_once(conn, files, replay=replay, privileges=migrations is None)
        except (asyncpg.DeadlockDetectedError, asyncpg.LockNotAvailableError) as exc:
            if isinstance(exc, asyncpg.DeadlockDetectedError):
                deadlocks += 1
            else:
                timeouts += 1
            if timeouts == ATTEMPTS or deadlocks == DEADLOCK_ATTEMPTS:
                raise MigrationLocked(
                    f"migrate gave way {timeouts + deadlocks} times to other transactions' locks"
                    f" ({exc.sqlstate}: {exc}); nothing was changed: run it again, or end the long"
                    " transactions on judgequeue's tables"
                ) from exc
            await asyncio.sleep(min(1.0, 0.2 * (timeouts + deadlocks)))


async def _migrate_once(
    conn: asyncpg.Connection, files: Sequence[Migration], *, replay: bool, privileges: bool
) -> list[int]:
    async with conn.transaction():
        applied = await _apply(conn, files, replay=replay)
        if privileges:
            # The statements' functions, the components' roles and their grants (core/store/privileges.py).
            installed = await install(conn, QUERIES)
            for warning in installed.warnings:
                log.warning("migrate: %s", warning, extra={"event": "migrate_privileges"})
    return applied


async def _apply(conn: asyncpg.Connection, files: Sequence[Migration], *, replay: bool) -> list[int]:
    # Transaction-scoped: a session lock would stay on a pooled server session (or be released
    # on another one) behind a transaction pooler. Taken before the lock timeout: a second run
    # waits for the first however long it takes.
    await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATE_LOCK_KEY)
    await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
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
    recorded = {r["version"]: r["checksum"] for r in rows}
    if not recorded and not replay:
        # A new database takes the schema as it is now, which every migration is in.
        await conn.execute(current_schema())
        for migration in files:
            await _record(conn, migration, ran=True)
        return [m.version for m in files]
    steps = plan(recorded, files)
    if steps.restore or steps.apply:
        await conn.execute(_LOCK_TABLES)
    for statement in steps.restore:
        await conn.execute(statement)
    for migration in steps.apply:
        await conn.execute(migration.sql)
        await _record(conn, migration, ran=True)
    for migration in steps.relabel:
        await _record(conn, migration, ran=False)
    return [m.version for m in steps.apply]


async def _record(conn: asyncpg.Connection, migration: Migration, *, ran: bool) -> None:
    """Record ``migration`` as the file, in place of what its version recorded; ``ran``: it ran just now."""
    await conn.execute(
        """
        INSERT INTO judgequeue.schema_migrations AS m (version, name, checksum) VALUES ($1, $2, $3)
        ON CONFLICT (version) DO UPDATE
           SET name = excluded.name, checksum = excluded.checksum,
               applied_at = CASE WHEN $4 THEN excluded.applied_at ELSE m.applied_at END
        """,
        migration.version,
        migration.name,
        migration.checksum,
        ran,
    )


async def applied_versions(conn: asyncpg.Connection) -> list[int]:
    """Versions recorded as applied (empty before the first migrate)."""
    exists = await conn.fetchval("SELECT to_regclass('judgequeue.schema_migrations') IS NOT NULL")
    if not exists:
        return []
    return [r["version"] for r in await conn.fetch("SELECT version FROM judgequeue.schema_migrations ORDER BY 1")]
