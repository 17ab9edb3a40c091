"""Stream upkeep: what would otherwise pile up in Redis.

Shadow stream entries older than ``retention`` are trimmed (worth nothing by then, and a queue may
send to that stream long before any shadow worker reads it). Consumers of group ``workers`` (on
both streams) idle longer than ten visibility timeouts with no pending entry are deleted, checked
and deleted atomically in one script, so a consumer that just read something is never dropped.
"""

from __future__ import annotations

import logging

from ...transport import redis_errors, streams
from .loop import Context, Maintainer

log = logging.getLogger("judgequeue.reaper")

#: A consumer idle this many visibility timeouts with nothing pending is removed.
IDLE_CONSUMER_FACTOR = 10


class ShadowTrim(Maintainer):
    name = "shadow_trim"

    async def run(self) -> int:
        """Trim shadow stream entries appended more than ``retention`` ago (Redis's clock)."""
        redis = self.ctx.redis
        seconds, micros = await redis_errors.guarded(lambda: redis.time())
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        retention_ms = int(self.ctx.settings.reaper.retention * 1000)
        key = streams.shadow_key(self.ctx.queue)
        return await streams.trim_older_than(redis, key, min_id_ms=now_ms - retention_ms)


class IdleConsumers(Maintainer):
    name = "consumers"

    def __init__(self, ctx: Context, *, idle_after: float | None = None) -> None:
        super().__init__(ctx)
        visibility = ctx.settings.reaper.visibility_timeout
        self.idle_after = idle_after if idle_after is not None else IDLE_CONSUMER_FACTOR * visibility

    async def run(self) -> int:
        """Delete consumers of ``workers`` idle past the threshold that hold no pending entry (on the
        work stream and the shadow stream)."""
        removed = 0
        for lane in (False, True):
            names = await streams.idle_consumers(
                self.ctx.redis, self.ctx.queue, idle_ms=int(self.idle_after * 1000), shadow=lane
            )
            removed += await streams.delete_idle_consumers(self.ctx.redis, self.ctx.queue, names, shadow=lane)
        if removed:
            log.info("idle consumers removed", extra={"queue": self.ctx.queue, "count": removed})
        return removed
