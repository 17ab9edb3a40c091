"""The same transport, reaper and DLQ code on a local 3-master Redis Cluster (hash-tagged keys)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import asyncpg
import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from judgequeue.core.roles.dispatcher import Dispatcher
from judgequeue.core.roles.reaper import Reaper
from judgequeue.core.store import dlq, outbox
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import stream_stats, streams
from judgequeue.core.transport.envelope import Envelope
from tests.support.queries import count_submissions
from tests.support.redis_servers import RedisServer, redis_cluster
from tests.support.settings import stream_settings
from tests.support.waiting import eventually


@pytest.fixture(scope="module")
def cluster_nodes() -> Iterator[list[RedisServer]]:
    with redis_cluster(3) as nodes:
        yield nodes


@pytest.fixture
async def cluster(cluster_nodes: list[RedisServer]) -> AsyncIterator[aioredis.Redis]:
    client = RedisCluster(host="127.0.0.1", port=cluster_nodes[0].port)
    await client.initialize()
    # The roles are typed against redis.asyncio.Redis; a cluster client serves the same calls.
    yield cast(aioredis.Redis, client)
    await client.aclose()


async def test_queues_spread_over_the_masters(cluster: aioredis.Redis) -> None:
    client = cast(Any, cluster)
    slots = {client.keyslot(streams.stream_key(f"q{i}")) for i in range(12)}
    owners = {client.nodes_manager.get_node_from_slot(slot).port for slot in slots}
    assert len(owners) == 3
    q = "q0"
    assert {client.keyslot(k) for k in (streams.stream_key(q), streams.dlq_key(q), streams.seen_key(q, 1, 1))} == {
        client.keyslot(streams.stream_key(q))
    }


async def test_enqueue_consume_reap_and_replay_on_a_cluster(
    cluster: aioredis.Redis, cluster_nodes: list[RedisServer], pg_pool: asyncpg.Pool, pg_dsn: str, queue_name: str
) -> None:
    url = cluster_nodes[0].url
    settings = stream_settings(pg_dsn, url, queue_name, visibility_timeout="100ms", max_deliveries="2")
    async with pg_pool.acquire() as conn:
        await create_queue(conn, queue_name)
        ids = [await outbox.submit(conn, queue_name, {"i": i}) for i in range(4)]
    await cast(Any, cluster).function_flush()  # a missing function loaded through the cluster pipeline
    # appended before the group exists, then consumed
    result = await Dispatcher(pg_pool, cluster, settings).cycle()
    assert result.by_result == {"sent": 4}
    dup = await streams.enqueue_many(cluster, queue_name, [Envelope(ids[0], 1, 1, 1, 1.0)], seen_ttl=60)
    assert dup[0].status == "duplicate"
    await streams.ensure_group(cluster, queue_name)
    got = await streams.read(cluster, queue_name, "worker-1", count=10, block_ms=200)
    assert sorted(d.envelope.submission for d in got if d.envelope) == ids
    assert await streams.ack(cluster, queue_name, [got[0].entry_id, got[1].entry_id]) == 2

    # two never acked: requeued once, then dead-lettered with Postgres updated
    reaper = Reaper(pg_pool, cluster, settings, name="reaper-a", idle_consumer_after=0.05)

    async def swept(kind: str) -> bool:
        return bool(getattr(await reaper.sweep_stream(), kind))

    await eventually(lambda: swept("requeued"), what="requeue on the cluster")
    again = await streams.read(cluster, queue_name, "worker-2", count=10, block_ms=200)
    assert {d.envelope.deliveries for d in again if d.envelope} == {2}
    await eventually(lambda: swept("dead_lettered"), what="dead-letter on the cluster")
    letters = await dlq.list_entries(cluster, queue_name, 10)
    assert len(letters) == 2 and {d.postgres for d in letters} == {"recorded"}

    figures = await stream_stats.stream_figures(cluster, queue_name)
    assert (figures.length, figures.pel, figures.dlq_length) == (0, 0, 2)
    assert await eventually(reaper.remove_idle_consumers, what="idle consumers removed") >= 1
    report = await reaper.sweep()
    assert report.errors == {}

    async with pg_pool.acquire() as conn:
        replayed = await dlq.replay(conn, cluster, queue_name)
        assert replayed.count("replayed") == 2
        assert await count_submissions(conn, generation=2) == 2
    assert await dlq.purge(cluster, queue_name) == 0
