"""Read a queue's stream figures from Redis: length, lag, PEL, oldest idle, DLQ, shadow, consumers.

:func:`stream_figures` is shared by the reaper's gauges, ``judgequeue status`` and the operator's
backlog reader. It works with a plain or a cluster client (every key carries the queue's hash tag).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rexc

from ..base import metrics
from .redis_errors import guarded
from .streams import GROUP, dlq_key, shadow_key, stream_key


@dataclass(frozen=True)
class StreamFigures:
    """One reading of a queue's streams. ``lag_exact`` is False when Redis reported a NULL lag
    (after XDEL/XTRIM) and the lag was derived as ``length - pel``, which is exact for judgequeue
    streams because acked and requeued entries are deleted."""

    length: int
    lag: int
    lag_exact: bool
    pel: int
    oldest_idle: float  # seconds the oldest pending entry has been idle; 0 with an empty PEL
    dlq_length: int
    shadow_length: int
    consumers: int
    group_present: bool

    @property
    def backlog(self) -> int:
        """Stream entries not finished: undelivered (lag) plus delivered but unacked (PEL)."""
        return self.lag + self.pel


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _get(mapping: dict[Any, Any], name: str) -> Any:
    return mapping[name] if name in mapping else mapping.get(name.encode())


def derive_lag(reported: int | None, length: int, pel: int) -> tuple[int, bool]:
    """The group's lag and whether Redis reported it (pure). NULL lag -> ``length - pel``."""
    if reported is not None:
        return int(reported), True
    return max(length - pel, 0), False


async def stream_figures(redis: aioredis.Redis, queue: str) -> StreamFigures:
    """Read every stream figure of ``queue`` (raises TransportError when Redis fails)."""
    stream = stream_key(queue)

    async def lengths() -> list[Any]:
        async with redis.pipeline(transaction=False) as pipe:
            pipe.xlen(stream)
            pipe.xlen(dlq_key(queue))
            pipe.xlen(shadow_key(queue))
            return list(await pipe.execute())

    length, dlq, shadow = (int(v) for v in await guarded(lengths))

    async def groups() -> list[dict[Any, Any]]:
        try:
            return list(await redis.xinfo_groups(stream))
        except rexc.ResponseError as exc:
            if "no such key" in str(exc).lower():
                return []
            raise

    group = next((g for g in await guarded(groups) if _text(_get(g, "name")) == GROUP), None)
    if group is None:
        return StreamFigures(length, length, True, 0, 0.0, dlq, shadow, 0, False)
    pel = int(_get(group, "pending") or 0)
    consumers = int(_get(group, "consumers") or 0)
    lag, exact = derive_lag(_get(group, "lag"), length, pel)
    oldest_idle = 0.0
    if pel:
        oldest = await guarded(lambda: redis.xpending_range(stream, GROUP, min="-", max="+", count=1))
        if oldest:
            oldest_idle = int(_get(oldest[0], "time_since_delivered") or 0) / 1000.0
    return StreamFigures(length, lag, exact, pel, oldest_idle, dlq, shadow, consumers, True)


def publish(queue: str, figures: StreamFigures) -> None:
    """Set the stream gauges of ``queue`` from ``figures``."""
    metrics.STREAM_LENGTH.labels(queue).set(figures.length)
    metrics.STREAM_LAG.labels(queue).set(figures.lag)
    metrics.PEL_SIZE.labels(queue).set(figures.pel)
    metrics.PEL_OLDEST_IDLE.labels(queue).set(figures.oldest_idle)
    metrics.DLQ_LENGTH.labels(queue).set(figures.dlq_length)
    metrics.SHADOW_LENGTH.labels(queue).set(figures.shadow_length)
    metrics.CONSUMERS.labels(queue).set(figures.consumers)
