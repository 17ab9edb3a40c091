"""Redis refusing work reaches callers as typed errors; the dispatcher keeps the outbox row retryable."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import asyncpg
import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from judgequeue.core.base.errors import TransportError
from judgequeue.core.roles.dispatcher import Dispatcher
from judgequeue.core.roles.reaper import Reaper
from judgequeue.core.store import dlq, outbox
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import redis_errors, stream_stats, streams
from judgequeue.core.transport.envelope import Envelope
from tests.support.databases import REDIS_URL
from tests.support.redis_servers import RedisServer, free_port, redis_server
from tests.support.settings import stream_settings
from tests.support.waiting import eventually


def client_for(port: int) -> aioredis.Redis:
    return aioredis.Redis(
        host="127.0.0.1", port=port, socket_connect_timeout=0.5, socket_timeout=2, retry=Retry(NoBackoff(), 0)
    )


async def assert_dispatch_keeps_row_retryable(
    pool: asyncpg.Pool, pg_dsn: str, client: aioredis.Redis, queue: str, needle: str
) -> None:
    async with pool.acquire() as conn:
        await create_queue(conn, queue)
        await outbox.submit(conn, queue, {})
    result = await Dispatcher(pool, client, stream_settings(pg_dsn, REDIS_URL, queue)).cycle()
    assert result.by_result == {"release": 1}
    async with pool.acquire() as conn:
        row = await conn.fetchrow("SELECT state, attempts, last_error FROM judgequeue.outbox")
    assert row["state"] == "PENDING" and row["attempts"] == 0 and needle in row["last_error"]


@pytest.fixture(scope="module")
def oom_server() -> Iterator[RedisServer]:
    with redis_server("--maxmemory-policy", "noeviction", "--repl-diskless-sync-delay", "0") as server:
        yield server


async def test_refused_connection_is_redis_unavailable_everywhere(
    pg_pool: asyncpg.Pool, pg_dsn: str, queue_name: str
) -> None:
    client = client_for(free_port())
    try:
        env = Envelope(1, 1, 1, 1, 1.0)
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: streams.enqueue_many(client, queue_name, [env], seen_ttl=60),
            lambda: streams.read(client, queue_name, "w", count=1, block_ms=10),
            lambda: streams.ack(client, queue_name, ["1-0"]),
            lambda: streams.ensure_group(client, queue_name),
            lambda: stream_stats.stream_figures(client, queue_name),
            lambda: dlq.list_entries(client, queue_name),
            lambda: Reaper(pg_pool, client, stream_settings(pg_dsn, REDIS_URL, queue_name)).sweep_stream(),
        ]
        for call in calls:
            with pytest.raises(redis_errors.RedisUnavailable):
                await call()
        await assert_dispatch_keeps_row_retryable(pg_pool, pg_dsn, client, queue_name, "redis")
    finally:
        await client.aclose()


async def test_out_of_memory_is_typed_and_rows_stay_retryable(
    oom_server: RedisServer, pg_pool: asyncpg.Pool, pg_dsn: str, queue_name: str
) -> None:
    client = client_for(oom_server.port)
    try:
        await client.config_set("maxmemory", "1")
        with pytest.raises(redis_errors.RedisOutOfMemory):
            await streams.enqueue_many(client, queue_name, [Envelope(1, 1, 1, 1, 1.0)], seen_ttl=60)
        assert await client.dbsize() == 0  # no seen marker left behind
        await assert_dispatch_keeps_row_retryable(pg_pool, pg_dsn, client, queue_name, "OOM")
        # once memory is available again the same row goes through
        await client.config_set("maxmemory", "0")
        async with pg_pool.acquire() as conn:
            await conn.execute("UPDATE judgequeue.outbox SET next_attempt_at = now()")
        result = await Dispatcher(pg_pool, client, stream_settings(pg_dsn, REDIS_URL, queue_name)).cycle()
        assert result.by_result == {"sent": 1}
    finally:
        await client.config_set("maxmemory", "0")
        await client.flushall()
        await client.aclose()


async def test_readonly_replica_is_typed_and_rows_stay_retryable(
    oom_server: RedisServer, pg_pool: asyncpg.Pool, pg_dsn: str, queue_name: str
) -> None:
    with redis_server("--replicaof", "127.0.0.1", str(oom_server.port)) as replica:
        client = client_for(replica.port)
        try:

            async def linked() -> bool:
                info = await client.info("replication")
                return bool(info.get("master_link_status") == "up")

            await eventually(linked, within=10, what="replica linked to its primary")
            with pytest.raises(redis_errors.RedisReadOnly):
                await streams.enqueue_many(client, queue_name, [Envelope(1, 1, 1, 1, 1.0)], seen_ttl=60)
            with pytest.raises(redis_errors.RedisReadOnly):
                await streams.ensure_group(client, queue_name)
            await assert_dispatch_keeps_row_retryable(pg_pool, pg_dsn, client, queue_name, "READONLY")
            report = await Reaper(pg_pool, client, stream_settings(pg_dsn, REDIS_URL, queue_name)).sweep()
            assert "stream" not in report.errors or "Redis" in report.errors["stream"]
            assert isinstance(redis_errors.translate_redis_error(Exception("READONLY x")), TransportError)
        finally:
            await client.aclose()
