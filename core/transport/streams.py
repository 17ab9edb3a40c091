"""The Redis Streams transport: key layout, thin envelope, atomic dedup-and-append, consume, ack.

Every key of a queue shares the hash tag ``{<queue>}`` so each Lua script touches one slot and the
same code runs on Redis Cluster. A stream entry carries ids only; the payload stays in Postgres.

Redis failures surface as :class:`TransportError` subclasses so callers can tell "try again later"
(the outbox row stays retryable) from a bug.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
import redis.exceptions as rexc

from ..base.errors import TransportError
from .envelope import ENVELOPE_FIELDS, Envelope, MalformedEnvelope
from .redis_errors import RedisOutOfMemory, RedisReadOnly, guarded, translate_redis_error
from .redis_scripts import ACK, ACK_PENDING, CLAIM, DELETE_IDLE_CONSUMERS, ENQUEUE, REQUEUE, evalsha_many, run_script

GROUP = "workers"


def stream_key(queue: str) -> str:
    return f"jq:{{{queue}}}:stream"


def shadow_key(queue: str) -> str:
    return f"jq:{{{queue}}}:shadow"


def work_key(queue: str, shadow: bool) -> str:
    """The stream a worker of either lane reads: the work stream, or the shadow stream (shadow judging)."""
    return shadow_key(queue) if shadow else stream_key(queue)


def dlq_key(queue: str) -> str:
    return f"jq:{{{queue}}}:dlq"


def seen_key(queue: str, submission: int, generation: int) -> str:
    return f"jq:{{{queue}}}:seen:{submission}:{generation}"


def shadow_seen_key(queue: str, submission: int, generation: int) -> str:
    # Separate from the live marker: a shadow append must never make a later live append of the
    # same (submission, generation) look like a duplicate.
    return f"jq:{{{queue}}}:shadow-seen:{submission}:{generation}"


EnqueueStatus = Literal["appended", "duplicate", "error"]


@dataclass(frozen=True)
class EnqueueResult:
    status: EnqueueStatus
    entry_id: str | None = None
    error: str | None = None


#: Envelopes per FCALL of the batched enqueue script (one pipeline carries all the batches).
ENQUEUE_CHUNK = 200

def _server_wide(error: str) -> TransportError | None:
    """READONLY and OOM concern the whole server, not one entry: they are raised, not reported."""
    if error.startswith("READONLY"):
        return RedisReadOnly(error)
    if error.startswith("OOM"):
        return RedisOutOfMemory(error)
    return None


async def enqueue_many(
    client: aioredis.Redis,
    queue: str,
    envelopes: Sequence[Envelope],
    *,
    seen_ttl: float,
    shadow: bool = False,
) -> list[EnqueueResult]:
    """Dedup-and-append each envelope atomically, all in one pipeline; one result per envelope.

    Raises TransportError if Redis cannot be reached at all, or refuses writes as a whole
    (RedisReadOnly, RedisOutOfMemory); then nothing can be assumed appended, and the dedup markers
    make a retry safe.
    """
    target = shadow_key(queue) if shadow else stream_key(queue)
    marker = shadow_seen_key if shadow else seen_key
    ttl = max(1, int(seen_ttl))
    calls: list[tuple[Sequence[str], Sequence[str | int | float]]] = []
    for start in range(0, len(envelopes), ENQUEUE_CHUNK):
        chunk = envelopes[start : start + ENQUEUE_CHUNK]
        keys = [target] + [marker(queue, env.submission, env.generation) for env in chunk]
        # One JSON argument for the whole chunk: redis-py packs every argument in Python, and this
        # was most of the client's time; cjson decodes it in C inside Redis.
        rows = json.dumps([env.values() for env in chunk], separators=(",", ":"))
        calls.append((keys, [ttl, rows]))
    replies = await evalsha_many(client, ENQUEUE, calls)
    out: list[EnqueueResult] = []
    for (call_keys, _args), reply in zip(calls, replies, strict=True):
        if isinstance(reply, Exception):
            error = translate_redis_error(reply)
            if isinstance(error, (RedisReadOnly, RedisOutOfMemory)):
                raise error
            out += [EnqueueResult("error", error=str(error))] * (len(call_keys) - 1)
            continue
        assert isinstance(reply, list)
        for value in reply:
            if value == 0:
                out.append(EnqueueResult("duplicate"))
                continue
            text = _text(value)
            if text.startswith("!"):
                wide = _server_wide(text[1:])
                if wide is not None:
                    raise wide
                out.append(EnqueueResult("error", error=f"XADD failed: {text[1:]}"))
            else:
                out.append(EnqueueResult("appended", entry_id=text))
    return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def ensure_group(client: aioredis.Redis, queue: str, *, shadow: bool = False) -> None:
    """Create the ``workers`` group from ``0-0`` (with the stream); an existing group is fine.

    ``shadow``: on the shadow stream, where it starts from ``0-0`` too, so a queue that sent entries
    to it before any shadow worker ran has them all judged once one starts."""

    async def create() -> None:
        try:
            await client.xgroup_create(work_key(queue, shadow), GROUP, id="0-0", mkstream=True)
        except rexc.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    await guarded(create)


@dataclass(frozen=True)
class Delivery:
    """One entry read from the group: its id and decoded envelope (None if malformed)."""

    entry_id: str
    envelope: Envelope | None
    error: str | None = None


def decode_entries(entries: Sequence[tuple[bytes | str, dict[Any, Any] | None]]) -> list[Delivery]:
    out = []
    for entry_id, raw in entries:
        if raw is None:  # entry deleted while pending (XAUTOCLAIM reports those separately)
            continue
        try:
            out.append(Delivery(_text(entry_id), Envelope.parse(raw)))
        except MalformedEnvelope as exc:
            out.append(Delivery(_text(entry_id), None, str(exc)))
    return out


async def read(
    client: aioredis.Redis, queue: str, consumer: str, *, count: int, block_ms: int | None, shadow: bool = False
) -> list[Delivery]:
    """Read up to ``count`` new entries for ``consumer`` (XREADGROUP ... BLOCK ``block_ms``; None:
    answer at once, as a direct-intake worker's look at the stream does); ``shadow``: from the
    shadow stream (a shadow worker).

    A NOGROUP (the stream was deleted, e.g. a Redis restart without persistence, or no shadow worker
    ever read it) creates the group and reads again.
    """
    if count <= 0:
        return []
    key = work_key(queue, shadow)

    async def xreadgroup() -> Any:
        try:
            return await client.xreadgroup(GROUP, consumer, {key: ">"}, count=count, block=block_ms)
        except rexc.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        await ensure_group(client, queue, shadow=shadow)
        return await client.xreadgroup(GROUP, consumer, {key: ">"}, count=count, block=block_ms)

    reply = await guarded(xreadgroup)
    if not reply:
        return []
    # RESP2: [[stream, [(id, fields), ...]]]; RESP3: {stream: [[(id, fields), ...]]}
    entries: Any
    if isinstance(reply, dict):
        entries = next(iter(reply.values()))
        entries = entries[0] if entries and isinstance(entries[0], list) else entries
    else:
        entries = reply[0][1]
    return decode_entries(entries)


async def ack(
    client: aioredis.Redis, queue: str, entry_ids: Sequence[str], forget: Sequence[tuple[int, int]] = (),
    *, shadow: bool = False,
) -> int:
    """XACK and XDEL the entries in one script; returns how many were pending.

    ``forget``: (submission, generation) pairs whose dedup markers go in the same script. A worker
    passes the pairs of the entries it acks: from then on the lease (or the generation that made
    the entry stale) owns the submission, and a later append of the same pair (a re-send after a
    lost mark) is acked as a stale envelope, never judged again. Without this the markers of every
    dispatched job stay for ``seen_ttl`` (24 h by default): Redis memory then grows with the
    submission rate, about 140 bytes per job (docs/performance.md, soak). ``shadow``: entries of the
    shadow stream, and their shadow markers.
    """
    if not entry_ids:
        return 0
    marker = shadow_seen_key if shadow else seen_key
    keys = [work_key(queue, shadow), *(marker(queue, s, g) for s, g in forget)]
    return int(await run_script(client, ACK, keys, [GROUP, *entry_ids]))


async def ack_pending(
    client: aioredis.Redis, queue: str, consumer: str, entry_ids: Sequence[str],
    forget: Sequence[tuple[int, int]] = (), *, shadow: bool = True,
) -> int:
    """Ack and delete the entries still pending for ``consumer`` (a give-up: another consumer that
    took one over acts on it instead); returns how many."""
    if not entry_ids:
        return 0
    marker = shadow_seen_key if shadow else seen_key
    keys = [work_key(queue, shadow), *(marker(queue, s, g) for s, g in forget)]
    return int(await run_script(client, ACK_PENDING, keys, [GROUP, consumer, *entry_ids]))


@dataclass(frozen=True)
class ClaimedEntry:
    """An idle pending entry claimed to a consumer, with who held it before."""

    entry_id: str
    fields: dict[str, str] | None  # None: deleted from the stream while pending
    last_consumer: str
    times_delivered: int


@dataclass(frozen=True)
class ClaimedBatch:
    cursor: str  # "0-0" when the scan is complete
    entries: list[ClaimedEntry]
    deleted: int  # pending ids whose entry no longer existed, acked


def _lossy_text(value: Any) -> str:
    # Field names and values a foreign client wrote may be any bytes; the envelope codec decides.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _claimed_fields(raw: Any) -> dict[str, str] | None:
    """A flat [field, value, ...] list (as the claim script returns it) as a dict; None if absent."""
    if raw is None or raw is False:
        return None
    if isinstance(raw, dict):  # an empty Lua table encodes as {}
        return {_lossy_text(k): _lossy_text(v) for k, v in raw.items()}
    return {_lossy_text(raw[i]): _lossy_text(raw[i + 1]) for i in range(0, len(raw) - 1, 2)}


async def claim_idle(
    client: aioredis.Redis, queue: str, consumer: str, *, min_idle_ms: int, cursor: str, count: int,
    shadow: bool = False,
) -> ClaimedBatch:
    """Claim up to ``count`` entries idle at least ``min_idle_ms`` to ``consumer``, from ``cursor``
    (of the shadow stream with ``shadow``)."""
    [reply] = await evalsha_many(
        client, CLAIM, [([work_key(queue, shadow)], [GROUP, consumer, max(1, min_idle_ms), cursor, count])]
    )
    if isinstance(reply, Exception):
        if "NOGROUP" in str(reply):
            return ClaimedBatch("0-0", [], 0)  # no stream or group yet: nothing is pending
        raise translate_redis_error(reply)
    next_cursor, raw_entries, deleted = json.loads(_lossy_text(reply))
    entries = [
        ClaimedEntry(_lossy_text(e[0]), _claimed_fields(e[1]), _lossy_text(e[2] or ""), int(e[3] or 0))
        for e in (raw_entries or [])  # an empty Lua table encodes as {}
    ]
    return ClaimedBatch(str(next_cursor), entries, int(deleted))


async def requeue(
    client: aioredis.Redis, queue: str, consumer: str, entries: Sequence[tuple[str, Envelope]], *, shadow: bool = False
) -> tuple[int, int]:
    """Replace each entry still pending for ``consumer`` by a new one carrying its envelope.

    Returns (requeued, skipped: no longer pending for ``consumer``).
    """
    if not entries:
        return 0, 0
    args: list[str | int | float] = [GROUP, consumer, ",".join(ENVELOPE_FIELDS)]
    for entry_id, envelope in entries:
        args += [entry_id, envelope.packed()]
    done, skipped = await run_script(client, REQUEUE, [work_key(queue, shadow)], args)
    return int(done), int(skipped)


async def idle_consumers(client: aioredis.Redis, queue: str, *, idle_ms: int, shadow: bool = False) -> list[str]:
    """Consumers of the group idle longer than ``idle_ms`` with nothing pending (candidates to delete)."""

    async def info() -> list[dict[Any, Any]]:
        try:
            return list(await client.xinfo_consumers(work_key(queue, shadow), GROUP))
        except rexc.ResponseError as exc:
            if "NOGROUP" in str(exc) or "no such key" in str(exc).lower():
                return []
            raise

    def number(c: dict[Any, Any], name: str) -> int:
        return int(c.get(name, c.get(name.encode(), 0)) or 0)

    return [
        _lossy_text(c.get("name", c.get(b"name")))
        for c in await guarded(info)
        if number(c, "pending") == 0 and number(c, "idle") > idle_ms
    ]


async def delete_idle_consumers(
    client: aioredis.Redis, queue: str, names: Sequence[str], *, shadow: bool = False
) -> int:
    """Delete those of ``names`` that hold no pending entry at this instant; returns how many."""
    if not names:
        return 0
    return int(await run_script(client, DELETE_IDLE_CONSUMERS, [work_key(queue, shadow)], [GROUP, *names]))


async def trim_older_than(client: aioredis.Redis, key: str, *, min_id_ms: int) -> int:
    """XTRIM ``key`` MINID ``min_id_ms``: the entries appended before that Redis time; returns how
    many went. For the shadow stream only: its entries past the retention
    are worth nothing (their shadow verdicts would be pruned at once), and a queue may send to it
    for a long time before any shadow worker reads it."""
    return int(await guarded(lambda: client.xtrim(key, minid=f"{max(0, min_id_ms)}-0", approximate=False)))
