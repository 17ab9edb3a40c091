"""Queue health on one screen: gather the figures, judge them against thresholds, render them.

:func:`evaluate` is a pure function (figures + thresholds -> verdict) so the rules are testable
without servers; :func:`gather` reads Postgres and Redis; :func:`render` formats one screen.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from .base.agreement import OUTCOMES, Agreement
from .config import format_duration
from .store import shadow
from .store.outbox import OUTBOX_STATES
from .store.outbox import stats as outbox_stats
from .store.queues import QueueFlags, get_queue
from .transport.stream_stats import stream_figures
from .transport.streams import GROUP, shadow_key, stream_key


@dataclass(frozen=True)
class Figures:
    """What ``judgequeue status`` shows about one queue. Redis figures are None when unknown."""

    queue: str
    outbox: dict[str, int]
    oldest_pending_age: float
    stream_length: int | None = None
    lag: int | None = None
    pel: int | None = None
    oldest_idle: float | None = None
    dlq_length: int | None = None
    shadow_length: int | None = None
    consumers: int | None = None
    live_consumers: int | None = None
    group_present: bool | None = None
    #: Shadow workers: the consumers of the shadow stream's group (shadow judging), and how many are live.
    shadow_consumers: int | None = None
    live_shadow_consumers: int | None = None
    mode: str | None = None
    watermark: datetime | None = None
    paused: bool | None = None
    config_version: int | None = None
    redis_error: str | None = None
    #: Shadow judging's figures (legacy and shadow verdicts compared), over what retention keeps.
    shadow: Agreement | None = None

    @property
    def backlog(self) -> int:
        """Work not yet being judged: outbox rows waiting plus undelivered and pending stream entries."""
        waiting = self.outbox.get("PENDING", 0) + self.outbox.get("CLAIMED", 0)
        return waiting + (self.lag or 0) + (self.pel or 0)


@dataclass(frozen=True)
class Thresholds:
    """Health limits; None disables a rule."""

    max_pending_age: float | None = 300.0
    max_backlog: int | None = None
    max_lag: int | None = None
    max_pel: int | None = None
    max_oldest_idle: float | None = 600.0
    max_dlq: int | None = 0
    max_dead: int | None = None
    min_live_consumers: int | None = None


@dataclass(frozen=True)
class Verdict:
    healthy: bool
    problems: list[str] = field(default_factory=list)


def evaluate(figures: Figures, thresholds: Thresholds) -> Verdict:
    """Every threshold ``figures`` crosses, as a sentence; healthy when there is none."""
    problems: list[str] = []

    def over(value: float | None, limit: float | None, what: str, unit: str = "") -> None:
        if value is not None and limit is not None and value > limit:
            shown = format_duration(round(value, 3)) if unit == "s" and value > 0 else f"{value:g}"
            limit_shown = format_duration(limit) if unit == "s" and limit > 0 else f"{limit:g}"
            problems.append(f"{what} is {shown}, over the limit of {limit_shown}")

    if figures.redis_error is not None:
        problems.append(f"redis: {figures.redis_error}")
    if figures.mode is None:
        problems.append(f"queue {figures.queue!r} does not exist")
    over(figures.oldest_pending_age, thresholds.max_pending_age, "oldest pending outbox row age", "s")
    over(figures.backlog, thresholds.max_backlog, "backlog")
    over(figures.lag, thresholds.max_lag, "stream lag")
    over(figures.pel, thresholds.max_pel, "pending entries (PEL)")
    over(figures.oldest_idle, thresholds.max_oldest_idle, "oldest pending entry idle time", "s")
    over(figures.dlq_length, thresholds.max_dlq, "dead-letter queue length")
    over(figures.outbox.get("DEAD", 0), thresholds.max_dead, "DEAD outbox rows")
    if (
        thresholds.min_live_consumers is not None
        and figures.live_consumers is not None
        and figures.live_consumers < thresholds.min_live_consumers
    ):
        problems.append(
            f"live consumers are {figures.live_consumers}, under the minimum of {thresholds.min_live_consumers}"
        )
    return Verdict(not problems, problems)


async def gather_redis(client: aioredis.Redis, queue: str, *, live_window: float = 60.0) -> dict[str, Any]:
    """The stream figures (shared with the reaper's gauges) plus how many consumers are live."""
    f = await stream_figures(client, queue)
    out: dict[str, Any] = {
        "stream_length": f.length,
        "lag": f.lag,
        "pel": f.pel,
        "oldest_idle": f.oldest_idle,
        "dlq_length": f.dlq_length,
        "shadow_length": f.shadow_length,
        "consumers": f.consumers,
        "group_present": f.group_present,
        "live_consumers": 0,
    }
    if f.group_present and f.consumers:
        consumers = await client.xinfo_consumers(stream_key(queue), GROUP)
        out["live_consumers"] = sum(1 for c in consumers if int(c["idle"]) / 1000 <= live_window)
    try:  # shadow workers read the shadow stream in a group of the same name
        shadow_consumers = list(await client.xinfo_consumers(shadow_key(queue), GROUP))
    except ResponseError as exc:  # no shadow stream, or no group on it yet: no shadow worker ever read
        if "no such key" not in str(exc).lower() and "nogroup" not in str(exc).lower():
            raise
        shadow_consumers = []
    out["shadow_consumers"] = len(shadow_consumers)
    out["live_shadow_consumers"] = sum(1 for c in shadow_consumers if int(c["idle"]) / 1000 <= live_window)
    return out


async def gather(
    conn: asyncpg.Connection, client: aioredis.Redis | None, queue: str, *, redis_timeout: float = 5.0
) -> Figures:
    """Read every figure of ``queue``; a Redis failure is reported in the figures, not raised."""
    stats = await outbox_stats(conn, queue)
    figures_of = await shadow.agreement(conn, queue)
    flags: QueueFlags | None
    try:
        flags = await get_queue(conn, queue)
    except LookupError:
        flags = None
    redis_part: dict[str, Any] = {}
    if client is not None:
        try:
            redis_part = await asyncio.wait_for(gather_redis(client, queue), redis_timeout)
        except Exception as exc:
            redis_part = {"redis_error": f"unreachable ({type(exc).__name__})"}
    return Figures(
        queue=queue,
        outbox=stats.by_state,
        oldest_pending_age=stats.oldest_pending_age,
        mode=flags.mode if flags else None,
        watermark=flags.watermark if flags else None,
        paused=flags.paused if flags else None,
        config_version=flags.config_version if flags else None,
        shadow=figures_of,
        **redis_part,
    )


def as_json(figures: Figures, verdict: Verdict) -> dict[str, Any]:
    """The ``--json`` document of ``judgequeue status``."""
    data = asdict(figures)
    data["watermark"] = figures.watermark.isoformat() if figures.watermark else None
    data["shadow"] = figures.shadow.as_dict() if figures.shadow is not None else None
    data["backlog"] = figures.backlog
    data["healthy"] = verdict.healthy
    data["problems"] = verdict.problems
    return data


def _show(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{float(value):.1f}s"
    return str(value)


def render(figures: Figures, verdict: Verdict) -> str:
    """One screen of text."""
    outbox = "  ".join(f"{state}={figures.outbox.get(state, 0)}" for state in OUTBOX_STATES)
    flags = (
        "queue does not exist"
        if figures.mode is None
        else f"mode={figures.mode}  watermark={figures.watermark.isoformat() if figures.watermark else 'none'}  "
        f"paused={'yes' if figures.paused else 'no'}  config_version={figures.config_version}"
    )
    lines = [
        f"queue {figures.queue}: {'HEALTHY' if verdict.healthy else 'UNHEALTHY'}",
        f"  cutover        {flags}",
        f"  outbox         {outbox}",
        f"  oldest pending {_show(figures.oldest_pending_age, 's')}",
        f"  stream         length={_show(figures.stream_length)}  lag={_show(figures.lag)}  "
        f"pel={_show(figures.pel)}  oldest idle={_show(figures.oldest_idle, 's')}",
        f"  dead letters   {_show(figures.dlq_length)}",
        f"  shadow stream  {_show(figures.shadow_length)}",
        f"  consumers      {_show(figures.live_consumers)} live of {_show(figures.consumers)}"
        + ("" if figures.group_present in (None, True) else f"  (group {GROUP!r} not created yet)"),
        *([f"  shadow workers {_show(figures.live_shadow_consumers)} live of {_show(figures.shadow_consumers)}"]
          if figures.mode == "shadow" or figures.shadow_consumers else []),
        f"  backlog        {figures.backlog}",
    ]
    lines += shadow_lines(figures)
    lines += [f"  ! {p}" for p in verdict.problems]
    return "\n".join(lines)


def shadow_lines(figures: Figures) -> list[str]:
    """The shadow section: shown for a queue in shadow mode or one that has shadow figures."""
    agreement = figures.shadow
    if agreement is None or (agreement.total.total == 0 and figures.mode != "shadow"):
        return []
    lines = [f"  shadow         {agreement.describe()}"]
    width = max((len(v) for v in agreement.by_verdict), default=0)
    for verdict, counts in sorted(agreement.by_verdict.items()):
        cells = "  ".join(f"{o}={getattr(counts, o)}" for o in OUTCOMES)
        lines.append(f"    {verdict.ljust(width)}  {cells}")
    return lines
