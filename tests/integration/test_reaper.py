"""The reaper against real Postgres and Redis: requeue, dead-letter, concurrency, crash between steps."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from judgequeue.core.roles import reaper
from judgequeue.core.roles.dispatcher import Dispatcher
from judgequeue.core.roles.reaper import ClaimedEntry, Decision, Reaper, decide
from judgequeue.core.store import dlq, outbox
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import stream_stats, streams
from judgequeue.core.transport.envelope import Envelope
from tests.support.databases import REDIS_URL
from tests.support.queries import status_of, submission
from tests.support.redis_servers import free_port
from tests.support.settings import stream_settings
from tests.support.waiting import eventually


def env(submission: int, deliveries: int = 1, generation: int = 1) -> Envelope:
    return Envelope(submission, generation, 1, submission, 1.0, deliveries)


Fields = dict[bytes, bytes]


async def entries(redis: aioredis.Redis, key: str) -> list[tuple[bytes, Fields]]:
    """XRANGE of a whole stream, typed for the tests."""
    reply: Any = await redis.xrange(key)
    return [(entry_id, fields) for entry_id, fields in reply]


async def pending(redis: aioredis.Redis, queue: str) -> list[dict[str, Any]]:
    reply: Any = await redis.xpending_range(streams.stream_key(queue), streams.GROUP, min="-", max="+", count=100_000)
    return list(reply)


def make_reaper(
    pool: asyncpg.Pool, redis: aioredis.Redis, pg_dsn: str, queue: str, name: str, **env_overrides: str
) -> Reaper:
    settings = stream_settings(
        pg_dsn, REDIS_URL, queue, **{"visibility_timeout": "200ms", "max_deliveries": "3", **env_overrides}
    )
    return Reaper(pool, redis, settings, name=name)


async def idle_pel(redis: aioredis.Redis, queue: str, at_least_ms: int) -> bool:
    """True once every pending entry has been idle at least ``at_least_ms``."""
    found = await pending(redis, queue)
    return bool(found) and all(p["time_since_delivered"] >= at_least_ms for p in found)


async def judging_submission(pool: asyncpg.Pool, queue: str, *, lease_expired: bool = False) -> int:
    """A new submission on a new ``queue`` marked JUDGING as if leased (its lease already expired if asked)."""
    async with pool.acquire() as conn:
        await create_queue(conn, queue)
        sid: int = await outbox.submit(conn, queue, {})
        await conn.execute(
            "UPDATE judgequeue.submissions SET status = 'JUDGING', attempt_id = gen_random_uuid(),"
            " lease_expires_at = now() + CASE WHEN $2 THEN interval '-1 second' ELSE interval '1 hour' END"
            " WHERE id = $1",
            sid,
            lease_expired,
        )
    return sid


async def sweep_until(r: Reaper, check: str, within: float = 5.0) -> reaper.StreamSweep:
    """Sweep until the sweep did something of kind ``check`` (e.g. requeued)."""

    async def attempt() -> reaper.StreamSweep | None:
        result = await r.sweep_stream()
        return result if getattr(result, check) else None

    found = await eventually(attempt, within=within, what=f"a sweep that {check}")
    assert found is not None
    return found


# --- pure decisions ------------------------------------------------------------------------------


def test_backoff_delay() -> None:
    assert reaper.backoff_delay(5, 0) == 5
    assert reaper.backoff_delay(5, 1) == 10
    assert reaper.backoff_delay(5, 30) == 60
    assert stream_stats.derive_lag(None, 10, 4) == (6, False)
    assert stream_stats.derive_lag(3, 10, 4) == (3, True)


# --- requeue then dead-letter --------------------------------------------------------------------


async def test_unacked_entry_is_requeued_then_dead_lettered_with_postgres_updated(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    async with pg_pool.acquire() as conn:
        await create_queue(conn, queue_name)
        sid = await outbox.submit(conn, queue_name, {"x": 1})
    await streams.ensure_group(redis_client, queue_name)
    await Dispatcher(pg_pool, redis_client, stream_settings(pg_dsn, REDIS_URL, queue_name)).cycle()
    r = make_reaper(pg_pool, redis_client, pg_dsn, queue_name, "reaper-a")
    dead_before = REGISTRY.get_sample_value("judgequeue_dead_letters_total", {"queue": queue_name}) or 0

    for delivery in (1, 2, 3):
        [got] = await streams.read(redis_client, queue_name, "worker-1", count=10, block_ms=1000)
        assert got.envelope is not None and got.envelope.deliveries == delivery
        # the worker never acks; the reaper acts only after the visibility timeout
        assert (await r.sweep_stream()).claimed == 0
        result = await sweep_until(r, "requeued" if delivery < 3 else "dead_lettered")
        assert result.claimed == 1

    stream = streams.stream_key(queue_name)
    assert await redis_client.xlen(stream) == 0
    assert (await redis_client.xpending(stream, streams.GROUP))["pending"] == 0
    [(_dlq_id, fields)] = await entries(redis_client, streams.dlq_key(queue_name))
    assert fields[b"deliveries"] == b"3" and fields[b"consumer"] == b"worker-1"
    assert fields[b"postgres"] == b"recorded" and fields[b"entry.submission"] == str(sid).encode()
    assert b"3 deliveries" in fields[b"reason"] and fields[b"source_id"]
    async with pg_pool.acquire() as conn:
        sub = await submission(conn, sid)
        box = await conn.fetchrow("SELECT state, last_error FROM judgequeue.outbox WHERE submission_id = $1", sid)
    assert sub["status"] == "SYSTEM_ERROR" and "3 deliveries" in sub["verdict"]
    assert box["state"] == "DEAD" and "3 deliveries" in box["last_error"]
    dead_after = REGISTRY.get_sample_value("judgequeue_dead_letters_total", {"queue": queue_name})
    assert dead_after == dead_before + 1


async def test_judging_submission_is_left_to_its_lease(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    sid = await judging_submission(pg_pool, queue_name)
    await streams.ensure_group(redis_client, queue_name)
    await streams.enqueue_many(redis_client, queue_name, [env(sid, deliveries=3)], seen_ttl=60)
    await streams.read(redis_client, queue_name, "w", count=1, block_ms=100)
    r = make_reaper(pg_pool, redis_client, pg_dsn, queue_name, "reaper-a")
    result = await sweep_until(r, "dead_lettered")
    assert result.postgres == {"judging": 1}
    async with pg_pool.acquire() as conn:
        assert await status_of(conn, sid) == "JUDGING"


async def test_malformed_and_deleted_entries(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    stream = streams.stream_key(queue_name)
    await streams.ensure_group(redis_client, queue_name)
    await redis_client.xadd(stream, {"hello": "world"})
    await streams.enqueue_many(redis_client, queue_name, [env(1)], seen_ttl=60)
    got = await streams.read(redis_client, queue_name, "w", count=10, block_ms=100)
    assert len(got) == 2
    await redis_client.xdel(stream, got[1].entry_id)  # deleted while pending
    r = make_reaper(pg_pool, redis_client, pg_dsn, queue_name, "reaper-a")
    # XAUTOCLAIM drops deleted ids from the PEL whatever their idle time; the script acks them
    assert (await r.sweep_stream()).deleted == 1
    result = await sweep_until(r, "dead_lettered")
    assert (result.dead_lettered, result.deleted, result.requeued) == (1, 0, 0)
    assert (await redis_client.xpending(stream, streams.GROUP))["pending"] == 0
    [(_id, fields)] = await entries(redis_client, streams.dlq_key(queue_name))
    assert b"malformed" in fields[b"reason"] and fields[b"entry.hello"] == b"world"
    assert fields[b"postgres"].startswith(b"none")


# --- several reapers ---------------------------------------------------------------------------


async def test_two_reapers_handle_each_idle_entry_exactly_once(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    n = 2000
    await streams.ensure_group(redis_client, queue_name)
    # odd submissions are on their last delivery (dead-letter), even ones get requeued
    envelopes = [env(i, deliveries=3 if i % 2 else 1) for i in range(1, n + 1)]
    await streams.enqueue_many(redis_client, queue_name, envelopes, seen_ttl=60)
    assert len(await streams.read(redis_client, queue_name, "w", count=n, block_ms=100)) == n
    await eventually(lambda: idle_pel(redis_client, queue_name, 250), what="PEL idle")

    other = aioredis.Redis.from_url(REDIS_URL)
    try:
        a = make_reaper(pg_pool, redis_client, pg_dsn, queue_name, "reaper-a", sweep_batch="100")
        b = make_reaper(pg_pool, other, pg_dsn, queue_name, "reaper-b", sweep_batch="100")
        ra, rb = await asyncio.gather(a.sweep_stream(), b.sweep_stream())
    finally:
        await other.aclose()
    assert ra.requeued + rb.requeued == n // 2
    assert ra.dead_lettered + rb.dead_lettered == n // 2
    assert ra.claimed + rb.claimed == n
    stream = streams.stream_key(queue_name)
    requeued = await entries(redis_client, stream)
    subs = [int(f[b"submission"]) for _id, f in requeued]
    assert sorted(subs) == list(range(2, n + 1, 2)) and {f[b"deliveries"] for _id, f in requeued} == {b"2"}
    dlq = await entries(redis_client, streams.dlq_key(queue_name))
    assert sorted(int(f[b"entry.submission"]) for _id, f in dlq) == list(range(1, n + 1, 2))
    assert len({f[b"source_id"] for _id, f in dlq}) == n // 2
    assert (await redis_client.xpending(stream, streams.GROUP))["pending"] == 0


async def test_a_reaper_whose_claim_was_taken_over_acts_on_nothing(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    await streams.ensure_group(redis_client, queue_name)
    await streams.enqueue_many(redis_client, queue_name, [env(1), env(2, deliveries=3)], seen_ttl=60)
    await streams.read(redis_client, queue_name, "w", count=10, block_ms=100)
    a = make_reaper(pg_pool, redis_client, pg_dsn, queue_name, "reaper-a")
    b = make_reaper(pg_pool, redis_client, pg_dsn, queue_name, "reaper-b")

    async def claimed_by(r: Reaper) -> list[ClaimedEntry]:
        _cursor, entries, _deleted = await r.claim()
        return entries

    slow = await eventually(lambda: claimed_by(a), what="reaper-a claims")
    # reaper-a stalls past the visibility timeout; reaper-b takes the entries over
    fast = await eventually(lambda: claimed_by(b), what="reaper-b claims")
    assert [e.entry_id for e in slow] == [e.entry_id for e in fast]
    slow_plan = [decide(e, 3) for e in slow]
    fast_plan = [decide(e, 3) for e in fast]
    assert await a.requeue([d for d in slow_plan if d.action == "requeue"]) == (0, 1)
    doomed_a = [d for d in slow_plan if d.action == "dead_letter"]
    assert await a.dead_letter(doomed_a, ["x"]) == (0, 0, 1)
    assert await b.requeue([d for d in fast_plan if d.action == "requeue"]) == (1, 0)
    doomed_b = [d for d in fast_plan if d.action == "dead_letter"]
    assert await b.dead_letter(doomed_b, ["x"]) == (1, 0, 0)
    assert await redis_client.xlen(streams.dlq_key(queue_name)) == 1
    assert await redis_client.xlen(streams.stream_key(queue_name)) == 1


async def test_marker_prevents_a_second_dead_letter(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    await streams.ensure_group(redis_client, queue_name)
    await streams.enqueue_many(redis_client, queue_name, [env(1, deliveries=3)], seen_ttl=60)
    [got] = await streams.read(redis_client, queue_name, "w", count=1, block_ms=100)
    await redis_client.set(dlq.dead_marker_key(queue_name, got.entry_id), "1")  # dead-lettered before
    r = make_reaper(pg_pool, redis_client, pg_dsn, queue_name, "reaper-a")
    result = await sweep_until(r, "already_dead")
    assert (result.dead_lettered, result.already_dead) == (0, 1)
    assert await redis_client.xlen(streams.dlq_key(queue_name)) == 0
    assert await redis_client.xlen(streams.stream_key(queue_name)) == 0


# --- a reaper killed between the Postgres and the Redis step ---------------------------------------


@pytest.mark.parametrize("failure", [RuntimeError, asyncio.CancelledError])
async def test_reaper_killed_between_postgres_and_redis_steps(
    pg_pool: asyncpg.Pool,
    pg_dsn: str,
    redis_client: aioredis.Redis,
    queue_name: str,
    failure: type[BaseException],
) -> None:
    async with pg_pool.acquire() as conn:
        await create_queue(conn, queue_name)
        sid = await outbox.submit(conn, queue_name, {})
    await streams.ensure_group(redis_client, queue_name)
    await Dispatcher(pg_pool, redis_client, stream_settings(pg_dsn, REDIS_URL, queue_name)).cycle()
    [got] = await streams.read(redis_client, queue_name, "worker-1", count=1, block_ms=100)
    await eventually(lambda: idle_pel(redis_client, queue_name, 250), what="PEL idle")

    doomed = make_reaper(pg_pool, redis_client, pg_dsn, queue_name, "reaper-doomed", max_deliveries="1")

    async def die(_decisions: Sequence[Decision]) -> None:
        raise failure()

    doomed.between_steps = die
    with pytest.raises(failure):
        await doomed.sweep_stream()

    # In between: Postgres has the explained outcome; Redis still holds the entry, claimed by the
    # dead reaper, and nothing was dead-lettered yet.
    stream = streams.stream_key(queue_name)
    async with pg_pool.acquire() as conn:
        assert await status_of(conn, sid) == "SYSTEM_ERROR"
        assert await conn.fetchval("SELECT state FROM judgequeue.outbox WHERE submission_id = $1", sid) == "DEAD"
    [held] = await pending(redis_client, queue_name)
    assert held["consumer"] == b"reaper-doomed" and held["message_id"].decode() == got.entry_id
    assert await redis_client.xlen(streams.dlq_key(queue_name)) == 0

    # A second reaper repairs it once the visibility timeout passes.
    survivor = make_reaper(pg_pool, redis_client, pg_dsn, queue_name, "reaper-b", max_deliveries="1")
    result = await sweep_until(survivor, "dead_lettered")
    assert result.postgres == {"recorded": 1}
    assert await redis_client.xlen(streams.dlq_key(queue_name)) == 1
    assert await redis_client.xlen(stream) == 0
    assert (await survivor.sweep_stream()).claimed == 0
    async with pg_pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE submission_id = $1", sid) == 1


async def test_postgres_down_postpones_dead_letters(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    await streams.ensure_group(redis_client, queue_name)
    await streams.enqueue_many(redis_client, queue_name, [env(1, deliveries=3)], seen_ttl=60)
    await streams.read(redis_client, queue_name, "w", count=1, block_ms=100)
    await eventually(lambda: idle_pel(redis_client, queue_name, 250), what="PEL idle")
    broken = await asyncpg.create_pool(pg_dsn, min_size=0, max_size=1)
    assert broken is not None
    await broken.close()
    r = make_reaper(broken, redis_client, pg_dsn, queue_name, "reaper-a")
    result = await r.sweep_stream()
    assert (result.deferred, result.dead_lettered) == (1, 0)
    assert await redis_client.xlen(streams.dlq_key(queue_name)) == 0
    assert (await redis_client.xpending(streams.stream_key(queue_name), streams.GROUP))["pending"] == 1


# --- steady state, idle consumers, gauges, the role loop ---------------------------------------------


async def test_stream_length_stays_bounded_over_a_steady_run(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    batch, rounds, capacity = 20, 150, 30
    stream = streams.stream_key(queue_name)
    await streams.ensure_group(redis_client, queue_name)
    r = make_reaper(
        pg_pool, redis_client, pg_dsn, queue_name, "reaper-a", visibility_timeout="20ms", max_deliveries="50"
    )
    finished: set[int] = set()
    next_id = 1
    peak = 0
    for i in range(rounds):
        await streams.enqueue_many(
            redis_client, queue_name, [env(s) for s in range(next_id, next_id + batch)], seen_ttl=60
        )
        next_id += batch
        got = await streams.read(redis_client, queue_name, "worker", count=capacity, block_ms=10)
        # every tenth delivery is lost by a crashing worker (never acked): the reaper re-delivers it
        done = [d for j, d in enumerate(got) if (i + j) % 10]
        await streams.ack(redis_client, queue_name, [d.entry_id for d in done])
        finished.update(d.envelope.submission for d in done if d.envelope)
        await r.sweep_stream()
        in_flight = (await redis_client.xpending(stream, streams.GROUP))["pending"]
        length = await redis_client.xlen(stream)
        peak = max(peak, length)
        assert length <= in_flight + capacity + batch, (i, length, in_flight)

    async def drained() -> bool:
        got = await streams.read(redis_client, queue_name, "worker", count=capacity, block_ms=10)
        await streams.ack(redis_client, queue_name, [d.entry_id for d in got])
        finished.update(d.envelope.submission for d in got if d.envelope)
        await r.sweep_stream()
        return len(finished) == next_id - 1 and await redis_client.xlen(stream) == 0

    await eventually(drained, within=10, what="every job acked and the stream empty")
    assert peak <= 2 * (capacity + batch)
    assert await redis_client.xlen(streams.dlq_key(queue_name)) == 0


async def test_idle_consumers_without_pending_entries_are_removed(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    await streams.ensure_group(redis_client, queue_name)
    await streams.enqueue_many(redis_client, queue_name, [env(1), env(2)], seen_ttl=60)
    [first] = await streams.read(redis_client, queue_name, "idle-worker", count=1, block_ms=100)
    await streams.ack(redis_client, queue_name, [first.entry_id])
    await streams.read(redis_client, queue_name, "busy-worker", count=1, block_ms=100)  # never acked
    settings = stream_settings(pg_dsn, REDIS_URL, queue_name, visibility_timeout="1h")
    r = Reaper(pg_pool, redis_client, settings, name="reaper-a", idle_consumer_after=0.1)

    async def names() -> set[bytes]:
        consumers = await redis_client.xinfo_consumers(streams.stream_key(queue_name), streams.GROUP)
        return {c["name"] for c in consumers}

    assert await r.remove_idle_consumers() == 0  # nobody idle long enough yet
    await eventually(r.remove_idle_consumers, what="idle consumer removed")
    assert await names() == {b"busy-worker"}
    assert Reaper(pg_pool, redis_client, settings).idle_consumer_after == 36000


async def test_gauges_including_null_lag(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    empty = await stream_stats.stream_figures(redis_client, queue_name)
    assert (empty.length, empty.lag, empty.pel, empty.group_present) == (0, 0, 0, False)

    await streams.ensure_group(redis_client, queue_name)
    await streams.enqueue_many(redis_client, queue_name, [env(i) for i in range(1, 6)], seen_ttl=60)
    await streams.enqueue_many(redis_client, queue_name, [env(1), env(2)], seen_ttl=60, shadow=True)
    got = await streams.read(redis_client, queue_name, "w", count=2, block_ms=100)
    before = await stream_stats.stream_figures(redis_client, queue_name)
    assert (before.length, before.lag, before.lag_exact, before.pel) == (5, 3, True, 2)

    await streams.ack(redis_client, queue_name, [got[0].entry_id])
    assert (await stream_stats.stream_figures(redis_client, queue_name)).lag_exact
    # deleting an undelivered entry (as XDEL or XTRIM by an operator would) makes Redis report NULL
    last_id = (await entries(redis_client, streams.stream_key(queue_name)))[-1][0]
    await redis_client.xdel(streams.stream_key(queue_name), last_id)
    groups = await redis_client.xinfo_groups(streams.stream_key(queue_name))
    assert groups[0]["lag"] is None
    async with pg_pool.acquire() as conn:
        await create_queue(conn, queue_name)
        await outbox.submit(conn, queue_name, {})
    r = make_reaper(pg_pool, redis_client, pg_dsn, queue_name, "reaper-a")
    figures = await eventually(lambda: _figures_when_idle(r), what="oldest pending entry idle")
    assert figures is not None
    assert (figures.length, figures.lag, figures.lag_exact, figures.pel) == (3, 2, False, 1)
    assert (figures.dlq_length, figures.shadow_length, figures.consumers) == (0, 2, 1)

    def sample(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"queue": queue_name, **labels})

    assert sample("judgequeue_stream_length") == 3 and sample("judgequeue_stream_lag") == 2
    assert sample("judgequeue_pel_size") == 1 and sample("judgequeue_shadow_stream_length") == 2
    assert sample("judgequeue_dlq_length") == 0 and sample("judgequeue_consumers") == 1
    assert (sample("judgequeue_pel_oldest_idle_seconds") or 0) >= 0.05
    assert sample("judgequeue_outbox_rows", state="PENDING") == 1
    assert sample("judgequeue_outbox_oldest_pending_age_seconds") is not None
    usage = REGISTRY.get_sample_value("judgequeue_notify_queue_usage")  # the database's, no queue label
    assert usage is not None and 0 <= usage < 1


async def _figures_when_idle(r: Reaper) -> stream_stats.StreamFigures | None:
    figures = await r.refresh_gauges()
    return figures if figures.oldest_idle >= 0.05 else None


async def test_role_loop_requeues_and_stops_promptly(
    pg_dsn: str, redis_client: aioredis.Redis, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "judgequeue.reaper")  # log records with extras must be valid
    settings = stream_settings(pg_dsn, REDIS_URL, queue_name, visibility_timeout="100ms", reaper_interval="50ms")
    await streams.ensure_group(redis_client, queue_name)
    await streams.enqueue_many(redis_client, queue_name, [env(1)], seen_ttl=60)
    await streams.read(redis_client, queue_name, "w", count=1, block_ms=100)
    stop = asyncio.Event()
    task = asyncio.create_task(reaper.run(settings, stop))

    async def requeued() -> bool:
        got = await streams.read(redis_client, queue_name, "w2", count=1, block_ms=10)
        return bool(got) and got[0].envelope is not None and got[0].envelope.deliveries == 2

    await eventually(requeued, within=5, what="entry re-delivered by the running reaper")
    stop.set()
    await asyncio.wait_for(task, 3)
    assert any(r.getMessage() == "reaper started" for r in caplog.records)


async def test_sweep_survives_unreachable_redis(pg_pool: asyncpg.Pool, pg_dsn: str, queue_name: str) -> None:
    dead = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    try:
        r = Reaper(pg_pool, dead, stream_settings(pg_dsn, REDIS_URL, queue_name))
        report = await r.sweep()
    finally:
        await dead.aclose()
    assert {"stream", "consumers", "gauges"} <= set(report.errors)
    assert "RedisUnavailable" in report.errors["stream"] and "prune" not in report.errors
    # The Postgres parts worked: flaky, not unreachable, so the next sweep comes at its interval.
    assert report.succeeded >= 2 and not report.unreachable


async def test_a_sweep_with_every_part_failing_is_unreachable(queue_name: str) -> None:
    """Backoff is for servers that are down: both dead, every part fails, the sweep says so."""
    dead_redis = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    dead_pg = await asyncpg.create_pool(
        f"postgresql://postgres@127.0.0.1:{free_port()}/x", min_size=0, max_size=1, timeout=0.5
    )
    try:
        r = Reaper(dead_pg, dead_redis, stream_settings("postgresql://x/y", REDIS_URL, queue_name))
        report = await r.sweep()
    finally:
        await dead_redis.aclose()
        await dead_pg.close()
    assert report.unreachable and report.succeeded == 0, report.errors


async def test_sweep_rescues_expired_leases(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    sid = await judging_submission(pg_pool, queue_name, lease_expired=True)
    r = make_reaper(pg_pool, redis_client, pg_dsn, queue_name, "reaper-a")
    report = await r.sweep()
    assert report.leases is not None and (report.leases.requeued, report.leases.failed) == (1, 0)
    async with pg_pool.acquire() as conn:
        row = await submission(conn, sid)
    assert (row["status"], row["generation"]) == ("PENDING", 2)


async def test_stranded_resend_clears_a_marker_that_outlived_its_entry(
    pg_pool: asyncpg.Pool, pg_dsn: str, queue_name: str, redis_client: aioredis.Redis
) -> None:
    """A Postgres failover to an asynchronous standby can lose a lease whose entry was acked: the
    submission is PENDING, its row SENT, the entry gone, but the dedup marker still in Redis.
    The re-send must reach the stream anyway, not be absorbed as a duplicate until SEEN_TTL."""
    settings = stream_settings(pg_dsn, REDIS_URL, queue_name, redispatch_after="1h")
    async with pg_pool.acquire() as conn:
        await create_queue(conn, queue_name)
        sid = await outbox.submit(conn, queue_name, {})
    dispatcher = Dispatcher(pg_pool, redis_client, settings)
    assert (await dispatcher.cycle()).by_result == {"sent": 1}
    stream = streams.stream_key(queue_name)
    [(entry_id, _)] = await entries(redis_client, stream)
    await redis_client.xdel(stream, entry_id)  # consumed and acked; then the lease was lost
    assert await redis_client.exists(streams.seen_key(queue_name, sid, 1))
    async with pg_pool.acquire() as conn:
        await conn.execute(
            "UPDATE judgequeue.outbox SET sent_at = sent_at - interval '2 hours';"
            "UPDATE judgequeue.submissions SET created_at = created_at - interval '2 hours'"
        )
    assert await Reaper(pg_pool, redis_client, settings).resend_stranded() == 1
    assert (await dispatcher.cycle()).by_result == {"sent": 1}, "appended again, not absorbed as a duplicate"
    [(_, fields)] = await entries(redis_client, stream)
    assert Envelope.parse(fields).submission == sid
