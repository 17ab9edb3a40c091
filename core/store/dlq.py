"""The dead-letter queue (``jq:{<queue>}:dlq``): its format, written and read here only.

A DLQ entry carries ``source_id``, ``reason``, ``consumer`` (the last holder), ``deliveries``,
``postgres`` (what was recorded there) and the original entry's fields prefixed ``entry.``.
:func:`add` writes it (the Redis step of giving up on an entry; the reaper and the workers call it
through :mod:`judgequeue.core.store.giving_up`), :func:`parse` reads it; list, show, replay and purge
are the CLI's operations over it.

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

from ..transport.envelope import MalformedEnvelope, parse_id
from ..transport.redis_errors import guarded
from ..transport.redis_scripts import run_script, script
from ..transport.streams import GROUP, dlq_key, stream_key
from . import submissions

#: Lifetime of the "already dead-lettered" marker of a source entry id (ids never repeat).
DEAD_MARKER_TTL = 7 * 86400
#: The DLQ is an operator's convenience copy (Postgres keeps the durable record): cap it.
DLQ_MAXLEN = 100_000
#: Prefix of the original entry's fields in a DLQ entry.
ENTRY_PREFIX = "entry."

# KEYS: stream, dlq, then one marker per entry (jq:{q}:dead:<id>). ARGV: group, consumer, marker
# TTL (s), DLQ approximate max length, then per entry 5 values: id, reason, last consumer,
# deliveries, Postgres outcome. For each entry still pending for this consumer: unless its marker
# exists, add a DLQ entry (meta fields + the original fields prefixed "entry.") and set the marker;
# then XACK and XDEL the original. Returns {dead, again, skipped}.
DEAD_LETTER = script("dead_letter", """
local stream, dlq = KEYS[1], KEYS[2]
local group, consumer, ttl, maxlen = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local dead, again, skipped = 0, 0, 0
for i = 3, #KEYS do
  local b = 4 + (i - 3) * 5
  local id = ARGV[b + 1]
  if #redis.call('XPENDING', stream, group, id, id, 1, consumer) == 0 then
    skipped = skipped + 1
  else
    if redis.call('EXISTS', KEYS[i]) == 1 then
      again = again + 1
    else
      local fields = {'source_id', id, 'reason', ARGV[b + 2], 'consumer', ARGV[b + 3],
                      'deliveries', ARGV[b + 4], 'postgres', ARGV[b + 5]}
      local e = redis.call('XRANGE', stream, id, id)
      if #e == 1 then
        local f = e[1][2]
        for j = 1, #f, 2 do
          fields[#fields + 1] = 'entry.' .. f[j]
          fields[#fields + 1] = f[j + 1]
        end
      end
      redis.call('XADD', dlq, 'MAXLEN', '~', maxlen, '*', unpack(fields))
      redis.call('SET', KEYS[i], '1', 'EX', ttl)
      dead = dead + 1
    end
    redis.call('XACK', stream, group, id)
    redis.call('XDEL', stream, id)
  end
end
return {dead, again, skipped}
""")


def dead_marker_key(queue: str, entry_id: str) -> str:
    return f"jq:{{{queue}}}:dead:{entry_id}"


@dataclass(frozen=True)
class Giving:
    """One entry to dead-letter: the DLQ entry's meta fields (the original's fields are copied in Redis)."""

    entry_id: str
    reason: str
    last_consumer: str
    deliveries: int
    postgres: str


async def add(redis: aioredis.Redis, queue: str, consumer: str, items: Sequence[Giving]) -> tuple[int, int, int]:
    """Dead-letter entries still pending for ``consumer``: (dead-lettered, already dead, skipped).

    Atomic per entry: the DLQ entry, its marker and the ack of the original happen together; an
    entry another consumer took over meanwhile is skipped (that consumer acts on it instead).
    """
    if not items:
        return 0, 0, 0
    keys = [stream_key(queue), dlq_key(queue)] + [dead_marker_key(queue, i.entry_id) for i in items]
    args: list[str | int | float] = [GROUP, consumer, DEAD_MARKER_TTL, DLQ_MAXLEN]
    for i in items:
        args += [i.entry_id, i.reason, i.last_consumer, i.deliveries, i.postgres]
    dead, again, skipped = await run_script(redis, DEAD_LETTER, keys, args)
    return int(dead), int(again), int(skipped)


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
        entry={k.removeprefix(ENTRY_PREFIX): v for k, v in fields.items() if k.startswith(ENTRY_PREFIX)},
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
        new_generation = await submissions.bump_generation(conn, submission, generation)
        if new_generation is not None:
            result.outcomes[entry_id] = "replayed"
            result.generations[entry_id] = int(new_generation)
        elif await submissions.exists(conn, submission):
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
