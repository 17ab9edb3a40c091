"""Poison jobs end explained, never loop: a payload that kills every worker that takes it ends in
SYSTEM_ERROR after maxRetries lease expiries; an entry no worker can even parse ends in the DLQ after
maxDeliveries. Everything else keeps flowing meanwhile."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import streams
from tests.support.queries import status_of, submission
from tests.support.roles import Roles, submit_retrying, wait_all_terminal

OK = {"seconds": 0.005, "status": "ACCEPTED"}


async def test_worker_killing_payload_ends_system_error_after_max_retries(
    pg_dsn: str, queue_name: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    conn = await asyncpg.connect(pg_dsn)
    await create_queue(conn, queue_name)
    roles = Roles.on(
        pg_dsn, queue_name, tmp_path, JUDGEQUEUE_MAX_RETRIES="3", JUDGEQUEUE_LEASE_TTL="1s", JUDGEQUEUE_CONCURRENCY="1"
    )
    roles.start("dispatcher")
    roles.start("reaper")
    roles.start("worker", 2)
    try:
        poison = await submit_retrying(pg_dsn, queue_name, {"exit": True})
        healthy = [await submit_retrying(pg_dsn, queue_name, OK) for _ in range(20)]
        deadline = time.monotonic() + 60
        # Play the Deployment: restart workers the poison kills, until it is given up on.
        while True:
            status = await status_of(conn, poison)
            if status == "SYSTEM_ERROR":
                break
            assert time.monotonic() < deadline, f"poison still {status}\n{roles.logs()}"
            for i, proc in enumerate(roles.procs):
                if proc.poll() is not None:
                    roles.procs.pop(i)
                    roles.start("worker")
                    break
            await asyncio.sleep(0.05)  # supervisor polling pace
        row = await submission(conn, poison)
        assert row["retry_count"] == 3 and row["generation"] == 3
        assert json.loads(row["verdict"])["reason"] == "gave up after 3 lease expiries"
        statuses = await wait_all_terminal(pg_dsn, healthy, within=30, roles=roles)
        assert set(statuses.values()) == {"ACCEPTED"}
    finally:
        await asyncio.to_thread(roles.stop)
        await conn.close()


async def test_unparseable_entry_is_dead_lettered_after_max_deliveries(
    pg_dsn: str, queue_name: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    conn = await asyncpg.connect(pg_dsn)
    await create_queue(conn, queue_name)
    await conn.close()
    await streams.ensure_group(redis_client, queue_name)
    await redis_client.xadd(streams.stream_key(queue_name), {"submission": "not-a-number"})
    roles = Roles.on(pg_dsn, queue_name, tmp_path, JUDGEQUEUE_MAX_DELIVERIES="3", JUDGEQUEUE_VISIBILITY_TIMEOUT="300ms")
    roles.start("worker")
    roles.start("reaper")
    try:
        deadline = time.monotonic() + 30
        while not await redis_client.xlen(streams.dlq_key(queue_name)):
            assert time.monotonic() < deadline, roles.logs()
            await asyncio.sleep(0.05)
        entries: Any = await redis_client.xrange(streams.dlq_key(queue_name))
        [(_, fields)] = entries
        text = {k.decode(): v.decode() for k, v in fields.items()}
        assert "submission" in text.get("reason", "") or "not a judgequeue" in text.get("reason", ""), text
        assert await redis_client.xlen(streams.stream_key(queue_name)) == 0
        pending = await redis_client.xpending(streams.stream_key(queue_name), streams.GROUP)
        assert pending["pending"] == 0
    finally:
        await asyncio.to_thread(roles.stop)
