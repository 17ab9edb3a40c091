"""A worker's wake-up for direct intake: LISTEN on the submit channel while registered as a waiter.

``judgequeue.submit()`` sends a notification only while some process of the queue is registered in
``judgequeue.dispatch_waiters`` (a NOTIFY per commit would cap the submit path; see docs/design.md),
so a process registers just before it would sleep and unregisters once work flows without it. The
order matters: register, look for work once more (rows committed before the registration sent no
notification), then wait. A registration is refreshed every ``refresh`` seconds of idleness: the
reaper prunes waiters not refreshed for a few dispatcher schedules (a crashed process's row).

Without a LISTEN-capable DSN (behind a transaction pooler with no listen DSN) nothing registers and
the waits run to their timeout: direct intake then polls.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from . import outbox
from .connect import connect_postgres
from .lifecycle import HeldSession, wait_any

log = logging.getLogger("judgequeue.worker")


class Wakeup:
    """Registration and notifications for one process of one queue."""

    def __init__(self, session: HeldSession, listen_dsn: str | None, queue: str, name: str) -> None:
        self._session = session
        self._dsn = listen_dsn
        self._queue = queue
        self._name = name
        self._conn: asyncpg.Connection | None = None
        self._registered = False
        self.event = asyncio.Event()

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        if payload == self._queue:
            self.event.set()

    async def arm(self) -> bool:
        """Make sure a notification will come; True if that took a registration just now (the
        caller looks for work once more before waiting). False when already armed or unable to
        listen. Raises the database's errors (the caller backs off)."""
        if self._dsn is None:
            return False
        if self._conn is None or self._conn.is_closed():
            # (Re)connect before registering, so no notification can go unheard.
            self._conn = await connect_postgres(self._dsn)
            await self._conn.add_listener(outbox.WAKEUP_CHANNEL, self._on_notify)
            self._registered = False
        if self._registered:
            return False
        await outbox.register_waiter(await self._session.get(), self._queue, self._name)
        self._registered = True
        return True

    async def disarm(self) -> None:
        """Work flows and the caller loops at once: submitters need not notify."""
        if self._registered:
            await outbox.unregister_waiter(await self._session.get(), self._queue, self._name)
            self._registered = False

    async def wait(self, stop: asyncio.Event, within: float) -> None:
        """Until a notification (or ``stop``) or ``within`` seconds; a wait that times out refreshes the
        registration on the next :meth:`arm`."""
        woke = await wait_any(stop, self.event, within)
        if not woke:
            self._registered = False

    def forget(self) -> None:
        """After a database error: the registration's state is unknown, make it again."""
        self._registered = False

    async def close(self) -> None:
        """Stop listening and unregister (best effort: a row left behind is pruned by the reaper)."""
        if self._conn is not None:
            self._conn.terminate()  # nothing to flush; a graceful close could wait on a dead link
            self._conn = None
        if self._registered:
            self._registered = False
            try:
                await outbox.unregister_waiter(await self._session.get(), self._queue, self._name)
            except Exception as exc:  # best effort at shutdown
                log.info("waiter not unregistered at shutdown", extra={"error": str(exc)})
