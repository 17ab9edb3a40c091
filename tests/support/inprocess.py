"""Roles run inside the test's own event loop, and a judge the test holds.

The integration suites drive real workers and dispatchers against real servers without processes:
:func:`running` runs their ``run(stop)`` for the length of a ``with`` block and stops them (their
graceful shutdown included) when it ends; :class:`GateJudge` holds every job until the test opens
its gate, recording what started, what was cancelled and how many ran at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol

from judgequeue.core.judges import Verdict


class _Role(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


@contextlib.asynccontextmanager
async def running(*roles: _Role, within: float = 15.0) -> AsyncIterator[None]:
    """Run ``roles`` until the block ends, then stop them and wait (at most ``within`` seconds)."""
    stop = asyncio.Event()
    tasks = [asyncio.ensure_future(role.run(stop)) for role in roles]
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), within)


class GateJudge:
    """A judge the test steers: each job waits until :attr:`gate` is set. Records each payload's
    ``i`` as it starts and as it is cancelled, and the most jobs it held at once; the verdict is the
    payload's ``status`` (``ACCEPTED`` by default) with ``{"i": i}`` as details."""

    def __init__(self) -> None:
        self.started: list[Any] = []
        self.cancelled: list[Any] = []
        self.running = 0
        self.most = 0
        self.gate = asyncio.Event()

    async def judge(self, payload: Any) -> Verdict:
        self.started.append(payload.get("i"))
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(payload.get("i"))
            raise
        finally:
            self.running -= 1
        return Verdict(payload.get("status", "ACCEPTED"), {"i": payload.get("i")})
