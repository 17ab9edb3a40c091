"""Waiting on a condition with a deadline: the only way tests wait (never a bare sleep as synchronisation)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


@overload
async def eventually(
    check: Callable[[], Awaitable[T]], *, within: float = ..., every: float = ..., what: str = ...
) -> T: ...


@overload
async def eventually(check: Callable[[], T], *, within: float = ..., every: float = ..., what: str = ...) -> T: ...


async def eventually(
    check: Callable[[], Any],
    *,
    within: float = 10.0,
    every: float = 0.02,
    what: str = "condition",
) -> Any:
    """Poll ``check`` (sync or async) until it returns a truthy value or ``within`` seconds pass (then fail loudly)."""
    deadline = time.monotonic() + within
    while True:
        result: Any = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within}s (last value: {result!r})")
        await asyncio.sleep(every)


def wait_for(predicate: Callable[[], T | None], within: float, what: str, every: float = 0.05) -> T:
    """Poll ``predicate`` from synchronous code until it returns something truthy, or fail after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within}s (last value: {value!r})")
        time.sleep(every)
