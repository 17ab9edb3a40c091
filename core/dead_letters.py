"""Dead-lettering a stream entry: the two steps every role that gives up on an entry takes.

The reaper gives up on entries idle past ``maxDeliveries``; a worker gives up at once on an entry
it cannot parse, or whose lease the database refuses for good (a poison entry must never hold a
worker slot for longer than one attempt). Both go through here, in the same order:

1. **Postgres** (:func:`record`): ``judgequeue.record_dead_letters`` marks the outbox row ``DEAD``
   and the submission ``SYSTEM_ERROR`` with the reason, fenced on the envelope's generation and
   only while the submission is ``PENDING``; idempotent. Skipped for entries that are not
   judgequeue envelopes (nothing in Postgres names them).
2. **Redis** (:func:`to_dlq`): one script adds the DLQ entry (source id, reason, last consumer,
   deliveries, Postgres outcome, the original fields prefixed ``entry.``), sets the marker
   ``jq:{q}:dead:<id>`` and acks and deletes the original, but only while the entry is still
   pending for the calling consumer (another reaper that took it over acts instead).

Why Postgres first: see :mod:`judgequeue.core.reaper`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg
import redis.asyncio as aioredis

from . import streams
from .errors import describe, is_permanent

#: Lifetime of the "already dead-lettered" marker of a source entry id (ids never repeat).
DEAD_MARKER_TTL = 7 * 86400
#: The DLQ is an operator's convenience copy (Postgres keeps the durable record): cap it.
DLQ_MAXLEN = 100_000

RECORD_SQL = "SELECT ord, outcome FROM judgequeue.record_dead_letters($1::bigint[], $2::bigint[], $3::text[])"

#: Postgres outcome of an entry that names no submission (it could not be parsed).
NOT_AN_ENVELOPE = "none: not a judgequeue envelope"


def dead_marker_key(queue: str, entry_id: str) -> str:
    return f"jq:{{{queue}}}:dead:{entry_id}"


@dataclass(frozen=True)
class ClaimedEntry:
    """A pending entry a role holds, with who held it before."""

    entry_id: str
    fields: dict[str, str] | None  # None: deleted from the stream while pending
    last_consumer: str
    times_delivered: int


@dataclass(frozen=True)
class Decision:
    entry: ClaimedEntry
    action: Literal["requeue", "dead_letter"]
    reason: str = ""
    envelope: streams.Envelope | None = None


async def record(pool: asyncpg.Pool, decisions: Sequence[Decision]) -> list[str]:
    """Postgres step (idempotent); one outcome per decision.

    A batch the database refuses for its values (:func:`~judgequeue.core.errors.is_permanent`) is
    recorded entry by entry, and an entry refused on its own gets the refusal as its outcome, so
    one bad envelope never keeps the others out of the DLQ. Transient errors propagate: the entries
    stay pending and the caller tries again later.
    """
    outcomes = [NOT_AN_ENVELOPE] * len(decisions)
    with_env = [(i, d, d.envelope) for i, d in enumerate(decisions) if d.envelope is not None]
    if not with_env:
        return outcomes
    try:
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                RECORD_SQL, [e.submission for _, _, e in with_env], [e.generation for _, _, e in with_env],
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
    if not decisions:
        return 0, 0, 0
    keys = [streams.stream_key(queue), streams.dlq_key(queue)]
    args: list[str | int | float] = [consumer, DEAD_MARKER_TTL, DLQ_MAXLEN]
    for d, outcome in zip(decisions, outcomes, strict=True):
        keys.append(dead_marker_key(queue, d.entry.entry_id))
        deliveries = d.envelope.deliveries if d.envelope else d.entry.times_delivered
        args += [d.entry.entry_id, d.reason, d.entry.last_consumer, deliveries, outcome]
    [reply] = await streams.evalsha_many(redis, "dead_letter", [(keys, args)])
    dead, again, skipped = _script_reply(reply)
    return int(dead), int(again), int(skipped)


def _script_reply(reply: object) -> Any:
    if isinstance(reply, Exception):
        raise streams.translate_redis_error(reply)
    return reply
