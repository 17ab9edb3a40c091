"""End to end against real Postgres and Redis: dispatcher + workers + lease rescue, real SIGKILL.

The victim is a real ``judgequeue worker`` process with a short lease; the live workers run in this
process with a long one, so the only leases that can expire are the victim's: which submissions are
rescued is decided by what the victim held when it was killed, not by how loaded the machine is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core.judges import Verdict
from judgequeue.core.judges.builtin import SleepJudge
from judgequeue.core.roles.dispatcher import Dispatcher
from judgequeue.core.roles.worker.role import Worker
from judgequeue.core.store import leases, outbox
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import streams
from tests.support.databases import REDIS_URL
from tests.support.queries import count_submissions, status_counts, submission, submissions
from tests.support.roles import RoleProcess, clean_env, role_env
from tests.support.settings import make_settings
from tests.support.waiting import eventually

#: The in-process workers' lease: far longer than any stall of a loaded machine, so never rescued.
LIVE_LEASE = "60s"


async def _rescue_loop(pool: asyncpg.Pool, queue: str, stop: asyncio.Event) -> None:
    """Stands in for the reaper's lease sweep."""
    while not stop.is_set():
        async with pool.acquire() as conn:
            await leases.rescue_expired_leases(conn, queue, max_retries=5)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


def _spawn_victim(pg_dsn: str, queue: str, log_dir: Path, *, lease_ttl: str, concurrency: int = 1) -> RoleProcess:
    """A ``judgequeue worker`` process with a short lease, to be SIGKILLed holding its jobs."""
    env = role_env(pg_dsn, queue, JUDGEQUEUE_JUDGE="sleep", JUDGEQUEUE_LEASE_TTL=lease_ttl,
                   JUDGEQUEUE_CONCURRENCY=str(concurrency))  # fmt: skip
    return RoleProcess("worker", clean_env(**env), log_dir / "victim.log")


class QuickJudge(SleepJudge):
    """The live workers' judge: the payload's verdict without its sleep (only the victim dawdles)."""

    async def judge(self, payload: Any) -> Verdict:
        return await super().judge({k: v for k, v in payload.items() if k != "seconds"})


@pytest.mark.slow
async def test_thousand_submissions_one_correct_verdict_each_despite_a_killed_worker(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str, tmp_path: Path
) -> None:
    n = 1000
    settings = make_settings(pg_dsn, REDIS_URL, queue_name, schedule="50ms", lease_ttl=LIVE_LEASE, concurrency="8",
                             grace_period="1s")  # fmt: skip
    statuses = ["ACCEPTED", "WRONG_ANSWER", "TIME_LIMIT", "RUNTIME_ERROR"]
    slow = 16  # the victim's concurrency: it is killed holding exactly these leases
    async with pg_pool.acquire() as conn:
        await create_queue(conn, queue_name)
        await streams.ensure_group(redis_client, queue_name)
        async with conn.transaction():
            for i in range(n):
                payload = {"status": statuses[i % 4], "echo": i, "seconds": 60 if i < slow else 0}
                await outbox.submit(conn, queue_name, payload)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(Dispatcher(pg_pool, redis_client, settings).run(stop))]
    victim = _spawn_victim(pg_dsn, queue_name, tmp_path, lease_ttl="1500ms", concurrency=slow)

    async def victim_holds_leases() -> bool:
        return await count_submissions(pg_pool, status="JUDGING") == slow

    try:
        await eventually(victim_holds_leases, within=20, what="the process worker holding leases")
        victim.send_signal(signal.SIGKILL)
        assert await asyncio.to_thread(victim.wait) == -signal.SIGKILL
        held = {sid for sid, row in (await submissions(pg_pool)).items() if row["status"] == "JUDGING"}
        workers = [Worker(pg_pool, redis_client, settings, judge=QuickJudge()) for _ in range(3)]
        tasks += [asyncio.create_task(w.run(stop)) for w in workers]
        tasks.append(asyncio.create_task(_rescue_loop(pg_pool, queue_name, stop)))

        async def all_done() -> bool:
            counts = await status_counts(pg_pool)
            return counts.get("PENDING", 0) + counts.get("JUDGING", 0) == 0

        await eventually(all_done, within=60, every=0.2, what="1000 verdicts")
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        victim.ensure_dead()
    rows = list((await submissions(pg_pool)).values())
    assert len(rows) == n
    for i, row in enumerate(rows):
        verdict = json.loads(row["verdict"])
        assert (row["status"], verdict["details"]["echo"]) == (statuses[i % 4], i)
        assert verdict["generation"] == row["generation"]
    rescued = {r["id"] for r in rows if r["generation"] > 1}
    assert rescued == held, "exactly the killed worker's leases were rescued (the live workers' never expire)"
    assert sum(w.stats.written for w in workers) == n  # every verdict written exactly once, by the live workers
    # Live workers ack (and delete) everything they read once their leases are durable. Only
    # entries the victim leased but was killed before acking may remain, pending under its consumer
    # until the reaper's PEL sweep.
    async def only_the_victims_left() -> bool:
        left = await redis_client.xlen(streams.stream_key(queue_name))
        pending: Any = await redis_client.xpending(streams.stream_key(queue_name), streams.GROUP)
        return bool(left == pending["pending"] <= slow)

    await eventually(only_the_victims_left, what="live workers' entries acked")


async def test_sigkilled_worker_job_is_rejudged_within_lease_ttl(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue_name: str, tmp_path: Path
) -> None:
    ttl = 1.0
    settings = make_settings(pg_dsn, REDIS_URL, queue_name, schedule="50ms", lease_ttl=LIVE_LEASE)
    async with pg_pool.acquire() as conn:
        await create_queue(conn, queue_name)
        await streams.ensure_group(redis_client, queue_name)
        [sid] = [await outbox.submit(conn, queue_name, {"seconds": 30, "echo": "x"})]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(Dispatcher(pg_pool, redis_client, settings).run(stop))]
    victim = _spawn_victim(pg_dsn, queue_name, tmp_path, lease_ttl=f"{ttl}s")
    try:
        async def judging() -> asyncpg.Record | None:
            row = await submission(pg_pool, sid)
            return row if row["status"] == "JUDGING" else None

        first = await eventually(judging, within=20, what="the process worker judging")
        victim.send_signal(signal.SIGKILL)
        assert await asyncio.to_thread(victim.wait) == -signal.SIGKILL
        killed_at = asyncio.get_running_loop().time()
        # The re-judge must not take 30 s: its payload is rewritten to be quick on the new attempt.
        async with pg_pool.acquire() as conn:
            await conn.execute(
                "UPDATE judgequeue.submissions SET payload = '{\"echo\": \"y\"}' WHERE id = $1", sid
            )
        w = Worker(pg_pool, redis_client, settings, judge=SleepJudge())
        tasks += [asyncio.create_task(w.run(stop)), asyncio.create_task(_rescue_loop(pg_pool, queue_name, stop))]

        async def accepted() -> asyncpg.Record | None:
            row = await submission(pg_pool, sid)
            return row if row["status"] == "ACCEPTED" else None

        row = await eventually(accepted, within=ttl + 5, what="re-judged after the kill")
        assert asyncio.get_running_loop().time() - killed_at < ttl + 5
        assert row["generation"] == 2 and row["retry_count"] == 1 and row["attempt_id"] != first["attempt_id"]
        assert json.loads(row["verdict"])["worker"] == w.name
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        victim.ensure_dead()
