"""A worker's wake-up for direct intake: LISTEN on the submit channel while registered as a waiter.

``judgequeue.submit()`` sends a notification only while some process of the queue is registered in
``judgequeue.dispatch_waiters`` (a NOTIFY per commit would cap the submit path; see docs/design.md),
so a process registers just before it would sleep and unregisters once work flows without it. The
order matters: register, look for work once more (rows committed before the registration sent no
notification), then wait. A registration is refreshed after a wait that timed out and at least
every :data:`REFRESH` seconds while it serves a trickle: the reaper prunes waiters not refreshed for
a few minutes (a crashed process's row), and a pruned registration would leave this process
waiting out its poll.

Both changes ride on the worker's takes where they can (``outbox.take_direct``): an unregistered
worker's take registers it when it finds nothing, a registered worker that saw work flowing leaves
with its next take that finds rows, so neither costs a round trip of its own; :meth:`Wakeup.arm` and
:meth:`Wakeup.disarm` are the standalone statements for the other cases (a refresh, a full worker, a
paused queue).

Without a LISTEN-capable DSN (behind a transaction pooler with no listen DSN) nothing registers and
the waits run to their timeout: direct intake then polls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import asyncpg

from . import outbox
from .connect import STATEMENT_TIMEOUT, connect_postgres
from .lifecycle import HeldSession, wait_any

#: Cycles in a row that must find work before a listening process stops listening and loops.
BUSY_STREAK = 3
#: Seconds between takes while work flows fast (see :func:`pace_takes`): at 2,800 jobs/s a take at
#: once brought 2.1 rows for 128 µs of server time; end to end rose from 65-70% to 80% of pgbench
#: with it (docs/performance.md).
TAKE_PACE = 0.002
#: Rows a second a busy streak's takes must find before they are paced: above the rate at which
#: offers stop (:data:`judgequeue.core.offer_keeper.MAX_FILL_RATE`), so where offers fall back to takes at
#: latency-bound rates (a cool-down, a burst's edge) each take still goes at once.
PACE_ABOVE = 1500.0
#: Seconds over which a streak's take rate is measured before its count starts again.
RATE_WINDOW = 0.5

#: Notifications beyond the rows taken since registering that show other processes serve the queue.
OTHERS_SERVE = 4

#: Seconds a registration serves before it is written again (the reaper prunes after 5 minutes).
REFRESH = 60.0


def keep_listening(claimed: int, batch_size: int, streak: int) -> bool:
    """Whether a registered process that just claimed ``claimed`` rows should go back to LISTEN (pure).

    A trickle (a partial batch, and not several busy cycles in a row) is served best by notification:
    every later commit notifies a registered waiter, so there is nothing to poll for, and staying
    registered spares a register/unregister/re-claim round per job. A full batch or a streak of busy
    cycles means work is flowing: looping at once is cheaper, and unregistering lets submitters stop
    notifying (a NOTIFY per commit serialises commits).
    """
    return 0 < claimed < batch_size and streak < BUSY_STREAK


def pace_takes(claimed: int, batch_size: int, streak: int, rows_per_second: float) -> bool:
    """Whether a process whose takes keep finding rows should wait :data:`TAKE_PACE` before the
    next (pure). A streak of busy takes that each leave free slots, at more than
    :data:`PACE_ABOVE` rows a second, means rows come faster than a take's round trip but slower
    than the slots fill: taking at once costs a statement for a row or two, where a short pause
    lets each take bring several (one round trip and one commit for all). A full batch means the
    slots are the limit; a trickle waits on notifications; below the rate, the pause would be
    latency for little gain."""
    return 0 < claimed < batch_size and streak >= BUSY_STREAK and rows_per_second >= PACE_ABOVE


class TakeRate:
    """Rows a second the takes of a busy streak find, over windows of :data:`RATE_WINDOW`.

    The first take of a streak is not counted: it brings what gathered while the process waited,
    which says nothing about how fast rows come now."""

    def __init__(self) -> None:
        self._since = 0.0
        self._rows = 0
        self.per_second = 0.0

    def start(self, now: float) -> None:
        """A streak's first take ended at ``now``."""
        self._since, self._rows, self.per_second = now, 0, 0.0

    def add(self, rows: int, now: float) -> None:
        """A later take of the streak found ``rows``, ending at ``now``."""
        self._rows += rows
        elapsed = now - self._since
        if elapsed > 0:
            self.per_second = self._rows / elapsed
        if elapsed >= RATE_WINDOW:
            self._since, self._rows = now, 0  # the next window; per_second stands until it has one


class Wakeup:
    """Registration and notifications for one process of one queue."""

    def __init__(
        self,
        session: HeldSession,
        listen_dsn: str | None,
        queue: str,
        name: str,
        *,
        offers: tuple[str, Callable[[str], None]] | None = None,
    ) -> None:
        self._session = session
        self._dsn = listen_dsn
        self._queue = queue
        self._name = name
        #: This process's own channel for filled offers (:mod:`judgequeue.core.offers`) and what
        #: receives each notification's payload; listened to on the same connection.
        self._offers = offers
        self._conn: asyncpg.Connection | None = None
        self._registered = False
        self._registered_at = 0.0
        self._leave_when_busy = False  # the next take unregisters if it finds rows
        self.event = asyncio.Event()
        self._heard = False  # a notification (not a nudge) set the event
        #: Since the registration: notifications received, and rows this process took. Each row
        #: committed while registered sends one notification, so notifications well beyond the
        #: rows taken mean other processes are taking this queue's rows (see :meth:`others_serve`).
        self.notified = 0
        self.taken = 0

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        # Only while registered: an unregistered process has stepped back for one that is, and
        # every listener receives every notification.
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
            await self._conn.add_listener(outbox.WAKEUP_CHANNEL, self._on_notify)
            if self._offers is not None:
                channel, receive = self._offers
                await self._conn.add_listener(channel, lambda _c, _p, _ch, payload: receive(str(payload)))
            self._registered = False
        return True

    @property
    def listening(self) -> bool:
        """Connected and listening (a notification sent now will be heard)."""
        return self._conn is not None and not self._conn.is_closed()

    def take_flags(self) -> tuple[bool, bool]:
        """What the next take does with the registration (``outbox.take_direct``'s
        ``unregister_if_busy``, ``register_if_idle``; pure over the state): a registered process
        that saw work flowing (:meth:`disarm_when_busy`) leaves if the take finds rows; an
        unregistered one that listens joins if it finds none."""
        if self._registered:
            return self._leave_when_busy, False
        return False, self.listening

    def after_take(self, registered: bool, unregistered: bool) -> None:
        """What the take did with the registration (see :meth:`take_flags`)."""
        self._leave_when_busy = False
        if unregistered:
            self._registered = False
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
        if self._registered and time.monotonic() - self._registered_at < REFRESH:
            return False
        await outbox.register_waiter(await self._session.get(), self._queue, self._name)
        self._joined()
        return True

    def others_serve(self) -> bool:
        """Whether other processes take most of what this one is notified of (pure over the
        counters): its registration then makes every submit pay a NOTIFY for nothing."""
        return self._registered and self.notified - self.taken >= OTHERS_SERVE

    @property
    def registered(self) -> bool:
        return self._registered

    async def disarm(self) -> None:
        """Unregister now (a full worker, a paused queue, others serve it): submitters need not notify."""
        self._leave_when_busy = False
        if self._registered:
            await outbox.unregister_waiter(await self._session.get(), self._queue, self._name)
            self._registered = False

    async def wait(self, stop: asyncio.Event, within: float) -> None:
        """Until a notification (or ``stop``) or ``within`` seconds; a wait that times out
        refreshes the registration on the next :meth:`arm`."""
        woke = await wait_any(stop, self.event, within)
        if not woke:
            self._registered = False

    def forget(self) -> None:
        """After a database error: the registration's state is unknown, make it again."""
        self._registered = False
        self._leave_when_busy = False

    async def close(self) -> None:
        """Stop listening and unregister. Run it as a best-effort step (``lifecycle.best_effort``):
        a row left behind by a failure is pruned by the reaper."""
        if self._conn is not None:
            self._conn.terminate()  # nothing to flush; a graceful close could wait on a dead link
            self._conn = None
        if self._registered:
            self._registered = False
            await outbox.unregister_waiter(await self._session.get(), self._queue, self._name)
