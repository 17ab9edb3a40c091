"""The Redis Streams transport: key layout, thin envelope, atomic dedup-and-append, consume, ack.

Every key of a queue shares the hash tag ``{<queue>}`` so each Lua script touches one slot and the
same code runs on Redis Cluster. A stream entry carries ids only; the payload stays in Postgres.

Redis failures surface as :class:`TransportError` subclasses so callers can tell "try again later"
(the outbox row stays retryable) from a bug.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import redis.asyncio as aioredis
import redis.exceptions as rexc

from .errors import TransportError

GROUP = "workers"


class RedisUnavailable(TransportError):
    """Connection refused, reset or timed out."""


class RedisReadOnly(TransportError):
    """The server is a replica (READONLY), e.g. during a failover."""


class RedisOutOfMemory(TransportError):
    """The server refused a write under maxmemory (OOM)."""


class RedisCommandError(TransportError):
    """Any other error reply."""


class MalformedEnvelope(ValueError):
    """A stream entry that is not a judgequeue envelope (foreign writer or corruption)."""


def stream_key(queue: str) -> str:
    return f"jq:{{{queue}}}:stream"


def shadow_key(queue: str) -> str:
    return f"jq:{{{queue}}}:shadow"


def dlq_key(queue: str) -> str:
    return f"jq:{{{queue}}}:dlq"


def seen_key(queue: str, submission: int, generation: int) -> str:
    return f"jq:{{{queue}}}:seen:{submission}:{generation}"


def shadow_seen_key(queue: str, submission: int, generation: int) -> str:
    # Separate from the live marker: a shadow append must never make a later live append of the
    # same (submission, generation) look like a duplicate.
    return f"jq:{{{queue}}}:shadow-seen:{submission}:{generation}"


def translate_redis_error(exc: BaseException) -> TransportError:
    """Map a redis-py exception to judgequeue's typed transport errors.

    redis-py strips the error code (``OOM``, ``READONLY``) from the messages of the classes it maps
    them to; it is put back so logs and ``last_error`` say what happened.
    """
    message = str(exc) or type(exc).__name__
    if isinstance(exc, rexc.ReadOnlyError) or message.startswith("READONLY"):
        return RedisReadOnly(message if message.startswith("READONLY") else f"READONLY {message}")
    if isinstance(exc, rexc.OutOfMemoryError) or message.startswith("OOM"):
        return RedisOutOfMemory(message if message.startswith("OOM") else f"OOM {message}")
    if isinstance(exc, (rexc.ConnectionError, rexc.TimeoutError, ConnectionError, TimeoutError, OSError)):
        return RedisUnavailable(message)
    return RedisCommandError(message)


T = TypeVar("T")


async def guarded(call: Callable[[], Awaitable[T]]) -> T:
    """Run a Redis call, turning redis-py errors into :class:`TransportError`."""
    try:
        return await call()
    except TransportError:
        raise
    except (rexc.RedisError, ConnectionError, TimeoutError, OSError) as exc:
        raise translate_redis_error(exc) from exc


@dataclass(frozen=True)
class Envelope:
    """What a stream entry carries: ids only."""

    submission: int
    generation: int
    attempt: int  # the outbox row's dispatch attempt that appended it
    outbox: int
    enqueued_at: float  # unix seconds, informational
    deliveries: int = 1

    def fields(self) -> dict[str, str]:
        return {
            "submission": str(self.submission),
            "generation": str(self.generation),
            "attempt": str(self.attempt),
            "outbox": str(self.outbox),
            "enqueued_at": f"{self.enqueued_at:.6f}",
            "deliveries": str(self.deliveries),
        }

    def packed(self) -> str:
        """The values of :meth:`fields`, in ``ENVELOPE_FIELDS`` order, joined by commas (requeue script)."""
        return ",".join(str(v) for v in self.values())

    def values(self) -> list[str | int]:
        """The values of :meth:`fields`, in ``ENVELOPE_FIELDS`` order (the enqueue script's arguments)."""
        return [self.submission, self.generation, self.attempt, self.outbox, f"{self.enqueued_at:.6f}", self.deliveries]

    @classmethod
    def parse(cls, raw: object) -> Envelope:
        """Decode a stream entry, or raise MalformedEnvelope naming what is wrong.

        Total: whatever a foreign client wrote (any bytes, missing or extra fields, numbers past
        bigint), the result is an envelope whose every id fits Postgres's ``bigint`` or a
        :class:`MalformedEnvelope`, never another exception. Field names other than the six are
        ignored (room for later versions).
        """
        if not isinstance(raw, dict):
            raise MalformedEnvelope(f"entry is a {type(raw).__name__}, not a field map")
        fields: dict[str, object] = {}
        for key, value in raw.items():
            fields[_ascii(key, "a field name")] = value

        def field(name: str) -> str:
            if name not in fields:
                raise MalformedEnvelope(f"entry has no {name!r} field")
            return _ascii(fields[name], f"field {name!r}")

        return cls(
            submission=parse_id(field("submission"), "submission", minimum=1),
            generation=parse_id(field("generation"), "generation"),
            attempt=parse_id(field("attempt"), "attempt"),
            outbox=parse_id(field("outbox"), "outbox"),
            enqueued_at=_parse_time(field("enqueued_at")),
            deliveries=parse_id(field("deliveries"), "deliveries", minimum=1),
        )


#: The largest value of Postgres's ``bigint``, which every id of an envelope must fit.
BIGINT_MAX = 2**63 - 1
_DIGITS = re.compile(r"[0-9]{1,19}")
_SECONDS = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")


def _ascii(value: object, what: str) -> str:
    """Text of an envelope name or value; envelopes are ASCII throughout."""
    if isinstance(value, bytes):
        try:
            return value.decode("ascii")
        except UnicodeDecodeError:
            raise MalformedEnvelope(f"{what} is not ASCII text: {value[:40]!r}") from None
    if isinstance(value, str) and value.isascii():
        return value
    raise MalformedEnvelope(f"{what} is not ASCII text: {value!r:.60}")


def parse_id(text: str, name: str, *, minimum: int = 0) -> int:
    """A decimal id in ``[minimum, BIGINT_MAX]``, or MalformedEnvelope naming the field (pure)."""
    if _DIGITS.fullmatch(text) is None:
        raise MalformedEnvelope(f"field {name!r} is not a decimal number of at most 19 digits: {text[:40]!r}")
    value = int(text)
    if not minimum <= value <= BIGINT_MAX:
        raise MalformedEnvelope(f"field {name!r} is out of range [{minimum}, 2^63-1]: {text}")
    return value


def _parse_time(text: str) -> float:
    if _SECONDS.fullmatch(text) is None:
        raise MalformedEnvelope(f"field 'enqueued_at' is not unix seconds: {text[:40]!r}")
    return float(text)


# KEYS: seen marker, stream. ARGV: marker TTL (seconds), then the entry's field/value pairs.
# Returns {1, id} when appended, {0, ""} for a duplicate (already appended: success), or an error
# reply after removing the marker, so a failed XADD never leaves a "seen" behind.
ENQUEUE_LUA = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  return {0, ''}
end
local id = redis.pcall('XADD', KEYS[2], '*', unpack(ARGV, 2))
if type(id) == 'table' and id.err then
  redis.call('DEL', KEYS[1])
  return redis.error_reply('XADD failed: ' .. id.err)
end
return {1, id}
"""

# KEYS: stream. ARGV: entry ids. Ack and delete together so acked entries never pile up.
ACK_LUA = """
local acked = redis.call('XACK', KEYS[1], 'workers', unpack(ARGV))
redis.call('XDEL', KEYS[1], unpack(ARGV))
return acked
"""

# The batched form of ENQUEUE_LUA: one EVALSHA appends many envelopes of one queue, with the same
# per-entry semantics: SET seen NX EX, then XADD; a failed XADD removes its marker. KEYS: stream,
# then one seen marker per entry. ARGV: TTL, then every envelope's values as one JSON array of
# arrays (ENVELOPE_FIELDS order). Returns one element per entry: the entry id (appended), 0
# (duplicate: already appended, success) or "!<error>" (nothing of that entry is left behind).
# A server-wide refusal (OOM, READONLY) aborts the script as a whole; the caller retries the batch
# and the markers absorb what was appended before it.
ENQUEUE_BATCH_LUA = """
local ttl = ARGV[1]
local rows = cjson.decode(ARGV[2])
local out = {}
for i = 2, #KEYS do
  local r = rows[i - 1]
  if redis.call('SET', KEYS[i], '1', 'NX', 'EX', ttl) then
    local id = redis.pcall('XADD', KEYS[1], '*', 'submission', r[1], 'generation', r[2], 'attempt', r[3],
      'outbox', r[4], 'enqueued_at', r[5], 'deliveries', r[6])
    if type(id) == 'table' then
      redis.call('DEL', KEYS[i])
      out[i - 1] = '!' .. id.err
    else
      out[i - 1] = id
    end
  else
    out[i - 1] = 0
  end
end
return out
"""

# Reaper, step 1. KEYS: stream. ARGV: reaper consumer, min idle (ms), start cursor, count.
# Reads who held each idle entry (XPENDING IDLE) and claims the batch to the reaper's own consumer
# (XAUTOCLAIM) in one atomic step; ids of entries deleted while pending are acked here.
# Returns JSON (one parse on the client instead of a deep RESP reply):
# [next cursor, [[id, [field, value, ...] or false, last consumer, times delivered], ...], #deleted].
CLAIM_LUA = """
local stream, consumer, idle, start, count = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local owners = {}
for _, p in ipairs(redis.call('XPENDING', stream, 'workers', 'IDLE', idle, start, '+', count)) do
  owners[p[1]] = {p[2], p[4]}
end
local reply = redis.call('XAUTOCLAIM', stream, 'workers', consumer, idle, start, 'COUNT', count)
local out = {}
for _, e in ipairs(reply[2]) do
  if e then
    local o = owners[e[1]] or {'', 0}
    out[#out + 1] = {e[1], e[2] or false, o[1], o[2]}
  end
end
local deleted = reply[3] or {}
if #deleted > 0 then
  redis.call('XACK', stream, 'workers', unpack(deleted))
end
return cjson.encode({reply[1], out, #deleted})
"""

# Reaper, requeue. KEYS: stream. ARGV: reaper consumer, the field names joined by ",", then per
# entry its id and the new entry's (numeric) values joined by "," (deliveries already +1; stream
# entries are immutable, so the values the claim returned are the entry's). For each entry still
# pending for this reaper's consumer (a slower reaper whose claim was taken over acts on nothing):
# append the new entry, then XACK and XDEL the originals in one call each. Returns {requeued, skipped}.
REQUEUE_LUA = """
local stream, consumer = KEYS[1], ARGV[1]
local names = {}
for name in string.gmatch(ARGV[2], '[^,]+') do names[#names + 1] = name end
local owned = {}
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  if #redis.call('XPENDING', stream, 'workers', id, id, 1, consumer) == 1 then
    local fields, j = {}, 0
    for value in string.gmatch(ARGV[i + 1], '[^,]+') do
      j = j + 1
      fields[#fields + 1] = names[j]
      fields[#fields + 1] = value
    end
    redis.call('XADD', stream, '*', unpack(fields))
    owned[#owned + 1] = id
  end
end
if #owned > 0 then
  redis.call('XACK', stream, 'workers', unpack(owned))
  redis.call('XDEL', stream, unpack(owned))
end
return {#owned, (#ARGV - 2) / 2 - #owned}
"""

# Reaper, dead-letter. KEYS: stream, dlq, then one marker per entry (jq:{q}:dead:<id>).
# ARGV: reaper consumer, marker TTL (s), DLQ approximate max length, then per entry 5 values:
# id, reason, last consumer, deliveries, Postgres outcome. For each entry still pending for this
# reaper: unless its marker exists, add a DLQ entry (meta fields + the original fields prefixed
# "entry.") and set the marker; then XACK and XDEL the original. Returns {dead, again, skipped}.
DEAD_LETTER_LUA = """
local stream, dlq = KEYS[1], KEYS[2]
local consumer, ttl, maxlen = ARGV[1], ARGV[2], ARGV[3]
local dead, again, skipped = 0, 0, 0
for i = 3, #KEYS do
  local b = 3 + (i - 3) * 5
  local id = ARGV[b + 1]
  if #redis.call('XPENDING', stream, 'workers', id, id, 1, consumer) == 0 then
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
    redis.call('XACK', stream, 'workers', id)
    redis.call('XDEL', stream, id)
  end
end
return {dead, again, skipped}
"""

# Idle consumers. KEYS: stream. ARGV: consumer names. Deletes each consumer only if it holds no
# pending entry at this instant (XGROUP DELCONSUMER would drop its pending entries otherwise).
DELETE_IDLE_CONSUMERS_LUA = """
local removed = 0
for i = 1, #ARGV do
  if #redis.call('XPENDING', KEYS[1], 'workers', '-', '+', 1, ARGV[i]) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], 'workers', ARGV[i])
    removed = removed + 1
  end
end
return removed
"""

_SCRIPTS: dict[str, str] = {
    "enqueue": ENQUEUE_LUA,
    "enqueue_batch": ENQUEUE_BATCH_LUA,
    "ack": ACK_LUA,
    "claim": CLAIM_LUA,
    "requeue": REQUEUE_LUA,
    "dead_letter": DEAD_LETTER_LUA,
    "delete_idle_consumers": DELETE_IDLE_CONSUMERS_LUA,
}
_SHAS: dict[str, str] = {}


def script_sha(name: str) -> str:
    if name not in _SHAS:
        import hashlib

        _SHAS[name] = hashlib.sha1(_SCRIPTS[name].encode()).hexdigest()
    return _SHAS[name]


async def load_scripts(client: aioredis.Redis) -> None:
    """SCRIPT LOAD every script (on every primary when ``client`` is a cluster client)."""
    for name, body in _SCRIPTS.items():
        sha = await guarded(lambda body=body: client.script_load(body))  # type: ignore[misc]
        _SHAS[name] = sha


def _is_noscript(result: object) -> bool:
    return isinstance(result, rexc.NoScriptError) or (
        isinstance(result, rexc.ResponseError) and str(result).startswith("NOSCRIPT")
    )


async def evalsha_many(
    client: aioredis.Redis, script: str, calls: Sequence[tuple[Sequence[str], Sequence[str | int | float]]]
) -> list[object]:
    """Run one script once per (keys, args) in a single pipeline; return each call's result or error.

    A NOSCRIPT (server restarted or flushed its script cache) loads the script and retries only the
    calls that hit it. Connection-level failures raise :class:`TransportError`.
    """
    results: list[object] = [None] * len(calls)
    todo = list(range(len(calls)))
    for _ in range(2):
        sha = script_sha(script)

        async def run(indexes: list[int] = todo, sha: str = sha) -> list[object]:
            if len(indexes) == 1:
                # The common case (a trickle, one ack): a plain call skips the pipeline's setup,
                # a measurable share of the commit-to-start latency. Command errors come back as
                # values, exactly as from the pipeline below.
                keys, args = calls[indexes[0]]
                try:
                    return [await client.execute_command("EVALSHA", sha, len(keys), *keys, *args)]  # type: ignore[no-untyped-call]
                except rexc.ResponseError as exc:
                    return [exc]
            async with client.pipeline(transaction=False) as pipe:
                for i in indexes:
                    keys, args = calls[i]
                    # execute_command, not pipe.evalsha: a cluster pipeline blocks the latter but
                    # routes a raw EVALSHA by its keys (all in one slot thanks to the hash tag).
                    pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
                return list(await pipe.execute(raise_on_error=False))

        replies = await guarded(run)
        retry = []
        for i, reply in zip(todo, replies, strict=True):
            if _is_noscript(reply):
                retry.append(i)
            else:
                results[i] = reply
        if not retry:
            return results
        await load_scripts(client)
        todo = retry
    for i in todo:  # pragma: no cover - NOSCRIPT right after SCRIPT LOAD
        results[i] = RedisCommandError("NOSCRIPT persisted after SCRIPT LOAD")
    return results


EnqueueStatus = Literal["appended", "duplicate", "error"]


@dataclass(frozen=True)
class EnqueueResult:
    status: EnqueueStatus
    entry_id: str | None = None
    error: str | None = None


#: Envelopes per EVALSHA of the batched enqueue script (one pipeline carries all the batches).
ENQUEUE_CHUNK = 200

ENVELOPE_FIELDS = ("submission", "generation", "attempt", "outbox", "enqueued_at", "deliveries")


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
    replies = await evalsha_many(client, "enqueue_batch", calls)
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


async def ensure_group(client: aioredis.Redis, queue: str) -> None:
    """Create the ``workers`` group from ``0-0`` (with the stream); an existing group is fine."""
    try:
        await client.xgroup_create(stream_key(queue), GROUP, id="0-0", mkstream=True)
    except rexc.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise translate_redis_error(exc) from exc
    except (rexc.RedisError, OSError) as exc:
        raise translate_redis_error(exc) from exc


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


async def read(client: aioredis.Redis, queue: str, consumer: str, *, count: int, block_ms: int) -> list[Delivery]:
    """Read up to ``count`` new entries for ``consumer`` (XREADGROUP ... BLOCK).

    A NOGROUP (the stream was deleted, e.g. a Redis restart without persistence) recreates the group
    and reads again.
    """
    if count <= 0:
        return []
    for attempt in range(2):
        try:
            reply = await client.xreadgroup(GROUP, consumer, {stream_key(queue): ">"}, count=count, block=block_ms)
        except rexc.ResponseError as exc:
            if "NOGROUP" in str(exc) and attempt == 0:
                await ensure_group(client, queue)
                continue
            raise translate_redis_error(exc) from exc
        except (rexc.RedisError, OSError) as exc:
            raise translate_redis_error(exc) from exc
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
    return []


async def ack(client: aioredis.Redis, queue: str, entry_ids: Sequence[str]) -> int:
    """XACK and XDEL the entries in one script; returns how many were pending."""
    if not entry_ids:
        return 0
    [reply] = await evalsha_many(client, "ack", [([stream_key(queue)], list(entry_ids))])
    if isinstance(reply, Exception):
        raise translate_redis_error(reply)
    assert isinstance(reply, int)
    return reply


async def nack(client: aioredis.Redis, queue: str, entry_ids: Sequence[str]) -> None:
    """Give up on entries without acking: they stay in the PEL and the reaper decides their fate."""
    return None


def now() -> float:
    return time.time()
