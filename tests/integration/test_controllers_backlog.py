"""core.backlog: the figure the operator autoscales on, against real Postgres and Redis."""

from __future__ import annotations

import asyncpg
import redis.asyncio as aioredis

from judgequeue.core.store.backlog import read_backlog
from judgequeue.core.store.outbox import submit
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport.streams import stream_key


async def test_missing_stream_and_group(pg: asyncpg.Connection, redis_client: aioredis.Redis, queue_name: str) -> None:
    await create_queue(pg, queue_name)
    backlog = await read_backlog(pg, redis_client, queue_name)
    assert (backlog.outbox_pending, backlog.stream_lag, backlog.pel, backlog.total) == (0, 0, 0, 0)
    # Entries appended before the group exists are still work: the group is created from 0-0.
    await redis_client.xadd(stream_key(queue_name), {"submission": "1"})
    assert (await read_backlog(pg, redis_client, queue_name)).stream_lag == 1


async def test_outbox_lag_and_pel(pg: asyncpg.Connection, redis_client: aioredis.Redis, queue_name: str) -> None:
    await create_queue(pg, queue_name)
    for i in range(3):
        await submit(pg, queue_name, {"n": i})
    key = stream_key(queue_name)
    await redis_client.xgroup_create(key, "workers", id="0-0", mkstream=True)
    for i in range(5):
        await redis_client.xadd(key, {"submission": str(i)})
    backlog = await read_backlog(pg, redis_client, queue_name)
    assert (backlog.outbox_pending, backlog.stream_lag, backlog.pel) == (3, 5, 0)
    read = await redis_client.xreadgroup("workers", "w1", {key: ">"}, count=2)
    assert read
    backlog = await read_backlog(pg, redis_client, queue_name)
    assert (backlog.stream_lag, backlog.pel, backlog.total) == (3, 2, 8)


async def test_null_lag_after_deletes(pg: asyncpg.Connection, redis_client: aioredis.Redis, queue_name: str) -> None:
    """Workers XACK+XDEL, which makes Redis report lag as NULL; XLEN - PEL stands in for it."""
    await create_queue(pg, queue_name)
    key = stream_key(queue_name)
    await redis_client.xgroup_create(key, "workers", id="0-0", mkstream=True)
    ids = [await redis_client.xadd(key, {"submission": str(i)}) for i in range(6)]
    await redis_client.xreadgroup("workers", "w1", {key: ">"}, count=3)
    await redis_client.xack(key, "workers", ids[0])
    await redis_client.xdel(key, ids[0], ids[4])  # a deleted entry after the read position
    groups = await redis_client.xinfo_groups(key)
    assert groups[0].get("lag") is None
    backlog = await read_backlog(pg, redis_client, queue_name)
    assert (backlog.pel, backlog.stream_lag) == (2, 2)
