"""How much work a queue has waiting: the figure the operator's autoscaler scales workers on.

Backlog = outbox rows not yet in Redis (``PENDING`` + ``CLAIMED``) + stream entries not yet delivered
to the ``workers`` group (lag) + entries delivered but not acknowledged (the PEL). Workers delete
entries once acknowledged (XACK + XDEL), which makes Redis report the group's lag as NULL; the lag is
then ``XLEN - PEL``, exact for this stream because only undelivered and pending entries remain in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from .outbox import stats

GROUP = "workers"


def stream_key(queue: str) -> str:
    return f"jq:{{{queue}}}:stream"


@dataclass(frozen=True)
class Backlog:
    outbox_pending: int  # outbox rows PENDING or CLAIMED
    stream_lag: int  # stream entries the group has not read yet
    pel: int  # entries read but not acknowledged

    @property
    def total(self) -> int:
        return self.outbox_pending + self.stream_lag + self.pel


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field(group: dict[Any, Any], name: str) -> Any:
    if name in group:
        return group[name]
    return group.get(name.encode())


async def stream_backlog(redis: aioredis.Redis, queue: str) -> tuple[int, int]:
    """(lag, PEL size) of the ``workers`` group; (0, 0) if the stream or the group does not exist yet."""
    key = stream_key(queue)
    try:
        groups = await redis.xinfo_groups(key)
    except ResponseError as exc:
        if "no such key" in str(exc).lower():
            return 0, 0
        raise
    for group in groups:
        if _text(_field(group, "name")) != GROUP:
            continue
        pel = int(_field(group, "pending") or 0)
        lag = _field(group, "lag")
        if lag is None:
            length = int(await redis.xlen(key))
            lag = max(length - pel, 0)
        return int(lag), pel
    return 0, 0


async def read_backlog(conn: asyncpg.Connection, redis: aioredis.Redis, queue: str) -> Backlog:
    """The queue's backlog from Postgres and Redis (raises if either is unreachable)."""
    outbox = await stats(conn, queue)
    lag, pel = await stream_backlog(redis, queue)
    return Backlog(
        outbox_pending=outbox.by_state.get("PENDING", 0) + outbox.by_state.get("CLAIMED", 0),
        stream_lag=lag,
        pel=pel,
    )
