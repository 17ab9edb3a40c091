"""Retention of terminal submissions: pruned by the reaper, batched, index-supported.

Invariant 5 (docs/design.md §6): nothing in Postgres grows without bound under steady load. Only
terminal submissions finished before the retention go; waiting ones (PENDING, JUDGING), recent
verdicts and other queues' rows stay.
"""

from __future__ import annotations

import json

import asyncpg
import redis.asyncio as aioredis

from judgequeue.core.base.states import VERDICTS
from judgequeue.core.roles.reaper import Reaper
from judgequeue.core.store import outbox
from judgequeue.core.store.queues import create_queue
from judgequeue.core.store.sql import QUERIES
from tests.support.databases import REDIS_URL
from tests.support.settings import make_settings


async def _status_counts(pg: asyncpg.Connection, queue: str) -> dict[str, int]:
    rows = await pg.fetch("SELECT status, count(*) AS n FROM judgequeue.submissions WHERE queue = $1 GROUP BY 1", queue)
    return {r["status"]: r["n"] for r in rows}


async def _fill(pg: asyncpg.Connection, queue: str) -> None:
    """300 submissions: 200 finished two days ago, 40 finished just now, 30 JUDGING, 30 PENDING."""
    await create_queue(pg, queue)
    await pg.execute("SELECT judgequeue.submit($1, '{}'::jsonb) FROM generate_series(1, 300)", queue)
    ids = [r["id"] for r in await pg.fetch("SELECT id FROM judgequeue.submissions WHERE queue = $1 ORDER BY id", queue)]
    old, recent, judging = ids[:200], ids[200:240], ids[240:270]
    await pg.execute(
        "UPDATE judgequeue.submissions SET status = 'ACCEPTED', verdict = '{}'::jsonb,"
        " finished_at = now() - interval '2 days', created_at = now() - interval '2 days' WHERE id = ANY($1)",
        old,
    )
    await pg.execute(
        "UPDATE judgequeue.submissions SET status = 'WRONG_ANSWER', finished_at = now() WHERE id = ANY($1)", recent
    )
    # Waiting rows old enough to be pruned if the status were ignored.
    await pg.execute(
        "UPDATE judgequeue.submissions SET status = 'JUDGING', attempt_id = gen_random_uuid(),"
        " lease_expires_at = now() + interval '1 hour', created_at = now() - interval '3 days' WHERE id = ANY($1)",
        judging,
    )


async def test_prune_submissions_deletes_only_old_terminal_rows_in_batches(pg: asyncpg.Connection) -> None:
    await _fill(pg, "judge")
    await _fill(pg, "other")
    assert await outbox.prune_submissions(pg, "judge", retention=86400, batch=30, max_batches=3) == 90, "bounded"
    assert await outbox.prune_submissions(pg, "judge", retention=86400, batch=30) == 110
    assert await _status_counts(pg, "judge") == {"WRONG_ANSWER": 40, "JUDGING": 30, "PENDING": 30}
    assert await _status_counts(pg, "other") == {"ACCEPTED": 200, "WRONG_ANSWER": 40, "JUDGING": 30, "PENDING": 30}
    assert await outbox.prune_submissions(pg, "judge", retention=86400, batch=30) == 0
    # A retention shorter than the recent verdicts' age takes them too, never the waiting ones.
    await pg.execute("UPDATE judgequeue.submissions SET finished_at = now() - interval '10 seconds'")
    assert await outbox.prune_submissions(pg, "judge", retention=5, batch=1000) == 40
    assert await _status_counts(pg, "judge") == {"JUDGING": 30, "PENDING": 30}


async def test_prune_submissions_is_served_by_the_finished_index(pg: asyncpg.Connection) -> None:
    await _fill(pg, "judge")
    # Enough unrelated waiting rows that a sequential scan would not be chosen by accident either.
    await pg.execute("SELECT judgequeue.submit('judge', '{}'::jsonb) FROM generate_series(1, 5000)")
    await pg.execute("ANALYZE judgequeue.submissions")
    statement = "EXPLAIN (FORMAT JSON) " + QUERIES["submissions_prune"]
    plan = await pg.fetch(statement, 86400.0, 1000, "judge", list(VERDICTS))
    text = json.dumps(json.loads(plan[0][0]))
    assert "submissions_finished" in text, text


async def test_reaper_sweep_prunes_terminal_submissions_past_retention(
    pg: asyncpg.Connection, pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    await _fill(pg, queue_name)
    settings = make_settings(pg_dsn, REDIS_URL, queue_name, retention="1d")
    reaper = Reaper(pg_pool, redis_client, settings, name="reaper-retention")
    report = await reaper.sweep()
    assert "prune" not in report.errors, report.errors
    assert reaper.pruned_submissions == 200
    assert await _status_counts(pg, queue_name) == {"WRONG_ANSWER": 40, "JUDGING": 30, "PENDING": 30}
