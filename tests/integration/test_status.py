"""``judgequeue status``: the pure health rules, and the figures gathered from real servers."""

from __future__ import annotations

import asyncpg
import redis.asyncio as aioredis

from judgequeue.core.status import Figures, Thresholds, as_json, evaluate, gather, render
from judgequeue.core.store.outbox import OUTBOX_STATES, submit
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import streams


def figures(**changes: object) -> Figures:
    base: dict[str, object] = {
        "queue": "q",
        "outbox": dict.fromkeys(OUTBOX_STATES, 0),
        "oldest_pending_age": 0.0,
        "stream_length": 0,
        "lag": 0,
        "pel": 0,
        "oldest_idle": 0.0,
        "dlq_length": 0,
        "consumers": 1,
        "live_consumers": 1,
        "group_present": True,
        "mode": "live",
        "paused": False,
        "config_version": 1,
    }
    base.update(changes)
    return Figures(**base)  # type: ignore[arg-type]


def test_quiet_queue_is_healthy() -> None:
    verdict = evaluate(figures(), Thresholds())
    assert verdict.healthy and verdict.problems == []


def test_each_threshold_names_what_crossed_it() -> None:
    limits = Thresholds(
        max_pending_age=60,
        max_backlog=10,
        max_lag=5,
        max_pel=5,
        max_oldest_idle=30,
        max_dlq=0,
        max_dead=0,
        min_live_consumers=2,
    )
    outbox = {**dict.fromkeys(OUTBOX_STATES, 0), "PENDING": 8, "DEAD": 1}
    bad = figures(
        outbox=outbox, oldest_pending_age=61.0, lag=6, pel=6, oldest_idle=31.0, dlq_length=1, live_consumers=1
    )
    verdict = evaluate(bad, limits)
    assert not verdict.healthy
    text = "\n".join(verdict.problems)
    for phrase in ("oldest pending", "backlog is 20", "stream lag is 6", "PEL", "idle", "dead-letter", "DEAD", "live"):
        assert phrase in text, phrase
    assert len(verdict.problems) == 8


def test_limits_are_inclusive_and_none_disables() -> None:
    at_limit = figures(oldest_pending_age=60.0, lag=5)
    assert evaluate(at_limit, Thresholds(max_pending_age=60, max_lag=5)).healthy
    way_over = figures(oldest_pending_age=10_000.0, dlq_length=99, oldest_idle=10_000.0)
    assert evaluate(way_over, Thresholds(max_pending_age=None, max_dlq=None, max_oldest_idle=None)).healthy


def test_unknown_figures_do_not_trip_rules_but_errors_and_missing_queue_do() -> None:
    unknown = figures(lag=None, pel=None, oldest_idle=None, dlq_length=None, live_consumers=None)
    assert evaluate(unknown, Thresholds(max_lag=0, max_pel=0, min_live_consumers=1)).healthy
    assert not evaluate(figures(redis_error="unreachable"), Thresholds()).healthy
    missing = evaluate(figures(mode=None), Thresholds())
    assert not missing.healthy and "does not exist" in missing.problems[0]


def test_backlog_adds_waiting_rows_lag_and_pel() -> None:
    outbox = {**dict.fromkeys(OUTBOX_STATES, 0), "PENDING": 2, "CLAIMED": 1, "SENT": 50}
    assert figures(outbox=outbox, lag=4, pel=3).backlog == 10


def test_render_and_json_show_every_figure() -> None:
    f = figures(pel=2, oldest_idle=12.5)
    verdict = evaluate(f, Thresholds(max_pel=1))
    text = render(f, verdict)
    assert "UNHEALTHY" in text and "pel=2" in text and "12.5s" in text and "mode=live" in text
    data = as_json(f, verdict)
    assert data["healthy"] is False and data["pel"] == 2 and data["backlog"] == 2


async def test_gather_reads_postgres_and_redis(
    pg: asyncpg.Connection, redis_client: aioredis.Redis, queue_name: str
) -> None:
    await create_queue(pg, queue_name)
    await submit(pg, queue_name, {"n": 1})
    await streams.ensure_group(redis_client, queue_name)
    await redis_client.xadd(streams.stream_key(queue_name), {"submission": "1"})
    await redis_client.xadd(streams.stream_key(queue_name), {"submission": "2"})
    await redis_client.xreadgroup(streams.GROUP, "c1", {streams.stream_key(queue_name): ">"}, count=1)
    await redis_client.xadd(streams.dlq_key(queue_name), {"reason": "poison"})
    f = await gather(pg, redis_client, queue_name)
    assert f.outbox["PENDING"] == 1
    assert (f.stream_length, f.lag, f.pel, f.dlq_length, f.consumers, f.live_consumers) == (2, 1, 1, 1, 1, 1)
    assert f.oldest_idle is not None and f.oldest_idle >= 0
    assert f.mode == "live" and f.group_present
    assert not evaluate(f, Thresholds()).healthy  # one dead letter, default limit 0


async def test_gather_reports_unreachable_redis(pg: asyncpg.Connection, queue_name: str) -> None:
    await create_queue(pg, queue_name)
    client = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=1)
    try:
        f = await gather(pg, client, queue_name, redis_timeout=2)
    finally:
        await client.aclose()
    assert f.redis_error is not None
    assert not evaluate(f, Thresholds()).healthy


async def test_shadow_workers_are_shown_as_the_shadow_streams_consumers(
    pg: asyncpg.Connection, redis_client: aioredis.Redis, queue_name: str
) -> None:
    """A queue in shadow mode judged by two shadow workers: they read the shadow stream in their
    group, not the work stream, and ``status`` counts them there instead of '0 live of 0'."""
    await create_queue(pg, queue_name, mode="shadow")
    f = await gather(pg, redis_client, queue_name)
    assert (f.shadow_consumers, f.live_shadow_consumers) == (0, 0)  # no shadow stream yet
    assert "shadow workers 0 live of 0" in render(f, evaluate(f, Thresholds()))
    await streams.ensure_group(redis_client, queue_name, shadow=True)
    for consumer in ("shadow-a", "shadow-b"):
        await redis_client.xadd(streams.shadow_key(queue_name), {"submission": consumer})
        await redis_client.xreadgroup(streams.GROUP, consumer, {streams.shadow_key(queue_name): ">"}, count=1)
    f = await gather(pg, redis_client, queue_name)
    assert (f.consumers, f.shadow_consumers, f.live_shadow_consumers) == (0, 2, 2)
    text = render(f, evaluate(f, Thresholds()))
    assert "consumers      0 live of 0" in text and "shadow workers 2 live of 2" in text, text
    assert as_json(f, evaluate(f, Thresholds()))["live_shadow_consumers"] == 2
    # A live queue without shadow workers shows no such line.
    await create_queue(pg, f"{queue_name}-live")
    live = await gather(pg, redis_client, f"{queue_name}-live")
    assert "shadow workers" not in render(live, evaluate(live, Thresholds()))
