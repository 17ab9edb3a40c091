"""The maintainer loop: every ``interval`` it runs the maintainers that are due, one after the other.

A maintainer (:class:`Maintainer`) is one piece of upkeep with a name (its key in reports and
logs) and an interval of its own (:attr:`Maintainer.every`: the least time between two of its runs;
0 runs it at every sweep). A sweep runs each due maintainer once, in their order, each guarded on
its own, so one failing dependency does not stop the others; a maintainer that failed is due again
at the next sweep. Once the stop event is set the maintainers not yet begun are skipped: each is
idempotent upkeep the next reaper redoes, and with Redis or Postgres unresponsive each would wait
out its own timeout before SIGTERM could take effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from ...base.errors import SERVER_ERRORS, reason
from ...config import Settings
from ...runtime.lifecycle import unless_stopped
from ...store.leases import LeaseSweep
from ...store.shadow import ShadowRescue
from ...transport.stream_stats import StreamFigures

log = logging.getLogger("judgequeue.reaper")


@dataclass
class Context:
    """What every maintainer works on: the role's connections, settings and consumer name."""

    pool: asyncpg.Pool
    redis: aioredis.Redis
    settings: Settings
    name: str

    @property
    def queue(self) -> str:
        return self.settings.queue


class Maintainer:
    """One piece of the reaper's upkeep: :meth:`run` does it once and returns what it did."""

    #: Its key in :class:`SweepReport` and in the logs.
    name = ""
    #: Seconds at least between two runs; 0: at every sweep (the reaper's ``interval``).
    every = 0.0

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def run(self) -> Any:
        raise NotImplementedError


@dataclass
class SweepReport:
    """One sweep: each maintainer's result by name, or its error."""

    results: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    succeeded: int = 0  # maintainers that ran without error

    @property
    def unreachable(self) -> bool:
        """Every maintainer that ran failed: the servers are down, not merely flaky (pure)."""
        return bool(self.errors) and self.succeeded == 0

    @property
    def stream(self) -> Any:
        return self.results.get("stream")

    @property
    def shadow_stream(self) -> Any:
        return self.results.get("shadow_stream")

    @property
    def leases(self) -> LeaseSweep | None:
        return self.results.get("leases")

    @property
    def shadow_leases(self) -> ShadowRescue | None:
        return self.results.get("shadow_leases")

    @property
    def figures(self) -> StreamFigures | None:
        return self.results.get("gauges")


class Maintenance:
    """The maintainers of one reaper, and when each last ran."""

    def __init__(self, maintainers: Sequence[Maintainer]) -> None:
        self.maintainers = list(maintainers)
        self._ran_at: dict[str, float] = {}

    def due(self, maintainer: Maintainer, now: float) -> bool:
        return now - self._ran_at.get(maintainer.name, float("-inf")) >= maintainer.every

    async def sweep(self, stop: asyncio.Event | None = None) -> SweepReport:
        """Run every due maintainer once; a failing one is logged and reported, the others still run."""
        report = SweepReport()
        for maintainer in self.maintainers:
            if stop is not None and stop.is_set():
                break
            now = time.monotonic()
            if not self.due(maintainer, now):
                continue
            try:
                result = await maintainer.run()
            except SERVER_ERRORS as exc:
                report.errors[maintainer.name] = f"{type(exc).__name__}: {exc}"
                log.warning("reaper step failed", extra={"step": maintainer.name, "error": reason(exc)})
                continue
            self._ran_at[maintainer.name] = now
            report.results[maintainer.name] = result
            report.succeeded += 1
        return report

    async def run(self, stop: asyncio.Event, interval: float) -> None:
        """Sweep every ``interval`` until ``stop`` is set; failures back off, never crash."""
        failures = 0
        while not stop.is_set():
            report = await unless_stopped(stop, self.sweep(stop))
            if report is None:
                return  # stopped mid-sweep: every maintainer is safe to abandon (see above)
            # Back off only while nothing works. A sweep whose first call met a connection killed while
            # the reaper slept (a restart, a reset, an idle timeout) did the rest of its work: under
            # frequent faults, backing off on that doubled the pause to a minute exactly when
            # rescues were most needed.
            failures = failures + 1 if report.unreachable else 0
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff_delay(interval, failures))


def backoff_delay(interval: float, failures: int, *, cap: float = 60.0) -> float:
    """Time to the next sweep: ``interval``, doubled per consecutive failing sweep up to ``cap`` (pure)."""
    if failures <= 0:
        return interval
    return float(min(interval * 2 ** min(failures, 16), max(cap, interval)))
