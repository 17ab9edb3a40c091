"""Dead-letter queue operations for the CLI: list, show, replay, purge (``jq:{<queue>}:dlq``).

A DLQ entry (written by the reaper) carries ``source_id``, ``reason``, ``consumer`` (the last holder),
``deliveries``, ``postgres`` (what the reaper recorded there) and the original entry's fields
prefixed ``entry.``.

Replay is idempotent by construction: it bumps the submission's generation *conditionally on the
dead generation* (``judgequeue.bump_generation(id, dead_generation, false)``), then deletes the DLQ
entry. A second replay of the same entry (or one interrupted before the delete) finds the
generation already moved and only deletes the entry, so replaying twice never creates two
generations. The new generation gets a fresh outbox row; the dispatcher sends it as usual.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import asyncpg
import redis.asyncio as aioredis

from .streams import MalformedEnvelope, dlq_key, guarded, parse_id


@dataclass(frozen=True)
class DeadLetter:
    """One DLQ entry, decoded."""

    entry_id: str
    source_id: str
    reason: str
    consumer: str
    deliveries: int | None
    postgres: str
    entry: dict[str, str]  # the original stream entry's fields

    @property
    def submission(self) -> int | None:
        return _int(self.entry.get("submission"))

    @property
    def generation(self) -> int | None:
        return _int(self.entry.get("generation"))


def _int(value: str | None) -> int | None:
    """An id as the envelope codec reads it (decimal, fits bigint), else None: a DLQ entry may hold anything."""
    if value is None:
        return None
    try:
        return parse_id(value, "id")
    except MalformedEnvelope:
        return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def parse(entry_id: Any, raw: dict[Any, Any]) -> DeadLetter:
    """Decode a DLQ entry (pure)."""
    fields = {_text(k): _text(v) for k, v in raw.items()}
    return DeadLetter(
        entry_id=_text(entry_id),
        source_id=fields.get("source_id", ""),
        reason=fields.get("reason", ""),
        consumer=fields.get("consumer", ""),
        deliveries=_int(fields.get("deliveries")),
        postgres=fields.get("postgres", ""),
        entry={k.removeprefix("entry."): v for k, v in fields.items() if k.startswith("entry.")},
    )


async def list_entries(redis: aioredis.Redis, queue: str, count: int = 100, *, after: str = "-") -> list[DeadLetter]:
    """Up to ``count`` DLQ entries, oldest first, starting after ``after`` (an entry id) if given."""
    start = "-" if after == "-" else f"({after}"

    async def fetch() -> Any:
        return await redis.xrange(dlq_key(queue), min=start, max="+", count=count)

    return [parse(entry_id, raw) for entry_id, raw in await guarded(fetch)]


async def length(redis: aioredis.Redis, queue: str) -> int:
    return int(await guarded(lambda: redis.xlen(dlq_key(queue))))


async def show(redis: aioredis.Redis, queue: str, entry_id: str) -> DeadLetter | None:
    """One DLQ entry by id, or None."""

    async def fetch() -> Any:
        return await redis.xrange(dlq_key(queue), min=entry_id, max=entry_id, count=1)

    found = await guarded(fetch)
    return parse(found[0][0], found[0][1]) if found else None


ReplayOutcome = Literal["replayed", "superseded", "unknown_submission", "not_an_envelope", "not_found"]


@dataclass
class ReplayResult:
    """Per DLQ entry: what replay did, and the new generation for replayed ones."""

    outcomes: dict[str, ReplayOutcome] = field(default_factory=dict)
    generations: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: ReplayOutcome) -> int:
        return sum(1 for o in self.outcomes.values() if o == outcome)


async def _all_ids(redis: aioredis.Redis, queue: str, batch: int = 1000) -> list[str]:
    ids: list[str] = []
    after = "-"
    while True:
        page = await list_entries(redis, queue, batch, after=after)
        ids += [d.entry_id for d in page]
        if len(page) < batch:
            return ids
        after = page[-1].entry_id


async def replay(
    conn: asyncpg.Connection, redis: aioredis.Redis, queue: str, entry_ids: Sequence[str] | None = None
) -> ReplayResult:
    """Re-dispatch dead-lettered submissions under a new generation; ``None`` replays every entry.

    Entries that cannot be replayed (not a judgequeue envelope, unknown submission) stay in the
    DLQ; purge them.
    Entries whose submission already moved to a newer generation (replayed before, or rejudged)
    are removed without a new generation.
    """
    ids = list(entry_ids) if entry_ids is not None else await _all_ids(redis, queue)
    result = ReplayResult()
    for entry_id in ids:
        letter = await show(redis, queue, entry_id)
        if letter is None:
            result.outcomes[entry_id] = "not_found"
            continue
        submission, generation = letter.submission, letter.generation
        if submission is None or generation is None:
            result.outcomes[entry_id] = "not_an_envelope"
            continue
        new_generation = await conn.fetchval(
            "SELECT judgequeue.bump_generation($1::bigint, $2::bigint, false)", submission, generation
        )
        if new_generation is not None:
            result.outcomes[entry_id] = "replayed"
            result.generations[entry_id] = int(new_generation)
        elif await conn.fetchval("SELECT true FROM judgequeue.submissions WHERE id = $1", submission):
            result.outcomes[entry_id] = "superseded"
        else:
            result.outcomes[entry_id] = "unknown_submission"  # kept for inspection; purge it
            continue
        await guarded(lambda entry_id=entry_id: redis.xdel(dlq_key(queue), entry_id))  # type: ignore[misc]
    return result


async def purge(redis: aioredis.Redis, queue: str, entry_ids: Sequence[str] | None = None) -> int:
    """Delete DLQ entries (``None``: all of them); returns how many were removed."""
    key = dlq_key(queue)
    if entry_ids is None:

        async def drop_all() -> int:
            n = int(await redis.xlen(key))
            await redis.delete(key)
            return n

        return await guarded(drop_all)
    if not entry_ids:
        return 0
    return int(await guarded(lambda: redis.xdel(key, *entry_ids)))
