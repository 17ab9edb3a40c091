"""The stream transport on the real Redis: dedup-and-append, group, read, ack."""

from __future__ import annotations

import contextlib

import redis.asyncio as aioredis
import redis.exceptions as rexc

from judgequeue.core.transport import redis_errors, redis_scripts, streams
from judgequeue.core.transport.envelope import Envelope


def env(submission: int, generation: int = 1) -> Envelope:
    return Envelope(submission=submission, generation=generation, attempt=1, outbox=submission, enqueued_at=1.5)


async def test_failed_xadd_leaves_no_seen_key_and_duplicates_are_absorbed(
    redis_client: aioredis.Redis, queue_name: str
) -> None:
    stream = streams.stream_key(queue_name)
    # Make XADD fail inside the script: the stream key holds a string.
    await redis_client.set(stream, "not a stream")
    [failed] = await streams.enqueue_many(redis_client, queue_name, [env(7)], seen_ttl=60)
    assert failed.status == "error" and "WRONGTYPE" in (failed.error or "")
    assert not await redis_client.exists(streams.seen_key(queue_name, 7, 1))

    await redis_client.delete(stream)
    [first] = await streams.enqueue_many(redis_client, queue_name, [env(7)], seen_ttl=60)
    [again] = await streams.enqueue_many(redis_client, queue_name, [env(7)], seen_ttl=60)
    assert (first.status, again.status) == ("appended", "duplicate")
    assert await redis_client.xlen(stream) == 1
    # a new generation is a new job
    [bumped] = await streams.enqueue_many(redis_client, queue_name, [env(7, 2)], seen_ttl=60)
    assert bumped.status == "appended" and await redis_client.xlen(stream) == 2


async def test_a_missing_function_is_loaded(redis_client: aioredis.Redis, queue_name: str) -> None:
    with contextlib.suppress(rexc.ResponseError):  # not loaded yet
        await redis_client.function_delete(redis_scripts.ENQUEUE.function)
    results = await streams.enqueue_many(redis_client, queue_name, [env(1), env(2)], seen_ttl=60)
    assert [r.status for r in results] == ["appended", "appended"]
    # several chunks go through one pipeline; its missing-function path loads it too
    await redis_client.function_delete(redis_scripts.ENQUEUE.function)
    many = [env(i) for i in range(10, 10 + 2 * streams.ENQUEUE_CHUNK + 1)]
    results = await streams.enqueue_many(redis_client, queue_name, many, seen_ttl=60)
    assert {r.status for r in results} == {"appended"} and len(results) == len(many)
    assert await redis_client.xlen(streams.stream_key(queue_name)) == 2 + len(many)


async def test_entries_before_the_group_are_consumed_and_ack_deletes(
    redis_client: aioredis.Redis, queue_name: str
) -> None:
    await streams.enqueue_many(redis_client, queue_name, [env(i) for i in range(1, 4)], seen_ttl=60)
    await streams.ensure_group(redis_client, queue_name)
    await streams.ensure_group(redis_client, queue_name)  # idempotent
    got = await streams.read(redis_client, queue_name, "c1", count=10, block_ms=100)
    assert [d.envelope.submission for d in got if d.envelope] == [1, 2, 3]
    assert await streams.ack(redis_client, queue_name, [d.entry_id for d in got]) == 3
    assert await redis_client.xlen(streams.stream_key(queue_name)) == 0
    assert await streams.read(redis_client, queue_name, "c1", count=10, block_ms=10) == []


async def test_nogroup_recovers_after_stream_deleted(redis_client: aioredis.Redis, queue_name: str) -> None:
    await streams.ensure_group(redis_client, queue_name)
    await redis_client.delete(streams.stream_key(queue_name))
    assert await streams.read(redis_client, queue_name, "c1", count=1, block_ms=10) == []
    await streams.enqueue_many(redis_client, queue_name, [env(5)], seen_ttl=60)
    [d] = await streams.read(redis_client, queue_name, "c1", count=1, block_ms=100)
    assert d.envelope is not None and d.envelope.submission == 5


async def test_malformed_entries_are_reported_not_raised(redis_client: aioredis.Redis, queue_name: str) -> None:
    await streams.ensure_group(redis_client, queue_name)
    await redis_client.xadd(streams.stream_key(queue_name), {"hello": "world"})
    [d] = await streams.read(redis_client, queue_name, "c1", count=1, block_ms=100)
    assert d.envelope is None and "submission" in (d.error or "")


async def test_unreachable_redis_is_a_typed_error(queue_name: str) -> None:
    client = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    try:
        try:
            await streams.enqueue_many(client, queue_name, [env(1)], seen_ttl=60)
        except redis_errors.RedisUnavailable:
            pass
        else:
            raise AssertionError("expected RedisUnavailable")
    finally:
        await client.aclose()
