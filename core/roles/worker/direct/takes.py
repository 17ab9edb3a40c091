"""Direct intake's take: a worker claims ready outbox rows, marks them sent to itself and leases
their submissions in one statement (``lease_direct`` in core/store/sql/queries.sql), and the rule that
paces a busy streak of takes.

Named so beside the stream's claim (:func:`judgequeue.core.store.outbox.mark_and_claim`) because the two
share the outbox's rows and states: a row either goes to the stream (a dispatcher's claim) or to a
worker (a take), never both, and the take honours the same flags, backoff and watermark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import asyncpg

from ....runtime.wakeup import BUSY_STREAK
from ....store import leases, sql
from . import tuning


@dataclass(frozen=True)
class Take:
    """What one :func:`take` claimed from the outbox."""

    leases: list[leases.Lease]
    #: (submission, generation) of rows marked sent whose submission had moved on (nothing to judge).
    stale: list[tuple[int, int]]
    #: Rows created before the live watermark: marked SKIPPED, never judged (the legacy path owns them).
    skipped: int
    #: The queue is live and not paused (else nothing is taken: shadow rows are the dispatcher's).
    live: bool = True
    #: The take registered the worker as a waiter (``register_if_idle`` and nothing was ready).
    registered: bool = False
    #: The take removed the worker's registration (``unregister_if_busy`` and rows were ready).
    unregistered: bool = False
    #: How many classes the queue declares (several: the worker keeps reserved offers for the first).
    classes: int = 1

    @property
    def rows(self) -> int:
        return len(self.leases) + len(self.stale) + self.skipped


async def take(
    conn: asyncpg.Connection,
    queue: str,
    worker: str,
    *,
    limit: int,
    ttl: float,
    unregister_if_busy: bool = False,
    register_if_idle: bool = False,
) -> Take:
    """Claim up to ``limit`` ready outbox rows of a live, unpaused queue, mark them sent to
    ``worker`` and lease their submissions, in one statement and one commit.

    The commit does not wait for the WAL flush, and needs no barrier: there is no stream entry to
    ack, and a crash that loses the commit loses the claim with the lease (the row is ready again).

    The worker's wake-up registration (:mod:`judgequeue.core.runtime.wakeup`) rides on the same statement,
    saving a round trip each: ``unregister_if_busy`` removes it if rows were ready (work is
    flowing); ``register_if_idle`` (for an unregistered worker) makes it when nothing was ready on
    a live queue, and the caller must then look once more before it sleeps (rows committed before
    the registration sent no notification).
    """
    if unregister_if_busy and register_if_idle:
        raise ValueError("a take either unregisters or registers its worker, not both")
    rows = await conn.fetch(
        sql.query("lease_direct"), queue, worker, limit, float(ttl), unregister_if_busy, register_if_idle
    )
    leased: list[leases.Lease] = []
    stale: list[tuple[int, int]] = []
    skipped = 0
    for r in rows:
        if r["outbox_state"] is None:
            continue  # nothing claimed: the row only carries the flags
        if r["outbox_state"] == "SKIPPED":
            skipped += 1
        elif r["attempt_id"] is None:
            stale.append((r["submission_id"], r["outbox_generation"]))
        else:
            leased.append(
                leases.Lease(
                    submission=r["submission_id"],
                    generation=r["outbox_generation"],
                    attempt=r["attempt_id"],  # asyncpg's UUID is a uuid.UUID
                    payload=json.loads(r["payload"]),
                    created_at=r["created_at"],
                    request_generation=r["request_generation"],
                    call_failures=r["call_failures"],
                )
            )
    flags = rows[0]
    return Take(
        leased,
        stale,
        skipped,
        live=bool(flags["live"]),
        registered=bool(flags["registered"]),
        unregistered=bool(flags["unregistered"]),
        classes=int(flags["classes"]),
    )


def pace_takes(claimed: int, batch_size: int, streak: int, rows_per_second: float) -> bool:
    """Whether a worker whose takes keep finding rows should wait :data:`~tuning.TAKE_PACE` before
    the next (pure). A streak of busy takes (``wakeup.BUSY_STREAK``) that each leave free slots, at
    more than :data:`~tuning.PACE_TAKES_ABOVE` rows a second, means rows come faster than a take's
    round trip but slower than the slots fill: taking at once costs a statement for a row or two,
    where a short pause lets each take bring several (one round trip and one commit for all). A full
    batch means the slots are the limit; a trickle waits on notifications; below the rate, the
    pause would be latency for little gain."""
    return 0 < claimed < batch_size and streak >= BUSY_STREAK and rows_per_second >= tuning.PACE_TAKES_ABOVE


class TakeRate:
    """Rows a second the takes of a busy streak find, over windows of :data:`~tuning.TAKE_RATE_WINDOW`.

    The first take of a streak is not counted: it brings what gathered while the worker waited,
    which says nothing about how fast rows come now."""

    def __init__(self) -> None:
        self._since = 0.0
        self._rows = 0
        self.per_second = 0.0

    def start(self, now: float) -> None:
        """A streak's first take ended at ``now``."""
        self._since, self._rows, self.per_second = now, 0, 0.0

    def add(self, rows: int, now: float) -> None:
        """A later take of the streak found ``rows``, ending at ``now``."""
        self._rows += rows
        elapsed = now - self._since
        if elapsed > 0:
            self.per_second = self._rows / elapsed
        if elapsed >= tuning.TAKE_RATE_WINDOW:
            self._since, self._rows = now, 0  # the next window; per_second stands until it has one
