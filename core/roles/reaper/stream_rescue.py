"""Stream rescue: entries idle in the PEL longer than ``visibilityTimeout`` are re-delivered, or given up.

One script reads who holds each entry idle longer than ``visibilityTimeout`` and XAUTOCLAIMs the
batch (``sweepBatch`` entries) to this reaper's own consumer; ids of entries deleted while pending
(XAUTOCLAIM's third reply) are acked in the same script. A pure function (:func:`decide`) then
requeues each entry (a copy with ``deliveries+1`` appended, the original acked and deleted, one
script) or, at ``maxDeliveries`` or when the entry is not a judgequeue envelope, dead-letters it.
Every requeue/dead-letter script first checks the entry is still pending *for this reaper's
consumer*: if a slower reaper's claim was taken over by another reaper (XAUTOCLAIM transfers
ownership), the slow one acts on nothing. So several reapers never requeue or dead-letter the same
entry twice.

**Dead-letter order: Postgres first, then Redis.**
  1. ``judgequeue.record_dead_letters`` (core/store/sql/schema.sql) marks the outbox row ``DEAD``
     and the submission ``SYSTEM_ERROR`` with the reason, fenced on the envelope's generation and only
     while the submission is ``PENDING`` (a ``JUDGING`` one belongs to its lease). It is
     idempotent: a second call changes nothing and reports the current state.
  2. One script adds the DLQ entry (source id, reason, last consumer, deliveries, Postgres
     outcome, the original fields), sets the marker ``jq:{q}:dead:<id>``, and acks and deletes
     the original; an existing marker means "already dead-lettered": ack and delete only.
A reaper killed between 1 and 2 leaves the submission finished (explained ``SYSTEM_ERROR``)
and the entry still pending under the dead reaper's consumer; a worker that somehow received
it would find the submission terminal and ack it as stale. After ``visibilityTimeout`` any
reaper claims it again, step 1 is a no-op, and step 2 completes the dead letter. The reverse
order would leave a window where Redis has given up on a job that Postgres still shows
``PENDING`` forever, which needs a separate repair scan; this order needs none.

The shadow stream is rescued the same way by its own maintainer (``shadow_stream``), except that an
entry given up on becomes a ``SYSTEM_ERROR`` *shadow* verdict and is acked and deleted, with no DLQ
and nothing of the submission touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from ...base import failpoints, metrics
from ...base.errors import DB_ERRORS, reason
from ...store import giving_up, shadow
from ...transport import streams
from ...transport.connect import STATEMENT_TIMEOUT
from ...transport.envelope import Envelope, MalformedEnvelope
from .loop import Context, Maintainer

ClaimedEntry = streams.ClaimedEntry
Decision = giving_up.Decision

log = logging.getLogger("judgequeue.reaper")


def decide(entry: ClaimedEntry, max_deliveries: int) -> Decision:
    """Requeue an idle entry, or dead-letter it at ``max_deliveries`` or when malformed (pure)."""
    if entry.fields is None:
        return Decision(entry, "dead_letter", "entry deleted while pending")
    try:
        envelope = Envelope.parse(entry.fields)
    except MalformedEnvelope as exc:
        return Decision(entry, "dead_letter", f"malformed entry: {exc}")
    if envelope.deliveries >= max_deliveries:
        holder = entry.last_consumer or "unknown"
        reason = (
            f"not acknowledged after {envelope.deliveries} deliveries (maxDeliveries {max_deliveries}); "
            f"last consumer {holder}"
        )
        return Decision(entry, "dead_letter", reason, envelope)
    return Decision(entry, "requeue", envelope=envelope)


@dataclass
class StreamSweep:
    """What one stream sweep did."""

    batches: int = 0
    claimed: int = 0
    requeued: int = 0
    dead_lettered: int = 0
    already_dead: int = 0  # marker found: acked and deleted only
    skipped: int = 0  # ownership moved to another reaper (or entry gone) before we acted
    deleted: int = 0  # pending ids whose entry no longer existed, acked
    deferred: int = 0  # dead letters postponed because Postgres failed
    postgres: dict[str, int] = field(default_factory=dict)


class StreamRescue(Maintainer):
    """Idle entries of the work stream (or, with ``shadow``, of the shadow stream), each requeued or
    given up on exactly once."""

    def __init__(self, ctx: Context, *, shadow: bool = False) -> None:
        super().__init__(ctx)
        self.shadow = shadow
        self.name = "shadow_stream" if shadow else "stream"
        #: Test seam: awaited after the Postgres step of a dead-letter batch, before the Redis step.
        self.between_steps: Callable[[Sequence[Decision]], Awaitable[None]] | None = None

    async def run(self) -> StreamSweep:
        return await self.sweep()

    async def claim(self, cursor: str = "0-0") -> tuple[str, list[ClaimedEntry], int]:
        """Claim one batch of idle entries to this reaper: (next cursor, entries, deleted ids acked)."""
        cfg = self.ctx.settings.reaper
        batch = await streams.claim_idle(
            self.ctx.redis,
            self.ctx.queue,
            self.ctx.name,
            min_idle_ms=int(cfg.visibility_timeout * 1000),
            cursor=cursor,
            count=cfg.sweep_batch,
            shadow=self.shadow,
        )
        if batch.entries:
            failpoints.hit("reaper.after_claim")
        return batch.cursor, batch.entries, batch.deleted

    async def requeue(self, decisions: Sequence[Decision]) -> tuple[int, int]:
        """Re-deliver entries still pending for this reaper (deliveries + 1): (requeued, skipped)."""
        entries = []
        for d in decisions:
            assert d.envelope is not None
            entries.append((d.entry.entry_id, replace(d.envelope, deliveries=d.envelope.deliveries + 1)))
        return await streams.requeue(self.ctx.redis, self.ctx.queue, self.ctx.name, entries, shadow=self.shadow)

    async def sweep(self, *, max_batches: int = 10_000) -> StreamSweep:
        """Claim idle entries batch by batch and requeue or give up on each exactly once."""
        stats = StreamSweep()
        claiming = asyncio.ensure_future(self.claim("0-0"))
        try:
            while True:
                cursor, entries, deleted = await claiming
                stats.batches += 1
                more = cursor != "0-0" and stats.batches < max_batches
                if more:
                    # Claim the next batch while this one is decided and requeued: the claim scans
                    # past this batch's entries, so the two never overlap.
                    claiming = asyncio.ensure_future(self.claim(cursor))
                stats.claimed += len(entries)
                stats.deleted += deleted
                await self._settle(entries, stats)
                if not more:
                    return stats
        finally:
            if not claiming.done():
                # Entries it claims stay pending under this reaper and are swept again later.
                claiming.cancel()
                with contextlib.suppress(BaseException):
                    await claiming

    async def _settle(self, entries: Sequence[ClaimedEntry], stats: StreamSweep) -> None:
        """Requeue or give up on one claimed batch."""
        decisions = [decide(e, self.ctx.settings.reaper.max_deliveries) for e in entries]
        done, skipped = await self.requeue([d for d in decisions if d.action == "requeue"])
        stats.requeued += done
        stats.skipped += skipped
        metrics.RECLAIMS.labels(self.ctx.queue).inc(done)
        doomed = [d for d in decisions if d.action == "dead_letter"]
        if doomed and self.shadow:
            await self._give_up_shadow(doomed, stats)
        elif doomed:
            await self._dead_letter_batch(doomed, stats)

    async def _postgres_first(
        self, record: Callable[[], Awaitable[list[str]]], postponed: str, doomed: Sequence[Decision], stats: StreamSweep
    ) -> list[str] | None:
        """Giving entries up starts in Postgres (``record``): its outcomes, tallied in ``stats``; None when
        Postgres failed (logged as ``postponed``, the entries counted as deferred)."""
        try:
            outcomes = await record()
        except DB_ERRORS as exc:
            # The entries stay pending under our consumer; a later sweep retries both steps.
            log.warning(postponed, extra={"error": reason(exc), "entries": len(doomed)})
            stats.deferred += len(doomed)
            return None
        for outcome in outcomes:
            stats.postgres[outcome] = stats.postgres.get(outcome, 0) + 1
        failpoints.hit("reaper.dead_letter.after_postgres")
        return outcomes

    async def record_dead(self, decisions: Sequence[Decision]) -> list[str]:
        """Postgres step of dead-lettering (idempotent); one outcome per decision."""
        return await giving_up.record(self.ctx.pool, decisions)

    async def dead_letter(self, decisions: Sequence[Decision], outcomes: Sequence[str]) -> tuple[int, int, int]:
        """Redis step of dead-lettering: (dead-lettered, already dead, skipped)."""
        return await giving_up.to_dlq(self.ctx.redis, self.ctx.queue, self.ctx.name, decisions, outcomes)

    async def _dead_letter_batch(self, doomed: Sequence[Decision], stats: StreamSweep) -> None:
        outcomes = await self._postgres_first(
            lambda: self.record_dead(doomed), "dead-letter postponed: postgres failed", doomed, stats
        )
        if outcomes is None:
            return
        if self.between_steps is not None:
            await self.between_steps(doomed)
        dead, again, skipped = await self.dead_letter(doomed, outcomes)
        stats.dead_lettered += dead
        stats.already_dead += again
        stats.skipped += skipped
        metrics.DEAD_LETTERS.labels(self.ctx.queue).inc(dead)
        for d, outcome in zip(doomed, outcomes, strict=True):
            if d.envelope is None or outcome != "recorded":
                log.info(
                    "entry dead-lettered",
                    extra={"entry": d.entry.entry_id, "reason": d.reason, "postgres": outcome},
                )
        if dead:
            log.warning("entries dead-lettered", extra={"queue": self.ctx.queue, "count": dead})

    async def _give_up_shadow(self, doomed: Sequence[Decision], stats: StreamSweep) -> None:
        """Shadow entries nobody acked in ``maxDeliveries`` (or not envelopes): a SYSTEM_ERROR shadow
        verdict with the reason (Postgres first, as for a dead letter), then the entry acked and
        deleted while still pending for this reaper."""
        named = [(d, d.envelope) for d in doomed if d.envelope is not None]
        pairs = [(e.submission, e.generation) for _, e in named]

        async def record() -> list[str]:
            async with self.ctx.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                return await shadow.give_up(conn, pairs, [d.reason for d, _ in named])

        if await self._postgres_first(record, "shadow give-up postponed: postgres failed", doomed, stats) is None:
            return
        acked = await streams.ack_pending(self.ctx.redis, self.ctx.queue, self.ctx.name,
                                          [d.entry.entry_id for d in doomed], pairs, shadow=True)
        stats.dead_lettered += acked
        stats.skipped += len(doomed) - acked
        if acked:
            log.warning("shadow entries given up", extra={"queue": self.ctx.queue, "count": acked,
                                                          "reasons": sorted({d.reason for d in doomed})[:5]})
