"""Leases commit without waiting for the WAL flush; a database crash must still lose nothing.

The worker acks a stream entry only after its lease is durable, so a crash either loses a lease
whose entry is still pending (the reaper re-delivers it) or keeps the lease of an acked entry (the
lease owns recovery). Each test freezes the server's WAL writer, so an asynchronous commit stays in
shared memory until the crash that the test causes: the outcome does not depend on timing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core.base.errors import DB_ERRORS
from judgequeue.core.transport import streams
from tests.support import queries
from tests.support.databases import REDIS_URL, connection
from tests.support.pg_servers import PostgresServer
from tests.support.roles import Roles, submit_retrying, wait_all_terminal
from tests.support.waiting import eventually


def roles_for(server: PostgresServer, queue: str, log_dir: Path) -> Roles:
    """Roles on the stream intake, whose entries and acks these tests are about (the direct take's
    test sets its own): with the default, direct intake, a job reaches the stream only when no
    worker took it within a schedule, which made an acked entry a matter of the worker's start-up
    time."""
    env = {
        "JUDGEQUEUE_POSTGRES_DSN": server.dsn,
        "JUDGEQUEUE_REDIS_URL": REDIS_URL,
        "JUDGEQUEUE_QUEUE": queue,
        "JUDGEQUEUE_INTAKE": "stream",
    }
    return Roles(env, log_dir)


async def submission(dsn: str, submission_id: int) -> asyncpg.Record:
    async def fetch() -> asyncpg.Record | None:
        # A connection made just before the postmaster resets every backend for crash recovery
        # is closed under the query: that is "not back yet" too.
        try:
            async with connection(dsn, timeout=2) as conn:
                row: asyncpg.Record | None = await queries.submission(conn, submission_id)
                return row
        except DB_ERRORS:
            return None  # still in crash recovery

    return await eventually(fetch, within=30, what="the server accepting connections")


async def died(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is not None


async def test_lease_lost_in_a_crash_is_redelivered(own_pg: PostgresServer, queue_name: str, tmp_path: Path) -> None:
    roles = roles_for(own_pg, queue_name, tmp_path)
    redis = aioredis.Redis.from_url(REDIS_URL)
    try:
        held = own_pg.hold_wal_writer()
        # Both die by SIGKILL: the dispatcher right after its append (no mark after the lease),
        # the worker right after its lease commit (no durability barrier, no ack).
        [dispatcher] = roles.start("dispatcher", JUDGEQUEUE_FAILPOINTS="dispatcher.after_xadd")
        [worker] = roles.start("worker", JUDGEQUEUE_FAILPOINTS="worker.after_lease")
        sid = await submit_retrying(own_pg.dsn, queue_name, {"seconds": 0.01, "status": "ACCEPTED"})
        await eventually(lambda: died(dispatcher), what="dispatcher killed after its append")
        await eventually(lambda: died(worker), what="worker killed after its lease")
        own_pg.crash_by_killing(held)

        row = await submission(own_pg.dsn, sid)
        assert (row["status"], row["attempt_id"]) == ("PENDING", None), "the crash should have lost the lease"
        pending = await redis.xpending(streams.stream_key(queue_name), streams.GROUP)
        assert pending["pending"] == 1, "the entry must still be pending: it was never acked"

        roles.start_all()
        statuses = await wait_all_terminal(own_pg.dsn, [sid], within=60, roles=roles)
        assert statuses == {sid: "ACCEPTED"}
        row = await submission(own_pg.dsn, sid)
        assert row["generation"] == 1  # re-delivered from the stream, not rescued by lease expiry
    finally:
        codes = roles.stop()
        await redis.aclose()
    assert codes[:2] == [-9, -9] and codes[2:] == [0, 0, 0], roles.logs()


async def test_direct_take_lost_in_a_crash_is_taken_again(
    own_pg: PostgresServer, queue_name: str, tmp_path: Path
) -> None:
    """Direct intake: the take (claim, SENT and lease in one statement) commits asynchronously too.
    A crash loses all of it or none: here all, so the outbox row is ready again and the job is taken
    and judged once more under the same generation (by a worker again, or through the stream if the
    restarted dispatcher's hand-off came first)."""
    roles = roles_for(own_pg, queue_name, tmp_path)
    roles.env["JUDGEQUEUE_INTAKE"] = "direct"
    try:
        held = own_pg.hold_wal_writer()
        [worker] = roles.start("worker", JUDGEQUEUE_FAILPOINTS="worker.after_lease")
        sid = await submit_retrying(own_pg.dsn, queue_name, {"seconds": 0.01, "status": "ACCEPTED"})
        await eventually(lambda: died(worker), what="worker killed right after its take")
        own_pg.crash_by_killing(held)

        row = await submission(own_pg.dsn, sid)
        assert (row["status"], row["attempt_id"]) == ("PENDING", None), "the crash should have lost the lease"
        async with connection(own_pg.dsn) as conn:
            state = await conn.fetchval("SELECT state FROM judgequeue.outbox WHERE submission_id = $1", sid)
        assert state == "PENDING", "the claim is lost with the lease: the row is ready again"

        roles.env["JUDGEQUEUE_LOG_LEVEL"] = "INFO"  # their "started" line: past installing SIGTERM's handler
        roles.start_all()
        statuses = await wait_all_terminal(own_pg.dsn, [sid], within=60, roles=roles)
        assert statuses == {sid: "ACCEPTED"}
        row = await submission(own_pg.dsn, sid)
        assert row["generation"] == 1  # taken again, not rescued by a lease expiry
        # The job can be judged before every restarted role is up; a role stopped before it
        # handles SIGTERM dies of it, so wait for each to say it started.
        await eventually(
            lambda: all(any(e.get("msg", "").endswith(" started") for e in p.events()) for p in roles.procs[1:]),
            within=30,
            what="every restarted role started",
        )
    finally:
        codes = roles.stop()
    assert codes[0] == -9 and codes[1:] == [0, 0, 0], roles.logs()


@pytest.mark.parametrize("database_default", ["on", "off"])
async def test_acked_entry_keeps_its_lease_through_a_crash(
    own_pg: PostgresServer, queue_name: str, tmp_path: Path, database_default: str
) -> None:
    # "off": a database whose default is asynchronous commit; the barrier must still be durable.
    conn = await asyncpg.connect(own_pg.dsn)
    await conn.execute(f"ALTER DATABASE postgres SET synchronous_commit = {database_default}")
    await conn.close()
    roles = roles_for(own_pg, queue_name, tmp_path)
    redis = aioredis.Redis.from_url(REDIS_URL)
    stream = streams.stream_key(queue_name)
    try:
        held = own_pg.hold_wal_writer()
        roles.start("dispatcher")
        [worker] = roles.start("worker")
        sid = await submit_retrying(own_pg.dsn, queue_name, {"seconds": 60, "status": "ACCEPTED"})

        async def acked() -> bool:
            if not await redis.exists(stream):
                return False  # the worker has not created its group yet
            [group] = await redis.xinfo_groups(stream)
            delivered = group["last-delivered-id"] not in (b"0-0", "0-0")
            return bool(delivered and group["pending"] == 0 and await redis.xlen(stream) == 0)

        await eventually(acked, within=15, what="entry read and acked")
        before = await submission(own_pg.dsn, sid)
        assert before["status"] == "JUDGING"
        worker.kill()  # the judge must not finish: only the lease can carry the job now
        worker.wait()
        own_pg.crash_by_killing(held)

        after = await submission(own_pg.dsn, sid)
        assert (after["status"], after["attempt_id"]) == ("JUDGING", before["attempt_id"]), (
            "an acked entry's lease must survive the crash"
        )
    finally:
        roles.stop()
        await redis.aclose()
