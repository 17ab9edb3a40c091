"""The Redis Streams transport: key layout, thin envelope, atomic dedup-and-append, consume, ack.

Every key of a queue shares the hash tag ``{<queue>}`` so each Lua script touches one slot and the
same code runs on Redis Cluster. A stream entry carries ids only; the payload stays in Postgres.

Redis failures surface as :class:`TransportError` subclasses so callers can tell "try again later"
(the outbox row stays retryable) from a bug.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import redis.asyncio as aioredis
import redis.exceptions as rexc

from ..base.errors import TransportError
from .envelope import ENVELOPE_FIELDS, Envelope, MalformedEnvelope

GROUP = "workers"


class RedisUnavailable(TransportError):
    """Connection refused, reset or timed out."""


class RedisReadOnly(TransportError):
    """The server is a replica (READONLY), e.g. during a failover."""


class RedisOutOfMemory(TransportError):
    """The server refused a write under maxmemory (OOM)."""


class RedisCommandError(TransportError):
    """Any other error reply."""


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


def closed_transport(exc: BaseException) -> bool:
    """Whether ``exc`` is uvloop refusing a write on a connection the peer reset (pure).

    Under uvloop (the roles' loop) a TCP RST closes the transport at once, and redis-py's next write
    on it raises ``RuntimeError: unable to perform operation on <TCPTransport closed=True ...>; the
    handler is closed`` instead of an OSError (asyncio's loop drops the write and the read fails with
    a ConnectionError). redis-py has already disconnected that connection, so the next call
    reconnects: it is Redis unavailable for this call, not a bug.
    """
    return isinstance(exc, RuntimeError) and "handler is closed" in str(exc)


T = TypeVar("T")


def transport_error(exc: BaseException) -> TransportError | None:
    """The :class:`TransportError` a failed Redis call means, or None when it is not one (a bug).

    One place for the whole mapping: redis-py's errors, socket errors and timeouts, and uvloop's
    refusal to write on a connection the peer reset (:func:`closed_transport`).
    """
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, (rexc.RedisError, ConnectionError, TimeoutError, OSError)):
        return translate_redis_error(exc)
    if closed_transport(exc):
        return RedisUnavailable(str(exc))
    return None


async def guarded(call: Callable[[], Awaitable[T]]) -> T:
    """Run a Redis call, turning redis-py errors into :class:`TransportError`."""
    try:
        return await call()
    except Exception as exc:
        mapped = transport_error(exc)
        if mapped is None or mapped is exc:
            raise
        raise mapped from exc


@dataclass(frozen=True)
class Script:
    """A Lua script run as a Redis function (FCALL), loaded on demand when the server does not have it.

    Each script is a function library of its own, named after the script and its text's digest
    (``jq_<name>_<sha1[:8]>``): two versions side by side in a rolling upgrade each call their own,
    and loading one never replaces another. Roles need ``FCALL`` and the commands the script runs,
    never ``EVAL`` (which would run any script); loading takes ``FUNCTION LOAD``, which only the
    migrator's (or a quick start's) user holds. Every script is registered by :func:`script` in the
    module that owns its typed wrapper, so :func:`load_scripts` can preload them all (on every
    primary of a cluster).
    """

    name: str
    body: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.body.encode()).hexdigest())

    @property
    def function(self) -> str:
        return f"jq_{self.name}_{self.sha[:8]}"

    @property
    def library(self) -> str:
        """The function library's code: the script as the body of its one function."""
        return (
            f"#!lua name={self.function}\n"
            f"redis.register_function('{self.function}', function(KEYS, ARGV)\n{self.body}\nend)\n"
        )


_REGISTRY: dict[str, Script] = {}


def script(name: str, body: str) -> Script:
    """Register a script under ``name`` (the names are unique) and return it."""
    if name in _REGISTRY and _REGISTRY[name].body != body:
        raise ValueError(f"two different scripts named {name!r}")
    _REGISTRY[name] = found = Script(name, body)
    return found


# Each script takes the consumer group's name as an argument: nothing in Lua names it.

# The batched dedup-and-append. KEYS: stream, then one seen marker per entry. ARGV: TTL, then every
# envelope's values as one JSON array of arrays (ENVELOPE_FIELDS order). For each entry: SET seen NX
# EX, then XADD; a failed XADD removes its marker. Returns one element per entry: the entry id
# (appended), 0 (duplicate: already appended, success) or "!<error>" (nothing of that entry is left
# behind). A server-wide refusal (OOM, READONLY) aborts the script as a whole; the caller retries
# the batch and the markers absorb what was appended before it.
ENQUEUE = script("enqueue_batch", """
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
""")

# KEYS: stream. ARGV: group, then entry ids. Ack and delete together so acked entries never pile up.
ACK = script("ack", """
local acked = redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
if #KEYS > 1 then redis.call('DEL', unpack(KEYS, 2)) end
return acked
""")

# Reaper, step 1. KEYS: stream. ARGV: group, reaper consumer, min idle (ms), start cursor, count.
# Reads who held each idle entry (XPENDING IDLE) and claims the batch to the reaper's own consumer
# (XAUTOCLAIM) in one atomic step; ids of entries deleted while pending are acked here.
# Returns JSON (one parse on the client instead of a deep RESP reply):
# [next cursor, [[id, [field, value, ...] or false, last consumer, times delivered], ...], #deleted].
CLAIM = script("claim", """
local stream, group, consumer, idle, start, count = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local owners = {}
for _, p in ipairs(redis.call('XPENDING', stream, group, 'IDLE', idle, start, '+', count)) do
  owners[p[1]] = {p[2], p[4]}
end
local reply = redis.call('XAUTOCLAIM', stream, group, consumer, idle, start, 'COUNT', count)
local out = {}
for _, e in ipairs(reply[2]) do
  if e then
    local o = owners[e[1]] or {'', 0}
    out[#out + 1] = {e[1], e[2] or false, o[1], o[2]}
  end
end
local deleted = reply[3] or {}
if #deleted > 0 then
  redis.call('XACK', stream, group, unpack(deleted))
end
return cjson.encode({reply[1], out, #deleted})
""")

# Reaper, requeue. KEYS: stream. ARGV: group, reaper consumer, the field names joined by ",", then
# per entry its id and the new entry's (numeric) values joined by "," (stream entries are
# immutable, so the values the claim returned are the entry's). For each entry still pending for
# this reaper's consumer (a slower reaper whose claim was taken over acts on nothing): append the
# new entry, then XACK and XDEL the originals in one call each. Returns {requeued, skipped}.
REQUEUE = script("requeue", """
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local names = {}
for name in string.gmatch(ARGV[3], '[^,]+') do names[#names + 1] = name end
local owned = {}
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  if #redis.call('XPENDING', stream, group, id, id, 1, consumer) == 1 then
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
  redis.call('XACK', stream, group, unpack(owned))
  redis.call('XDEL', stream, unpack(owned))
end
return {#owned, (#ARGV - 3) / 2 - #owned}
""")

# Idle consumers. KEYS: stream. ARGV: group, then consumer names. Deletes each consumer only if it
# holds no pending entry at this instant (XGROUP DELCONSUMER would drop its pending entries).
DELETE_IDLE_CONSUMERS = script("delete_idle_consumers", """
local removed = 0
for i = 2, #ARGV do
  if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[i]) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[i])
    removed = removed + 1
  end
end
return removed
""")


# Giving up on shadow entries. KEYS: stream, then dedup markers to delete. ARGV: group, consumer, then
# entry ids. Acks and deletes the entries still pending for this consumer (another that took one over
# acts on it instead); returns how many. The shadow lane has no DLQ: what it gives up on is recorded
# in Postgres as a SYSTEM_ERROR shadow verdict before this runs.
ACK_PENDING = script("ack_pending", """
local owned = {}
for i = 3, #ARGV do
  if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2]) == 1 then
    owned[#owned + 1] = ARGV[i]
  end
end
if #owned > 0 then
  redis.call('XACK', KEYS[1], ARGV[1], unpack(owned))
  redis.call('XDEL', KEYS[1], unpack(owned))
end
if #KEYS > 1 then redis.call('DEL', unpack(KEYS, 2)) end
return #owned
""")


async def load_scripts(client: aioredis.Redis) -> None:
    """FUNCTION LOAD REPLACE every registered script (on every primary when ``client`` is a cluster client)."""
    for registered in list(_REGISTRY.values()):
        await guarded(lambda code=registered.library: client.function_load(code, replace=True))  # type: ignore[misc]


def registered_scripts() -> list[Script]:
    """Every script registered so far (``judgequeue roles`` and the migrator load them)."""
    return list(_REGISTRY.values())


def _is_noscript(result: object) -> bool:
    return isinstance(result, rexc.ResponseError) and "Function not found" in str(result)


async def evalsha_many(
    client: aioredis.Redis, lua: Script, calls: Sequence[tuple[Sequence[str], Sequence[str | int | float]]]
) -> list[object]:
    """Run one script once per (keys, args) in a single pipeline; return each call's result or error.

    A function the server does not have (a restart without persistence, a new version) is loaded
    and only the calls that hit it run again. Connection-level failures raise :class:`TransportError`.
    """
    results: list[object] = [None] * len(calls)
    todo = list(range(len(calls)))
    for _ in range(2):

        async def run(indexes: list[int] = todo) -> list[object]:
            if len(indexes) == 1:
                # The common case (a trickle, one ack): a plain call skips the pipeline's setup,
                # a measurable share of the commit-to-start latency. Command errors come back as
                # values, exactly as from the pipeline below.
                keys, args = calls[indexes[0]]
                try:
                    return [await client.execute_command("FCALL", lua.function, len(keys), *keys, *args)]  # type: ignore[no-untyped-call]
                except rexc.ResponseError as exc:
                    return [exc]
            async with client.pipeline(transaction=False) as pipe:
                for i in indexes:
                    keys, args = calls[i]
                    # execute_command, not pipe.fcall: a raw FCALL is routed by its keys (all in one
                    # slot thanks to the hash tag).
                    pipe.execute_command("FCALL", lua.function, len(keys), *keys, *args)
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
        await guarded(lambda: client.function_load(lua.library, replace=True))
        todo = retry
    for i in todo:  # pragma: no cover - not found right after FUNCTION LOAD
        results[i] = RedisCommandError(f"function {lua.function} not found after FUNCTION LOAD")
    return results


async def run_script(
    client: aioredis.Redis, lua: Script, keys: Sequence[str], args: Sequence[str | int | float]
) -> Any:
    """One call of ``lua``; an error reply raises the matching :class:`TransportError`."""
    [reply] = await evalsha_many(client, lua, [(keys, args)])
    if isinstance(reply, Exception):
        raise translate_redis_error(reply)
    return reply


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
