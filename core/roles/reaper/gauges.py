"""Gauges: the queue's figures, exported for every reaper's ``/metrics``.

At every sweep, the stream figures (:func:`judgequeue.core.transport.stream_stats.stream_figures`),
the waiting outbox rows and the oldest one's age (in all and per priority class), and the
database's notification queue usage.
Once a minute (:class:`Counts`), what costs a scan of everything kept for ``retention``: the terminal
outbox rows by state, and the shadow agreement figures (:func:`judgequeue.core.store.shadow.agreement`).
"""

from __future__ import annotations

from ...base import agreement, metrics
from ...base.agreement import Agreement
from ...runtime import wakeup
from ...store import outbox, shadow
from ...store.outbox import OutboxStats
from ...transport.connect import STATEMENT_TIMEOUT
from ...transport.stream_stats import StreamFigures, publish, stream_figures
from .loop import Context, Maintainer

#: Seconds between exact counts of terminal outbox rows and the shadow agreement figures.
COUNT_EVERY = 60.0


def publish_outbox(queue: str, stats: OutboxStats) -> None:
    for state, n in stats.by_state.items():
        metrics.OUTBOX_ROWS.labels(queue, state).set(n)
    metrics.OUTBOX_OLDEST_PENDING_AGE.labels(queue).set(stats.oldest_pending_age)


def publish_classes(queue: str, classes: list[outbox.ClassBacklog]) -> None:
    for c in classes:
        metrics.CLASS_BACKLOG.labels(queue, c.name).set(c.waiting)
        metrics.CLASS_OLDEST_PENDING_AGE.labels(queue, c.name).set(c.age)


class Gauges(Maintainer):
    name = "gauges"

    async def run(self) -> StreamFigures:
        queue = self.ctx.queue
        figures = await stream_figures(self.ctx.redis, queue)
        publish(queue, figures)
        async with self.ctx.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            stats = await outbox.stats(conn, queue, include_terminal=False)
            classes = await outbox.class_backlog(conn, queue)
            metrics.NOTIFY_QUEUE_USAGE.set(await wakeup.notify_queue_usage(conn))
        publish_outbox(queue, stats)
        publish_classes(queue, classes)
        return figures


class Counts(Maintainer):
    name = "counts"
    every = COUNT_EVERY

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._agreement_published = False

    async def run(self) -> Agreement:
        async with self.ctx.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            stats = await outbox.stats(conn, self.ctx.queue, include_terminal=True)
            figures = await shadow.agreement(conn, self.ctx.queue)
        publish_outbox(self.ctx.queue, stats)
        self.publish_agreement(figures)
        return figures

    def publish_agreement(self, figures: Agreement) -> None:
        """Export the shadow figures: every verdict class and outcome of a queue that has any (a live
        queue that never had shadow judging gets no series; one whose figures were pruned reads 0)."""
        if figures.total.total == 0 and not self._agreement_published:
            return
        self._agreement_published = True
        for (verdict, outcome), child in metrics.shadow_series(self.ctx.queue).items():
            child.set(getattr(figures.by_verdict.get(verdict, agreement.Counts()), outcome))
        rate = figures.rate
        metrics.SHADOW_AGREEMENT.labels(self.ctx.queue).set(float("nan") if rate is None else float(rate))
        metrics.SHADOW_SAMPLES.labels(self.ctx.queue).set(figures.samples)
