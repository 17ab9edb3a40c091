"""DLQ operations: list, show, replay (idempotent, new generation), purge."""

from __future__ import annotations

import asyncio

import asyncpg
import redis.asyncio as aioredis

from judgequeue.core.roles.dispatcher import Dispatcher
from judgequeue.core.roles.reaper import Reaper
from judgequeue.core.store import dlq, outbox
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import streams
from tests.support.databases import REDIS_URL
from tests.support.queries import submissions
from tests.support.settings import stream_settings
from tests.support.waiting import eventually


async def dead_letter_submissions(
    pool: asyncpg.Pool, redis: aioredis.Redis, pg_dsn: str, queue: str, n: int
) -> list[int]:
    """Submit ``n`` jobs, deliver them once, never ack, and let a reaper dead-letter them."""
    settings = stream_settings(pg_dsn, REDIS_URL, queue, visibility_timeout="100ms", max_deliveries="1")
    async with pool.acquire() as conn:
        await create_queue(conn, queue)
        ids = [await outbox.submit(conn, queue, {"i": i}) for i in range(n)]
    await streams.ensure_group(redis, queue)
    await Dispatcher(pool, redis, settings).cycle()
    assert len(await streams.read(redis, queue, "worker-1", count=n, block_ms=100)) == n
    r = Reaper(pool, redis, settings, name="reaper-a")

    async def all_dead() -> bool:
        await r.sweep_stream()
        return await dlq.length(redis, queue) == n

    await eventually(all_dead, what="entries dead-lettered")
    return ids


async def test_list_show_and_purge(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    ids = await dead_letter_submissions(pg_pool, redis_client, pg_dsn, queue_name, 3)
    letters = await dlq.list_entries(redis_client, queue_name, 10)
    assert [d.submission for d in letters] == ids
    first = letters[0]
    assert first.consumer == "worker-1" and first.deliveries == 1 and first.postgres == "recorded"
    assert first.generation == 1 and "1 deliveries" in first.reason and first.source_id
    assert await dlq.show(redis_client, queue_name, first.entry_id) == first
    assert await dlq.show(redis_client, queue_name, "1-1") is None
    assert [d.entry_id for d in await dlq.list_entries(redis_client, queue_name, 1, after=first.entry_id)] == [
        letters[1].entry_id
    ]
    assert await dlq.purge(redis_client, queue_name, [first.entry_id]) == 1
    assert await dlq.purge(redis_client, queue_name) == 2
    assert await dlq.length(redis_client, queue_name) == 0


async def test_replay_creates_one_new_generation_and_removes_the_entry(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    ids = await dead_letter_submissions(pg_pool, redis_client, pg_dsn, queue_name, 3)
    letters = await dlq.list_entries(redis_client, queue_name, 10)
    # two operators replay the same entry at once: one new generation only
    async with pg_pool.acquire() as c1, pg_pool.acquire() as c2:
        r1, r2 = await asyncio.gather(
            dlq.replay(c1, redis_client, queue_name, [letters[0].entry_id]),
            dlq.replay(c2, redis_client, queue_name, [letters[0].entry_id]),
        )
    outcomes = sorted([*r1.outcomes.values(), *r2.outcomes.values()])
    assert outcomes in (["replayed", "superseded"], ["not_found", "replayed"])
    # a replay interrupted after Postgres (generation bumped, DLQ entry still there) is finished
    # by the next replay without a second bump
    async with pg_pool.acquire() as conn:
        await conn.execute("SELECT judgequeue.bump_generation($1, 1, false)", ids[1])
        again = await dlq.replay(conn, redis_client, queue_name)
    assert again.outcomes == {letters[1].entry_id: "superseded", letters[2].entry_id: "replayed"}
    assert await dlq.length(redis_client, queue_name) == 0
    async with pg_pool.acquire() as conn:
        rows = list((await submissions(conn)).values())
        assert [(r["generation"], r["status"]) for r in rows] == [(2, "PENDING")] * 3
        assert await conn.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE generation = 2") == 3
        assert await conn.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE state = 'PENDING'") == 3
        assert (await dlq.replay(conn, redis_client, queue_name, [letters[2].entry_id])).outcomes == {
            letters[2].entry_id: "not_found"
        }


async def test_malformed_entries_are_not_replayed(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    raw_id = await redis_client.xadd(streams.dlq_key(queue_name), {"source_id": "1-0", "entry.hello": "x"})
    entry_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
    async with pg_pool.acquire() as conn:
        result = await dlq.replay(conn, redis_client, queue_name)
    assert result.outcomes == {entry_id: "not_an_envelope"}
    assert await dlq.length(redis_client, queue_name) == 1
