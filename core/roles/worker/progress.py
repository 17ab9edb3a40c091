"""Live progress of the jobs a worker judges, written as progress events (docs/events.md).

With ``JUDGEQUEUE_PROGRESS=on`` each job gets a :class:`JobProgress`, the reporter its judge finds
(:func:`~judgequeue.core.judges.current_progress`): a report only records the job's latest state
and marks it changed. :class:`ProgressWriter` writes, in one statement, the latest state of every
job that changed, at most once per ``interval``: a job of 100 tests judged in 3 s writes about 13
rows at 250 ms (4 at the default 1 s), not 200, and a job shorter than the interval one or two. Each row is
fenced like the verdict (id, generation, attempt, ``JUDGING``), so a stale attempt's progress is
refused exactly as its verdict would be; such a job writes no more.

Order with the verdict: before its verdict is written, a job waits (:meth:`ProgressWriter.finish`)
for a progress write carrying it to commit, and its unwritten state is dropped (the verdict says
more). So the verdict's transaction starts after every progress row of its attempt committed, and
sorts after them in the event log. Progress is best effort: a failed write is tried again at the
next interval with whatever state is latest then; it never holds up a verdict for longer than a
statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

import asyncpg

from ...base.errors import describe
from ...runtime.lifecycle import DB_ERRORS, SHUTDOWN_STEP, Doorbell, cancel_within
from ...store import events, leases
from ...transport.connect import STATEMENT_TIMEOUT

log = logging.getLogger("judgequeue.worker")


class JobProgress:
    """One job's reporter (:class:`~judgequeue.core.judges.Progress`): its latest state."""

    __slots__ = ("_writer", "done", "lease", "rows", "stale", "state")

    def __init__(self, writer: ProgressWriter, lease: leases.Lease) -> None:
        self._writer = writer
        self.lease = lease
        self.state: dict[str, Any] = {"phase": "judging"}
        self.rows = 0  # progress rows written for this job
        self.stale = False  # the fence refused a write: its lease is gone
        self.done = False  # its verdict comes next: no more rows

    def compiled(self, ok: bool = True) -> None:
        self.state["phase"] = "compiled"
        if not ok:
            self.state["compile_error"] = True
        self._writer.changed(self)

    def test_started(self, number: int, total: int) -> None:
        s = self.state
        s["phase"] = "testing"
        s["tests_total"] = total
        s.setdefault("tests_done", 0)
        s["running"] = number
        self._writer.changed(self)

    def test_finished(self, number: int, total: int, verdict: str, seconds: float) -> None:
        s = self.state
        s["phase"] = "testing"
        s["tests_total"] = total
        s["tests_done"] = s.get("tests_done", 0) + 1
        s["running"] = None
        s["test"] = number
        s["last_verdict"] = verdict
        s["last_time"] = round(float(seconds), 3)
        self._writer.changed(self)


class ProgressWriter:
    """Writes the changed jobs' latest progress, one statement per ``interval`` at most."""

    def __init__(self, pool: asyncpg.Pool, *, interval: float) -> None:
        self._pool = pool
        self.interval = interval
        self._changed: dict[int, JobProgress] = {}  # by id(): insertion order is first-changed order
        self._writing: asyncio.Future[None] | None = None  # the write in flight, and who it carries
        self._carrying: set[int] = set()
        self._wake = Doorbell()
        self._last = 0.0  # monotonic time of the last write's start
        self._task: asyncio.Task[None] | None = None
        #: Statements issued, rows written, rows the fence refused (stale attempts).
        self.statements = 0
        self.rows = 0
        self.refused = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="progress-writer")

    def job(self, lease: leases.Lease) -> JobProgress:
        return JobProgress(self, lease)

    def changed(self, job: JobProgress) -> None:
        if job.done or job.stale:
            return
        self._changed[id(job)] = job
        self._wake.ring()

    async def finish(self, job: JobProgress) -> None:
        """The job's verdict comes next: drop its unwritten state and wait (bounded) for a write
        carrying it to commit, so that the verdict sorts after every progress row of its attempt."""
        job.done = True
        self._changed.pop(id(job), None)
        writing = self._writing
        if writing is not None and id(job) in self._carrying:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(writing), STATEMENT_TIMEOUT)

    def drop(self, job: JobProgress) -> None:
        """The job ended without a verdict of this worker's (cancelled, released, deferred)."""
        job.done = True
        self._changed.pop(id(job), None)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            wait = self._last + self.interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)  # coalesce: the states reported meanwhile share one row each
            if self._changed:
                await self._write()

    async def _write(self) -> None:
        batch = [j for j in self._changed.values() if not (j.done or j.stale)]
        self._changed.clear()
        if not batch:
            return
        writes = [
            events.ProgressWrite(j.lease.submission, j.lease.generation, j.lease.attempt,
                                 json.dumps(j.state, separators=(",", ":")))
            for j in batch
        ]  # fmt: skip
        self._last = time.monotonic()
        self._writing = asyncio.get_running_loop().create_future()
        self._carrying = {id(j) for j in batch}
        try:
            async with self._pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                written = await events.record_progress(conn, writes)
        except DB_ERRORS as exc:
            # Best effort: the next interval writes whatever state is latest then.
            log.warning("progress write failed; trying again next interval", extra={"error": describe(exc)})
            for j in batch:
                self.changed(j)
            return
        finally:
            self._writing.set_result(None)
            self._writing = None
            self._carrying = set()
        self.statements += 1
        for j in batch:
            if j.lease.attempt in written:
                j.rows += 1
                self.rows += 1
            else:
                j.stale = True
                self.refused += 1

    async def close(self) -> None:
        if self._task is not None:
            await cancel_within(self._task, SHUTDOWN_STEP)
            self._task = None
