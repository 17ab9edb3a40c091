"""Retention: what is past ``retention`` is deleted, and soft state that crashed processes left.

Terminal outbox rows; terminal submissions by ``finished_at``, oldest first; verdict events and
dead webhook deliveries; the verdict history; rejudgings (by when they were opened); shadow and
legacy verdicts; dispatcher and worker
waiters, and offers their worker stopped refreshing. Each table in batches of 1,000 rows, at most
:data:`PRUNE_BATCHES` a sweep.
"""

from __future__ import annotations

from ...base import metrics
from ...runtime import wakeup
from ...store import events, outbox, rejudgings, shadow, submissions
from ...transport.connect import STATEMENT_TIMEOUT
from .loop import Context, Maintainer

#: Batches of 1,000 rows one sweep may prune per table: 50,000 rows per ``interval`` (10,000/s at
#: the default 5 s), above the steady rates measured on the project's machine (docs/performance.md),
#: so retention keeps up; a backlog left by a retention change is worked off over several sweeps.
PRUNE_BATCHES = 50


class Retention(Maintainer):
    name = "prune"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.pruned_submissions = 0  # terminal submissions deleted, for tests and logs
        self.pruned_shadow = 0  # shadow and legacy verdicts deleted
        self.pruned_events = 0  # verdict events (and dead webhook deliveries) deleted
        self.pruned_history = 0  # verdict history rows deleted
        self.pruned_rejudgings = 0  # rejudgings deleted (their items with them)

    async def run(self) -> tuple[int, int]:
        """Delete what is past ``retention`` and the soft state left behind: (outbox rows, waiters and offers)."""
        queue, settings = self.ctx.queue, self.ctx.settings
        waiter_age = max(300.0, 3 * settings.dispatcher.schedule)
        retention = settings.reaper.retention
        async with self.ctx.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            rows = await outbox.prune(conn, queue, retention=retention, batch=1000, max_batches=PRUNE_BATCHES)
            finished = await outbox.prune_submissions(
                conn, queue, retention=retention, batch=1000, max_batches=PRUNE_BATCHES
            )
            waiters = await wakeup.prune_waiters(conn, older_than=waiter_age)
            # Offers expire within seconds of their worker's last refresh (roles/worker/direct/offers.py);
            # what is left of a crashed worker's goes once it is clearly gone (its filled ones' jobs
            # have leases of their own, rescued when they expire).
            waiters += await wakeup.prune_offers(conn, older_than=waiter_age)
            pruned_events = await events.prune(conn, queue, retention=retention, batch=1000,
                                               max_batches=PRUNE_BATCHES)
            pruned_history = await submissions.prune_history(conn, queue, retention=retention, batch=1000,
                                                             max_batches=PRUNE_BATCHES)
            self.pruned_rejudgings += await rejudgings.prune(conn, queue, retention=retention, batch=1000,
                                                             max_batches=PRUNE_BATCHES)
            shadows, legacies = await shadow.prune(conn, queue, retention=retention, batch=1000,
                                                   max_batches=PRUNE_BATCHES)
        metrics.PRUNED_ROWS.labels(queue).inc(rows)
        metrics.PRUNED_SUBMISSIONS.labels(queue).inc(finished)
        metrics.PRUNED_EVENTS.labels(queue).inc(pruned_events)
        self.pruned_events += pruned_events
        metrics.PRUNED_HISTORY.labels(queue).inc(pruned_history)
        self.pruned_history += pruned_history
        metrics.PRUNED_SHADOW.labels(queue, "shadow").inc(shadows)
        metrics.PRUNED_SHADOW.labels(queue, "legacy").inc(legacies)
        self.pruned_submissions += finished
        self.pruned_shadow += shadows + legacies
        return rows, waiters
