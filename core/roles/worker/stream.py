"""Where a worker's jobs come from: the :class:`Intake` its loop steps, and the stream's.

A worker chooses its intake once (``JUDGEQUEUE_INTAKE``; a shadow worker always reads the stream):
direct intake (:class:`judgequeue.core.roles.worker.direct.DirectIntake`: the worker takes ready outbox rows
itself, and an idle one offers slots the submits fill) or :class:`StreamIntake` (every job through
the dispatcher and the Redis stream). Its loop calls nothing else of it, so neither intake's work
shows in the other's path (docs/design.md section 1).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import redis.asyncio as aioredis

from ...base.errors import TransportError, reason
from ...runtime.lifecycle import backoff, wait_any
from ...transport import streams

log = logging.getLogger("judgequeue.worker")


class Intake(Protocol):
    """Where a worker's jobs come from; the worker's loop calls nothing else of it."""

    def start(self) -> None:
        """In the running loop, before the first step."""

    async def step(self, free: int, stop: asyncio.Event) -> None:
        """Bring up to ``free`` jobs and start them, or wait a while for some (until ``stop``)."""

    async def full(self) -> None:
        """Every slot is busy: nothing is brought until one frees."""

    def freed(self) -> None:
        """A job ended: its slot is free."""

    def reserved(self, attempt: uuid.UUID) -> bool:
        """Whether the job of ``attempt`` holds a slot kept for the first class (its verdict is
        then written without lingering: the slot serves the next first-class job sooner)."""

    def needs_slots(self) -> bool:
        """Whether the intake waits for slots that jobs in flight hold while it could bring work
        (their verdicts are then written without lingering: the slots come free sooner)."""

    def reserve_open(self) -> bool:
        """Whether first-class jobs may arrive one at a time through reserved offers now (the other
        jobs then start a few per turn of the event loop, so such an arrival starts between them)."""

    async def close(self) -> None:
        """Stopping: bring nothing more (bounded, best effort)."""


class StreamIntake:
    """The stream intake: read up to ``free`` entries of the lane's stream, then lease, start and ack
    them (``start``). Nothing to do when full, when a job ends or at close."""

    def __init__(
        self,
        redis: aioredis.Redis,
        queue: str,
        name: str,
        block_ms: int,
        shadow: bool,
        *,
        start: Callable[[Sequence[streams.Delivery], asyncio.Event], Awaitable[None]],
    ) -> None:
        self._redis, self._queue, self._name, self._block_ms, self._shadow = redis, queue, name, block_ms, shadow
        self._start = start
        self._failures = 0

    def start(self) -> None:
        pass

    async def step(self, free: int, stop: asyncio.Event) -> None:
        if deliveries := await self._read(free, stop):
            await self._start(deliveries, stop)  # lease, judge, ack once the leases are durable

    async def _read(self, free: int, stop: asyncio.Event) -> Sequence[streams.Delivery]:
        """Up to ``free`` entries from the lane's stream; none after a failed read (backed off)."""
        try:
            deliveries = await streams.read(
                self._redis, self._queue, self._name, count=free, block_ms=self._block_ms, shadow=self._shadow
            )
        except TransportError as exc:
            self._failures += 1
            delay = backoff(self._failures)
            log.warning("stream read failed", extra={"error": reason(exc), "retry_in": delay})
            await wait_any(stop, None, delay)
            return []
        self._failures = 0
        return deliveries

    async def full(self) -> None:
        pass

    def freed(self) -> None:
        pass

    def reserved(self, attempt: uuid.UUID) -> bool:
        return False

    def needs_slots(self) -> bool:
        return False  # a full worker flushes its lingering verdicts (the worker's loop)

    def reserve_open(self) -> bool:
        return False

    async def close(self) -> None:
        pass
