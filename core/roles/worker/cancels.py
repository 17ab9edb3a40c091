"""A worker learns that a submission it is judging was cancelled, and stops it (docs/cancel.md).

``judgequeue.cancel()`` ends a submission ``CANCELLED`` under a new generation, which fences every
earlier attempt out: whatever a running judge would still write is refused. What is left is to stop
the judge at once rather than let it run to its end. The cancel of a running submission sends a
notification on :data:`CANCEL_CHANNEL` (``"<queue> <submission> <generation>"``, delivered only
once the cancel committed), and :class:`CancelWatch` listens for it on the worker's LISTEN-capable
DSN: a job of that submission at an older generation is stopped (its task cancelled, which kills the
sandbox or aborts the remote call) without a round trip. It also checks its running leases against
the database (``lease_gone``, read only): after every (re)connect, since notifications sent while it
was not listening are lost, every :data:`LISTENING_CHECK` seconds, and every :data:`POLL` seconds
when it cannot listen (behind a transaction pooler without a listen DSN); a lease found gone is
stopped (as cancelled when its submission is, else as lost: rejudged or rescued). A job handed
over by a filled offer whose cancellation was heard before it started is never started
(:meth:`CancelWatch.cancelled`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence

import asyncpg

from ...base.errors import DB_ERRORS, reason
from ...runtime.lifecycle import backoff
from ...store import leases, sql
from ...transport.connect import STATEMENT_TIMEOUT, connect_postgres

log = logging.getLogger("judgequeue.worker")

#: The channel ``judgequeue.cancel()`` notifies when it cancels a submission being judged.
CANCEL_CHANNEL = "judgequeue_cancel"
#: Seconds between lease checks while the worker cannot listen: a cancelled job stops within this
#: (plus the judge's own stop), at two read-only statements a second while jobs run.
POLL = 0.5
#: Seconds between lease checks while listening: a safety net for a notification lost with the
#: connection; the notification itself stops a job at once.
LISTENING_CHECK = 5.0
#: Seconds a heard cancellation is remembered for a job that has not started yet (a filled offer
#: whose notification comes after the cancel's), and at most how many are kept.
REMEMBER = 120.0
REMEMBER_MAX = 10_000


def parse_notice(payload: str) -> tuple[str, int, int] | None:
    """``(queue, submission, generation)`` of a cancel notification, or None if malformed (pure)."""
    parts = payload.split(" ")
    if len(parts) != 3:
        return None
    queue, submission, generation = parts
    try:
        return queue, int(submission), int(generation)
    except ValueError:
        return None


class CancelWatch:
    """Stops a worker's running jobs whose submissions were cancelled (see the module's text).

    ``running`` gives the leases being judged now; ``stop(attempt, cancelled)`` stops one (True: its
    submission was cancelled; False: the lease is gone otherwise, as the heartbeat would find it).
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        listen_dsn: str | None,
        queue: str,
        *,
        running: Callable[[], Sequence[leases.Lease]],
        stop: Callable[[uuid.UUID, bool], None],
    ) -> None:
        self._pool = pool
        self._dsn = listen_dsn
        self._queue = queue
        self._running = running
        self._stop = stop
        self._conn: asyncpg.Connection | None = None
        self._check = asyncio.Event()
        self._heard: dict[int, tuple[int, float]] = {}  # submission -> (cancelled generation, when)
        self._task: asyncio.Task[None] | None = None
        #: Checks run against the database (for tests and logs).
        self.checks = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cancel-watch")

    def cancelled(self, lease: leases.Lease) -> bool:
        """Whether a cancellation of ``lease``'s submission at a later generation was heard."""
        heard = self._heard.get(lease.submission)
        return heard is not None and heard[0] > lease.generation and time.monotonic() - heard[1] < REMEMBER

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        notice = parse_notice(payload) if isinstance(payload, str) else None
        if notice is None or notice[0] != self._queue:
            return
        _, submission, generation = notice
        if len(self._heard) >= REMEMBER_MAX:
            now = time.monotonic()
            self._heard = {s: v for s, v in self._heard.items() if now - v[1] < REMEMBER}
            if len(self._heard) >= REMEMBER_MAX:
                self._heard.clear()
        self._heard[submission] = (generation, time.monotonic())
        for lease in self._running():
            if lease.submission == submission and lease.generation < generation:
                self._stop(lease.attempt, True)

    def _on_lost(self, _conn: object) -> None:
        self._check.set()  # reconnect (and check) now, not at the next periodic check

    async def _listen(self) -> bool:
        """Listening (connecting if needed; a new connection asks for a check); False if it cannot."""
        if self._dsn is None:
            return False
        if self._conn is None or self._conn.is_closed():
            self._conn = await connect_postgres(self._dsn, timeout=STATEMENT_TIMEOUT)
            await self._conn.add_listener(CANCEL_CHANNEL, self._on_notify)
            self._conn.add_termination_listener(self._on_lost)
            self._check.set()  # a cancel sent while not listening was not heard
        return True

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                listening = await self._listen()
                interval = LISTENING_CHECK if listening else POLL
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._check.wait(), interval)
                self._check.clear()
                await self.check()
                failures = 0
            except DB_ERRORS as exc:
                failures += 1
                if self._conn is not None:
                    self._conn.terminate()
                    self._conn = None
                log.warning("cancel watch failed; retrying", extra={"error": reason(exc)})
                await asyncio.sleep(backoff(failures))

    async def check(self) -> None:
        """Stop every running job whose lease is gone (one read-only statement): as cancelled when
        its submission is, else as lost."""
        running = list(self._running())
        if not running:
            return
        async with self._pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            rows = await conn.fetch(sql.query("lease_gone"), *leases.fence_arrays(running))
        self.checks += 1
        for r in rows:
            self._stop(uuid.UUID(bytes=r["attempt_id"].bytes), bool(r["cancelled"]))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None
