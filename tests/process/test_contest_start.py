"""A contest start end to end: two contests' bursts and a rejudge queued in one queue, the roles as
processes, a worker killed with SIGKILL mid-run and replaced.

Every submission ends with exactly one verdict and no stale write is accepted (DESIGN section 9,
checked from an audit of every status change); the two contests take turns (fair share by key: the
smaller one is not held behind the larger one's burst); and the rejudge class gets its share of the
starts, no more, while contest jobs wait, and everything after.

The CI size is 20,000 jobs; ``JUDGEQUEUE_CONTEST_JOBS=100000`` runs the full contest start.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core.base.classes import JobClass
from judgequeue.core.store.queues import create_queue, set_classes
from tests.support.chaos import VERDICT_AUDIT_SQL, ChaosReport, check_invariants
from tests.support.databases import REDIS_URL
from tests.support.roles import Roles
from tests.support.settings import FAST_ROLE_ENV
from tests.support.waiting import eventually

JOBS = int(os.environ.get("JUDGEQUEUE_CONTEST_JOBS", "20000"))
#: Contest a bursts half the jobs, contest b a quarter, and a rejudge of a quarter waits behind both.
PARTS = {"a": JOBS // 2, "b": JOBS // 4, "r": JOBS - JOBS // 2 - JOBS // 4}
REJUDGE_SHARE = 10
#: Each job sleeps this long (the sleep judge), so a worker always holds leases when it is killed.
JOB_SECONDS = 0.02


async def _queue_all(conn: asyncpg.Connection, queue: str) -> dict[int, str]:
    """Every job queued before the roles start, one statement per part: submission id -> part."""
    parts: dict[int, str] = {}
    for part, n in PARTS.items():
        job_class, key = ("rejudge", None) if part == "r" else ("contest", f"contest-{part}")
        rows = await conn.fetch(
            "SELECT judgequeue.submit($1, jsonb_build_object('part', $2::text, 'i', g, 'seconds', $6::float8),"
            " $3, $4) AS id FROM generate_series(1, $5) AS g",
            queue, part, job_class, key, n, JOB_SECONDS,
        )  # fmt: skip
        parts.update((row["id"], part) for row in rows)
    return parts


async def _first_starts(conn: asyncpg.Connection, parts: dict[int, str]) -> str:
    """Each submission's part at its first lease, in the order the leases committed."""
    rows = await conn.fetch(
        "SELECT submission FROM public.chaos_audit WHERE new_status = 'JUDGING'"
        " AND old_status = 'PENDING' ORDER BY seq"
    )
    seen: set[int] = set()
    order = []
    for row in rows:
        if row["submission"] not in seen:
            seen.add(row["submission"])
            order.append(parts[row["submission"]])
    return "".join(order)


@pytest.mark.slow
async def test_a_contest_start_with_a_worker_killed(
    pg: asyncpg.Connection, pg_dsn: str, pg_pool: asyncpg.Pool, queue_name: str, tmp_path: Path
) -> None:
    await create_queue(pg, queue_name)
    await set_classes(pg, queue_name, (JobClass("contest"), JobClass("rejudge", REJUDGE_SHARE)))
    await pg.execute(VERDICT_AUDIT_SQL)
    begun = time.monotonic()
    parts = await _queue_all(pg, queue_name)
    assert len(parts) == JOBS
    await pg.execute("ANALYZE judgequeue.outbox; ANALYZE judgequeue.submissions")

    queued = time.monotonic()
    env = {**FAST_ROLE_ENV, "JUDGEQUEUE_CONCURRENCY": "8"}  # the sleep judge
    roles = Roles.on(pg_dsn, queue_name, tmp_path, **env)
    started = time.monotonic()
    try:
        roles.start_all(dispatchers=1, workers=2, reapers=1)

        async def judged() -> int:
            n: int = await pg.fetchval(
                "SELECT count(*) FROM judgequeue.submissions WHERE queue = $1 AND status = 'ACCEPTED'", queue_name
            )
            return n

        # Mid-run: a third judged, then one worker is killed with its leases held, and replaced.
        await eventually(lambda: _at_least(judged, JOBS // 3), within=JOBS / 20, every=0.2, what="a third judged")
        victim = next(p for p in roles.procs if p.role == "worker")

        async def stopped_holding_leases() -> bool:
            # Stopped, it cannot end its leases; killed only while it holds some (a worker slow to
            # start under load had taken nothing when a third was judged by the other one).
            os.kill(victim.pid, signal.SIGSTOP)
            if await _leases_held(pg, queue_name, victim.pid):
                return True
            os.kill(victim.pid, signal.SIGCONT)
            return False

        await eventually(stopped_holding_leases, within=60, every=0.1, what="the worker to kill holding leases")
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        roles.start("worker")
        await eventually(lambda: _at_least(judged, JOBS), within=JOBS / 10, every=0.5, what="every job judged")
        seconds = time.monotonic() - started
    finally:
        roles.stop()

    report = ChaosReport()
    redis = aioredis.Redis.from_url(REDIS_URL)
    try:
        await check_invariants(pg_pool, redis, queue_name, dict.fromkeys(parts, "ACCEPTED"), report)
    finally:
        await redis.aclose()
    assert not report.violations, report.violations
    assert report.lost_submissions == report.wrong_verdicts == report.system_errors == 0
    assert report.generation_bumps >= 1, "the killed worker held no lease: nothing was rescued"

    order = await _first_starts(pg, parts)
    assert len(order) == JOBS
    # While contest jobs wait, the rejudge gets its share of the starts (10%: within +-10% of it)...
    contests_done = max(order.rfind("a"), order.rfind("b")) + 1
    rejudge_share = order[:contests_done].count("r") / contests_done
    assert 0.09 <= rejudge_share <= 0.11, (rejudge_share, contests_done)
    # ...and the contests take turns: contest b's jobs are spread over the first half of a's, not
    # held behind a's burst (b's share of the contest starts while both wait is within 45-55%).
    both = order[: order.rfind("b") + 1].replace("r", "")
    b_share = both.count("b") / len(both)
    assert 0.45 <= b_share <= 0.55, b_share
    print(
        f"\n{JOBS} jobs queued in {queued - begun:.1f} s, judged in {seconds:.1f} s ({JOBS / seconds:.0f}/s), "
        f"a worker killed at a third: "
        f"rejudge share while contests waited {rejudge_share:.1%}, contest b's share while both "
        f"waited {b_share:.1%}, {report.generation_bumps} leases of the killed worker rescued"
    )


async def _leases_held(conn: asyncpg.Connection, queue: str, pid: int) -> int:
    """How many submissions the worker of process ``pid`` holds leased (its takes name it, with its pid)."""
    n: int = await conn.fetchval(
        "SELECT count(*) FROM judgequeue.outbox o JOIN judgequeue.submissions s"
        " ON s.id = o.submission_id AND s.generation = o.generation"
        " WHERE o.queue = $1 AND s.status = 'JUDGING' AND o.claimed_by LIKE $2",
        queue,
        f"worker-%-{pid}-%",
    )
    return n


async def _at_least(count: Callable[[], Awaitable[int]], n: int) -> bool:
    return await count() >= n
