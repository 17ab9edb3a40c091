"""Giving up on a stream entry (dead-lettering it): the two steps every role that gives up takes.

The reaper gives up on entries idle past ``maxDeliveries``; a worker gives up at once on an entry
it cannot parse, or whose lease the database refuses for good (a poison entry must never hold a
worker slot for longer than one attempt). Both go through here, in the same order:

1. **Postgres** (:func:`record`): ``judgequeue.record_dead_letters`` marks the outbox row ``DEAD``
   and the submission ``SYSTEM_ERROR`` with the reason, fenced on the envelope's generation and
   only while the submission is ``PENDING``; idempotent. Skipped for entries that are not
   judgequeue envelopes (nothing in Postgres names them).
2. **Redis** (:func:`to_dlq`, through :func:`judgequeue.core.store.dlq.add`): the DLQ entry, its
   "already dead" marker and the ack of the original, atomically, but only while the entry is
   still pending for the calling consumer (another reaper that took it over acts instead).

Why Postgres first: see :mod:`judgequeue.core.roles.reaper`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import asyncpg
import redis.asyncio as aioredis

from ..base.errors import describe, is_permanent
from ..transport import streams
from ..transport.connect import STATEMENT_TIMEOUT
from ..transport.envelope import Envelope
from . import dlq, sql

#: Postgres outcome of an entry that names no submission (it could not be parsed).
NOT_AN_ENVELOPE = "none: not a judgequeue envelope"


@dataclass(frozen=True)
class Decision:
    entry: streams.ClaimedEntry
    action: Literal["requeue", "dead_letter"]
    reason: str = ""
    envelope: Envelope | None = None


async def record(pool: asyncpg.Pool, decisions: Sequence[Decision]) -> list[str]:
    """Postgres step (idempotent); one outcome per decision.

    A batch the database refuses for its values (:func:`~judgequeue.core.base.errors.is_permanent`) is
    recorded entry by entry, and an entry refused on its own gets the refusal as its outcome, so
    one bad envelope never keeps the others out of the DLQ. Transient errors propagate: the entries
    stay pending and the caller tries again later.
    """
    outcomes = [NOT_AN_ENVELOPE] * len(decisions)
    with_env = [(i, d, d.envelope) for i, d in enumerate(decisions) if d.envelope is not None]
    if not with_env:
        return outcomes
    try:
        async with pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            rows = await conn.fetch(
                sql.query("record_dead_letters"),
                [e.submission for _, _, e in with_env],
                [e.generation for _, _, e in with_env],
                [d.reason for _, d, _ in with_env],
            )
    except asyncpg.PostgresError as exc:
        if not is_permanent(exc):
            raise
        if len(with_env) == 1:
            outcomes[with_env[0][0]] = f"refused: {describe(exc)}"
            return outcomes
        for i, d, _ in with_env:
            [outcomes[i]] = await record(pool, [d])
        return outcomes
    for row in rows:
        outcomes[with_env[row["ord"] - 1][0]] = row["outcome"]
    return outcomes


async def to_dlq(
    redis: aioredis.Redis, queue: str, consumer: str, decisions: Sequence[Decision], outcomes: Sequence[str]
) -> tuple[int, int, int]:
    """Redis step: (dead-lettered, already dead, skipped because no longer pending for ``consumer``)."""
    items = [
        dlq.Giving(
            d.entry.entry_id,
            d.reason,
            d.entry.last_consumer,
            d.envelope.deliveries if d.envelope else d.entry.times_delivered,
            outcome,
        )
        for d, outcome in zip(decisions, outcomes, strict=True)
    ]
    return await dlq.add(redis, queue, consumer, items)
