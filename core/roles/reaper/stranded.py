"""Stranded deliveries: sent but never leased within ``redispatchAfter`` (Redis lost the entry) are
sent again. It only matters after Redis lost data, so it runs every quarter of that period."""

from __future__ import annotations

import logging

from ...base import metrics
from ...store import outbox
from ...transport import redis_errors, streams
from ...transport.connect import STATEMENT_TIMEOUT
from .loop import Context, Maintainer

log = logging.getLogger("judgequeue.reaper")


class Stranded(Maintainer):
    name = "stranded"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.every = ctx.settings.reaper.redispatch_after / 4

    async def run(self) -> int:
        """Re-send deliveries that were sent but never leased within ``redispatch_after``."""
        queue, after = self.ctx.queue, self.ctx.settings.reaper.redispatch_after
        async with self.ctx.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            stranded = await outbox.find_stranded(conn, queue, older_than=after)
        if not stranded:
            return 0
        # A lost entry's dedup marker may have survived it (a Postgres failover that lost a lease
        # or a generation bump after the entry was consumed): clear it first, or it absorbs the
        # re-send until SEEN_TTL. If the entry did survive (a very long backlog), the re-send is a
        # duplicate delivery, which the generation fence acks as stale.
        keys = [streams.seen_key(queue, s.submission_id, s.generation) for s in stranded]
        await redis_errors.guarded(lambda: self.ctx.redis.delete(*keys))
        async with self.ctx.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            resent = await outbox.resend_stranded(conn, queue, older_than=after, only=[s.outbox_id for s in stranded])
        if resent:
            metrics.RESENT_STRANDED.labels(queue).inc(resent)
            log.warning("stranded deliveries re-sent", extra={"queue": queue, "count": resent})
        return resent
