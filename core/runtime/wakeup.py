"""The wake-up shared by the dispatcher and a direct-intake worker: LISTEN on the submit channel while
registered as a waiter.

``judgequeue.submit()`` sends a notification only while some process of the queue is registered in
``judgequeue.dispatch_waiters`` (a NOTIFY per commit would cap the submit path; see docs/design.md),
so a process registers just before it would sleep and unregisters once work flows without it
(:func:`keep_listening`, the one rule for both roles). The order matters: register, look for work
once more (rows committed before the registration sent no notification), then wait. A registration
is refreshed after a wait that timed out and at least every :data:`WAITER_REFRESH` seconds while it
serves a trickle: the reaper prunes waiters not refreshed for a few minutes (a crashed process's
row), and a pruned registration would leave this process waiting out its poll.

A direct-intake worker's changes ride on its takes where they can
(:func:`judgequeue.core.roles.worker.direct.takes.take`, see :meth:`Wakeup.take_flags`): an unregistered
worker's take registers it when it finds nothing, a registered worker that saw work flowing leaves
with its next take that finds rows, so neither costs a round trip of its own. :meth:`Wakeup.arm` and
:meth:`Wakeup.disarm` are the standalone statements for the other cases (the dispatcher's, a
refresh, a full worker, a paused queue).

Without a LISTEN-capable DSN (behind a transaction pooler with no listen DSN) nothing registers and
the waits run to their timeout: the process polls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

import asyncpg

from ..store import sql
from ..transport.connect import STATEMENT_TIMEOUT, connect_postgres
from .lifecycle import HeldSession, wait_any

#: Channel that waiting processes LISTEN on; ``judgequeue.submit()`` notifies it (the payload is the
#: queue's name) only while one of the queue is registered.
WAKEUP_CHANNEL = "judgequeue_wakeup"

#: Cycles in a row that must find work before a listening process stops listening and loops. One
#: or two busy cycles are what a trickle gives (a submit landing during a cycle); three in a row
#: mean work comes faster than a cycle's round trip, where every commit's NOTIFY costs the submits
#: more than polling costs this process.
BUSY_STREAK = 3

#: Notifications beyond the rows this process took since registering that show other processes
#: serve the queue: each row committed while it is registered sends one notification, so a few
#: more than it took (not one: a row can be notified and taken by a peer in a race) mean its
#: registration makes every submit pay a NOTIFY for rows it never takes.
OTHERS_SERVE_EXCESS = 4

#: Seconds a registration serves before it is written again: well inside the five minutes (or three
#: schedules, if longer) after which the reaper prunes a waiter (a crashed process's row), at one
#: statement a minute.
WAITER_REFRESH = 60.0


async def register_waiter(conn: asyncpg.Connection, queue: str, waiter: str) -> None:
    """Tell submitters that ``waiter`` (a dispatcher or a direct-intake worker) is about to sleep on
    the wake-up channel, or refresh its registration."""
    await conn.execute(sql.query("waiter_register"), queue, waiter)


async def unregister_waiter(conn: asyncpg.Connection, queue: str, waiter: str) -> None:
    """Tell submitters that ``waiter`` need not be notified any more."""
    await conn.execute(sql.query("waiter_unregister"), queue, waiter)


async def prune_waiters(conn: asyncpg.Connection, *, older_than: float) -> int:
    """Forget waiters of crashed processes (they only cost extra notifications, never correctness)."""
    return int(await conn.fetchval(sql.query("waiter_prune"), float(older_than)))


async def prune_offers(conn: asyncpg.Connection, *, older_than: float) -> int:
    """Forget offers not refreshed for ``older_than`` seconds past their expiry (crashed workers'): a
    direct-intake worker offers its free slots while it waits (:mod:`judgequeue.core.roles.worker.direct.offers`)."""
    return int(await conn.fetchval(sql.query("offers_prune"), float(older_than)))


async def notify_queue_usage(conn: asyncpg.Connection) -> float:
    """The fraction of the database's notification queue in use (``pg_notification_queue_usage``):
    fills carry their payloads in notifications, so a listener that stops reading fills it sooner."""
    return float(await conn.fetchval(sql.query("notify_queue_usage")))


def keep_listening(claimed: int, batch_size: int, streak: int) -> bool:
    """Whether a registered process that just claimed ``claimed`` rows should go back to LISTEN (pure).

    A trickle (a partial batch, and not several busy cycles in a row) is served best by notification:
    every later commit notifies a registered waiter, so there is nothing to poll for, and staying
    registered spares a register/unregister/re-claim round per job. A full batch or a streak of busy
    cycles means work is flowing: looping at once is cheaper, and unregistering lets submitters stop
    notifying (a NOTIFY per commit serialises commits).
    """
    return 0 < claimed < batch_size and streak < BUSY_STREAK


class Wakeup:
    """Registration and notifications for one process of one queue (a dispatcher, a worker).

    ``session`` runs the registration statements (the process's own held session); ``listen_dsn``
    None means the process cannot listen and polls. ``also`` are more channels to listen on the
    same connection, each with what receives a notification's payload (a direct-intake worker's
    offer channel, :mod:`judgequeue.core.roles.worker.direct.offers`).
    """

    def __init__(
        self,
        session: HeldSession,
        listen_dsn: str | None,
        queue: str,
        name: str,
        *,
        also: Mapping[str, Callable[[str], None]] | None = None,
    ) -> None:
        self._session = session
        self._dsn = listen_dsn
        self._queue = queue
        self._name = name
        self._also = dict(also or {})
        self._conn: asyncpg.Connection | None = None
        self._registered = False
        self._registered_at = 0.0
        # A waiter row of this process's may stand: set before any statement that may write one,
        # cleared once one is known to have removed it. Unlike ``_registered`` (which a timed-out
        # wait or an error clears to have the registration written again), it says whether
        # close() must unregister.
        self._row_may_stand = False
        self._leave_when_busy = False  # the next take unregisters if it finds rows
        self.event = asyncio.Event()
        self._heard = False  # a notification (not a nudge) set the event
        #: Since the registration: notifications received, and rows this process took. Each row
        #: committed while registered sends one notification, so notifications well beyond the
        #: rows taken mean other processes are taking this queue's rows (see :meth:`others_serve`).
        self.notified = 0
        self.taken = 0

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        # Only while registered: an unregistered process has stepped back for one that is (or
        # loops anyway), and every listener receives every notification.
        if payload == self._queue and self._registered:
            self.notified += 1
            self._heard = True
            self.event.set()

    def nudge(self) -> None:
        """End the current wait without a notification (the process's own state changed)."""
        self.event.set()

    def heard(self) -> bool:
        """Whether a notification arrived since the last call (and not only a :meth:`nudge`)."""
        heard, self._heard = self._heard, False
        return heard

    async def listen(self) -> bool:
        """Make sure this process listens on the wake-up channel, (re)connecting if needed; False
        when it cannot listen (no LISTEN-capable DSN). Raises the database's errors."""
        if self._dsn is None:
            return False
        if self._conn is None or self._conn.is_closed():
            # (Re)connect before any registration, so no notification can go unheard.
            self._conn = await connect_postgres(self._dsn, timeout=STATEMENT_TIMEOUT)
            await self._conn.add_listener(WAKEUP_CHANNEL, self._on_notify)
            for channel, receive in self._also.items():
                await self._conn.add_listener(channel, _payload_to(receive))
            self._registered = False
        return True

    @property
    def listening(self) -> bool:
        """Connected and listening (a notification sent now will be heard)."""
        return self._conn is not None and not self._conn.is_closed()

    def take_flags(self) -> tuple[bool, bool]:
        """What the next take does with the registration (:func:`judgequeue.core.roles.worker.direct.takes.take`'s
        ``unregister_if_busy``, ``register_if_idle``): a registered process that saw work flowing
        (:meth:`disarm_when_busy`) leaves if the take finds rows; an unregistered one that listens
        joins if it finds none."""
        if self._registered:
            return self._leave_when_busy, False
        join = self.listening
        self._row_may_stand |= join
        return False, join

    def after_take(self, registered: bool, unregistered: bool) -> None:
        """What the take did with the registration (see :meth:`take_flags`)."""
        self._leave_when_busy = False
        if unregistered:
            self._registered = self._row_may_stand = False
        if registered:
            self._joined()

    def disarm_when_busy(self) -> None:
        """Work flows: the next take unregisters if it finds rows (no round trip of its own)."""
        self._leave_when_busy = self._registered

    def _joined(self) -> None:
        if not self._registered:
            self.notified = self.taken = 0
        self._registered, self._registered_at = True, time.monotonic()

    async def arm(self) -> bool:
        """Make sure a notification will come; True if that took a registration just now (the
        caller looks for work once more before waiting). False when already armed or unable to
        listen. Raises the database's errors (the caller backs off)."""
        if not await self.listen():
            return False
        if self._registered and time.monotonic() - self._registered_at < WAITER_REFRESH:
            return False
        self._row_may_stand = True
        await register_waiter(await self._session.get(), self._queue, self._name)
        self._joined()
        return True

    def others_serve(self) -> bool:
        """Whether other processes take most of what this one is notified of (pure over the
        counters): its registration then makes every submit pay a NOTIFY for nothing."""
        return self._registered and self.notified - self.taken >= OTHERS_SERVE_EXCESS

    @property
    def registered(self) -> bool:
        return self._registered

    async def disarm(self) -> None:
        """Unregister now (work flows, a full worker, a paused queue, others serve it): submitters
        need not notify."""
        self._leave_when_busy = False
        if self._registered:
            await unregister_waiter(await self._session.get(), self._queue, self._name)
            self._registered = self._row_may_stand = False

    async def wait(self, stop: asyncio.Event, within: float) -> bool:
        """Until a notification (or ``stop``) or ``within`` seconds; True if the wait was ended
        early. A wait that times out refreshes the registration on the next :meth:`arm`."""
        woke = await wait_any(stop, self.event, within)
        if not woke:
            self._registered = False
        return woke

    def forget(self) -> None:
        """After a database error: the registration's state is unknown, make it again."""
        self._registered = False
        self._leave_when_busy = False

    async def close(self) -> None:
        """Stop listening and unregister if a row of this process's may stand. Run it as a
        best-effort step (``lifecycle.best_effort``): a row left behind by a failure is pruned by
        the reaper."""
        if self._conn is not None:
            self._conn.terminate()  # nothing to flush; a graceful close could wait on a dead link
            self._conn = None
        self._registered = False
        if self._row_may_stand:
            await unregister_waiter(await self._session.get(), self._queue, self._name)
            self._row_may_stand = False


def _payload_to(receive: Callable[[str], None]) -> Callable[[object, int, str, object], None]:
    """An asyncpg listener that hands ``receive`` the notification's payload."""

    def listener(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        receive(str(payload))

    return listener
