"""The dispatcher against real Postgres and Redis: batches, modes, wake-up, Redis outage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import redis.asyncio as aioredis

from judgequeue.core.config import Settings
from judgequeue.core.roles.dispatcher import Dispatcher
from judgequeue.core.store import outbox
from judgequeue.core.store.queues import create_queue, set_cutover
from judgequeue.core.transport import streams
from tests.support.databases import REDIS_URL
from tests.support.settings import stream_settings
from tests.support.waiting import eventually


async def test_burst_stops_listening_then_registers_again_when_idle(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    settings = stream_settings(pg_dsn, REDIS_URL, queue_name, schedule="1h", batch_size="3")
    async with running_dispatcher(pg_pool, redis_client, settings):
        await eventually(lambda: waiters_are(pg_pool, 1), what="dispatcher registered as waiter")
        async with pg_pool.acquire() as conn, conn.transaction():
            for i in range(10):
                await outbox.submit(conn, queue_name, {"i": i})

        async def all_delivered() -> bool:
            return bool(await redis_client.xlen(streams.stream_key(queue_name)) == 10)

        # Full batches loop without waiting (the 1-hour schedule would otherwise stall them).
        await eventually(all_delivered, within=5, what="burst dispatched")
        await eventually(lambda: waiters_are(pg_pool, 1), what="registered again once idle")


@asynccontextmanager
async def running_dispatcher(pool: asyncpg.Pool, redis: aioredis.Redis, settings: Settings) -> AsyncIterator[None]:
    """A dispatcher's run loop on a fresh queue, stopped (and checked to stop) on exit."""
    async with pool.acquire() as conn:
        await create_queue(conn, settings.queue)
    stop = asyncio.Event()
    task = asyncio.create_task(Dispatcher(pool, redis, settings).run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def waiters_are(pool: asyncpg.Pool, expected: int) -> bool:
    async with pool.acquire() as conn:
        return bool(await conn.fetchval("SELECT count(*) FROM judgequeue.dispatch_waiters") == expected)


async def test_cycle_sends_batch_and_marks_rows(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    async with pg_pool.acquire() as conn:
        await create_queue(conn, queue_name)
        for i in range(5):
            await outbox.submit(conn, queue_name, {"i": i})
    d = Dispatcher(pg_pool, redis_client, stream_settings(pg_dsn, REDIS_URL, queue_name, batch_size="3"))
    first = await d.cycle()
    second = await d.cycle()
    assert (first.claimed, second.claimed) == (3, 2)
    assert first.by_result == {"sent": 3}
    assert await redis_client.xlen(streams.stream_key(queue_name)) == 5
    async with pg_pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE state = 'SENT'") == 5


async def test_shadow_mode_goes_to_shadow_stream_only(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    async with pg_pool.acquire() as conn:
        await create_queue(conn, queue_name, mode="shadow")
        await outbox.submit(conn, queue_name, {})
    d = Dispatcher(pg_pool, redis_client, stream_settings(pg_dsn, REDIS_URL, queue_name))
    result = await d.cycle()
    assert result.by_result == {"shadow_sent": 1}
    assert await redis_client.xlen(streams.shadow_key(queue_name)) == 1
    assert await redis_client.xlen(streams.stream_key(queue_name)) == 0
    async with pg_pool.acquire() as conn:
        assert await conn.fetchval("SELECT state FROM judgequeue.outbox") == "SHADOW_SENT"


async def test_redis_outage_releases_rows_without_spending_attempts(
    pg_pool: asyncpg.Pool, pg_dsn: str, queue_name: str
) -> None:
    async with pg_pool.acquire() as conn:
        await create_queue(conn, queue_name)
        await outbox.submit(conn, queue_name, {})
    dead_redis = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    d = Dispatcher(pg_pool, dead_redis, stream_settings(pg_dsn, REDIS_URL, queue_name))
    result = await d.cycle()
    await dead_redis.aclose()
    assert result.by_result == {"release": 1}
    async with pg_pool.acquire() as conn:
        row = await conn.fetchrow("SELECT state, attempts, last_error FROM judgequeue.outbox")
    assert row["state"] == "PENDING" and row["attempts"] == 0 and "redis" in row["last_error"]


async def test_idle_dispatcher_wakes_on_submit_within_the_poll_interval(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    # schedule of 1 hour: only the wake-up can deliver within the test's deadline
    settings = stream_settings(pg_dsn, REDIS_URL, queue_name, schedule="1h")
    async with running_dispatcher(pg_pool, redis_client, settings):
        await eventually(lambda: waiters_are(pg_pool, 1), what="dispatcher registered as waiter")
        for i in range(3):
            async with pg_pool.acquire() as conn, conn.transaction():
                await outbox.submit(conn, queue_name, {"i": i})

            async def delivered(n: int = i + 1) -> bool:
                # Marked SENT too: the dispatcher applies a batch's marks just before it sleeps.
                sent = await pg_pool.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE state = 'SENT'")
                return bool(sent == n and await redis_client.xlen(streams.stream_key(queue_name)) == n)

            await eventually(delivered, within=5, what=f"submission {i} dispatched")
            # A trickle keeps the registration: no unregister/register/re-claim round per job.
            assert await waiters_are(pg_pool, 1)
    assert await waiters_are(pg_pool, 0)  # a stopped dispatcher unregisters


async def test_paused_queue_dispatches_nothing_until_resumed(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    async with pg_pool.acquire() as conn:
        await create_queue(conn, queue_name)
        await set_cutover(conn, queue_name, paused=True)
        await outbox.submit(conn, queue_name, {})
    d = Dispatcher(pg_pool, redis_client, stream_settings(pg_dsn, REDIS_URL, queue_name))
    assert (await d.cycle()).claimed == 0
    async with pg_pool.acquire() as conn:
        await set_cutover(conn, queue_name, paused=False)
    assert (await d.cycle()).by_result == {"sent": 1}
