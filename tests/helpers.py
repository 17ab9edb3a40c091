"""Small test helpers shared by suites: waiting on conditions with deadlines, settings builders."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from judgequeue.core.config import Settings, load_settings

T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[T]], *, within: float = 10.0, every: float = 0.02, what: str = "condition"
) -> T:
    """Poll ``check`` until it returns a truthy value or the deadline passes (then fail loudly)."""
    deadline = time.monotonic() + within
    while True:
        last = await check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within}s (last value: {last!r})")
        await asyncio.sleep(every)


def make_settings(pg_dsn: str, redis_url: str, queue: str, **env: str) -> Settings:
    """Settings as a role would load them, with JUDGEQUEUE_<KEY> overrides from keyword arguments."""
    base = {
        "JUDGEQUEUE_POSTGRES_DSN": pg_dsn,
        "JUDGEQUEUE_REDIS_URL": redis_url,
        "JUDGEQUEUE_QUEUE": queue,
    }
    base.update({f"JUDGEQUEUE_{k.upper()}": v for k, v in env.items()})
    return load_settings(base)
