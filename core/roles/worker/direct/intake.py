"""The worker's side of direct intake: each turn of a direct-intake worker's loop (docs/design.md §1).

With ``JUDGEQUEUE_INTAKE=direct`` a worker claims and leases ready outbox rows in one statement
(:func:`~judgequeue.core.roles.worker.direct.takes.take`: no stream entry and so no ack), woken by the submits'
notifications (:mod:`judgequeue.core.runtime.wakeup`, shared with the dispatcher), and, when it can listen,
offers some free slots for the submits to fill (:mod:`judgequeue.core.roles.worker.direct.offer_keeper`). The
stream then carries what no worker took within a ``schedule`` (the overflow) and the reaper's
re-deliveries, which this intake reads first while there are any. The jobs it brings are judged,
heartbeated and written like any other: it hands them to the worker's ``start_jobs`` (leases) or
``start_deliveries`` (stream entries).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence

import asyncpg
import redis.asyncio as aioredis

from ....base import failpoints, metrics
from ....base.errors import SERVER_ERRORS, TransportError, reason
from ....config import Settings
from ....runtime.lifecycle import SHUTDOWN_STEP, HeldSession, backoff, best_effort, unless_stopped, wait_any
from ....runtime.wakeup import Wakeup, keep_listening
from ....store import leases
from ....store.queues import get_classes
from ....transport import streams
from . import offers, takes, tuning
from .offer_keeper import OfferKeeper

log = logging.getLogger("judgequeue.worker")


class DirectIntake:
    """One worker's direct intake: its takes, its wake-up and its offers.

    ``session`` is the worker's intake session (shared with its stream leases); ``jobs`` counts the
    worker's jobs in flight; ``start_jobs`` starts judges for leases taken here or by a filled
    offer; ``start_deliveries`` leases and starts stream entries; ``count_stale`` counts the stale
    envelopes a take found.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        redis: aioredis.Redis,
        settings: Settings,
        name: str,
        *,
        session: HeldSession,
        jobs: Callable[[], int],
        start_jobs: Callable[[list[leases.Lease]], None],
        start_deliveries: Callable[[Sequence[streams.Delivery], asyncio.Event], Awaitable[None]],
        count_stale: Callable[[list[tuple[int, int]]], Awaitable[None]],
        running: Callable[[], Collection[uuid.UUID]] = frozenset,
        flush: Callable[[], None] = lambda: None,
    ) -> None:
        self._pool, self._redis, self._settings, self._name = pool, redis, settings, name
        self._queue = settings.queue
        self._cfg = settings.worker  # one name, so tests/unit/test_spec_model.py sees what it reads
        self._session, self._jobs, self._count_stale = session, jobs, count_stale
        self._start_jobs, self._start_deliveries = start_jobs, start_deliveries
        self._running = running
        self._flush = flush  # write the verdicts lingering for company now (their slots come free)
        #: The last step found no slot a take may fill and waits (see :meth:`needs_slots`).
        self._waiting_for_room = False
        #: Rows wait that no offer will bring (committed PENDING): a notification came while no slot
        #: was free for a take, or a reserve-keeping worker's take filled its room. The next step
        #: with room takes them, withdrawing ordinary offers reopened meanwhile (see :meth:`step`).
        self._rows_waiting = False
        #: Slots kept for the first class in a queue with several (see :meth:`_keep_reserved`).
        self.reserve = offers.reserved_slots(self._cfg.concurrency, self._cfg.reserve_percent)
        # Whether the queue has several classes is read once before the first take (which must not
        # fill the reserved slots), then from every take.
        self._classes_unknown = True
        #: Take statements issued, rows or not.
        self.takes_issued = 0
        self._stream_checked = -float("inf")  # when the stream was last read
        self._stream_flowing = False  # the last read of the stream found entries
        self._streak = 0  # takes in a row that found rows without waiting
        self._take_rate = takes.TakeRate()  # how fast the streak's takes find rows
        self._failures = 0
        #: With a LISTEN connection and ``JUDGEQUEUE_OFFERS`` > 0: slots offered to the submits.
        self.offering: OfferKeeper | None = None
        #: Slots a take, stream read or lease under way may fill: busy for the offers, which must
        #: not open them meanwhile (jobs + offers + this never exceed the concurrency).
        self._taking = 0
        self.wakeup: Wakeup | None = None

    def start(self) -> None:
        """Open the wake-up, with offers when the worker can listen (they come by notification) and
        is allowed some (``JUDGEQUEUE_OFFERS``); in the running loop."""
        also: dict[str, Callable[[str], None]] = {}
        if self._settings.listen_dsn is not None and self._cfg.offers > 0:
            self.offering = OfferKeeper(
                self._pool, self._queue, self._name, limit=self._cfg.offers, concurrency=self._cfg.concurrency,
                lease_ttl=self._cfg.lease_ttl, busy=lambda: self._jobs() + self._taking, start=self._start_offered,
                running=self._running,
            )  # fmt: skip
            self.offering.start()
            also = {self.offering.channel: self.offering.receive}  # fills come on the wake-up's connection
        self.wakeup = Wakeup(self._session, self._settings.listen_dsn, self._queue, self._name, also=also)

    def freed(self) -> None:
        """A job ended: its slot may be offered again. With reserved slots, a busy worker waits
        for this (the free slots it has are reserved, see :meth:`step`): it takes again at once."""
        if self.offering is not None:
            self.offering.freed()
            if self.wakeup is not None and (
                self.needs_slots() or (self.offering.reserve and not self.wakeup.registered)
            ):
                self.wakeup.nudge()

    def reserved(self, attempt: uuid.UUID) -> bool:
        """Whether the job of ``attempt`` came through a reserved offer (holds a reserved slot)."""
        return self.offering is not None and self.offering.holds_reserved(attempt)

    def reserve_open(self) -> bool:
        """Whether the worker keeps reserved offers open now (see :meth:`OfferKeeper.keeping`)."""
        return self.offering is not None and self.offering.keeping()

    def needs_slots(self) -> bool:
        """Whether the last step found no slot a take may fill, none of its free slots being offered
        to any job: the rest are reserved, and the others held by jobs in flight, so their verdicts
        are written at once instead of lingering for company (the worker never looks full while it
        keeps reserved slots free: at 56 of 64 slots a drain waited out the linger every round and
        ran at half of one class's speed). An idle worker whose free slots are offered lingers as
        before."""
        return self._waiting_for_room and (self.offering is None or self.offering.held_general == 0)

    async def full(self) -> None:
        """The worker is full and takes nothing: submitters need not notify it."""
        wakeup = self.wakeup
        if wakeup is None or not wakeup.registered:
            return
        try:
            await self._disarm(wakeup)
        except SERVER_ERRORS:
            wakeup.forget()  # its row is pruned by the reaper if left behind
            await self._session.drop()

    async def close(self) -> None:
        """Offers first: those being filled right now still reach this worker through the listener."""
        if self.offering is not None:
            await self.offering.close(SHUTDOWN_STEP)
        if self.wakeup is not None:
            await best_effort(self.wakeup.close(), SHUTDOWN_STEP)

    async def step(self, free: int, stop: asyncio.Event) -> None:
        """One turn of the worker's loop with ``free`` slots: the stream's entries first while it
        has any (the dispatcher's overflow and the reaper's re-deliveries are older than anything in
        the outbox), looked at
        once a ``schedule`` otherwise; then lease ready outbox rows; then, unless work is flowing,
        sleep on the submit notification.

        The dispatcher's rule (:func:`~judgequeue.core.runtime.wakeup.keep_listening`): register as a
        waiter only when a take finds nothing, stay registered while a trickle comes in, and loop
        unregistered while takes keep finding rows: a busy queue pays no NOTIFY per commit (which
        would serialise the submits' commits). In that loop, while the takes find rows faster than
        offers carry them and leave slots free, they come :data:`~tuning.TAKE_PACE` apart
        (:func:`~judgequeue.core.roles.worker.direct.takes.pace_takes`), so each brings several rows instead of
        one statement per row or two. Notified of more rows than it took, the worker steps back for
        :data:`~tuning.OTHERS_SERVE_STEP_BACK` (other workers serve the queue). Redis being down
        stops only the stream's part.
        """
        wakeup = self.wakeup
        if wakeup is None:
            raise RuntimeError("DirectIntake.start() opens the wake-up before the first step")
        schedule = self._settings.dispatcher.schedule
        nudged = wakeup.event.is_set()
        notified = wakeup.heard()
        wakeup.event.clear()  # a notification during the take below ends the wait at once
        try:
            now = time.monotonic()
            stream_due = self._stream_flowing or now - self._stream_checked >= schedule
            rows_due = notified or self._rows_waiting
            if nudged and not rows_due and not stream_due and wakeup.registered:
                # Woken only because a filled offer made it full (see _start_offered) and it is not
                # (any more): nothing new to take, and a notification comes if there is.
                await wakeup.wait(stop, schedule)
                return
            if self._classes_unknown:
                await self._read_classes()
            free = await self._take_capacity(free, wakeup_due=rows_due or stream_due or not wakeup.registered)
            if free <= 0:
                # Heard and not taken: the slots that come free are offered again before the next
                # step, and without this the rows would wait for them to be withdrawn, a schedule.
                self._rows_waiting = rows_due
                # Every free slot is offered or reserved for the first class, and nothing says there
                # is more to take (registered: a notification would): submits fill them. The verdicts
                # lingering meanwhile hold slots (see needs_slots): written now, and a job that ends
                # wakes this wait for the next take.
                self._waiting_for_room = True
                if self.needs_slots():
                    self._flush()
                    if self.offering is not None:
                        self.offering.no_room()  # a first-class arrival would wait: the reserve opens
                try:
                    await wakeup.wait(stop, schedule)
                finally:
                    self._waiting_for_room = False
                return
            # From here to the take's end these slots are the take's: the offers leave them alone.
            self._rows_waiting = False
            self._taking = free
            try:
                if stream_due and await self._read_stream(now, free, stop):
                    return
                take = await self._take(wakeup, free, stop)
            finally:
                self._taking = 0
            # A take that filled its room likely left rows behind. A worker keeping a reserve never
            # looks full, so it stays registered and its ordinary offers reopen as slots come free:
            # the next step takes again, withdrawing them. (One without a reserve unregisters when
            # full and takes when a slot frees; withdrawing its offers after every take that filled
            # a slot or two kept them closed under a trickle.)
            reserve = self.offering.reserve if self.offering is not None else 0
            self._rows_waiting = take is not None and take.rows >= free and reserve > 0
            if take is None or await self._after_take(wakeup, take, free, stop):
                return
        except SERVER_ERRORS as exc:
            wakeup.forget()
            await self._session.drop()
            self._failures += 1
            delay = backoff(self._failures)
            log.warning("direct intake failed; retrying", extra={"error": reason(exc), "retry_in": delay})
            await wait_any(stop, None, delay)
            return
        # Only takes run back to back make a busy streak: one that waits serves a trickle.
        if not wakeup.event.is_set():
            self._streak = 0
        await wakeup.wait(stop, schedule)

    async def _read_stream(self, now: float, free: int, stop: asyncio.Event) -> bool:
        """Read up to ``free`` of the stream's entries and start them; whether there were any."""
        self._stream_checked = now
        try:
            deliveries = await streams.read(self._redis, self._queue, self._name, count=free, block_ms=None)
        except TransportError as exc:
            # Direct intake needs no Redis: judge from the outbox; look again next schedule.
            log.warning("stream read failed; taking from the outbox only", extra={"error": reason(exc)})
            deliveries = []
        self._stream_flowing = bool(deliveries)
        if deliveries:
            await self._start_deliveries(deliveries, stop)
        return bool(deliveries)

    async def _after_take(self, wakeup: Wakeup, take: takes.Take, free: int, stop: asyncio.Event) -> bool:
        """What a take that found ``take.rows`` of ``free`` means for the wait: True when the turn is
        over (take again, or a pause taken here), False when the worker should wait on the wake-up."""
        schedule = self._settings.dispatcher.schedule
        self._failures = 0
        taken = take.rows
        wakeup.taken += taken
        if not take.live:
            # Paused, or shadow (the dispatcher's): nothing to take until a flip, which a poll
            # finds within a schedule; registered, every submit would notify for nothing.
            await self._disarm(wakeup)
            await wait_any(stop, None, schedule)
            return True
        if taken:
            self._streak += 1
            if self._streak == 1:
                self._take_rate.start(time.monotonic())
            else:
                self._take_rate.add(taken, time.monotonic())
            if not (wakeup.registered and keep_listening(taken, free, self._streak)):
                wakeup.disarm_when_busy()  # the next take leaves if it finds rows
                if takes.pace_takes(taken, free, self._streak, self._take_rate.per_second):
                    await wait_any(stop, None, tuning.TAKE_PACE)
                return True  # work is flowing: take again
        elif wakeup.others_serve():
            # Other workers take the rows this one is woken for (they loop, busy): staying
            # registered would only make every submit pay a NOTIFY.
            await self._disarm(wakeup)
            await wait_any(stop, None, min(schedule, tuning.OTHERS_SERVE_STEP_BACK))
            return True
        else:
            self._streak = 0
        if take.registered or await wakeup.arm():
            self._want_offers(True)  # it waits for work now: its free slots are the submits' to fill
            return True  # rows committed before the registration sent no notification: look again
        return False

    async def _take(self, wakeup: Wakeup, free: int, stop: asyncio.Event) -> takes.Take | None:
        """Lease up to ``free`` ready rows straight from the outbox and start their judges; returns
        what the take claimed (None if ``stop`` came first)."""
        await wakeup.listen()  # before a take may register: no notification goes unheard
        leave, join = wakeup.take_flags()
        conn = await self._session.get()
        take = await unless_stopped(
            stop,
            takes.take(
                conn, self._queue, self._name, limit=free, ttl=self._cfg.lease_ttl,
                unregister_if_busy=leave, register_if_idle=join,
            ),
        )  # fmt: skip
        if take is None:
            # Abandoned mid-statement: a claim it committed is rescued like a crashed worker's lease.
            await self._session.drop()
            return None
        self.takes_issued += 1
        wakeup.after_take(take.registered, take.unregistered)
        if self.offering is not None:
            self.offering.taken(take.rows, free)
            # Reserved slots only where there is a class to keep them for (and a live queue to fill them).
            self.offering.keep_reserved(self.reserve if take.classes > 1 and take.live else 0)
        if take.unregistered or not take.live:
            self._want_offers(False)  # work flows through takes (or none may be taken): no offers
        if take.leases:
            failpoints.hit("worker.after_lease")
            self._start_jobs(take.leases)
            metrics.DISPATCH_RESULTS.labels(self._queue, "direct").inc(len(take.leases) + len(take.stale))
        if take.skipped:
            metrics.DISPATCH_RESULTS.labels(self._queue, "skipped").inc(take.skipped)
        if take.stale:
            await self._count_stale(take.stale)
        return take

    async def _read_classes(self) -> None:
        """Before the first take: keep reserved slots if the queue has several classes (one
        statement, only where the worker would keep some)."""
        if self.offering is not None and self.reserve:
            conn = await self._session.get()
            classes = await get_classes(conn, self._queue)
            self.offering.keep_reserved(self.reserve if classes is not None and len(classes) > 1 else 0)
        self._classes_unknown = False

    def _want_offers(self, wanted: bool) -> None:
        if self.offering is not None:
            self.offering.want(wanted)

    async def _disarm(self, wakeup: Wakeup) -> None:
        """Unregister (full, paused, others serve the queue), and offer nothing either."""
        self._want_offers(False)
        await wakeup.disarm()

    async def _take_capacity(self, free: int, *, wakeup_due: bool) -> int:
        """Slots a take may fill: free ones not held for offers. When all of them are offered and a
        notification (or the stream's schedule) says some rows went the usual way (a submit that
        found no open offer, a rejudge, a rescue), the offers are taken back first: otherwise such
        rows would wait for as long as submits keep the offers filled."""
        if self.offering is None:
            return free
        capacity = self.offering.take_room(free)
        if capacity <= 0 and self.offering.held_general and wakeup_due:
            await self.offering.withdraw_now()
            # Counted again: offers filled while the withdrawal ran brought jobs meanwhile.
            capacity = self.offering.take_room(self._cfg.concurrency - self._jobs())
        return capacity

    def _start_offered(self, held: list[leases.Lease]) -> None:
        """Jobs a submit leased to this worker by filling one of its offers."""
        failpoints.hit("worker.after_lease")
        self._start_jobs(held)
        if self._jobs() >= self._cfg.concurrency and self.wakeup is not None:
            self.wakeup.nudge()  # full now: the intake loop unregisters (submits stop notifying it)
