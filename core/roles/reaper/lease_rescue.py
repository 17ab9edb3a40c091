"""Lease rescue: expired ``JUDGING`` leases, live and shadow.

A live lease that expired gets a new generation and a new outbox row in one transaction
(:func:`judgequeue.core.store.leases.rescue_expired_leases`), or ends ``SYSTEM_ERROR`` at
``maxRetries``. An expired shadow lease's entry is sent to the shadow stream again
(:func:`judgequeue.core.store.shadow.rescue_expired`), or ends ``SYSTEM_ERROR`` at ``maxRetries``.
"""

from __future__ import annotations

import logging
import time

from ...base import failpoints, metrics
from ...store import shadow
from ...store.leases import LeaseSweep, rescue_expired_leases
from ...transport import streams
from ...transport.connect import STATEMENT_TIMEOUT
from ...transport.envelope import Envelope
from .loop import Maintainer

log = logging.getLogger("judgequeue.reaper")


class LeaseRescue(Maintainer):
    name = "leases"

    async def run(self, *, batch: int = 500, max_batches: int = 20) -> LeaseSweep:
        """Rescue expired JUDGING leases (new generation, or SYSTEM_ERROR at ``maxRetries``)."""
        requeued = failed = 0
        for _ in range(max_batches):
            async with self.ctx.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                got = await rescue_expired_leases(
                    conn, self.ctx.queue, max_retries=self.ctx.settings.reaper.max_retries, batch=batch
                )
            requeued += got.requeued
            failed += got.failed
            if got.requeued or got.failed:
                failpoints.hit("reaper.after_lease_rescue")
            if got.requeued + got.failed < batch:
                break
        if requeued or failed:
            log.info("expired leases rescued", extra={"queue": self.ctx.queue, "requeued": requeued, "failed": failed})
        return LeaseSweep(requeued=requeued, failed=failed)


class ShadowLeaseRescue(Maintainer):
    name = "shadow_leases"

    async def run(self, *, batch: int = 500, max_batches: int = 20) -> shadow.ShadowRescue:
        """Send the entries of expired shadow leases again (or end them SYSTEM_ERROR at ``maxRetries``).

        Postgres first: the row is marked waiting for a delivery (the old attempt fenced out) and is
        rescued again ``redispatchAfter`` later if this send is lost. The send goes through the
        dedup-and-append script: a worker's ack removed the entry's marker, and a marker still there
        means its entry is still pending, which the stream sweep re-delivers."""
        settings, queue = self.ctx.settings, self.ctx.queue
        resend: list[shadow.Resend] = []
        failed = 0
        for _ in range(max_batches):
            async with self.ctx.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                got = await shadow.rescue_expired(conn, queue, max_retries=settings.reaper.max_retries,
                                                  resend_after=settings.reaper.redispatch_after, batch=batch)
            failed += got.failed
            if got.resend:
                failpoints.hit("reaper.after_lease_rescue")
                now = time.time()
                envelopes = [Envelope(r.submission, r.generation, r.attempts, r.outbox, now) for r in got.resend]
                await streams.enqueue_many(self.ctx.redis, queue, envelopes,
                                           seen_ttl=settings.dispatcher.seen_ttl, shadow=True)
                resend += got.resend
            if len(got.resend) + got.failed < batch:
                break
        if resend or failed:
            metrics.SHADOW_RESENT.labels(queue).inc(len(resend))
            log.info("expired shadow leases rescued", extra={"queue": queue, "resent": len(resend), "failed": failed})
        return shadow.ShadowRescue(resend, failed)
