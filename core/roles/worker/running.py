"""What a worker keeps of its running jobs: their leases renewed, given back, or set aside.

:class:`RunningJob` is one held lease and the task judging it; :class:`WorkerStats` counts what the
worker did; :class:`StartPacer` spreads a batch's starts over turns of the event loop.
:func:`keep_leases` is the heartbeat; :func:`release_leases` gives leases back when the worker stops
(bounded: what it cannot give back expires and is rescued); :func:`dead_letter` sets aside entries
no retry can judge.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import asyncpg
import redis.asyncio as aioredis

from ...base.errors import SERVER_ERRORS, reason
from ...runtime.lifecycle import DB_ERRORS, SHUTDOWN_STEP, backoff
from ...store import giving_up, leases
from ...transport.connect import STATEMENT_TIMEOUT
from .lanes import Lane

log = logging.getLogger("judgequeue.worker")


@dataclass
class WorkerStats:
    """What this worker did (for tests and logs; the metrics carry the same counts)."""

    leased: int = 0
    written: int = 0
    stale_envelopes: int = 0
    stale_results: int = 0
    lost_leases: int = 0
    malformed: int = 0
    dead_lettered: int = 0
    released: int = 0
    judge_errors: int = 0
    cancelled: int = 0


#: Jobs started per turn of the worker's event loop while it keeps reserved offers open (see
#: :class:`StartPacer`): a few judges' first steps, a fraction of a millisecond with a quick judge.
START_PER_TURN = 8


class StartPacer:
    """Lets at most ``per_turn`` jobs start in one turn of the event loop; the others wait for the
    next turns, oldest first.

    A reserved offer's job starts when the worker has read its fill's notification, which it reads
    between turns. A take of 56 jobs started in one turn (each judge's first step: the whole of a
    quick judge and its verdict's serialisation, about 3 ms on the project's machines) made that
    job wait for all of them, and a drain takes such batches back to back: in ``bench.priority`` a
    contest's p99 beside another contest's burst was 3.9-5.3 ms against 3.4-3.9 ms paced. The
    reserved job itself is not paced (:meth:`admit` is for the others)."""

    def __init__(self, per_turn: int = START_PER_TURN) -> None:
        self._per_turn = per_turn
        self._started = 0  # in this turn
        self._turn_ends = False  # a callback that starts the count again is scheduled

    async def admit(self) -> None:
        """Return once this job may start."""
        while True:
            if self._started < self._per_turn:
                self._started += 1
                if not self._turn_ends:
                    self._turn_ends = True
                    asyncio.get_running_loop().call_soon(self._next_turn)
                return
            await asyncio.sleep(0)  # the next turn: the loop reads the sockets in between

    def _next_turn(self) -> None:
        self._started = 0
        self._turn_ends = False


@dataclass
class RunningJob:
    """One held lease and the task judging it."""

    lease: leases.Lease
    task: asyncio.Task[None] | None = None
    phase: str = "judging"  # judging -> writing (or releasing, when the worker is unfit) -> done
    lost: bool = False
    releasing: bool = False
    cancelled: bool = False  # its submission was cancelled: stopped, nothing of it is written


async def keep_leases(
    pool: asyncpg.Pool, lane: Lane, jobs: Callable[[], Iterable[RunningJob]], ttl: float, failed: Callable[[], None]
) -> None:
    """Renew every held lease of ``jobs()`` each ``ttl / 3`` in one fenced statement, forever; a
    judging job whose lease is gone (rejudged, rescued, cancelled) is marked lost and its judge
    cancelled. ``failed`` counts each renewal that failed and each lease lost."""
    interval = ttl / 3
    while True:
        await asyncio.sleep(interval)
        held_jobs = [j for j in jobs() if j.phase != "done"]
        if not held_jobs:
            continue
        try:
            async with pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                held = await lane.renew(conn, [j.lease for j in held_jobs], ttl=ttl)
        except DB_ERRORS as exc:
            # Keep judging: the fence decides at write time whether the result still counts.
            failed()
            log.warning("lease renew failed", extra={"error": reason(exc), "leases": len(held_jobs)})
            continue
        for job in held_jobs:
            if job.lease.attempt in held or job.phase != "judging":
                continue  # a job already writing learns its fate from the verdict write
            failed()
            job.lost = True
            if job.task is not None:
                job.task.cancel()


async def release_leases(pool: asyncpg.Pool, lane: Lane, held: list[leases.Lease]) -> int:
    """Give in-flight leases back so another worker takes the jobs at once; bounded, best effort.
    Returns how many were given back.

    If the database does not answer within :data:`SHUTDOWN_STEP` the leases simply expire and
    the reaper rescues the jobs: slower, never lost.
    """
    deadline = asyncio.get_running_loop().time() + SHUTDOWN_STEP
    for attempt in range(3):
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            break
        try:
            async with asyncio.timeout(left), pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                released = await lane.release(conn, held)
            log.info("released in-flight jobs", extra={"released": len(released), "asked": len(held)})
            return len(released)
        except DB_ERRORS as exc:
            log.warning("lease release failed", extra={"error": reason(exc), "attempt": attempt + 1})
            await asyncio.sleep(min(backoff(attempt + 1), max(0.0, left)))
    log.error("could not release leases; they will expire and be rescued", extra={"leases": len(held)})
    return 0


async def dead_letter(
    lane: Lane, pool: asyncpg.Pool, redis: aioredis.Redis, queue: str, worker: str, poison: list[giving_up.Decision]
) -> int:
    """Dead-letter entries no retry can judge, at once (Postgres record first, then the DLQ); how
    many were. If either step fails the entries stay pending: the reaper dead-letters them after
    ``maxDeliveries`` as before, so nothing is lost; the worker moves on either way.
    """
    try:
        dead: int = await lane.give_up(pool, redis, queue, worker, poison)
    except SERVER_ERRORS as exc:
        log.warning("dead-letter failed; left pending for the reaper", extra={"error": reason(exc)})
        return 0
    for d in poison:
        log.error("entry dead-lettered", extra={"entry": d.entry.entry_id, "reason": d.reason})
    return dead
