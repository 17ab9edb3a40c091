"""Roles run inside the test's own event loop, and a judge the test holds.

The integration suites drive real workers and dispatchers against real servers without processes:
:func:`running` runs their ``run(stop)`` for the length of a ``with`` block and stops them (their
graceful shutdown included) when it ends; :class:`GateJudge` holds every job until the test opens
it, counting how many ran at once.
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
    """A judge that holds every job until :attr:`open` is set; records each payload's ``i`` and the
    most jobs it held at once."""

    def __init__(self) -> None:
        self.started: list[Any] = []
        self.running = 0
        self.most = 0
        self.open = asyncio.Event()

    async def judge(self, payload: Any) -> Verdict:
        self.started.append(payload.get("i"))
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.open.wait()
        finally:
            self.running -= 1
        return Verdict("ACCEPTED", {})
