"""What real servers and foreign clients do to a running queue (reproductions of what users saw).

Each test starts the roles as real processes, does to them what a user did from outside with
``psql`` and ``redis-cli``, and checks the invariants: the roles stay up (and exit 0 on SIGTERM),
every good submission gets exactly one terminal verdict, and every foreign entry leaves the PEL.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from judgequeue.core.transport import streams
from judgequeue.core.transport.envelope import Envelope
from tests.support.databases import connection
from tests.support.queries import count_submissions, create_queue_at
from tests.support.roles import Roles, submit_retrying, wait_all_terminal
from tests.support.waiting import eventually

OK = {"seconds": 0.002, "status": "ACCEPTED"}


async def _started(pg_dsn: str, queue: str, redis: aioredis.Redis, tmp_path: Path, *, workers: int) -> Roles:
    """The queue, its roles (one job at a time per worker) running, and the consumer group in place."""
    await create_queue_at(pg_dsn, queue)
    roles = Roles.on(pg_dsn, queue, tmp_path, JUDGEQUEUE_CONCURRENCY="1")
    roles.start_all(workers=workers)
    try:
        await eventually(lambda: _group_exists(redis, streams.stream_key(queue)), within=30, what="consumer group")
    except BaseException:
        roles.stop()
        raise
    return roles


async def _terminate_backends(admin: asyncpg.Connection, database: str) -> int:
    terminated = await admin.fetchval(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = $1 AND pid <> pg_backend_pid()",
        database,
    )
    return int(terminated or 0)


async def test_roles_survive_every_backend_terminated_repeatedly(pg_dsn: str, queue_name: str, tmp_path: Path) -> None:
    """``pg_terminate_backend`` of every session, again and again, while jobs flow."""
    await create_queue_at(pg_dsn, queue_name)
    database = pg_dsn.rsplit("/", 1)[1]
    roles = Roles.on(pg_dsn, queue_name, tmp_path)
    roles.start_all(dispatchers=2, workers=2)
    admin = await asyncpg.connect(pg_dsn.rsplit("/", 1)[0] + "/postgres")
    ids: list[int] = []
    terminated = 0
    try:
        for _ in range(8):
            # A stream of submissions between terminations, each committed on its own connection.
            for _ in range(25):
                ids.append(await submit_retrying(pg_dsn, queue_name, OK))
            terminated += await _terminate_backends(admin, database)
        statuses = await wait_all_terminal(pg_dsn, ids, within=90, roles=roles)
        assert set(statuses.values()) == {"ACCEPTED"}
        assert terminated > 0
        assert roles.alive() == 5, "every role rides out its sessions being terminated\n" + roles.logs()
        # The roles still work after the faults, not only survive them.
        terminated += await _terminate_backends(admin, database)
        after = [await submit_retrying(pg_dsn, queue_name, OK) for _ in range(20)]
        await wait_all_terminal(pg_dsn, after, within=60, roles=roles)
    finally:
        await admin.close()
        codes = roles.stop()
    assert codes == [0] * 5, roles.logs()
    async with connection(pg_dsn) as conn:
        verdicts = await count_submissions(conn, ids=ids + after, not_status=("PENDING", "JUDGING"))
    assert verdicts == len(ids) + len(after), "every one has its verdict"


async def _pending(redis: aioredis.Redis, queue: str) -> int:
    summary = await redis.xpending(streams.stream_key(queue), streams.GROUP)
    return int(summary["pending"])


async def test_foreign_entries_leave_the_pel_and_the_workers_stay_up(
    pg_dsn: str, queue_name: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    """Non-UTF-8 bytes and a submission id beyond int64, written with XADD by a foreign client."""
    roles = await _started(pg_dsn, queue_name, redis_client, tmp_path, workers=2)
    key = streams.stream_key(queue_name)
    try:
        foreign = [
            {b"submission": b"\xff\xfe\x01", b"generation": b"1"},
            {
                b"submission": b"99999999999999999999999",
                b"generation": b"1",
                b"attempt": b"1",
                b"outbox": b"1",
                b"enqueued_at": b"1.0",
                b"deliveries": b"1",
            },
            {b"\xff\xfe": b"\x00", b"generation": b"1"},
        ]
        for fields in foreign:
            await redis_client.xadd(key, fields)  # type: ignore[arg-type]
        started = time.monotonic()
        ids = [await submit_retrying(pg_dsn, queue_name, OK) for _ in range(30)]
        statuses = await wait_all_terminal(pg_dsn, ids, within=60, roles=roles)
        assert set(statuses.values()) == {"ACCEPTED"}
        await eventually(lambda: _dlq_length(redis_client, queue_name, len(foreign)), within=30, what="DLQ")
        await eventually(lambda: _pel_empty(redis_client, queue_name), within=30, what="empty PEL")
        # Dead-lettered at once by the worker that read them, not after maxDeliveries idle periods.
        assert time.monotonic() - started < 30
        assert roles.alive() == 4, roles.logs()
        dead: Any = await redis_client.xrange(streams.dlq_key(queue_name))
        reasons = sorted(fields[b"reason"].decode() for _, fields in dead)
        assert all("malformed" in r for r in reasons), reasons
    finally:
        codes = roles.stop()
    assert codes == [0] * 4, roles.logs()


async def _group_exists(redis: aioredis.Redis, key: str) -> bool:
    try:
        return bool(await redis.xinfo_groups(key))
    except Exception:
        return False


async def _dlq_length(redis: aioredis.Redis, queue: str, n: int) -> bool:
    return bool(await redis.xlen(streams.dlq_key(queue)) >= n)


async def _pel_empty(redis: aioredis.Redis, queue: str) -> bool:
    return await _pending(redis, queue) == 0


async def test_an_envelope_at_the_edge_of_int64_for_no_submission_is_acked_as_stale(
    pg_dsn: str, queue_name: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    """Well-formed numbers at the very top of bigint, naming no submission: acked, nothing else stops."""
    roles = await _started(pg_dsn, queue_name, redis_client, tmp_path, workers=1)
    key = streams.stream_key(queue_name)
    async with roles.all_stay_up():
        poison = Envelope(submission=2**63 - 1, generation=2**63 - 1, attempt=1, outbox=1, enqueued_at=1.0)
        await redis_client.xadd(key, poison.fields())  # type: ignore[arg-type]
        ids = [await submit_retrying(pg_dsn, queue_name, OK) for _ in range(10)]
        statuses = await wait_all_terminal(pg_dsn, ids, within=60, roles=roles)
        assert set(statuses.values()) == {"ACCEPTED"}
        await eventually(lambda: _pel_empty(redis_client, queue_name), within=30, what="empty PEL")
