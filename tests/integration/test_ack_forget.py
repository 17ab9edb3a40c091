"""An entry's dedup marker goes with its ack (streams.ack ``forget``), so markers do not pile up.

Without it every dispatched job's marker stayed for ``seen_ttl`` (24 h by default) and Redis
memory grew with the submission rate (the 30-minute soak, docs/performance.md). After the marker
is gone a re-append of the same (submission, generation) is delivered again; the worker's fence
acks it as stale (tests/test_worker.py covers stale envelopes).
"""

from __future__ import annotations

import redis.asyncio as aioredis

from judgequeue.core.transport import streams
from judgequeue.core.transport.envelope import Envelope


async def test_ack_deletes_the_markers_it_is_given(redis_client: aioredis.Redis, queue_name: str) -> None:
    await streams.ensure_group(redis_client, queue_name)
    envs = [Envelope(submission=i, generation=1, attempt=1, outbox=i, enqueued_at=0.0) for i in (1, 2)]
    results = await streams.enqueue_many(redis_client, queue_name, envs, seen_ttl=3600)
    assert [r.status for r in results] == ["appended", "appended"]
    got = await streams.read(redis_client, queue_name, "w", count=10, block_ms=100)
    assert len(got) == 2
    assert await streams.ack(redis_client, queue_name, [got[0].entry_id], forget=[(1, 1)]) == 1
    assert await streams.ack(redis_client, queue_name, [got[1].entry_id]) == 1
    assert not await redis_client.exists(streams.seen_key(queue_name, 1, 1))
    assert await redis_client.exists(streams.seen_key(queue_name, 2, 1)), "no forget: the marker stays"
    again = await streams.enqueue_many(redis_client, queue_name, envs, seen_ttl=3600)
    assert [r.status for r in again] == ["appended", "duplicate"]
