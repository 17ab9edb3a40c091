"""Verdict storage: the document a verdict is stored as, and the group-commit writer that stores it
fenced (docs/design.md §1, §4).

A judge's verdict becomes a JSON document carrying the fence's fields (attempt, generation, worker);
:func:`stored_verdict` makes it something Postgres can store, once, with the one serialisation the
write needs anyway. :class:`VerdictWriter` writes whatever finished while the previous write was in
flight in the next single fenced statement (one round trip and one durable commit for the group);
zero rows for an attempt means the result is stale and is dropped. A batch the database refuses is
written one verdict at a time, a refused verdict replaced by an explained ``SYSTEM_ERROR``, so one
bad verdict never holds up the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from typing import Any

import asyncpg

from ...base import failpoints
from ...base.errors import describe, is_permanent, reason
from ...judges import Verdict
from ...runtime.lifecycle import DB_ERRORS, SHUTDOWN_STEP, Doorbell, backoff, cancel_within
from ...store import leases
from ...transport.connect import STATEMENT_TIMEOUT
from .lanes import LIVE_LANE, Lane

log = logging.getLogger("judgequeue.worker")

#: Verdict writes per statement.
WRITE_BATCH = 500
#: Seconds a finished job's verdict may wait for others to share its write (one statement and one
#: durable commit for the group). At a trickle each verdict would otherwise cost a round trip and a
#: WAL flush of its own; waiting a few milliseconds is invisible next to judging, and nothing waits
#: on it: the lease keeps the job safe meanwhile, and a worker that needs the slot (full) or is
#: stopping writes at once.
VERDICT_LINGER = 0.02
#: Verdicts that make a write worth issuing without waiting out :data:`VERDICT_LINGER`.
VERDICT_COMPANY = 64


class WriteAbandoned(Exception):
    """The verdict was not written (shutdown, or a failed batch); the lease expiry will rescue the job."""


def verdict_document(verdict: Verdict, lease: leases.Lease, worker: str) -> dict[str, Any]:
    """The JSON stored in ``submissions.verdict`` (pure)."""
    doc: dict[str, Any] = {
        "status": verdict.status,
        "details": verdict.details,
        "attempt": str(lease.attempt),
        "generation": lease.generation,
        "worker": worker,
    }
    reason = verdict.details.get("reason")
    if reason is not None:
        doc["reason"] = reason
    return doc


def stored_verdict(verdict: Verdict, lease: leases.Lease, worker: str) -> tuple[Verdict, dict[str, Any], str]:
    """The verdict as Postgres can store it, its document and that document's JSON text (pure).

    jsonb refuses NaN, infinities and the NUL character, and JSON cannot carry arbitrary objects.
    A plugin judge returning such details would otherwise fail its verdict write on every retry and
    hold up every verdict of the worker behind it: unserialisable details become an explained
    ``SYSTEM_ERROR``; NUL characters and lone surrogates (program output may contain them) become
    U+FFFD. The check is the one serialisation the write needs anyway.
    """
    doc = verdict_document(verdict, lease, worker)
    try:
        text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        verdict = Verdict("SYSTEM_ERROR", {"reason": f"verdict details not storable as JSON: {exc}"[:2000]})
    else:
        # ASCII-escaped JSON shows a NUL as \u0000 and any surrogate as \udXXX; only then copy and clean.
        if "\\u0000" not in text and "\\ud" not in text:
            return verdict, doc, text
        verdict = Verdict(verdict.status, _jsonb_safe(verdict.details))
    doc = verdict_document(verdict, lease, worker)
    return verdict, doc, json.dumps(doc, separators=(",", ":"))


def _jsonb_safe(value: Any) -> Any:
    if isinstance(value, str):
        if value.isascii():
            return value.replace("\x00", "\ufffd")
        # Lone surrogates (from surrogateescape decoding) are not valid in jsonb either.
        value = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_jsonb_safe(k): _jsonb_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonb_safe(v) for v in value]
    return value


def unstorable_replacement(write: leases.VerdictWrite) -> leases.VerdictWrite:
    """The SYSTEM_ERROR written in place of a verdict the database refused (pure)."""
    reason = "verdict refused by the database (see the worker's log)"
    doc = {**{k: v for k, v in write.verdict.items() if k != "details"}, "status": "SYSTEM_ERROR", "reason": reason}
    return leases.VerdictWrite(write.lease, "SYSTEM_ERROR", {**doc, "details": {"reason": reason}})


class VerdictWriter:
    """Group commit of fenced verdict writes: one statement per batch of finished jobs."""

    def __init__(self, pool: asyncpg.Pool, *, linger: float, lane: Lane = LIVE_LANE) -> None:
        self._pool = pool
        self._lane = lane
        #: Verdict statements issued (each a group of verdicts, see :data:`VERDICT_LINGER`).
        self.statements = 0
        self._linger = linger
        self._pending: list[tuple[leases.VerdictWrite, asyncio.Future[float | None]]] = []
        self._wake = Doorbell()
        self._now = Doorbell()  # write what is queued without lingering (see flush)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle = asyncio.Event()  # set when nothing is queued or being written
        self._idle.set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="verdict-writer")

    async def write(self, write: leases.VerdictWrite, *, at_once: bool = False) -> float | None:
        """Queue a write; returns its end-to-end seconds, or None when the fence dropped it. With
        ``at_once`` what is queued is written without lingering (a reserved slot waits on it)."""
        loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[float | None] = loop.create_future()
        self._pending.append((write, future))
        self._idle.clear()
        self._wake.ring()
        if at_once or len(self._pending) >= VERDICT_COMPANY:
            self._now.ring()
        return await future

    def flush(self, *, from_now_on: bool = False) -> None:
        """Write what is queued now instead of lingering: the worker is full (a slot waits on a
        verdict) or, ``from_now_on``, stopping (no later verdict lingers either)."""
        if from_now_on:
            self._linger = 0.0
        if self._pending:
            self._now.ring()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._linger and len(self._pending) < VERDICT_COMPANY:
                await self._now.wait(self._linger)  # the verdicts of jobs finishing meanwhile share this write
            self._now.clear()
            if self._pending:
                await self._write_one_batch()
            if self._pending:
                self._wake.ring()  # queued during that write: the next round (which lingers if they are few)
            else:
                self._idle.set()

    async def _write_one_batch(self) -> None:
        batch, self._pending = self._pending[:WRITE_BATCH], self._pending[WRITE_BATCH:]
        try:
            written = await self._write_batch([w for w, _ in batch])
        except Exception as exc:
            # Like the acker: one bad batch must not stop every later verdict. Its jobs end
            # unwritten and their leases expire, so the reaper rescues them.
            log.exception("verdict batch failed", extra={"verdicts": len(batch)})
            for _, future in batch:
                if not future.done():
                    future.set_exception(WriteAbandoned(f"verdict write failed: {exc}"))
            return
        for w, future in batch:
            if not future.done():
                future.set_result(written.get(w.lease.attempt))

    async def _write_batch(self, writes: list[leases.VerdictWrite]) -> dict[uuid.UUID, float]:
        """One statement for the batch, retried while the database is unreachable."""
        failures = 0
        while True:
            try:
                async with self._pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                    written = await self._lane.write(conn, writes)
                self.statements += 1
                failpoints.hit("worker.after_verdict")
                return written
            except DB_ERRORS as exc:
                if is_permanent(exc):
                    # Retrying the same values would hold up every later verdict.
                    log.error("verdict batch refused; writing one by one", extra={"error": describe(exc)})
                    return await self._write_one_by_one(writes)
                failures += 1
                delay = backoff(failures)
                log.warning("verdict write failed; retrying", extra={"error": reason(exc), "retry_in": delay})
                await asyncio.sleep(delay)

    async def _write_one_by_one(self, writes: list[leases.VerdictWrite]) -> dict[uuid.UUID, float]:
        """Write each verdict alone; one the database refuses becomes an explained SYSTEM_ERROR.

        If even that is refused (or the database goes away meanwhile) the write is given up: the
        lease expires and the reaper rescues the job, so nothing is lost.
        """
        written: dict[uuid.UUID, float] = {}
        for write in writes:
            for attempt in (write, unstorable_replacement(write)):
                try:
                    async with self._pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                        written.update(await self._lane.write(conn, [attempt]))
                    break
                except DB_ERRORS as exc:
                    if is_permanent(exc):
                        submission = write.lease.submission
                        log.error("verdict refused", extra={"submission": submission, "error": describe(exc)})
                        continue
                    log.warning(
                        "verdict write failed; the lease expiry will rescue the job",
                        extra={"submission": write.lease.submission, "error": reason(exc)},
                    )
                    break
        return written

    async def close(self, within: float) -> None:
        """Flush what is queued within ``within`` seconds; writes still pending then are abandoned."""
        if self._task is None:
            return
        if self._pending:
            self.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), within)
        await cancel_within(self._task, SHUTDOWN_STEP)
        for _, future in self._pending:
            if not future.done():
                future.set_exception(WriteAbandoned("worker stopped before the verdict was written"))
        self._pending = []
