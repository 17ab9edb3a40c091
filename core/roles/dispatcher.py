"""The dispatcher role: move committed outbox rows into the Redis stream (docs/design.md §1).

One cycle claims a batch in a short statement (``FOR UPDATE SKIP LOCKED``, flags read in the same
statement, no lock held across Redis), appends the batch in one pipeline of dedup-and-append
scripts, then marks every row in one statement fenced on this dispatcher's claim.

Wake-up (:mod:`judgequeue.core.runtime.wakeup`, the same one a direct-intake worker runs): only when a
claim finds nothing does the dispatcher register in ``judgequeue.dispatch_waiters`` (then claims
once more, then blocks on LISTEN). While registered, a trickle of work (partial batches) is
dispatched and it goes straight back to LISTEN; a full batch or a streak of busy cycles makes it
unregister and loop at once (:func:`~judgequeue.core.runtime.wakeup.keep_listening`).
``judgequeue.submit`` notifies only while a waiter exists, so a busy system pays nothing per commit
(a NOTIFY per commit serialises commits).
``schedule`` is only the idle poll fallback (it also bounds the one race a waiter cannot close: a
submit that checked for waiters just before registration).

LISTEN needs a server session of its own for as long as it listens, which a transaction pooler does
not give. Behind one (``JUDGEQUEUE_POSTGRES_POOLER=transaction``) the dispatcher listens on
``JUDGEQUEUE_POSTGRES_LISTEN_DSN`` (a direct connection) when it is set; without it, it neither
listens nor registers (so submitters never notify) and polls every ``schedule``.

Direct intake (``JUDGEQUEUE_INTAKE=direct``): the workers lease ready rows themselves and are the
ones woken by submits; the dispatcher neither listens nor registers, polls every ``schedule`` and
claims a live queue's rows only once they have been ready for a ``schedule`` (the hand-off): the
overflow when every worker is busy, and rows no worker was there to take. Shadow rows go at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import asyncpg
import redis.asyncio as aioredis

from ..base import failpoints, metrics
from ..base.errors import TransportError, reason
from ..config import Settings
from ..runtime.lifecycle import (
    DB_ERRORS,
    SHUTDOWN_STEP,
    HeldSession,
    best_effort,
    instance_id,
    serve,
    unless_stopped,
    wait_any,
)
from ..runtime.wakeup import Wakeup, keep_listening
from ..store import outbox
from ..transport import redis_errors, streams
from ..transport.connect import STATEMENT_TIMEOUT
from ..transport.envelope import Envelope

log = logging.getLogger("judgequeue.dispatcher")

T = TypeVar("T")


@dataclass
class CycleResult:
    claimed: int = 0
    by_result: dict[str, int] = field(default_factory=dict)
    #: Marks left for the next cycle's claim statement (``Dispatcher.run`` only).
    deferred: list[outbox.Mark] = field(default_factory=list)


def plan_marks(
    rows: list[outbox.ClaimedRow], results: list[streams.EnqueueResult] | TransportError
) -> tuple[list[outbox.Mark], dict[str, int]]:
    """Decide each row's outcome from the enqueue results (pure; the counts feed metrics).

    A duplicate is success: the entry was appended by an earlier attempt. A per-entry error counts
    an attempt (it may be permanent); a transport-wide failure only releases the rows, because an
    outage must not exhaust ``maxAttempts`` and kill submissions.
    """
    marks: list[outbox.Mark] = []
    counts: dict[str, int] = {}
    for i, row in enumerate(rows):
        shadow = row.mode == "shadow"
        if isinstance(results, TransportError):
            mark, counted = outbox.Mark(row.outbox_id, "release", f"redis: {results}"), "release"
        else:
            result = results[i]
            if result.status == "error":
                mark, counted = outbox.Mark(row.outbox_id, "retry", result.error), "retry"
            else:
                mark = outbox.Mark(row.outbox_id, "shadow_sent" if shadow else "sent")
                counted = ("shadow_" if shadow else "") + ("duplicate" if result.status == "duplicate" else "sent")
        marks.append(mark)
        counts[counted] = counts.get(counted, 0) + 1
    return marks, counts


#: Seconds an idle dispatcher waits for Redis to answer its PING.
IDLE_PING_TIMEOUT = 2.0


class Dispatcher:
    """One dispatcher instance; several may run against the same queue."""

    def __init__(
        self, pool: asyncpg.Pool, redis: aioredis.Redis, settings: Settings, *, name: str | None = None
    ) -> None:
        self.pool = pool
        self.redis = redis
        self.settings = settings
        self.queue = settings.queue
        self.name = name or instance_id("dispatcher")
        self._redis_ok = True
        # Direct intake: a live row is the workers' for one schedule before it goes to the stream.
        self._hand_off = settings.dispatcher.schedule if settings.worker.intake == "direct" else 0.0
        cfg = settings.dispatcher
        self._retry = outbox.Retry(cfg.max_attempts, cfg.backoff_base, cfg.backoff_max)

    async def cycle(self, conn: asyncpg.Connection | None = None) -> CycleResult:
        """Claim, enqueue and mark one batch; returns what happened.

        ``conn`` is the session for the claim and the mark (the run loop keeps one); without it
        the cycle takes one from the pool.
        """
        if conn is None:
            async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as pooled:
                return await self._cycle(pooled)
        return await self._cycle(conn)

    async def _cycle(
        self, conn: asyncpg.Connection, *, carry: Sequence[outbox.Mark] = (), defer: bool = False
    ) -> CycleResult:
        """One cycle. ``carry``: the previous cycle's marks, applied in the same statement as this
        claim. ``defer``: leave this batch's marks in ``result.deferred`` for the next cycle (the
        run loop, which flushes them with :meth:`flush` before it sleeps)."""
        cfg = self.settings.dispatcher
        started = time.monotonic()
        result = CycleResult()
        rows = await self._mark_and_claim(conn, carry, result, claim=cfg.batch_size)
        result.claimed = len(rows)
        if rows:
            failpoints.hit("dispatcher.after_claim")
        skipped = [r for r in rows if r.state == "SKIPPED"]
        if skipped:
            result.by_result["skipped"] = len(skipped)
        todo = [r for r in rows if r.state == "CLAIMED"]
        if not todo:
            self._count(result)
            return result

        enqueue_results: list[streams.EnqueueResult] | TransportError
        live = [r for r in todo if r.mode != "shadow"]
        shadow = [r for r in todo if r.mode == "shadow"]
        try:
            enqueue_results = []
            for group, is_shadow in ((live, False), (shadow, True)):
                if group:
                    enqueue_results += await streams.enqueue_many(
                        self.redis,
                        self.queue,
                        [self._envelope(r) for r in group],
                        seen_ttl=cfg.seen_ttl,
                        shadow=is_shadow,
                    )
            todo = live + shadow
        except TransportError as exc:
            log.warning("enqueue failed; rows released for retry", extra={"error": reason(exc), "rows": len(todo)})
            enqueue_results = exc
        enqueued_at = time.monotonic()
        failpoints.hit("dispatcher.after_xadd")

        marks, counts = plan_marks(todo, enqueue_results)
        for key, n in counts.items():
            result.by_result[key] = result.by_result.get(key, 0) + n
        if not isinstance(enqueue_results, TransportError):
            hist = metrics.COMMIT_TO_ENQUEUE.labels(self.queue)
            for row, res in zip(todo, enqueue_results, strict=True):
                if res.status == "appended" and row.mode != "shadow":
                    hist.observe(row.age + (enqueued_at - started))
        if defer:
            result.deferred = marks
        else:
            await self._mark(conn, marks, result)
        self._count(result)
        return result

    async def _mark(self, conn: asyncpg.Connection, marks: Sequence[outbox.Mark], result: CycleResult) -> None:
        if marks:
            await self._mark_and_claim(conn, marks, result, claim=0)

    async def _mark_and_claim(
        self, conn: asyncpg.Connection, marks: Sequence[outbox.Mark], result: CycleResult, *, claim: int
    ) -> list[outbox.ClaimedRow]:
        """Apply ``marks`` (counted into ``result``) and claim up to ``claim`` rows, in one statement."""
        cfg = self.settings.dispatcher
        applied, rows = await outbox.mark_and_claim(
            conn, marks, owner=self.name, retry=self._retry, queue=self.queue, limit=claim, claim_ttl=cfg.claim_ttl,
            hand_off=self._hand_off,
        )  # fmt: skip
        if marks:
            self._marked(marks, applied, result)
        return rows

    def _marked(
        self, marks: Sequence[outbox.Mark], applied: dict[int, outbox.OutboxState], result: CycleResult
    ) -> None:
        failpoints.hit("dispatcher.after_mark")
        lost = len(marks) - len(applied)
        if lost:
            # Our claim expired and another dispatcher took the rows; the dedup marker (or, once
            # the entry is acked, the lease fence) absorbs whatever both of us appended.
            log.warning("claims lost before marking", extra={"rows": lost})
        dead = sum(1 for state in applied.values() if state == "DEAD")
        if dead:
            result.by_result["dead"] = result.by_result.get("dead", 0) + dead

    async def flush(self, conn: asyncpg.Connection, marks: Sequence[outbox.Mark]) -> None:
        """Apply marks a looping cycle deferred (before the loop sleeps or stops)."""
        if marks:
            result = CycleResult()
            await self._mark(conn, marks, result)
            self._count(result)

    async def _check_redis_while_idle(self) -> None:
        """PING Redis when there is nothing to send, so an outage is logged before work arrives.

        A busy dispatcher learns of a Redis outage from its appends; an idle one would otherwise
        say nothing until the first submission fails to go out. Logged once per change of state.
        """
        try:
            await redis_errors.guarded(lambda: asyncio.wait_for(self.redis.ping(), IDLE_PING_TIMEOUT))
        except TransportError as exc:
            if self._redis_ok:
                log.warning("redis unreachable while idle", extra={"error": reason(exc)})
            self._redis_ok = False
            return
        if not self._redis_ok:
            log.info("redis reachable again")
        self._redis_ok = True

    def _envelope(self, row: outbox.ClaimedRow) -> Envelope:
        return Envelope(
            submission=row.submission_id,
            generation=row.generation,
            attempt=row.attempts,
            outbox=row.outbox_id,
            enqueued_at=time.time(),
        )

    def _count(self, result: CycleResult) -> None:
        for key, n in result.by_result.items():
            metrics.DISPATCH_RESULTS.labels(self.queue, key).inc(n)

    async def run(self, stop: asyncio.Event) -> None:
        """Dispatch until ``stop`` is set, sleeping on LISTEN when there is nothing to do."""
        cfg = self.settings.dispatcher
        session = HeldSession(self.pool)
        # No listen DSN: poll on schedule, never register. With direct intake the workers are woken
        # by the submits and this dispatcher only sends what they left for a schedule: it polls.
        listen_dsn = self.settings.listen_dsn if not self._hand_off else None
        wakeup = Wakeup(session, listen_dsn, self.queue, self.name)
        failures = 0
        streak = 0  # cycles run back to back (no wait between them) that found work
        carry: list[outbox.Mark] = []  # the last batch's marks, applied with the next claim

        async def step(work: Awaitable[T]) -> tuple[bool, T | None]:
            """A statement of the loop, abandoned if SIGTERM comes first ((False, None): stop now)."""
            done = await unless_stopped(stop, work)
            if stop.is_set():
                await session.drop()  # possibly abandoned mid-statement: never reuse that session
                return False, None
            return True, done

        try:
            while not stop.is_set():
                wakeup.event.clear()
                try:
                    await wakeup.listen()
                    conn = await session.get()
                    # While work flows, each batch's marks ride on the next batch's claim: one
                    # statement and commit per batch instead of two. They are flushed before any
                    # sleep, so a mark waits for nothing but the next claim.
                    result = await unless_stopped(stop, self._cycle(conn, carry=carry, defer=True))
                    if result is None:
                        await session.drop()  # abandoned mid-statement: never reuse that session
                        break
                    carry = result.deferred
                    failures = 0
                    if result.claimed:
                        streak += 1
                        if not (wakeup.registered and keep_listening(result.claimed, cfg.batch_size, streak)):
                            # Work is flowing and we loop at once: submitters need not notify.
                            if not (await step(wakeup.disarm()))[0]:
                                break
                            continue
                    else:
                        streak = 0
                        going_on, armed = await step(wakeup.arm())
                        if not going_on:
                            break
                        if armed:
                            continue  # rows committed before registering sent no notification
                    marks, carry = carry, []
                    if not (await step(self.flush(conn, marks)))[0]:  # about to sleep
                        carry = marks  # not applied: the finally below tries once more
                        break
                except DB_ERRORS as exc:
                    failures += 1
                    delay = min(5.0, 0.1 * 2**failures)
                    log.warning("dispatch cycle failed", extra={"error": reason(exc), "retry_in": delay})
                    wakeup.forget()
                    # Marks not applied: those rows stay CLAIMED until claim_ttl, are claimed
                    # again and re-sent, and the dedup marker or the lease fence absorbs them.
                    carry = []
                    await session.drop()
                    await wait_any(stop, None, delay)
                    continue
                # Only cycles run back to back make a busy streak: one that had to wait for a
                # notification serves a trickle, however many jobs the trickle has had.
                if not wakeup.event.is_set():
                    streak = 0
                woke = await wakeup.wait(stop, cfg.schedule)
                if not woke and not stop.is_set():
                    await self._check_redis_while_idle()
        finally:
            if carry:
                # Stopping between cycles: best effort and bounded (unapplied marks only cost a
                # duplicate send after claim_ttl, which the lease fence drops).
                await best_effort(self._flush_pooled(carry), SHUTDOWN_STEP)
            # Best effort and bounded: a waiter row left behind is pruned by the reaper.
            await best_effort(wakeup.close(), SHUTDOWN_STEP)
            await session.release()

    async def _flush_pooled(self, marks: Sequence[outbox.Mark]) -> None:
        async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            await self.flush(conn, marks)


async def run(settings: Settings, stop: asyncio.Event) -> None:
    """Entry point of the dispatcher role: owns its connections and runs until ``stop`` is set."""
    await serve(
        settings, stop, lambda conns: Dispatcher(conns.pool, conns.redis, settings), role="dispatcher", pool_size=4
    )
