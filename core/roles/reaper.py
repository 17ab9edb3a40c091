"""The reaper role: rescue idle stream entries and expired leases, prune, refresh gauges (docs/design.md §1).

A sweep (:meth:`Reaper.sweep`) runs these parts in this order, each guarded on its own so one
failing dependency does not stop the others; the names are the ones its report and logs use.

1. **stream**: the stream sweep. One script reads who holds each entry idle longer than
    ``visibilityTimeout`` and XAUTOCLAIMs the batch (``sweepBatch`` entries) to this reaper's own consumer; ids of
    entries deleted while pending (XAUTOCLAIM's third reply) are acked in the same script. A pure
    function (:func:`decide`) then requeues each entry (a copy with ``deliveries+1`` appended, the
    original acked and deleted, one script) or, at ``maxDeliveries`` or when the entry is not a
    judgequeue envelope, dead-letters it. Every requeue/dead-letter script first checks the entry
    is still pending *for this reaper's consumer*: if a slower reaper's claim was taken over by
    another reaper (XAUTOCLAIM transfers ownership), the slow one acts on nothing. So several
    reapers never requeue or dead-letter the same entry twice.

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

2. **leases**: lease rescue through ``judgequeue.core.store.leases.rescue_expired_leases``, batch by batch.
3. **shadow_stream**, **shadow_leases**: the same for shadow judging (docs/gitops.md), on its own
   stream and table: an entry given up on (``maxDeliveries``, or not an envelope) becomes a
   ``SYSTEM_ERROR`` *shadow* verdict and is acked and deleted, with no DLQ and nothing of the
   submission touched; an expired shadow lease is sent again
   (:func:`judgequeue.core.store.shadow.rescue_expired`), or ends ``SYSTEM_ERROR`` at ``maxRetries``.
4. **prune**: rows past ``retention`` (terminal outbox rows; terminal submissions by
   ``finished_at``, oldest first; shadow and legacy verdicts) and soft state left behind (dispatcher
   and worker waiters, offers their worker stopped refreshing).
5. **analyse**: on a new database, ANALYZE the tables direct intake's take reads once they have
   rows (:func:`judgequeue.core.store.outbox.analyze_new_tables`); nothing once both are done.
6. **shadow_trim**: shadow stream entries older than ``retention`` are trimmed (worth nothing by
   then, and a queue may send to that stream long before any shadow worker reads it).
7. **consumers**: consumers of group ``workers`` (on both streams) idle longer than ten visibility
   timeouts with no pending entry are deleted (checked and deleted atomically in one script, so a
   consumer that just read something is never dropped).
8. **stranded**: deliveries sent but never leased (Redis lost the entry) are sent again.
9. **gauges** from :func:`judgequeue.core.transport.stream_stats.stream_figures` and ``outbox.stats``, and,
   once a minute, the shadow agreement figures (:func:`judgequeue.core.store.shadow.agreement`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from ..base import failpoints, metrics
from ..base.agreement import Agreement, Counts
from ..base.errors import DB_ERRORS, SERVER_ERRORS
from ..config import Settings
from ..runtime import wakeup
from ..runtime.lifecycle import instance_id, serve, unless_stopped
from ..store import giving_up, outbox, shadow
from ..store.leases import LeaseSweep, rescue_expired_leases
from ..transport import streams
from ..transport.connect import STATEMENT_TIMEOUT
from ..transport.envelope import Envelope, MalformedEnvelope
from ..transport.stream_stats import StreamFigures, publish, stream_figures

ClaimedEntry = streams.ClaimedEntry
Decision = giving_up.Decision

log = logging.getLogger("judgequeue.reaper")

#: A consumer idle this many visibility timeouts with nothing pending is removed.
IDLE_CONSUMER_FACTOR = 10
#: Batches of 1,000 rows one sweep may prune per table: 50,000 rows per ``interval`` (10,000/s at
#: the default 5 s), above the steady rates measured on the project's machine (docs/performance.md),
#: so retention keeps up; a backlog left by a retention change is worked off over several sweeps.
PRUNE_BATCHES = 50
#: Seconds between exact counts of terminal outbox rows (a scan of everything kept).
TERMINAL_COUNT_EVERY = 60.0
#: Seconds between refreshes of the shadow agreement gauges (a count over everything kept).
AGREEMENT_EVERY = 60.0


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


@dataclass
class SweepReport:
    """One full sweep: every part's outcome, or its error."""

    stream: StreamSweep | None = None
    leases: LeaseSweep | None = None
    shadow_stream: StreamSweep | None = None
    shadow_leases: shadow.ShadowRescue | None = None
    pruned_rows: int = 0
    pruned_waiters: int = 0
    resent_stranded: int = 0
    removed_consumers: int = 0
    figures: StreamFigures | None = None
    errors: dict[str, str] = field(default_factory=dict)
    succeeded: int = 0  # parts that ran without error

    @property
    def unreachable(self) -> bool:
        """Every part that ran failed: the servers are down, not merely flaky (pure)."""
        return bool(self.errors) and self.succeeded == 0


class Reaper:
    """One reaper instance; several may sweep the same queue at once."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        redis: aioredis.Redis,
        settings: Settings,
        *,
        name: str | None = None,
        idle_consumer_after: float | None = None,
    ) -> None:
        self.pool = pool
        self.redis = redis
        self.settings = settings
        self.queue = settings.queue
        self.name = name or instance_id("reaper")
        cfg = settings.reaper
        self.idle_consumer_after = (
            idle_consumer_after if idle_consumer_after is not None else IDLE_CONSUMER_FACTOR * cfg.visibility_timeout
        )
        #: Test seam: awaited after the Postgres step of a dead-letter batch, before the Redis step.
        self.between_steps: Callable[[Sequence[Decision]], Awaitable[None]] | None = None
        self._terminal_counted_at = float("-inf")
        self._agreement_counted_at = float("-inf")
        self._agreement_published = False
        self.pruned_submissions = 0  # terminal submissions deleted by retention, for tests and logs
        self.pruned_shadow = 0  # shadow and legacy verdicts deleted by retention
        self._stranded_checked_at = float("-inf")
        #: Tables this process has analysed once (outbox.analyze_new_tables); a role that does not own
        #: them gets only a warning and no statistics, so it must not try again every sweep.
        self._analysed: set[str] = set()

    # --- stream, shadow_stream ------------------------------------------------------------------------

    async def claim(self, cursor: str = "0-0", *, shadow: bool = False) -> tuple[str, list[ClaimedEntry], int]:
        """Claim one batch of idle entries to this reaper: (next cursor, entries, deleted ids acked)."""
        cfg = self.settings.reaper
        batch = await streams.claim_idle(
            self.redis,
            self.queue,
            self.name,
            min_idle_ms=int(cfg.visibility_timeout * 1000),
            cursor=cursor,
            count=cfg.sweep_batch,
            shadow=shadow,
        )
        if batch.entries:
            failpoints.hit("reaper.after_claim")
        return batch.cursor, batch.entries, batch.deleted

    async def requeue(self, decisions: Sequence[Decision], *, shadow: bool = False) -> tuple[int, int]:
        """Re-deliver entries still pending for this reaper (deliveries + 1): (requeued, skipped)."""
        entries = []
        for d in decisions:
            assert d.envelope is not None
            entries.append((d.entry.entry_id, replace(d.envelope, deliveries=d.envelope.deliveries + 1)))
        return await streams.requeue(self.redis, self.queue, self.name, entries, shadow=shadow)

    async def record_dead(self, decisions: Sequence[Decision]) -> list[str]:
        """Postgres step of dead-lettering (idempotent); one outcome per decision."""
        return await giving_up.record(self.pool, decisions)

    async def dead_letter(self, decisions: Sequence[Decision], outcomes: Sequence[str]) -> tuple[int, int, int]:
        """Redis step of dead-lettering: (dead-lettered, already dead, skipped)."""
        return await giving_up.to_dlq(self.redis, self.queue, self.name, decisions, outcomes)

    async def sweep_stream(self, *, max_batches: int = 10_000, shadow: bool = False) -> StreamSweep:
        """Claim idle entries batch by batch and requeue or dead-letter each exactly once (``shadow``:
        those of the shadow stream, given up on as shadow verdicts)."""
        cfg = self.settings.reaper
        stats = StreamSweep()
        claiming = asyncio.ensure_future(self.claim("0-0", shadow=shadow))
        try:
            while True:
                cursor, entries, deleted = await claiming
                stats.batches += 1
                more = cursor != "0-0" and stats.batches < max_batches
                if more:
                    # Claim the next batch while this one is decided and requeued: the claim scans
                    # past this batch's entries, so the two never overlap.
                    claiming = asyncio.ensure_future(self.claim(cursor, shadow=shadow))
                stats.claimed += len(entries)
                stats.deleted += deleted
                decisions = [decide(e, cfg.max_deliveries) for e in entries]
                done, skipped = await self.requeue([d for d in decisions if d.action == "requeue"], shadow=shadow)
                stats.requeued += done
                stats.skipped += skipped
                metrics.RECLAIMS.labels(self.queue).inc(done)
                doomed = [d for d in decisions if d.action == "dead_letter"]
                if doomed and shadow:
                    await self._give_up_shadow(doomed, stats)
                elif doomed:
                    await self._dead_letter_batch(doomed, stats)
                if not more:
                    return stats
        finally:
            if not claiming.done():
                # Entries it claims stay pending under this reaper and are swept again later.
                claiming.cancel()
                with contextlib.suppress(BaseException):
                    await claiming

    async def _postgres_first(
        self, record: Callable[[], Awaitable[list[str]]], postponed: str, doomed: Sequence[Decision], stats: StreamSweep
    ) -> list[str] | None:
        """Giving entries up starts in Postgres (``record``): its outcomes, tallied in ``stats``; None when
        Postgres failed (logged as ``postponed``, the entries counted as deferred)."""
        try:
            outcomes = await record()
        except DB_ERRORS as exc:
            # The entries stay pending under our consumer; a later sweep retries both steps.
            log.warning(postponed, extra={"error": str(exc), "entries": len(doomed)})
            stats.deferred += len(doomed)
            return None
        for outcome in outcomes:
            stats.postgres[outcome] = stats.postgres.get(outcome, 0) + 1
        failpoints.hit("reaper.dead_letter.after_postgres")
        return outcomes

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
        metrics.DEAD_LETTERS.labels(self.queue).inc(dead)
        for d, outcome in zip(doomed, outcomes, strict=True):
            if d.envelope is None or outcome != "recorded":
                log.info(
                    "entry dead-lettered",
                    extra={"entry": d.entry.entry_id, "reason": d.reason, "postgres": outcome},
                )
        if dead:
            log.warning("entries dead-lettered", extra={"queue": self.queue, "count": dead})

    async def _give_up_shadow(self, doomed: Sequence[Decision], stats: StreamSweep) -> None:
        """Shadow entries nobody acked in ``maxDeliveries`` (or not envelopes): a SYSTEM_ERROR shadow
        verdict with the reason (Postgres first, as for a dead letter), then the entry acked and
        deleted while still pending for this reaper."""
        named = [(d, d.envelope) for d in doomed if d.envelope is not None]
        pairs = [(e.submission, e.generation) for _, e in named]

        async def record() -> list[str]:
            async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                return await shadow.give_up(conn, pairs, [d.reason for d, _ in named])

        if await self._postgres_first(record, "shadow give-up postponed: postgres failed", doomed, stats) is None:
            return
        acked = await streams.ack_pending(self.redis, self.queue, self.name, [d.entry.entry_id for d in doomed], pairs,
                                          shadow=True)
        stats.dead_lettered += acked
        stats.skipped += len(doomed) - acked
        if acked:
            log.warning("shadow entries given up", extra={"queue": self.queue, "count": acked,
                                                          "reasons": sorted({d.reason for d in doomed})[:5]})

    # --- leases, shadow_leases ------------------------------------------------------------------------

    async def rescue_leases(self, *, batch: int = 500, max_batches: int = 20) -> LeaseSweep:
        """Rescue expired JUDGING leases (new generation, or SYSTEM_ERROR at ``maxRetries``)."""
        requeued = failed = 0
        for _ in range(max_batches):
            async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                got = await rescue_expired_leases(
                    conn, self.queue, max_retries=self.settings.reaper.max_retries, batch=batch
                )
            requeued += got.requeued
            failed += got.failed
            if got.requeued or got.failed:
                failpoints.hit("reaper.after_lease_rescue")
            if got.requeued + got.failed < batch:
                break
        if requeued or failed:
            log.info("expired leases rescued", extra={"queue": self.queue, "requeued": requeued, "failed": failed})
        return LeaseSweep(requeued=requeued, failed=failed)

    async def rescue_shadow_leases(self, *, batch: int = 500, max_batches: int = 20) -> shadow.ShadowRescue:
        """Send the entries of expired shadow leases again (or end them SYSTEM_ERROR at ``maxRetries``).

        Postgres first: the row is marked waiting for a delivery (the old attempt fenced out) and is
        rescued again ``redispatchAfter`` later if this send is lost. The send goes through the
        dedup-and-append script: a worker's ack removed the entry's marker, and a marker still there
        means its entry is still pending, which the stream sweep re-delivers."""
        cfg = self.settings.reaper
        resend: list[shadow.Resend] = []
        failed = 0
        for _ in range(max_batches):
            async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                got = await shadow.rescue_expired(conn, self.queue, max_retries=cfg.max_retries,
                                                  resend_after=cfg.redispatch_after, batch=batch)
            failed += got.failed
            if got.resend:
                failpoints.hit("reaper.after_lease_rescue")
                now = time.time()
                envelopes = [Envelope(r.submission, r.generation, r.attempts, r.outbox, now) for r in got.resend]
                await streams.enqueue_many(self.redis, self.queue, envelopes,
                                           seen_ttl=self.settings.dispatcher.seen_ttl, shadow=True)
                resend += got.resend
            if len(got.resend) + got.failed < batch:
                break
        if resend or failed:
            metrics.SHADOW_RESENT.labels(self.queue).inc(len(resend))
            log.info("expired shadow leases rescued", extra={"queue": self.queue, "resent": len(resend),
                                                            "failed": failed})
        return shadow.ShadowRescue(resend, failed)

    # --- prune, analyse, shadow_trim, consumers -------------------------------------------------------

    async def prune(self) -> tuple[int, int]:
        """Delete what is past ``retention`` (terminal outbox rows and submissions, shadow and legacy
        verdicts) and soft state left behind (waiters, offers); returns (outbox rows, waiters and offers)."""
        waiter_age = max(300.0, 3 * self.settings.dispatcher.schedule)
        retention = self.settings.reaper.retention
        async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            rows = await outbox.prune(conn, self.queue, retention=retention, batch=1000, max_batches=PRUNE_BATCHES)
            finished = await outbox.prune_submissions(
                conn, self.queue, retention=retention, batch=1000, max_batches=PRUNE_BATCHES
            )
            waiters = await wakeup.prune_waiters(conn, older_than=waiter_age)
            # Offers expire within seconds of their worker's last refresh (core/roles/worker/direct/offers.py); what is
            # left of a crashed worker's goes once it is clearly gone (its filled ones' jobs have
            # leases of their own, rescued when they expire).
            waiters += await wakeup.prune_offers(conn, older_than=waiter_age)
            shadows, legacies = await shadow.prune(
                conn, self.queue, retention=retention, batch=1000, max_batches=PRUNE_BATCHES
            )
        metrics.PRUNED_ROWS.labels(self.queue).inc(rows)
        metrics.PRUNED_SUBMISSIONS.labels(self.queue).inc(finished)
        metrics.PRUNED_SHADOW.labels(self.queue, "shadow").inc(shadows)
        metrics.PRUNED_SHADOW.labels(self.queue, "legacy").inc(legacies)
        self.pruned_submissions += finished
        self.pruned_shadow += shadows + legacies
        return rows, waiters

    async def analyse_new_tables(self) -> list[str]:
        """ANALYZE the tables direct intake's take reads once they have rows, on a new database
        (:func:`~judgequeue.core.store.outbox.analyze_new_tables`); nothing once both are analysed."""
        if len(self._analysed) == 2:
            return []
        async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            analysed = await outbox.analyze_new_tables(conn, skip=self._analysed)
        self._analysed.update(analysed)
        if analysed:
            log.info("analysed tables that had no statistics", extra={"tables": analysed})
        return analysed

    async def trim_shadow_stream(self) -> int:
        """Trim shadow stream entries appended more than ``retention`` ago (Redis's clock)."""
        seconds, micros = await streams.guarded(lambda: self.redis.time())
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        retention_ms = int(self.settings.reaper.retention * 1000)
        key = streams.shadow_key(self.queue)
        return await streams.trim_older_than(self.redis, key, min_id_ms=now_ms - retention_ms)

    async def remove_idle_consumers(self) -> int:
        """Delete consumers of ``workers`` idle past the threshold that hold no pending entry (on the
        work stream and the shadow stream)."""
        removed = 0
        for lane in (False, True):
            names = await streams.idle_consumers(
                self.redis, self.queue, idle_ms=int(self.idle_consumer_after * 1000), shadow=lane
            )
            removed += await streams.delete_idle_consumers(self.redis, self.queue, names, shadow=lane)
        if removed:
            log.info("idle consumers removed", extra={"queue": self.queue, "count": removed})
        return removed

    # --- stranded -------------------------------------------------------------------------------------

    async def resend_stranded(self) -> int:
        """Re-send deliveries that were sent but never leased within ``redispatch_after``.

        Runs at most every quarter of that period: it only matters after Redis lost data.
        """
        now = time.monotonic()
        after = self.settings.reaper.redispatch_after
        if now - self._stranded_checked_at < after / 4:
            return 0
        self._stranded_checked_at = now
        async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            stranded = await outbox.find_stranded(conn, self.queue, older_than=after)
        if not stranded:
            return 0
        # A lost entry's dedup marker may have survived it (a Postgres failover that lost a lease
        # or a generation bump after the entry was consumed): clear it first, or it absorbs the
        # re-send until SEEN_TTL. If the entry did survive (a very long backlog), the re-send is a
        # duplicate delivery, which the generation fence acks as stale.
        keys = [streams.seen_key(self.queue, s.submission_id, s.generation) for s in stranded]
        await streams.guarded(lambda: self.redis.delete(*keys))
        async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            resent = await outbox.resend_stranded(
                conn, self.queue, older_than=after, only=[s.outbox_id for s in stranded]
            )
        if resent:
            metrics.RESENT_STRANDED.labels(self.queue).inc(resent)
            log.warning("stranded deliveries re-sent", extra={"queue": self.queue, "count": resent})
        return resent

    # --- gauges ---------------------------------------------------------------------------------------

    async def refresh_gauges(self) -> StreamFigures:
        figures = await stream_figures(self.redis, self.queue)
        publish(self.queue, figures)
        # Terminal counts scan everything kept for retention: refresh them once a minute.
        now = time.monotonic()
        include_terminal = now - self._terminal_counted_at >= TERMINAL_COUNT_EVERY
        async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            stats = await outbox.stats(conn, self.queue, include_terminal=include_terminal)
            metrics.NOTIFY_QUEUE_USAGE.set(await wakeup.notify_queue_usage(conn))
        if include_terminal:
            self._terminal_counted_at = now
        for state, n in stats.by_state.items():
            metrics.OUTBOX_ROWS.labels(self.queue, state).set(n)
        metrics.OUTBOX_OLDEST_PENDING_AGE.labels(self.queue).set(stats.oldest_pending_age)
        if now - self._agreement_counted_at >= AGREEMENT_EVERY:
            async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                figures_of = await shadow.agreement(conn, self.queue)
            self._agreement_counted_at = now
            self.publish_agreement(figures_of)
        return figures

    def publish_agreement(self, figures: Agreement) -> None:
        """Export the shadow figures: every verdict class and outcome of a queue that has any (a live
        queue that never had shadow judging gets no series; one whose figures were pruned reads 0)."""
        if figures.total.total == 0 and not self._agreement_published:
            return
        self._agreement_published = True
        for (verdict, outcome), child in metrics.shadow_series(self.queue).items():
            child.set(getattr(figures.by_verdict.get(verdict, Counts()), outcome))
        rate = figures.rate
        metrics.SHADOW_AGREEMENT.labels(self.queue).set(float("nan") if rate is None else float(rate))
        metrics.SHADOW_SAMPLES.labels(self.queue).set(figures.samples)

    # --- the whole sweep ------------------------------------------------------------------------------

    async def sweep(self, stop: asyncio.Event | None = None) -> SweepReport:
        """Run every part once; a failing part is logged and reported, the others still run.

        Once ``stop`` is set the parts not yet begun are skipped: each is idempotent upkeep the next
        reaper redoes, and with Redis or Postgres unresponsive each would wait out its own timeout
        before SIGTERM could take effect (5 s per Redis step: 15 s in all behind a stalled network).
        """
        report = SweepReport()

        async def part(name: str, call: Callable[[], Awaitable[Any]]) -> Any:
            if stop is not None and stop.is_set():
                return None
            try:
                result = await call()
            except SERVER_ERRORS as exc:
                report.errors[name] = f"{type(exc).__name__}: {exc}"
                log.warning("reaper step failed", extra={"step": name, "error": str(exc)})
                return None
            report.succeeded += 1
            return result

        report.stream = await part("stream", self.sweep_stream)
        report.leases = await part("leases", self.rescue_leases)
        report.shadow_stream = await part("shadow_stream", lambda: self.sweep_stream(shadow=True))
        report.shadow_leases = await part("shadow_leases", self.rescue_shadow_leases)
        pruned = await part("prune", self.prune)
        if pruned is not None:
            report.pruned_rows, report.pruned_waiters = pruned
        await part("analyse", self.analyse_new_tables)
        await part("shadow_trim", self.trim_shadow_stream)
        report.removed_consumers = await part("consumers", self.remove_idle_consumers) or 0
        report.resent_stranded = await part("stranded", self.resend_stranded) or 0
        report.figures = await part("gauges", self.refresh_gauges)
        return report

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every ``interval`` until ``stop`` is set; failures back off, never crash."""
        interval = self.settings.reaper.interval
        failures = 0
        while not stop.is_set():
            report = await unless_stopped(stop, self.sweep(stop))
            if report is None:
                return  # stopped mid-sweep: every step is safe to abandon (see the module docstring)
            # Back off only while nothing works. A sweep whose first call met a connection killed while
            # the reaper slept (a restart, a reset, an idle timeout) did the rest of its work: under
            # frequent faults, backing off on that doubled the pause to a minute exactly when
            # rescues were most needed.
            failures = failures + 1 if report.unreachable else 0
            delay = backoff_delay(interval, failures)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)


def backoff_delay(interval: float, failures: int, *, cap: float = 60.0) -> float:
    """Time to the next sweep: ``interval``, doubled per consecutive failing sweep up to ``cap`` (pure)."""
    if failures <= 0:
        return interval
    return float(min(interval * 2 ** min(failures, 16), max(cap, interval)))


async def run(settings: Settings, stop: asyncio.Event) -> None:
    """Entry point of the reaper role: owns its connections and sweeps until ``stop`` is set."""
    await serve(settings, stop, lambda conns: Reaper(conns.pool, conns.redis, settings), role="reaper", pool_size=2)
