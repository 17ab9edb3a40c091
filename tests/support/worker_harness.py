"""A queue with a dispatcher task, and helpers to start in-process workers and read submissions:
what the in-process worker tests (the worker's own, shadow judging's, the http-call judge's) share."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Self

import asyncpg
import redis.asyncio as aioredis

from judgequeue.core.config import Settings
from judgequeue.core.roles.dispatcher import Dispatcher
from judgequeue.core.roles.worker.role import Worker
from judgequeue.core.store import outbox
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import streams
from tests.support.databases import REDIS_URL
from tests.support.queries import submission
from tests.support.settings import make_settings


class Harness:
    """A queue, a dispatcher task and helpers to start workers and read submissions."""

    def __init__(self, pool: asyncpg.Pool, redis: aioredis.Redis, dsn: str, queue: str) -> None:
        self.pool, self.redis, self.dsn, self.queue = pool, redis, dsn, queue
        self.tasks: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    def settings(self, **env: str) -> Settings:
        return make_settings(self.dsn, REDIS_URL, self.queue, **env)

    async def start(self) -> None:
        async with self.pool.acquire() as conn:
            await create_queue(conn, self.queue)
        await streams.ensure_group(self.redis, self.queue)
        self.spawn(Dispatcher(self.pool, self.redis, self.settings(schedule="50ms")).run)

    def spawn(self, run: Callable[[asyncio.Event], Awaitable[None]]) -> asyncio.Event:
        stop = asyncio.Event()
        self.tasks.append((stop, asyncio.ensure_future(run(stop))))
        return stop

    def worker(self, judge: Any, **env: str) -> Worker:
        env.setdefault("grace_period", "500ms")
        w = Worker(self.pool, self.redis, self.settings(**env), judge=judge)
        self.spawn(w.run)
        return w

    async def submit(self, *payloads: dict[str, Any]) -> list[int]:
        async with self.pool.acquire() as conn:
            return [await outbox.submit(conn, self.queue, p) for p in payloads]

    async def row(self, sid: int) -> asyncpg.Record:
        async with self.pool.acquire() as conn:
            row = await submission(conn, sid)
        assert row is not None
        return row

    async def status_is(self, sid: int, *statuses: str) -> bool:
        return (await self.row(sid))["status"] in statuses

    async def __aenter__(self) -> Self:
        """Started (what a fixture yields); closed when the block ends."""
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for stop, _ in self.tasks:
            stop.set()
        for _, task in self.tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)
