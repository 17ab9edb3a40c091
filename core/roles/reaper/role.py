"""The reaper role: its maintainers, in the order a sweep runs them, and its entry point."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence

import asyncpg
import redis.asyncio as aioredis

from ...config import Settings
from ...runtime.lifecycle import Connections, instance_id, serve
from ...store.leases import LeaseSweep
from ...store.shadow import ShadowRescue
from ...transport.stream_stats import StreamFigures
from .gauges import Counts, Gauges
from .lease_rescue import LeaseRescue, ShadowLeaseRescue
from .loop import Context, Maintenance, SweepReport
from .retention import Retention
from .statistics import Statistics
from .stranded import Stranded
from .stream_rescue import ClaimedEntry, Decision, StreamRescue, StreamSweep
from .stream_upkeep import IdleConsumers, ShadowTrim
from .webhooks import Deliverer, load_webhooks


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
        webhooks: Deliverer | None = None,
    ) -> None:
        self.settings = settings
        self.queue = settings.queue
        self.name = name or instance_id("reaper")
        ctx = Context(pool, redis, settings, self.name)
        self.stream = StreamRescue(ctx)
        self.shadow_stream = StreamRescue(ctx, shadow=True)
        self.leases = LeaseRescue(ctx)
        self.shadow_leases = ShadowLeaseRescue(ctx)
        self.retention = Retention(ctx)
        self.consumers = IdleConsumers(ctx, idle_after=idle_consumer_after)
        self.stranded = Stranded(ctx)
        self.gauges = Gauges(ctx)
        self.counts = Counts(ctx)
        self.shadow_trim = ShadowTrim(ctx)
        #: Webhook delivery (a task beside the sweeps), when the queue has endpoints configured.
        self.webhooks = webhooks
        self.maintenance = Maintenance(
            [
                self.stream,
                self.leases,
                self.shadow_stream,
                self.shadow_leases,
                self.retention,
                Statistics(ctx),
                self.shadow_trim,
                self.consumers,
                self.stranded,
                self.gauges,
                self.counts,
            ]
        )

    @property
    def idle_consumer_after(self) -> float:
        return self.consumers.idle_after

    @property
    def between_steps(self) -> Callable[[Sequence[Decision]], Awaitable[None]] | None:
        """Test seam: awaited after the Postgres step of a dead-letter batch, before the Redis step."""
        return self.stream.between_steps

    @between_steps.setter
    def between_steps(self, call: Callable[[Sequence[Decision]], Awaitable[None]] | None) -> None:
        self.stream.between_steps = call

    @property
    def pruned_submissions(self) -> int:
        return self.retention.pruned_submissions

    @property
    def pruned_shadow(self) -> int:
        return self.retention.pruned_shadow

    # --- one maintainer at a time, as the tests and benchmarks call them ------------------------------

    async def claim(self, cursor: str = "0-0", *, shadow: bool = False) -> tuple[str, list[ClaimedEntry], int]:
        return await (self.shadow_stream if shadow else self.stream).claim(cursor)

    async def requeue(self, decisions: Sequence[Decision], *, shadow: bool = False) -> tuple[int, int]:
        return await (self.shadow_stream if shadow else self.stream).requeue(decisions)

    async def dead_letter(self, decisions: Sequence[Decision], outcomes: Sequence[str]) -> tuple[int, int, int]:
        return await self.stream.dead_letter(decisions, outcomes)

    async def sweep_stream(self, *, max_batches: int = 10_000, shadow: bool = False) -> StreamSweep:
        return await (self.shadow_stream if shadow else self.stream).sweep(max_batches=max_batches)

    async def rescue_leases(self, *, batch: int = 500, max_batches: int = 20) -> LeaseSweep:
        return await self.leases.run(batch=batch, max_batches=max_batches)

    async def rescue_shadow_leases(self, *, batch: int = 500, max_batches: int = 20) -> ShadowRescue:
        return await self.shadow_leases.run(batch=batch, max_batches=max_batches)

    async def prune(self) -> tuple[int, int]:
        return await self.retention.run()

    async def remove_idle_consumers(self) -> int:
        return await self.consumers.run()

    async def trim_shadow_stream(self) -> int:
        return await self.shadow_trim.run()

    async def resend_stranded(self) -> int:
        return await self.stranded.run()

    async def refresh_gauges(self) -> StreamFigures:
        """Every gauge now, the minute's counts too."""
        figures = await self.gauges.run()
        await self.counts.run()
        return figures

    # --- the loop -------------------------------------------------------------------------------------

    async def sweep(self, stop: asyncio.Event | None = None) -> SweepReport:
        """Run every due maintainer once (see :class:`~.loop.Maintenance`)."""
        return await self.maintenance.sweep(stop)

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every ``interval`` (and deliver webhooks, if any) until ``stop`` is set; failures
        back off, never crash."""
        if self.webhooks is None:
            await self.maintenance.run(stop, self.settings.reaper.interval)
            return
        await asyncio.gather(self.maintenance.run(stop, self.settings.reaper.interval), self.webhooks.run(stop))


async def run(settings: Settings, stop: asyncio.Event) -> None:
    """Entry point of the reaper role: owns its connections and sweeps until ``stop`` is set; with
    ``JUDGEQUEUE_WEBHOOKS`` set it delivers the queue's verdict events to those endpoints too."""
    endpoints, problem = load_webhooks(os.environ)

    def make(conns: Connections) -> Reaper:
        name = instance_id("reaper")
        webhooks = None
        if endpoints or problem:
            webhooks = Deliverer(conns.pool, settings.queue, endpoints, name, listen_dsn=settings.listen_dsn,
                                 problem=problem)  # fmt: skip
        return Reaper(conns.pool, conns.redis, settings, name=name, webhooks=webhooks)

    pool_size = 2 + min(sum(ep.concurrency for ep in endpoints), 8) if endpoints else 2
    await serve(settings, stop, make, role="reaper", pool_size=pool_size)
