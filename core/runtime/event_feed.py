"""Following the verdict events: the table as the truth, ``LISTEN`` as the wake-up (docs/events.md).

:func:`follow` yields every verdict event after a position, in position order, forever. It holds
one connection of its own with ``LISTEN judgequeue_events``; each notification (or a timer, or the
connection's loss) makes it read the table again from the last position it yielded, so a lost
notification costs latency, never an event, and a disconnect (a restart, ``pg_terminate_backend``,
a failover) is followed by a reconnect and a read from where it stood. Events whose transaction
committed while an older transaction is still running are read once that one ends
(:func:`events.held`): polled quickly, since no notification announces it.

LISTEN is a session feature: give it a direct DSN, not a transaction pooler's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

import asyncpg

from ..base.errors import DB_ERRORS
from ..store import events
from ..transport.connect import STATEMENT_TIMEOUT, connect_postgres
from .lifecycle import backoff

log = logging.getLogger("judgequeue.events")

#: Seconds between reads while nothing is announced: only a safety net, the notification wakes first.
IDLE_POLL = 5.0
#: First and longest wait (seconds) before reading again while events are held behind an older
#: transaction still running; the wait doubles between.
HELD_POLL = (0.005, 0.2)


async def _wait(wake: asyncio.Event, within: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wake.wait(), within)


async def follow(
    dsn: str,
    *,
    after: events.Position = events.START,
    queue: str | None = None,
    batch: int = 500,
    idle_poll: float = IDLE_POLL,
    pooler: str = "none",
    kinds: Sequence[str] | None = ("verdict",),
) -> AsyncIterator[events.VerdictEvent]:
    """Every event of ``kinds`` (None: every kind) after ``after`` (of ``queue``, or of every
    queue), in position order, each once, across any number of lost connections; runs until the
    caller stops iterating."""
    kinds = events.check_kinds(kinds)  # a bad kind fails here, not at the first read
    position = after
    failures = 0
    wake = asyncio.Event()

    def announced(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        if queue is None or payload == queue:
            wake.set()

    def lost(_conn: object) -> None:
        wake.set()

    while True:
        conn: asyncpg.Connection | None = None
        try:
            conn = await connect_postgres(
                dsn, pooler=pooler, timeout=STATEMENT_TIMEOUT, command_timeout=STATEMENT_TIMEOUT
            )
            await conn.add_listener(events.CHANNEL, announced)
            conn.add_termination_listener(lost)
            held_wait = HELD_POLL[0]
            while True:
                wake.clear()  # before the read: an announcement from now on wakes the wait below
                found = await events.read(conn, position, queue=queue, limit=batch, kinds=kinds)
                failures = 0
                for event in found:
                    position = event.position
                    yield event
                if len(found) == batch:
                    continue
                if await events.held(conn, queue=queue):
                    await _wait(wake, held_wait)
                    held_wait = min(held_wait * 2, HELD_POLL[1])
                    continue
                held_wait = HELD_POLL[0]
                await _wait(wake, idle_poll)
        except DB_ERRORS as exc:
            failures += 1
            delay = backoff(failures)
            log.warning("event feed lost its connection; reading again from %s in %.1fs: %s",
                        position, delay, exc)  # fmt: skip
            await asyncio.sleep(delay)
        finally:
            if conn is not None:
                conn.terminate()
