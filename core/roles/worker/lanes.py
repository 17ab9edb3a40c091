"""A worker's two lanes, and the acks of the entries it reads from them (docs/design.md §1).

A lane says where a worker's jobs come from and where their leases and verdicts go: the live lane
reads the work stream and leases and judges ``judgequeue.submissions``; the shadow lane
(``JUDGEQUEUE_SHADOW=judge``, docs/gitops.md) reads the shadow stream and keeps its leases and
verdicts in ``judgequeue.shadow_verdicts`` (:mod:`judgequeue.core.store.shadow`), never touching the
submission. Both have the fence's contract of :mod:`judgequeue.core.store.leases`.

An entry read from a lane's stream is acked (XACK+XDEL) only once the lease taken for it is
durable: :class:`AckWhenDurable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from ...base import failpoints, metrics
from ...base.errors import DB_ERRORS, TransportError, reason
from ...base.states import VERDICTS
from ...runtime.lifecycle import SHUTDOWN_STEP, cancel_within
from ...store import giving_up, leases, shadow
from ...transport import streams
from ...transport.connect import STATEMENT_TIMEOUT

log = logging.getLogger("judgequeue.worker")

#: Entry ids per ack script call.
ACK_BATCH = 500


class Lane:
    """The live lane: the work stream, leases and verdicts on ``judgequeue.submissions``."""

    shadow = False
    #: Prefix of this lane's ``judgequeue_stale_results_dropped_total`` reasons.
    stale_prefix = ""

    async def acquire(
        self, conn: asyncpg.Connection, queue: str, pairs: Sequence[tuple[int, int]], *, ttl: float, worker: str
    ) -> list[leases.Lease]:
        return await leases.acquire(conn, queue, pairs, ttl=ttl)

    async def renew(self, conn: asyncpg.Connection, held: Sequence[leases.Lease], *, ttl: float) -> set[uuid.UUID]:
        return await leases.renew(conn, held, ttl=ttl)

    async def write(self, conn: asyncpg.Connection, writes: Sequence[leases.VerdictWrite]) -> dict[uuid.UUID, float]:
        return await leases.write_verdicts(conn, writes)

    async def release(self, conn: asyncpg.Connection, held: Sequence[leases.Lease]) -> list[int]:
        return await leases.release(conn, held)

    async def stale_reasons(self, conn: asyncpg.Connection, pairs: Sequence[tuple[int, int]]) -> list[str]:
        return await leases.stale_reasons(conn, pairs)

    async def give_up(
        self, pool: asyncpg.Pool, redis: aioredis.Redis, queue: str, consumer: str,
        poison: Sequence[giving_up.Decision],
    ) -> int:
        """Set aside entries no retry can judge: Postgres record first, then the DLQ; how many went."""
        outcomes = await giving_up.record(pool, poison)
        dead, _again, _skipped = await giving_up.to_dlq(redis, queue, consumer, poison, outcomes)
        metrics.DEAD_LETTERS.labels(queue).inc(dead)
        return dead

    def verdict_counter(self, queue: str, status: str) -> Any:
        return metrics.VERDICTS.labels(queue, status)

    def verdict_counters(self, queue: str) -> dict[str, Any]:
        """This lane's verdict counter of every verdict, each series created at zero."""
        return {status: self.verdict_counter(queue, status) for status in VERDICTS}


class ShadowLane(Lane):
    """The shadow lane: the shadow stream, shadow leases and shadow verdicts (core/store/shadow.py)."""

    shadow = True
    stale_prefix = "shadow_"

    async def acquire(
        self, conn: asyncpg.Connection, queue: str, pairs: Sequence[tuple[int, int]], *, ttl: float, worker: str
    ) -> list[leases.Lease]:
        return await shadow.acquire(conn, queue, pairs, ttl=ttl, worker=worker)

    async def renew(self, conn: asyncpg.Connection, held: Sequence[leases.Lease], *, ttl: float) -> set[uuid.UUID]:
        return await shadow.renew(conn, held, ttl=ttl)

    async def write(self, conn: asyncpg.Connection, writes: Sequence[leases.VerdictWrite]) -> dict[uuid.UUID, float]:
        return await shadow.write_verdicts(conn, writes)

    async def release(self, conn: asyncpg.Connection, held: Sequence[leases.Lease]) -> list[int]:
        return await shadow.release(conn, held)

    async def stale_reasons(self, conn: asyncpg.Connection, pairs: Sequence[tuple[int, int]]) -> list[str]:
        return await shadow.stale_reasons(conn, pairs)

    async def give_up(
        self, pool: asyncpg.Pool, redis: aioredis.Redis, queue: str, consumer: str,
        poison: Sequence[giving_up.Decision],
    ) -> int:
        """A SYSTEM_ERROR shadow verdict with the reason (where the entry names a submission), then the
        entry acked and deleted: the shadow lane has no DLQ, and nothing of the submission changes."""
        pairs = [(d.envelope.submission, d.envelope.generation) for d in poison if d.envelope is not None]
        if pairs:
            async with pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                await shadow.give_up(conn, pairs, [d.reason for d in poison if d.envelope is not None])
        return await streams.ack_pending(redis, queue, consumer, [d.entry.entry_id for d in poison], pairs,
                                         shadow=True)

    def verdict_counter(self, queue: str, status: str) -> Any:
        return metrics.SHADOW_VERDICTS.labels(queue, status)


LIVE_LANE = Lane()
SHADOW_LANE = ShadowLane()

class AckWhenDurable:
    """Acks stream entries once the leases taken for them are durable, a group at a time.

    Leases commit without waiting for the WAL flush (the judge starts sooner); an entry may only be
    acked once its lease cannot be lost, or a database crash would strand the submission. Each
    group costs one :func:`leases.make_durable` and one XACK+XDEL; entries handed over meanwhile form
    the next group. If either step fails the entries stay pending: the reaper re-delivers them, and
    a worker then acks them as stale (lease held) or leases them again (lease lost).
    """

    def __init__(self, pool: asyncpg.Pool, redis: aioredis.Redis, queue: str, *, shadow: bool = False) -> None:
        self._pool = pool
        self._redis = redis
        self._queue = queue
        self._shadow = shadow
        self._pending: list[str] = []
        self._forget: list[tuple[int, int] | None] = []  # each entry's (submission, generation)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ack-when-durable")

    def add(self, entry_ids: Sequence[str], pairs: Sequence[tuple[int, int]] | None = None) -> None:
        """Entries to ack; ``pairs`` (one per entry): their dedup markers are deleted with the ack."""
        self._pending += entry_ids
        self._forget += pairs if pairs is not None else [None] * len(entry_ids)
        self._idle.clear()
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                group, self._pending = self._pending, []
                forget, self._forget = self._forget, []
                try:
                    await self._settle(group, forget)
                except Exception:
                    # Never let one bad group stop every later ack; these entries stay pending.
                    log.exception("ack group failed; entries left pending", extra={"entries": len(group)})
            self._idle.set()

    async def _settle(self, entry_ids: list[str], forget: list[tuple[int, int] | None]) -> None:
        try:
            async with self._pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                await leases.make_durable(conn)
        except DB_ERRORS as exc:
            log.warning(
                "leases not confirmed durable; entries left pending",
                extra={"error": reason(exc), "entries": len(entry_ids)},
            )
            return
        try:
            for start in range(0, len(entry_ids), ACK_BATCH):
                pairs = [p for p in forget[start : start + ACK_BATCH] if p is not None]
                await streams.ack(
                    self._redis, self._queue, entry_ids[start : start + ACK_BATCH], pairs, shadow=self._shadow
                )
            failpoints.hit("worker.after_ack")
        except TransportError as exc:
            # Harmless: the entries stay pending, get re-delivered and are then acked as stale.
            log.warning("ack failed", extra={"error": reason(exc), "entries": len(entry_ids)})

    async def close(self, within: float) -> None:
        """Ack what is queued within ``within`` seconds; the rest stays pending for the reaper."""
        if self._task is None:
            return
        if self._pending or not self._idle.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), within)
        await cancel_within(self._task, SHUTDOWN_STEP)

