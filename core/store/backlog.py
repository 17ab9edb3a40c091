"""How much work a queue has waiting: the figure the operator's autoscaler scales workers on.

Backlog = outbox rows not yet in Redis (``PENDING`` + ``CLAIMED``) + stream entries not yet delivered
to the ``workers`` group (lag) + entries delivered but not acknowledged (the PEL). Workers delete
entries once acknowledged (XACK + XDEL), which makes Redis report the group's lag as NULL; the lag is
then ``XLEN - PEL``, exact for this stream because only undelivered and pending entries remain in it.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
import redis.asyncio as aioredis

from ..transport.stream_stats import stream_figures
from .outbox import stats


@dataclass(frozen=True)
class Backlog:
    outbox_pending: int  # outbox rows PENDING or CLAIMED
    stream_lag: int  # stream entries the group has not read yet
    pel: int  # entries read but not acknowledged

    @property
    def total(self) -> int:
        return self.outbox_pending + self.stream_lag + self.pel


async def read_backlog(conn: asyncpg.Connection, redis: aioredis.Redis, queue: str) -> Backlog:
    """The queue's backlog from Postgres and Redis (raises if either is unreachable)."""
    # Only rows still waiting count; terminal counts would scan everything kept for retention.
    outbox = await stats(conn, queue, include_terminal=False)
    figures = await stream_figures(redis, queue)
    return Backlog(
        outbox_pending=outbox.by_state.get("PENDING", 0) + outbox.by_state.get("CLAIMED", 0),
        stream_lag=figures.lag,
        pel=figures.pel,
    )
