"""The keeper of one worker's offers: which of its slots are open, the jobs that fill them, and the
loop that keeps its rows of ``judgequeue.worker_offers`` in line (the table, its statement and the
notification's format are :mod:`judgequeue.core.roles.worker.direct.offers`).

The worker decides *whether* to offer (:meth:`OfferKeeper.want`: while it waits for work, registered
as a waiter) and gives this class its free-slot count; this class decides *how many* (topping up
once three quarters are gone, :func:`offers.to_add`), writes them, refreshes them every
:data:`~tuning.OFFER_REFRESH` seconds while wanted, withdraws them when not, and turns each filled offer
(by notification, or by :func:`offers.sync` when the notification was lost or could not carry the
payload) into a lease handed to the worker, exactly once per slot.

Slots held open are reserved: the worker takes from the outbox only into slots neither busy nor
offered, so jobs never outnumber its concurrency.

In a queue with several classes the worker also keeps a few slots for the first class
(:meth:`OfferKeeper.keep_reserved`, ``JUDGEQUEUE_RESERVE_PERCENT``): no take fills them, and while
a backlog drains behind the worker's takes (:func:`offers.backlog_seen`) this class keeps those no
job holds offered, topped up once half are filled (slot numbers from ``limit`` up, ``max_rank`` 0 in
the table), so a first-class submit that nothing of its class is ahead of starts at once instead of
waiting for a slot. A take that finds fewer rows than it had room for (the worker keeps up: an
arrival is in its next take), the cool-down (fills too fast) and the close take them back; a take
that finds many rows does not (that is a backlog, not a burst of submits).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection
from datetime import UTC, datetime

import asyncpg

from ....base import metrics
from ....base.errors import reason
from ....runtime.lifecycle import DB_ERRORS, Doorbell, backoff, cancel_within
from ....store import leases
from ....transport.connect import STATEMENT_TIMEOUT
from . import offers, tuning

log = logging.getLogger("judgequeue.worker")


def too_fast(fills_in_window: int) -> bool:
    """Whether fills arrive faster than :data:`~tuning.OFFER_MAX_FILL_RATE` (pure)."""
    return fills_in_window > tuning.OFFER_MAX_FILL_RATE * tuning.OFFER_RATE_WINDOW


class OfferKeeper:
    """One worker's offers."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        queue: str,
        worker: str,
        *,
        limit: int,
        concurrency: int,
        lease_ttl: float,
        busy: Callable[[], int],
        start: Callable[[list[leases.Lease]], None],
        running: Callable[[], Collection[uuid.UUID]] = frozenset,
    ) -> None:
        self.channel = offers.channel_name()
        self._pool = pool
        self._queue = queue
        self._worker = worker
        self._limit = limit
        self._concurrency = concurrency
        self._lease_ttl = lease_ttl
        self._busy = busy
        self._start = start
        self._running = running  # the attempts of the worker's jobs in flight
        #: Reserved slots kept for the first class (0: none, a queue with one class); their offers
        #: are the slot numbers from ``limit`` up.
        self._reserve = 0
        self._reserved_jobs: set[uuid.UUID] = set()  # attempts started from reserved offers
        self._open: set[int] = set()  # offered and not known filled (in the table, or in doubt)
        self._awaiting: set[int] = set()  # filled, notified without the payload: the sync brings it
        # Filled and handled (slot -> the attempt that filled it): the next sync opens them again or
        # forgets them. By attempt, since a reopened slot can be filled again before that sync's
        # answer is read.
        self._seen: dict[int, uuid.UUID] = {}
        # Attempts whose job was started or given up (see tuning.OFFER_FILL_MEMORY), oldest first in the deque.
        self._handled: set[uuid.UUID] = set()
        self._handled_at: deque[tuple[float, uuid.UUID]] = deque()
        self._wanted = False
        self._closing = False
        self._fills: deque[float] = deque()  # when the recent fills came (see tuning.OFFER_MAX_FILL_RATE)
        self._cooldown_until = 0.0
        self._reserved_cooldown_until = 0.0  # the reserved offers' (fills too fast only)
        self._full_takes = 0  # takes in a row that filled their room (see taken)
        self._full_since = 0.0  # when the first of them ended
        self._refreshed_at = 0.0  # when the open offers were last kept alive (see tuning.OFFER_REFRESH)
        self._bell = Doorbell()
        self._sync_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._m_offer = metrics.DISPATCH_RESULTS.labels(queue, "offer")

    @property
    def reserved(self) -> int:
        """Slots held for offers: open ones and filled ones whose job is on its way."""
        return len(self._open) + len(self._awaiting)

    @property
    def held_general(self) -> int:
        """Of :attr:`reserved`, the offers any job may fill."""
        return sum(1 for slot in (*self._open, *self._awaiting) if slot < self._limit)

    @property
    def reserve(self) -> int:
        """Slots kept for the first class (see :meth:`keep_reserved`)."""
        return self._reserve

    def reserved_busy(self) -> int:
        """Jobs in flight that came through reserved offers (they hold reserved slots)."""
        if not self._reserved_jobs:
            return 0
        running = self._running()
        self._reserved_jobs.intersection_update(running)
        return len(self._reserved_jobs)

    def holds_reserved(self, attempt: uuid.UUID) -> bool:
        """Whether the job of ``attempt`` came through a reserved offer."""
        return attempt in self._reserved_jobs

    def take_room(self, free: int) -> int:
        """Of ``free`` slots (concurrency less jobs in flight), how many a take or a stream read may
        fill: neither offered nor reserved for the first class (pure but for the counts)."""
        room = free - self.reserved
        if self._reserve:
            general_busy = self._concurrency - free - self.reserved_busy()
            room = min(room, self._concurrency - self._reserve - general_busy - self.held_general)
        return room

    def keep_reserved(self, slots: int) -> None:
        """Keep ``slots`` slots for the first class (a queue with several classes), or none (0: one
        class, a paused or shadow queue); a change is written by the loop at once."""
        if slots != self._reserve:
            self._reserve = slots
            self._bell.ring()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="offers")

    def want(self, wanted: bool) -> None:
        """Offer (the worker waits for work) or not (work flows through takes, it is full, the queue
        is paused): a change is written by the loop at once."""
        if wanted != self._wanted and not self._closing:
            self._wanted = wanted
            self._bell.ring()

    def freed(self) -> None:
        """A slot came free: top the offers up if they ran low (the reserved ones once half are gone)."""
        now = time.monotonic()
        if (self._offering(now) and self._general_to_add()) or (self._keeping(now) and self._reserved_to_add()):
            self._bell.ring()

    def _general_to_add(self) -> int:
        """Offers any job may fill to open now: up to ``limit`` in the slots the reserve leaves."""
        busy = self._busy() - self.reserved_busy()
        return offers.to_add(self._concurrency - self._reserve, busy, self.held_general, self._limit)

    def _reserved_to_add(self) -> int:
        """Reserved offers to open now (:func:`offers.reserved_to_add`)."""
        free = self._concurrency - self._busy() - self.held_general
        return offers.reserved_to_add(self._reserve, self.reserved_busy(), free, self.reserved - self.held_general)

    def receive(self, text: str) -> None:
        """A fill notification from the worker's channel (called by the listener, not awaited)."""
        try:
            filled = offers.parse_notification(text)
        except ValueError as exc:
            log.error("unreadable offer notification", extra={"error": reason(exc)})
            self._bell.ring()  # the sync reports every filled offer, readable or not
            return
        self._handle(filled, from_sync=False)

    def taken(self, rows: int, limit: int) -> None:
        """A take of the worker's found ``rows`` (see :data:`~tuning.OFFER_BURST_ROWS`).

        Only a take while the offers are open says the submits outran them: during a cool-down
        every row comes through takes, and a take there that found a group of submits (8
        connections submitting in step at 1,000 a second) used to extend the cool-down, and the
        next one again, so offers never came back at a rate they serve.

        The reserved offers stay: a take of many rows is as likely a backlog draining (a bulk
        rejudge), which is what they are kept for, and their fills are few (one per reserved slot
        at a time); only fills coming too fast take them back too (:meth:`_count_fill`). What opens
        and closes them is whether the take filled its room, ``limit`` (:func:`offers.full_takes`):
        kept open where every take would make a first-class arrival wait for a slot, they are only
        a cost where the worker keeps up (each submit looks for one, each fill is a NOTIFY and a
        verdict written alone)."""
        if self._offering(time.monotonic()) and rows >= tuning.OFFER_BURST_ROWS:
            self._cool_down(reserved=False)
        self._note_full(offers.full_takes(rows, limit, self._full_takes))

    def no_room(self) -> None:
        """The worker's jobs hold every slot a take may fill (none is offered either): as good as a
        take that filled its room, since a first-class arrival would wait for one of them to end."""
        self._note_full(max(self._full_takes, 1))

    def _note_full(self, streak: int) -> None:
        now = time.monotonic()
        before = self._backlog(now)
        began = bool(streak) and not self._full_takes
        if began:
            self._full_since = now
        self._full_takes = streak
        if self._reserve and (self._backlog(now) != before or began):
            self._bell.ring()  # open or close them now, or wake when the full take has stood long enough

    def _backlog(self, now: float) -> bool:
        """Whether a backlog drains behind the worker's takes (:func:`offers.backlog_seen`)."""
        return offers.backlog_seen(self._full_takes, now - self._full_since)

    def _next_wake(self, now: float) -> float:
        """Seconds the loop may sleep: until the next refresh, or until a full take has stood
        :data:`~tuning.BACKLOG_WAIT` (the reserve opens then, see :meth:`_backlog`)."""
        wait = self._refreshed_at + tuning.OFFER_REFRESH - now
        if self._reserve and self._full_takes and not self._backlog(now):
            wait = min(wait, self._full_since + tuning.BACKLOG_WAIT - now)
        return max(0.0, wait)

    def _offering(self, now: float) -> bool:
        """Whether the worker offers its slots now: wanted, not closing, not cooling down."""
        return self._wanted and not self._closing and now >= self._cooldown_until

    def keeping(self) -> bool:
        """Whether the worker keeps its reserved offers open now (see :meth:`_keeping`)."""
        return self._keeping(time.monotonic())

    def _keeping(self, now: float) -> bool:
        """Whether the worker keeps its reserved offers open now: it has some, not closing, not
        cooling down, and a first-class arrival would otherwise wait for a take: a backlog drains
        behind its takes, or it waits for work but its slots may not be offered yet (the cool-down
        a backlog's first take starts, which outlasts the backlog: a take per arrival meanwhile)."""
        if self._reserve <= 0 or self._closing or now < self._reserved_cooldown_until:
            return False
        return self._backlog(now) or (self._wanted and now < self._cooldown_until)

    async def withdraw_now(self) -> None:
        """Take the open offers back before returning (the worker wants their slots for a take)."""
        self._wanted = False
        await self._sync()

    async def close(self, within: float) -> None:
        """Withdraw every open offer (bounded by ``within``); filled ones reach the worker meanwhile."""
        self._closing, self._wanted = True, False
        self._bell.ring()
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), within)
        await cancel_within(self._task, 1.0)

    # --- the loop -------------------------------------------------------------------------------

    async def _run(self) -> None:
        failures = 0
        while True:
            await self._bell.wait(self._next_wake(time.monotonic()))
            self._bell.clear()
            try:
                await self._sync()
                failures = 0
            except Exception as exc:
                # Open offers expire on their own (tuning.OFFER_VALIDITY); filled ones wait in the table
                # and are reported by the next sync that succeeds. A bug must not end the loop
                # either: the slots it reserves would never come back.
                failures += 1
                delay = backoff(failures)
                if isinstance(exc, DB_ERRORS):
                    log.warning("offers sync failed; retrying", extra={"error": reason(exc), "retry_in": delay})
                else:
                    log.exception("offers sync failed; retrying", extra={"retry_in": delay})
                await asyncio.sleep(delay)
                continue
            if self._closing and not self._open and not self._seen and not self._awaiting:
                return

    async def _sync(self) -> None:
        async with self._sync_lock:
            self._forget_old()
            now = time.monotonic()
            offering = self._offering(now)
            keeping = self._keeping(now)
            # Every open offer is kept alive about once a second; a top-up between refreshes (every
            # few fills at a steady trickle) writes only the slots it opens.
            refresh = (offering or keeping) and now >= self._refreshed_at + tuning.OFFER_REFRESH
            opened: list[int] = []
            held = self._open | self._awaiting
            if offering:
                n = self._general_to_add()
                # Slot numbers are reused (the filled ones first): the table holds at most ``limit``
                # rows per worker, updated in place.
                general = set(range(self._limit))
                unused = general - held - set(self._seen)
                spare = sorted((set(self._seen) & general) - held) + sorted(unused)
                opened = spare[:n]
                self._open.update(opened)  # before the statement: a fill may be heard before its answer
            if keeping:
                n = self._reserved_to_add()
                kept = set(range(self._limit, self._limit + self._reserve))
                unused = kept - held - set(self._seen)
                spare = sorted((set(self._seen) & kept) - held) + sorted(unused)
                opened += spare[:n]
                self._open.update(spare[:n])
            # Open offers to take back: any job's while not offering, reserved ones beyond the reserve.
            keep = {s for s in self._open if (s < self._limit and offering)
                    or (keeping and self._limit <= s < self._limit + self._reserve)}  # fmt: skip
            withdraw = not (offering or keeping) or bool(self._open - keep)
            if not (offering or keeping) and not (self._open or self._seen or self._awaiting):
                self._refreshed_at = now  # nothing to keep alive: the loop sleeps a whole REFRESH
                return
            if not (opened or refresh or withdraw or self._seen or self._awaiting):
                return  # nothing to write: the open offers stand, the next refresh keeps them
            seen = dict(self._seen)
            # Withdrawing: every slot kept is listed (the rest of the open ones are taken back).
            listed = sorted(keep) if withdraw else sorted(self._open if refresh else opened)
            async with self._pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                result = await offers.sync(
                    conn,
                    self._queue,
                    self._worker,
                    channel=self.channel,
                    lease_ttl=self._lease_ttl,
                    open_slots=listed,
                    seen=sorted(seen.items()),
                    withdraw=withdraw,
                    refresh=refresh,
                    reserved_from=self._limit,
                )
            if refresh or not (offering or keeping):
                self._refreshed_at = now
            for slot, attempt in seen.items():
                if self._seen.get(slot) == attempt:
                    del self._seen[slot]
            self._open.difference_update(result.withdrawn)
            # Open slots the table does not hold (a withdrawal raced a fill's rollback, or the
            # unlogged table was lost in a crash of the database and this statement did not add
            # them back) are no longer reserved.
            self._open.intersection_update(result.present)
            for filled in result.filled:
                self._handle(filled, from_sync=True)

    def _handle(self, filled: offers.Filled, *, from_sync: bool) -> None:
        slot = filled.slot
        if filled.attempt in self._handled:
            if from_sync:
                self._seen[slot] = filled.attempt  # reported again: the forget did not reach the table
            return
        self._open.discard(slot)
        if not filled.has_payload:
            if not from_sync:
                # Too large for the notification: the next sync reads it with the job.
                self._awaiting.add(slot)
                self._bell.ring()
                return
            # From the table without a job: its lease no longer stands (rescued, rejudged).
            self._awaiting.discard(slot)
            self._mark_handled(slot, filled.attempt)
            return
        self._awaiting.discard(slot)
        self._mark_handled(slot, filled.attempt)
        self._count_fill()
        self._m_offer.inc()
        if slot >= self._limit:
            self._reserved_jobs.add(filled.attempt)  # holds a reserved slot until it ends
        created = filled.created_at or datetime.now(UTC)  # always set with a payload
        self._start([leases.Lease(filled.submission, 1, filled.attempt, filled.payload, created)])
        self.freed()

    def _count_fill(self) -> None:
        now = time.monotonic()
        self._fills.append(now)
        while self._fills[0] < now - tuning.OFFER_RATE_WINDOW:
            self._fills.popleft()
        if too_fast(len(self._fills)):
            self._cool_down()  # submits come faster than offers help (see tuning.OFFER_MAX_FILL_RATE)

    def _cool_down(self, *, reserved: bool = True) -> None:
        """Take the offers back for :data:`~tuning.OFFER_COOLDOWN` (the reserved ones too, with
        ``reserved``): at this rate the takes batch, and the submits commit without a NOTIFY each."""
        self._fills.clear()
        self._cooldown_until = time.monotonic() + tuning.OFFER_COOLDOWN
        if reserved:
            self._reserved_cooldown_until = self._cooldown_until
        self._bell.ring()

    def _mark_handled(self, slot: int, attempt: uuid.UUID) -> None:
        self._handled.add(attempt)
        self._handled_at.append((time.monotonic(), attempt))
        self._seen[slot] = attempt

    def _forget_old(self) -> None:
        cutoff = time.monotonic() - tuning.OFFER_FILL_MEMORY
        while self._handled_at and self._handled_at[0][0] < cutoff:
            self._handled.discard(self._handled_at.popleft()[1])
