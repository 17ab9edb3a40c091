"""Fleet-wide flow control for the endpoints a queue's jobs call: a bound on calls at once and a
rate, shared by every worker of the queue through Redis (docs/agent-jobs.md).

Per endpoint two keys under the queue's prefix (so a worker's ACL user, ``~jq:{<queue>}:*``,
reaches them and nothing else, and one function touches one cluster slot):

* ``jq:{<queue>}:endpoint:<name>:holders``: a sorted set of the calls holding a slot, each scored
  by its lease's expiry (milliseconds, the Redis server's clock). A holder renews its lease while
  its call runs and removes itself when it ends; a worker killed mid-call stops renewing, and its
  slot is free once the lease expires: every acquire first drops the expired holders, so a slot
  never leaks. The bound is checked and the holder added in one function, so concurrent acquirers
  never exceed it.
* ``jq:{<queue>}:endpoint:<name>:rate``: a token bucket (``tokens``, ``at``) refilled at the
  endpoint's rate up to its burst; a call takes one token when it takes its slot.
* ``jq:{<queue>}:endpoint:<name>:moved``: when a slot was last taken or freed. A refused acquire
  says how long ago that was, so a worker can tell an endpoint whose calls are ending (worth
  waiting for) from one whose calls all hang (not worth holding a worker slot for).

Both keys expire on their own once idle (nothing grows without bound). All times are the Redis
server's (``TIME``), so workers' clocks never disagree about a lease.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis

from ..base.names import validate_queue_name
from .redis_scripts import run_script, script

# KEYS: holders, bucket, moved. ARGV: holder, bound, lease (ms), rate (calls per second, 0: none),
# burst. Returns {1, 0, held} (granted: the holder holds a slot until now + lease), or
# {0, ms, why, held, idle} (refused): why = 'bound' (every slot held; ms: until the earliest lease
# expires, at the latest) or 'rate' (no token; ms: until one is due); idle: ms since a slot was last
# taken or freed (-1: not known). A holder already holding gets its lease renewed.
ACQUIRE = script("endpoint_acquire", """
local holders, bucket, moved = KEYS[1], KEYS[2], KEYS[3]
local holder, bound, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local rate, burst = tonumber(ARGV[4]), tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
local held = redis.call('ZCARD', holders)
local last = tonumber(redis.call('GET', moved))
local idle = last and (now - last) or -1
if not redis.call('ZSCORE', holders, holder) then
  if held >= bound then
    local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
    return {0, tonumber(first[2]) - now, 'bound', held, idle}
  end
  if rate > 0 then
    local b = redis.call('HMGET', bucket, 'tokens', 'at')
    local tokens, at = tonumber(b[1]) or burst, tonumber(b[2]) or now
    tokens = math.min(burst, tokens + math.max(now - at, 0) * rate / 1000)
    if tokens < 1 then
      return {0, math.ceil((1 - tokens) * 1000 / rate), 'rate', held, idle}
    end
    redis.call('HSET', bucket, 'tokens', tostring(tokens - 1), 'at', tostring(now))
    redis.call('PEXPIRE', bucket, math.ceil(burst * 1000 / rate) + 1000)
  end
  held = held + 1
  redis.call('SET', moved, now, 'PX', 600000)
end
redis.call('ZADD', holders, now + lease, holder)
local latest = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', holders, tonumber(latest[2]) - now + 1000)
return {1, 0, held}
""")

# KEYS: holders. ARGV: holder, lease (ms). Renews the holder's lease if it still holds its slot
# (1), else 0: its lease expired and the slot may be someone else's now.
RENEW = script("endpoint_renew", """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now + 1000)
return 1
""")

# KEYS: holders, moved. ARGV: holder. Frees the holder's slot; 1 if it held one.
RELEASE = script("endpoint_release", """
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if removed == 1 then
  local t = redis.call('TIME')
  redis.call('SET', KEYS[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), 'PX', 600000)
end
return removed
""")


def endpoint_keys(queue: str, endpoint: str) -> tuple[str, str, str]:
    """The holders set, the rate bucket and the last move of ``endpoint`` in ``queue`` (one hash
    tag: one cluster slot)."""
    validate_queue_name(queue)
    prefix = f"jq:{{{queue}}}:endpoint:{endpoint}"
    return f"{prefix}:holders", f"{prefix}:rate", f"{prefix}:moved"


@dataclass(frozen=True)
class Limits:
    """An endpoint's fleet-wide flow control: ``bound`` calls at once, and at most ``rate`` calls a
    second (0: no rate limit) with bursts of up to ``burst`` calls."""

    bound: int
    rate: float = 0.0
    burst: int = 1


@dataclass(frozen=True)
class Grant:
    """An acquire's answer: ``granted``, or refused because of ``why`` (``bound`` or ``rate``) with
    ``retry_in`` seconds until a try could succeed at the earliest (a token due) or at the latest
    (the earliest lease expires: a release comes sooner). ``held``: the slots held afterwards;
    ``idle``: seconds since any slot was taken or freed (None: not known)."""

    granted: bool
    retry_in: float
    why: str
    held: int
    idle: float | None = None


class EndpointSlots:
    """The fleet's slots of the endpoints of one Redis, for any queue its client may reach."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis

    async def acquire(self, queue: str, endpoint: str, holder: str, limits: Limits, lease: float) -> Grant:
        """Take a slot for ``holder`` (a unique id per call) for ``lease`` seconds, if the bound and
        the rate allow it now; never waits. Raises :class:`TransportError` when Redis does not answer."""
        reply = await run_script(
            self.redis, ACQUIRE, list(endpoint_keys(queue, endpoint)),
            [holder, limits.bound, max(1, round(lease * 1000)), repr(float(limits.rate)), max(1, limits.burst)],
        )  # fmt: skip
        if int(reply[0]) == 1:
            return Grant(True, 0.0, "", int(reply[2]))
        why = reply[2].decode() if isinstance(reply[2], bytes) else str(reply[2])
        idle = int(reply[4])
        return Grant(False, max(0.0, int(reply[1]) / 1000), why, int(reply[3]), idle / 1000 if idle >= 0 else None)

    async def renew(self, queue: str, endpoint: str, holder: str, lease: float) -> bool:
        """Extend ``holder``'s lease by ``lease`` seconds from now; False if it no longer holds a slot."""
        holders, _, _ = endpoint_keys(queue, endpoint)
        return int(await run_script(self.redis, RENEW, [holders], [holder, max(1, round(lease * 1000))])) == 1

    async def release(self, queue: str, endpoint: str, holder: str) -> bool:
        """Free ``holder``'s slot; False if it held none (its lease had expired)."""
        holders, _, moved = endpoint_keys(queue, endpoint)
        return int(await run_script(self.redis, RELEASE, [holders, moved], [holder])) == 1

    async def holders(self, queue: str, endpoint: str) -> int:
        """Slots held now, counting leases not yet dropped even if expired (for tests and figures)."""
        key, _, _ = endpoint_keys(queue, endpoint)
        return int(await self.redis.zcard(key))
