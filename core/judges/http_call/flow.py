"""Flow control of the ``http-call`` judge's endpoints: a call holds one of its endpoint's slots,
counted across the whole fleet of the queue's workers (:mod:`judgequeue.core.transport.endpoint_slots`),
and takes a token of its rate.

A job whose endpoint is at its bound (or out of tokens) *waits* in its worker slot for one to free
(unless the endpoint is stalled, :data:`STALL`: its calls hang, so no slot is coming),
holding its job lease (the worker's heartbeat renews it as for any running job), up to
:data:`WAIT_CAP` seconds: it is woken at once by a call of the same worker ending, and looks again
every :data:`POLL` seconds for slots freed elsewhere in the fleet (or when its token is due). So
that a slow endpoint cannot fill a worker with waiting jobs, a worker's *waiting room* seats at most
the endpoint's bound of its jobs, and at most half of the worker's slots in all; a job that finds no
seat waits :data:`ROOM_WAIT` for one (or for a slot) and is then deferred briefly out of any slot
(:class:`~judgequeue.core.judges.CallLater`, not a failed try), as is one that waited
:data:`WAIT_CAP` in vain and one whose slots Redis cannot answer for (the bound is never guessed).

A call's slot is a lease (:data:`SLOT_LEASE`) renewed every third of it while the call runs: a
worker killed mid-call stops renewing and the slot frees when the lease expires. A call whose slot
could not be renewed in time (its lease expired: someone else may hold it now) is cancelled and
deferred, so the bound holds even then.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ...base import metrics
from ...base.errors import TransportError, reason
from ...transport.endpoint_slots import EndpointSlots, Grant, Limits
from ..interface import CallLater

log = logging.getLogger("judgequeue.judge.http_call")

T = TypeVar("T")

#: Seconds a call's slot is leased for; renewed every third of it while the call runs. A worker
#: killed mid-call frees its slot this long after its last renewal at the latest.
SLOT_LEASE = 10.0
#: Seconds a job waits in its worker slot for an endpoint's slot before it is deferred instead.
WAIT_CAP = 30.0
#: Seconds a job that finds the waiting room full waits for a seat in it (or a slot) before it is
#: deferred: long enough that a worker does not churn through its backlog deferring job after job,
#: short enough that other endpoints' jobs get the slot soon.
ROOM_WAIT = 1.0
#: Seconds between looks for a slot freed by another worker (half of it to all of it, at random).
POLL = 0.05
#: An endpoint none of whose slots was taken or freed (anywhere in the fleet) for this long, or for
#: twice its calls' usual time over its bound if that is longer, is *stalled* (its calls hang): its
#: jobs do not wait for it in a worker slot, they are deferred at once.
STALL = 5.0


class EndpointFlow:
    """One worker's side of its endpoints' fleet-wide slots: waiting, holding, renewing, freeing."""

    def __init__(
        self, slots: EndpointSlots, *, worker_slots: int | None = None, lease: float = SLOT_LEASE,
        wait_cap: float = WAIT_CAP, poll: float = POLL, room_wait: float = ROOM_WAIT, stall: float = STALL,
    ) -> None:  # fmt: skip
        self.slots = slots
        self.lease = lease
        self.wait_cap = wait_cap
        self.poll = poll
        self.room_wait = room_wait
        self.stall = stall
        #: Each endpoint's calls' usual time on this worker (a moving average; absent: none ended yet).
        self._call_seconds: dict[str, float] = {}
        #: Jobs that may wait at once on this worker, whatever their endpoints (half its slots).
        self.waiting_room = max(1, worker_slots // 2) if worker_slots else None
        self._waiting: Counter[str] = Counter()
        self._freed: dict[str, asyncio.Event] = {}

    def waiting(self, endpoint: str | None = None) -> int:
        """Jobs waiting on this worker, for ``endpoint`` or for any."""
        return self._waiting[endpoint] if endpoint is not None else sum(self._waiting.values())

    async def call(
        self, queue: str, endpoint: str, limits: Limits, fn: Callable[[], Awaitable[T]], *, defer_for: float
    ) -> T:
        """Wait for a slot of ``endpoint`` (see the module), run ``fn`` holding it, free it.

        Raises :class:`CallLater` (not a failed try, ``defer_for`` seconds) when the job may not wait,
        waited :attr:`wait_cap` in vain, Redis does not answer, or the slot was lost mid-call.
        """
        holder = uuid.uuid4().hex
        await self._acquire(queue, endpoint, holder, limits, defer_for)
        try:
            return await self._holding(queue, endpoint, holder, fn, defer_for)
        finally:
            await self._release(queue, endpoint, holder)

    async def _acquire(self, queue: str, endpoint: str, holder: str, limits: Limits, defer_for: float) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        give_up = began + self.wait_cap
        gauge = metrics.ENDPOINT_WAITING.labels(queue, endpoint)
        outside_until: float | None = None  # waiting for a seat in the waiting room, until then
        waiting = False
        why = "bound"
        try:
            while True:
                freed = self._freed.setdefault(endpoint, asyncio.Event())  # before looking: no release missed
                try:
                    grant = await self.slots.acquire(queue, endpoint, holder, limits, self.lease)
                except TransportError as exc:
                    reason = f"endpoint {endpoint}'s slots are unknown: {exc}"
                    raise CallLater(defer_for, reason, failed=False) from None
                if grant.granted:
                    metrics.ENDPOINT_WAIT.labels(queue, endpoint).observe(loop.time() - began)
                    return
                why = grant.why
                if self._stalled(endpoint, limits, grant):
                    why = "stalled"
                    break
                now = loop.time()
                left = give_up - now
                if not waiting:
                    if self._waiting[endpoint] >= limits.bound or (
                        self.waiting_room is not None and self.waiting() >= self.waiting_room
                    ):
                        outside_until = outside_until or now + self.room_wait
                        left = min(left, outside_until - now)
                    else:
                        self._waiting[endpoint] += 1
                        gauge.inc()
                        waiting = True
                if left <= 0 or (grant.why == "rate" and grant.retry_in > left):
                    break
                pause = grant.retry_in if grant.why == "rate" else self.poll * (0.5 + random.random() / 2)
                try:
                    async with asyncio.timeout(min(pause, left)):
                        await freed.wait()
                except TimeoutError:
                    pass
        finally:
            if waiting:
                self._waiting[endpoint] -= 1
                gauge.dec()
        what = {"bound": "at its concurrency bound", "rate": "at its rate limit",
                "stalled": "at its concurrency bound and none of its calls ended lately"}[why]  # fmt: skip
        raise CallLater(defer_for, f"endpoint {endpoint} is {what}", failed=False)

    def _stalled(self, endpoint: str, limits: Limits, grant: Grant) -> bool:
        """Whether the endpoint's slots have not moved for long enough that waiting is pointless."""
        if grant.why != "bound":
            return False
        usual = self._call_seconds.get(endpoint)
        threshold = max(self.stall, 2 * usual / limits.bound) if usual is not None else self.stall
        return grant.idle is None or grant.idle > threshold

    async def _holding(
        self, queue: str, endpoint: str, holder: str, fn: Callable[[], Awaitable[T]], defer_for: float
    ) -> T:
        """Run ``fn`` while renewing the slot's lease; cancel it if the lease runs out unrenewed."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        task = asyncio.ensure_future(fn())
        held_until = loop.time() + self.lease  # a lower bound: the lease started before this
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=min(self.lease / 3, max(0.0, held_until - loop.time())))
                if done:
                    result = task.result()
                    took = loop.time() - began
                    usual = self._call_seconds.get(endpoint)
                    self._call_seconds[endpoint] = took if usual is None else 0.8 * usual + 0.2 * took
                    return result
                if loop.time() >= held_until:
                    break
                asked = loop.time()
                try:
                    if not await self.slots.renew(queue, endpoint, holder, self.lease):
                        break
                    held_until = asked + self.lease
                except TransportError as exc:
                    log.warning("endpoint slot not renewed", extra={"endpoint": endpoint, "error": reason(exc)})
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)
        log.warning("endpoint slot lost mid-call; the call is cancelled", extra={"endpoint": endpoint})
        raise CallLater(defer_for, f"endpoint {endpoint}'s slot was lost during the call", failed=False)

    async def _release(self, queue: str, endpoint: str, holder: str) -> None:
        try:
            async with asyncio.timeout(2.0):
                await self.slots.release(queue, endpoint, holder)
        except (TransportError, TimeoutError) as exc:  # its lease expires instead
            log.warning("endpoint slot not released; it frees when its lease expires",
                        extra={"endpoint": endpoint, "error": reason(exc)})  # fmt: skip
        freed = self._freed.pop(endpoint, None)
        if freed is not None:
            freed.set()  # this worker's waiters look at once; later ones wait on a new event
