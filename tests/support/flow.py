"""Jobs flowing through running roles while a test breaks something, then the end-state check.

:class:`Flow` is the offered load: a few concurrent "applications" submitting (each commit retried
through an outage, like :func:`tests.support.roles.submit_retrying`) until told to stop, remembering what
each committed submission asks the ``sleep`` judge to answer (or, given ``job``, any judge's payloads
with the verdict each must get). :func:`check_flow` waits for every
committed submission to finish and checks DESIGN section 9 with the chaos harness's audit
(:func:`tests.support.chaos.check_invariants`): exactly one terminal verdict each, the expected one, no stale
write, nothing left in the outbox, the stream or the PEL.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from judgequeue.core.transport.connect import redis_client
from tests.support.chaos import AUDIT_SQL, JUDGE_STATUSES, VERDICT_AUDIT_SQL, ChaosReport, check_invariants
from tests.support.databases import connection
from tests.support.queries import count_submissions
from tests.support.roles import Roles, submit_retrying, wait_all_terminal
from tests.support.waiting import eventually


async def install_audit(dsn: str, *, shadow: bool = True) -> None:
    """The chaos audit trigger: every status/generation transition recorded (install before any job);
    ``shadow=False`` for a schema from before shadow judging (the submissions' audit only)."""
    async with connection(dsn) as conn:
        await conn.execute(AUDIT_SQL if shadow else VERDICT_AUDIT_SQL)


#: One submission of a flow: its payload and the verdict it must get.
Job = Callable[[random.Random], tuple[object, str]]


class Flow:
    """``submitters`` concurrent applications submitting through ``dsn`` until :meth:`stop`; each
    payload is the ``sleep`` judge's answering a random status, or what ``job`` makes."""

    def __init__(
        self,
        dsn: str,
        queue: str,
        *,
        submitters: int = 3,
        pace: float = 0.02,
        connect_options: dict[str, Any] | None = None,
        job_seconds: tuple[float, float] = (0.0, 0.05),
        seed: int = 13,
        job: Job | None = None,
    ) -> None:
        self.dsn = dsn
        self.job_seconds = job_seconds
        self.job = job or self._sleep_job
        self.queue = queue
        self.pace = pace
        self.connect_options = connect_options
        self.rng = random.Random(seed)
        self.expected: dict[int, str] = {}
        self.committed_at: dict[int, float] = {}
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._submit_loop()) for _ in range(submitters)]

    def _sleep_job(self, rng: random.Random) -> tuple[object, str]:
        status = rng.choice(JUDGE_STATUSES)
        return {"seconds": rng.uniform(*self.job_seconds), "status": status}, status

    async def _submit_loop(self) -> None:
        while not self._stop.is_set():
            payload, status = self.job(self.rng)
            sid = await submit_retrying(
                self.dsn, self.queue, payload, within=60, connect_options=self.connect_options
            )
            self.expected[sid] = status
            self.committed_at[sid] = time.monotonic()
            await asyncio.sleep(self.pace)  # pacing of the offered load, not synchronisation

    async def stop(self) -> dict[int, str]:
        """Stop submitting (the commits in progress finish); the committed submissions and their answers."""
        self._stop.set()
        await asyncio.gather(*self._tasks)
        return dict(self.expected)

    async def verdicts(self) -> int:
        """How many committed submissions have their verdict."""
        return await terminal_count(self.dsn, list(self.expected), **(self.connect_options or {}))

    async def wait_verdicts(self, n: int, *, within: float = 60, what: str = "verdicts") -> None:
        async def enough() -> bool:
            return await self.verdicts() >= n

        await eventually(enough, within=within, what=f"{n} {what}")

    async def wait_judging(self, n: int, *, within: float = 30) -> None:
        """Until at least ``n`` committed submissions are leased by a worker (jobs in flight)."""

        async def enough() -> bool:
            return await judging_count(self.dsn, list(self.expected)) >= n

        await eventually(enough, within=within, what=f"{n} jobs being judged")

    def committed_after(self, moment: float) -> list[int]:
        return [sid for sid, at in self.committed_at.items() if at > moment]


async def terminal_count(dsn: str, ids: list[int], **connect_options: Any) -> int:
    """How many of ``ids`` have their verdict."""
    async with connection(dsn, timeout=2, **connect_options) as conn:
        return await count_submissions(conn, ids=ids, not_status=("PENDING", "JUDGING"))


async def judging_count(dsn: str, ids: list[int]) -> int:
    """How many of ``ids`` a worker holds a lease on right now (jobs in flight)."""
    async with connection(dsn, timeout=2) as conn:
        return await count_submissions(conn, ids=ids, status="JUDGING")


async def check_flow(
    dsn: str, redis_url: str, queue: str, expected: dict[int, str], roles: Roles | None, *, within: float = 90
) -> ChaosReport:
    """Wait until every committed submission is terminal, then check the invariants; the report.
    ``roles``: the processes whose logs a timeout shows (None when they are pods)."""
    await wait_all_terminal(dsn, list(expected), within=within, roles=roles)
    report = ChaosReport(submissions=len(expected))
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    redis: aioredis.Redis = redis_client(redis_url)
    try:
        await _wait_drained(pool, redis, queue, within=within)
        await check_invariants(pool, redis, queue, expected, report)
    finally:
        await redis.aclose()
        await pool.close()
    return report


async def _wait_drained(pool: asyncpg.Pool, redis: aioredis.Redis, queue: str, *, within: float) -> None:
    """Outbox settled and stream/PEL empty (entries acked after the last verdict may trail it a little)."""
    from judgequeue.core.transport import streams

    deadline = time.monotonic() + within
    while True:
        active = await pool.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE state IN ('PENDING', 'CLAIMED')")
        try:
            length = await redis.xlen(streams.stream_key(queue))
        except Exception:  # Redis still failing over: keep waiting
            length = -1
        if active == 0 and length == 0:
            return
        if time.monotonic() > deadline:
            return  # check_invariants reports what is left
        await asyncio.sleep(0.1)
