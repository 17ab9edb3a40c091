"""The worker role: judge jobs from the stream and write fenced verdicts (docs/design.md §1, §4).

One loop reads only as many entries as there are free slots (``XREADGROUP COUNT=free``), takes the
leases of the whole batch in one statement (which returns the payloads) and starts one task per
job; the batch is acked (XACK+XDEL) in the background as soon as the leases are durable (the lease
commit itself does not wait for the WAL flush). From then on the lease owns recovery:

* a heartbeat task renews every held lease every ``lease_ttl / 3`` in one fenced statement; a lease
  that is gone (rejudged, rescued) cancels its running judge;
* verdicts go through a group-commit writer: whatever finished while the previous write was in
  flight is written in the next single fenced statement. Zero rows for an attempt means stale: the
  result is dropped and counted;
* on ``stop`` the worker stops reading, lets in-flight jobs finish within ``grace_period``, then
  cancels the rest and releases their leases (new generation + outbox row) so another worker takes
  them at once.

With direct intake (``JUDGEQUEUE_INTAKE=direct``, docs/design.md §1) a worker with free slots also
claims and leases ready outbox rows itself (``outbox.take_direct``, one statement, no stream entry
and so no ack), woken by the submits' notifications (:mod:`judgequeue.core.wakeup`); the stream then
carries what no worker took within a ``schedule``.

A *shadow worker* (``JUDGEQUEUE_SHADOW=judge``, docs/gitops.md) runs the same loop, judge and sandbox
over the queue's shadow stream instead, in the shadow :class:`Lane`: its leases and verdicts are rows
of ``judgequeue.shadow_verdicts`` (:mod:`judgequeue.core.shadow`), fenced the same way, and never
touch the submission, whose status the legacy judge owns. It takes no direct intake and no offers.

A stale envelope (generation moved on, already judging or terminal) is acked and counted, never
judged. An entry that can never be judged (it does not parse, or the database refuses its lease for
its values) is dead-lettered at once with the reason, so a poison entry holds no slot beyond one
attempt. Postgres and Redis errors are logged and retried with backoff; nothing is lost because
entries stay pending until a lease is held, and a held lease is rescued by the reaper if this worker
disappears.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from . import dead_letters, deferral, failpoints, leases, metrics, outbox, shadow, streams
from .config import Settings
from .connect import STATEMENT_TIMEOUT
from .envelope import Envelope
from .errors import SERVER_ERRORS, RoleUnfit, TransportError, describe, is_permanent
from .judges import CallLater, Judge, SelfChecking, UsesPackages, Verdict, judge_job, load_judge
from .lifecycle import (
    DB_ERRORS,
    SHUTDOWN_STEP,
    Connections,
    Doorbell,
    HeldSession,
    backoff,
    best_effort,
    cancel_within,
    instance_id,
    serve,
    unless_stopped,
    wait_any,
)
from .offering import Offering
from .problems import ProblemCache
from .wakeup import TAKE_PACE, TakeRate, Wakeup, keep_listening, pace_takes

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
#: Entry ids per ack script call.
ACK_BATCH = 500
#: Seconds a direct-intake worker stays unregistered when other workers take what it is woken for
#: (it then registers again).
STEP_BACK = 0.05


@dataclass
class WorkerStats:
    """What this worker did (for tests and logs; the metrics carry the same counts)."""

    leased: int = 0
    written: int = 0
    stale_envelopes: int = 0
    stale_results: int = 0
    lost_leases: int = 0
    malformed: int = 0
    dead_lettered: int = 0
    released: int = 0
    judge_errors: int = 0
    direct_takes: int = 0  # statements of direct intake, rows or not
    verdict_writes: int = 0  # verdict statements (each a group of verdicts, see VERDICT_LINGER)


class WriteAbandoned(Exception):
    """The verdict was not written (shutdown, or a failed batch); the lease expiry will rescue the job."""


@dataclass
class _Job:
    lease: leases.Lease
    task: asyncio.Task[None] | None = None
    phase: str = "judging"  # judging -> writing (or releasing, when the worker is unfit) -> done
    lost: bool = False
    releasing: bool = False



class Lane:
    """Where a worker's jobs come from and where their leases and verdicts go: the live lane (the
    work stream, leases and verdicts on ``judgequeue.submissions``). Every method has the fence's
    contract of :mod:`judgequeue.core.leases`."""

    shadow = False
    #: Prefix of this lane's ``judgequeue_stale_results_dropped_total`` reasons.
    stale_prefix = ""

    async def acquire(
        self, conn: asyncpg.Connection, queue: str, pairs: Sequence[tuple[int, int]], *, ttl: float, worker: str
    ) -> list[leases.Lease]:
        return await leases.acquire(conn, queue, pairs, ttl=ttl)

    async def renew(self, conn: asyncpg.Connection, held: Sequence[leases.Lease], *, ttl: float) -> set[uuid.UUID]:
        return await leases.renew(conn, held, ttl=ttl)

    async def write(self, conn: asyncpg.Connection, writes: Sequence[leases.VerdictWrite]) -> dict[uuid.UUID, float]:
        return await leases.write_verdicts(conn, writes)

    async def release(self, conn: asyncpg.Connection, held: Sequence[leases.Lease]) -> list[int]:
        return await leases.release(conn, held)

    async def stale_reasons(self, conn: asyncpg.Connection, pairs: Sequence[tuple[int, int]]) -> list[str]:
        return await leases.stale_reasons(conn, pairs)

    async def give_up(
        self, pool: asyncpg.Pool, redis: aioredis.Redis, queue: str, consumer: str,
        poison: Sequence[dead_letters.Decision],
    ) -> int:
        """Set aside entries no retry can judge: Postgres record first, then the DLQ; how many went."""
        outcomes = await dead_letters.record(pool, poison)
        dead, _again, _skipped = await dead_letters.to_dlq(redis, queue, consumer, poison, outcomes)
        metrics.DEAD_LETTERS.labels(queue).inc(dead)
        return dead

    def verdict_counter(self, queue: str, status: str) -> Any:
        return metrics.VERDICTS.labels(queue, status)


class ShadowLane(Lane):
    """The shadow lane: the shadow stream, shadow leases and shadow verdicts (core/shadow.py)."""

    shadow = True
    stale_prefix = "shadow_"

    async def acquire(
        self, conn: asyncpg.Connection, queue: str, pairs: Sequence[tuple[int, int]], *, ttl: float, worker: str
    ) -> list[leases.Lease]:
        return await shadow.acquire(conn, queue, pairs, ttl=ttl, worker=worker)

    async def renew(self, conn: asyncpg.Connection, held: Sequence[leases.Lease], *, ttl: float) -> set[uuid.UUID]:
        return await shadow.renew(conn, held, ttl=ttl)

    async def write(self, conn: asyncpg.Connection, writes: Sequence[leases.VerdictWrite]) -> dict[uuid.UUID, float]:
        return await shadow.write_verdicts(conn, writes)

    async def release(self, conn: asyncpg.Connection, held: Sequence[leases.Lease]) -> list[int]:
        return await shadow.release(conn, held)

    async def stale_reasons(self, conn: asyncpg.Connection, pairs: Sequence[tuple[int, int]]) -> list[str]:
        return await shadow.stale_reasons(conn, pairs)

    async def give_up(
        self, pool: asyncpg.Pool, redis: aioredis.Redis, queue: str, consumer: str,
        poison: Sequence[dead_letters.Decision],
    ) -> int:
        """A SYSTEM_ERROR shadow verdict with the reason (where the entry names a submission), then the
        entry acked and deleted: the shadow lane has no DLQ, and nothing of the submission changes."""
        pairs = [(d.envelope.submission, d.envelope.generation) for d in poison if d.envelope is not None]
        if pairs:
            async with pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                await shadow.give_up(conn, pairs, [d.reason for d in poison if d.envelope is not None])
        return await streams.ack_pending(redis, queue, consumer, [d.entry.entry_id for d in poison], pairs,
                                         shadow=True)

    def verdict_counter(self, queue: str, status: str) -> Any:
        return metrics.SHADOW_VERDICTS.labels(queue, status)


LIVE_LANE = Lane()
SHADOW_LANE = ShadowLane()


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
    """The verdict as it will be stored, its document and that document's JSON text (pure).

    What :func:`storable` decides, with the one serialisation the write needs anyway.
    """
    doc = verdict_document(verdict, lease, worker)
    try:
        text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        verdict = _unserialisable(exc)
    else:
        if "\\u0000" not in text and "\\ud" not in text:
            return verdict, doc, text
        verdict = Verdict(verdict.status, _jsonb_safe(verdict.details))
    doc = verdict_document(verdict, lease, worker)
    return verdict, doc, json.dumps(doc, separators=(",", ":"))


def _unserialisable(exc: Exception) -> Verdict:
    return Verdict("SYSTEM_ERROR", {"reason": f"verdict details not storable as JSON: {exc}"[:2000]})


def storable(verdict: Verdict) -> Verdict:
    """``verdict`` as Postgres can store it (pure).

    jsonb refuses NaN, infinities and the NUL character, and JSON cannot carry arbitrary objects.
    A plugin judge returning such details would otherwise fail its verdict write on every retry and
    hold up every verdict of the worker behind it: unserialisable details become an explained
    ``SYSTEM_ERROR``; NUL characters and lone surrogates (program output may contain them) become
    U+FFFD.
    """
    try:
        text = json.dumps(verdict.details, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return _unserialisable(exc)
    # ASCII-escaped JSON shows a NUL as \u0000 and any surrogate as \udXXX; only then copy and clean.
    if "\\u0000" not in text and "\\ud" not in text:
        return verdict
    return Verdict(verdict.status, _jsonb_safe(verdict.details))


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


def judge_failure(exc: BaseException) -> Verdict:
    """The verdict of a judge that raised instead of returning (an explained SYSTEM_ERROR)."""
    return Verdict("SYSTEM_ERROR", {"reason": f"judge raised {type(exc).__name__}: {exc}"[:2000]})


def judge_fault(judge: Judge) -> str | None:
    """Why ``judge`` says this worker cannot judge any more (see :class:`SelfChecking`), or None."""
    if not isinstance(judge, SelfChecking):
        return None
    try:
        return judge.fault()
    except Exception as exc:  # a check that cannot run says as much about the worker
        return f"the judge's self-check raised {type(exc).__name__}: {exc}"


def unleased(asked: Sequence[tuple[int, int]], leased: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The envelopes of a batch that got no lease, duplicates included (pure)."""
    remaining = Counter(leased)
    out = []
    for pair in asked:
        if remaining[pair] > 0:
            remaining[pair] -= 1
        else:
            out.append(pair)
    return out


class _VerdictWriter:
    """Group commit of fenced verdict writes: one statement per batch of finished jobs."""

    def __init__(self, pool: asyncpg.Pool, stats: WorkerStats, *, linger: float, lane: Lane = LIVE_LANE) -> None:
        self._pool = pool
        self._lane = lane
        self._stats = stats
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

    async def write(self, write: leases.VerdictWrite) -> float | None:
        """Queue a write; returns its end-to-end seconds, or None when the fence dropped it."""
        loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[float | None] = loop.create_future()
        self._pending.append((write, future))
        self._idle.clear()
        self._wake.ring()
        if len(self._pending) >= VERDICT_COMPANY:
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
                self._stats.verdict_writes += 1
                failpoints.hit("worker.after_verdict")
                return written
            except DB_ERRORS as exc:
                if is_permanent(exc):
                    # Retrying the same values would hold up every later verdict.
                    log.error("verdict batch refused; writing one by one", extra={"error": describe(exc)})
                    return await self._write_one_by_one(writes)
                failures += 1
                delay = backoff(failures)
                log.warning("verdict write failed; retrying", extra={"error": str(exc), "retry_in": delay})
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
                        extra={"submission": write.lease.submission, "error": str(exc)},
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


class _AckWhenDurable:
    """Acks stream entries once the leases taken for them are durable, a group at a time.

    Leases commit without waiting for the WAL flush (the judge starts sooner); an entry may only be
    acked once its lease cannot be lost, or a database crash would strand the submission. Each
    group costs one :func:`leases.make_durable` and one XACK+XDEL; entries handed over meanwhile form
    the next group. If either step fails the entries stay pending: the reaper re-delivers them, and
    a worker then acks them as stale (lease held) or leases them again (lease lost).
    """

    def __init__(self, pool: asyncpg.Pool, redis: aioredis.Redis, queue: str, *, shadow: bool = False) -> None:
        self._pool = pool
        self._redis = redis
        self._queue = queue
        self._shadow = shadow
        self._pending: list[str] = []
        self._forget: list[tuple[int, int] | None] = []  # each entry's (submission, generation)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ack-when-durable")

    def add(self, entry_ids: Sequence[str], pairs: Sequence[tuple[int, int]] | None = None) -> None:
        """Entries to ack; ``pairs`` (one per entry): their dedup markers are deleted with the ack."""
        self._pending += entry_ids
        self._forget += pairs if pairs is not None else [None] * len(entry_ids)
        self._idle.clear()
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                group, self._pending = self._pending, []
                forget, self._forget = self._forget, []
                try:
                    await self._settle(group, forget)
                except Exception:
                    # Never let one bad group stop every later ack; these entries stay pending.
                    log.exception("ack group failed; entries left pending", extra={"entries": len(group)})
            self._idle.set()

    async def _settle(self, entry_ids: list[str], forget: list[tuple[int, int] | None]) -> None:
        try:
            async with self._pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                await leases.make_durable(conn)
        except DB_ERRORS as exc:
            log.warning(
                "leases not confirmed durable; entries left pending",
                extra={"error": str(exc), "entries": len(entry_ids)},
            )
            return
        try:
            for start in range(0, len(entry_ids), ACK_BATCH):
                pairs = [p for p in forget[start : start + ACK_BATCH] if p is not None]
                await streams.ack(
                    self._redis, self._queue, entry_ids[start : start + ACK_BATCH], pairs, shadow=self._shadow
                )
            failpoints.hit("worker.after_ack")
        except TransportError as exc:
            # Harmless: the entries stay pending, get re-delivered and are then acked as stale.
            log.warning("ack failed", extra={"error": str(exc), "entries": len(entry_ids)})

    async def close(self, within: float) -> None:
        """Ack what is queued within ``within`` seconds; the rest stays pending for the reaper."""
        if self._task is None:
            return
        if self._pending or not self._idle.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), within)
        await cancel_within(self._task, SHUTDOWN_STEP)


class Worker:
    """One worker instance: ``concurrency`` jobs at once from one queue's consumer group."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        redis: aioredis.Redis,
        settings: Settings,
        *,
        judge: Judge | None = None,
        name: str | None = None,
        block_ms: int = 200,
    ) -> None:
        self.pool = pool
        self.redis = redis
        self.settings = settings
        self.queue = settings.queue
        self.cfg = settings.worker
        self.judge = judge if judge is not None else load_judge(settings.worker.judge)
        self.name = name or instance_id("worker")
        self.block_ms = block_ms
        self.stats = WorkerStats()
        self._jobs: dict[uuid.UUID, _Job] = {}
        self._slot_freed = asyncio.Event()
        #: The shadow lane (JUDGEQUEUE_SHADOW=judge) judges the shadow stream only, into shadow verdicts.
        self.lane: Lane = SHADOW_LANE if self.cfg.shadow == "judge" else LIVE_LANE
        self._writer = _VerdictWriter(pool, self.stats, linger=VERDICT_LINGER, lane=self.lane)
        self._intake = HeldSession(pool)  # the read loop's leases: one session, not one per batch
        self._acks = _AckWhenDurable(pool, redis, self.queue, shadow=self.lane.shadow)
        self.direct = self.cfg.intake == "direct" and not self.lane.shadow
        self._stream_checked = -float("inf")  # direct intake: when the stream was last read
        self._stream_flowing = False  # direct intake: the last read of the stream found entries
        self._streak = 0  # direct intake: takes in a row that found rows without waiting
        self._take_rate = TakeRate()  # direct intake: how fast the streak's takes find rows
        self._direct_failures = 0
        #: Set when the judge reports this worker unfit (:func:`judge_fault`): the reason it stops.
        self.unfit: str | None = None
        self._halt = asyncio.Event()  # set by stop, or by the worker itself when unfit
        #: Direct intake with a LISTEN connection: slots offered to the submits (core/offering.py).
        self._offering: Offering | None = None
        #: Slots a take, stream read or lease under way may fill: busy for the offers, which must
        #: not open them meanwhile (jobs + offers + this never exceed the concurrency).
        self._taking = 0
        self._wakeup: Wakeup | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # run()'s, for the tasks started per job
        q = self.queue
        self._m_judge = metrics.JUDGE_DURATION.labels(q)
        self._m_e2e = metrics.END_TO_END.labels(q)
        self._m_in_flight = metrics.JOBS_IN_FLIGHT.labels(q)
        self._m_renew_failures = metrics.LEASE_RENEW_FAILURES.labels(q)
        self._m_verdicts: dict[str, Any] = {} if self.lane.shadow else metrics.verdict_series(q)

    # --- public -----------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._jobs)

    async def run(self, stop: asyncio.Event) -> None:
        """Judge until ``stop`` is set, then shut down gracefully (finish or release in-flight jobs)."""
        self._loop = asyncio.get_running_loop()
        self._writer.start()
        self._acks.start()
        halt = self._halt
        follow = asyncio.create_task(_follow(stop, halt), name="worker-stop")
        stop = halt  # from here on "stop" also means the worker stopping itself (unfit)
        heartbeat = asyncio.create_task(self._heartbeat(), name="lease-heartbeat")
        wakeup = self._direct_wakeup() if self.direct else None
        failures = 0
        try:
            while not stop.is_set():
                self._slot_freed.clear()
                free = self.cfg.concurrency - len(self._jobs)
                if free <= 0:
                    self._writer.flush()  # a slot is held by a verdict waiting for company
                    if wakeup is not None and wakeup.registered:
                        # A full worker takes nothing: submitters need not notify it.
                        try:
                            await self._disarm(wakeup)
                        except SERVER_ERRORS:
                            wakeup.forget()  # its row is pruned by the reaper if left behind
                            await self._intake.drop()
                    await wait_any(stop, self._slot_freed, 1.0)
                    continue
                if wakeup is not None:
                    await self._direct_step(wakeup, free, stop)
                    continue
                try:
                    deliveries = await streams.read(
                        self.redis, self.queue, self.name, count=free, block_ms=self.block_ms,
                        shadow=self.lane.shadow,
                    )
                    failures = 0
                except TransportError as exc:
                    failures += 1
                    delay = backoff(failures)
                    log.warning("stream read failed", extra={"error": str(exc), "retry_in": delay})
                    await wait_any(stop, None, delay)
                    continue
                if deliveries:
                    await self._start(deliveries, stop)
        finally:
            if self._offering is not None:
                # Before the listener goes: offers being filled right now still reach this worker.
                await self._offering.close(SHUTDOWN_STEP)
            if wakeup is not None:
                await best_effort(wakeup.close(), SHUTDOWN_STEP)
            await self._intake.release()
            await self._shutdown()
            await cancel_within(heartbeat, SHUTDOWN_STEP)
            follow.cancel()
        if self.unfit is not None:
            raise RoleUnfit(f"the worker cannot judge any more, its jobs were given back: {self.unfit}")

    # --- direct intake ----------------------------------------------------------------------------

    async def _direct_step(self, wakeup: Wakeup, free: int, stop: asyncio.Event) -> None:
        """One turn of direct intake: the stream's entries first while it has any (the dispatcher's
        overflow and the reaper's re-deliveries are older than anything in the outbox), looked at
        once a ``schedule`` otherwise; then lease ready outbox rows; then, unless work is flowing,
        sleep on the submit notification.

        The dispatcher's rule (:func:`~judgequeue.core.wakeup.keep_listening`): register as a
        waiter only when a take finds nothing, stay registered while a trickle comes in, and loop
        unregistered while takes keep finding rows: a busy queue pays no NOTIFY per commit (which
        would serialise the submits' commits). In that loop, while the takes find rows faster than
        offers carry them and leave slots free, they come :data:`~judgequeue.core.wakeup.TAKE_PACE`
        apart (:func:`~judgequeue.core.wakeup.pace_takes`), so each brings several rows instead of
        one statement per row or two. Notified of more rows than it took, the
        worker steps back for :data:`STEP_BACK` (other workers serve the queue). Redis being down
        stops only the stream's part.
        """
        schedule = self.settings.dispatcher.schedule
        nudged = wakeup.event.is_set()
        notified = wakeup.heard()
        wakeup.event.clear()  # a notification during the take below ends the wait at once
        try:
            now = time.monotonic()
            stream_due = self._stream_flowing or now - self._stream_checked >= schedule
            if nudged and not notified and not stream_due and wakeup.registered:
                # Woken only because a filled offer made it full (see _start_offered) and it is not
                # (any more): nothing new to take, and a notification comes if there is.
                await wakeup.wait(stop, schedule)
                return
            free = await self._take_capacity(free, wakeup_due=notified or stream_due or not wakeup.registered)
            if free <= 0:
                # Every free slot is offered and nothing says there is more to take (registered: a
                # notification would): submits fill them.
                await wakeup.wait(stop, schedule)
                return
            # From here to the take's end these slots are the take's: the offers leave them alone.
            self._taking = free
            try:
                if stream_due:
                    self._stream_checked = now
                    try:
                        deliveries = await streams.read(self.redis, self.queue, self.name, count=free, block_ms=None)
                    except TransportError as exc:
                        # Direct intake needs no Redis: judge from the outbox; look again next schedule.
                        log.warning("stream read failed; taking from the outbox only", extra={"error": str(exc)})
                        deliveries = []
                    self._stream_flowing = bool(deliveries)
                    if deliveries:
                        await self._start(deliveries, stop)
                        return
                take = await self._take_direct(wakeup, free, stop)
            finally:
                self._taking = 0
            if take is None:
                return
            self._direct_failures = 0
            taken = take.rows
            wakeup.taken += taken
            if not take.live:
                # Paused, or shadow (the dispatcher's): nothing to take until a flip, which a poll
                # finds within a schedule; registered, every submit would notify for nothing.
                await self._disarm(wakeup)
                await wait_any(stop, None, schedule)
                return
            if taken:
                self._streak += 1
                if self._streak == 1:
                    self._take_rate.start(time.monotonic())
                else:
                    self._take_rate.add(taken, time.monotonic())
                if not (wakeup.registered and keep_listening(taken, free, self._streak)):
                    wakeup.disarm_when_busy()  # the next take leaves if it finds rows
                    if pace_takes(taken, free, self._streak, self._take_rate.per_second):
                        await wait_any(stop, None, TAKE_PACE)
                    return  # work is flowing: take again
            elif wakeup.others_serve():
                # Other workers take the rows this one is woken for (they loop, busy): staying
                # registered would only make every submit pay a NOTIFY.
                await self._disarm(wakeup)
                await wait_any(stop, None, min(schedule, STEP_BACK))
                return
            else:
                self._streak = 0
            if take.registered or await wakeup.arm():
                self._want_offers(True)  # it waits for work now: its free slots are the submits' to fill
                return  # rows committed before the registration sent no notification: look again
        except SERVER_ERRORS as exc:
            wakeup.forget()
            await self._intake.drop()
            self._direct_failures += 1
            delay = backoff(self._direct_failures)
            log.warning("direct intake failed; retrying", extra={"error": str(exc), "retry_in": delay})
            await wait_any(stop, None, delay)
            return
        # Only takes run back to back make a busy streak: one that waits serves a trickle.
        if not wakeup.event.is_set():
            self._streak = 0
        await wakeup.wait(stop, schedule)

    async def _take_direct(self, wakeup: Wakeup, free: int, stop: asyncio.Event) -> outbox.DirectTake | None:
        """Lease up to ``free`` ready rows straight from the outbox and start their judges; returns
        what the take claimed (None if ``stop`` came first)."""
        await wakeup.listen()  # before a take may register: no notification goes unheard
        leave, join = wakeup.take_flags()
        conn = await self._intake.get()
        take = await unless_stopped(
            stop,
            outbox.take_direct(
                conn, self.queue, self.name, limit=free, ttl=self.cfg.lease_ttl,
                unregister_if_busy=leave, register_if_idle=join,
            ),
        )  # fmt: skip
        if take is None:
            # Abandoned mid-statement: a claim it committed is rescued like a crashed worker's lease.
            await self._intake.drop()
            return None
        self.stats.direct_takes += 1
        wakeup.after_take(take.registered, take.unregistered)
        if self._offering is not None:
            self._offering.taken(take.rows)
        if take.unregistered or not take.live:
            self._want_offers(False)  # work flows through takes (or none may be taken): no offers
        if take.leases:
            failpoints.hit("worker.after_lease")
            self._start_jobs(take.leases)
            metrics.DISPATCH_RESULTS.labels(self.queue, "direct").inc(len(take.leases) + len(take.stale))
        if take.skipped:
            metrics.DISPATCH_RESULTS.labels(self.queue, "skipped").inc(take.skipped)
        if take.stale:
            await self._count_stale(take.stale)
        return take

    def _direct_wakeup(self) -> Wakeup:
        """The wake-up of direct intake, with offers when the worker can listen (they come by
        notification) and is allowed some (``JUDGEQUEUE_OFFERS``)."""
        channel = None
        if self.settings.listen_dsn is not None and self.cfg.offers > 0:
            self._offering = Offering(
                self.pool, self.queue, self.name, limit=self.cfg.offers, concurrency=self.cfg.concurrency,
                lease_ttl=self.cfg.lease_ttl, busy=lambda: len(self._jobs) + self._taking, start=self._start_offered,
            )  # fmt: skip
            self._offering.start()
            channel = (self._offering.channel, self._offering.receive)
        self._wakeup = Wakeup(self._intake, self.settings.listen_dsn, self.queue, self.name, offers=channel)
        return self._wakeup

    def _want_offers(self, wanted: bool) -> None:
        if self._offering is not None:
            self._offering.want(wanted)

    async def _disarm(self, wakeup: Wakeup) -> None:
        """Unregister (full, paused, others serve the queue), and offer nothing either."""
        self._want_offers(False)
        await wakeup.disarm()

    async def _take_capacity(self, free: int, *, wakeup_due: bool) -> int:
        """Slots a take may fill: free ones not held for offers. When all of them are offered and a
        notification (or the stream's schedule) says some rows went the usual way (a submit that
        found no open offer, a rejudge, a rescue), the offers are taken back first: otherwise such
        rows would wait for as long as submits keep the offers filled."""
        if self._offering is None:
            return free
        capacity = free - self._offering.reserved
        if capacity <= 0 and self._offering.reserved and wakeup_due:
            await self._offering.withdraw_now()
            # Counted again: offers filled while the withdrawal ran brought jobs meanwhile.
            capacity = self.cfg.concurrency - len(self._jobs) - self._offering.reserved
        return capacity

    def _start_offered(self, held: list[leases.Lease]) -> None:
        """Jobs a submit leased to this worker by filling one of its offers."""
        failpoints.hit("worker.after_lease")
        self._start_jobs(held)
        if len(self._jobs) >= self.cfg.concurrency and self._wakeup is not None:
            self._wakeup.nudge()  # full now: the intake loop unregisters (submits stop notifying it)

    # --- intake -----------------------------------------------------------------------------------

    async def _start(self, deliveries: Sequence[streams.Delivery], stop: asyncio.Event) -> None:
        """Lease, ack and launch a batch of deliveries; set aside what can never be judged."""
        good: list[tuple[str, Envelope]] = []
        poison: list[dead_letters.Decision] = []
        for d in deliveries:
            if d.envelope is None:
                self.stats.malformed += 1
                metrics.MALFORMED_ENTRIES.labels(self.queue).inc()
                poison.append(self._give_up(d.entry_id, None, f"malformed entry: {d.error}"))
            else:
                good.append((d.entry_id, d.envelope))
        if good:
            held, refused = await self._lease(good, stop)
            if held is None:
                return  # stopping: the entries stay pending; the reaper re-delivers them
            poison += refused
            stale = self._launch(held, good, refused)
            if stale:
                await self._count_stale(stale)
        if poison:
            await self._dead_letter(poison)
        # Yield once so the judges just launched start before the next read is prepared.
        await asyncio.sleep(0)

    async def _lease(
        self, batch: list[tuple[str, Envelope]], stop: asyncio.Event
    ) -> tuple[list[leases.Lease] | None, list[dead_letters.Decision]]:
        """Leases for ``batch``, retrying transient errors; envelopes the database refuses for good.

        A batch refused for its values (:func:`~judgequeue.core.errors.is_permanent`) is leased one
        envelope at a time, so the envelope at fault is found and set aside on this first attempt
        and the others are judged. Returns ``(None, [])`` if ``stop`` is set while retrying.
        """
        failures = 0
        while True:
            try:
                conn = await self._intake.get()
                pairs = [(env.submission, env.generation) for _, env in batch]
                got = await unless_stopped(
                    stop, self.lane.acquire(conn, self.queue, pairs, ttl=self.cfg.lease_ttl, worker=self.name)
                )
                if got is None:
                    # Stopping while the statement hung: the entries stay pending for the reaper,
                    # and a lease it did take expires and is rescued like a crashed worker's.
                    await self._intake.drop()
                    return None, []
                return got, []
            except DB_ERRORS as exc:
                await self._intake.drop()
                if is_permanent(exc):
                    if len(batch) == 1:
                        entry_id, env = batch[0]
                        log.error("lease refused by the database", extra={"entry": entry_id, "error": describe(exc)})
                        return [], [self._give_up(entry_id, env, f"lease refused by the database: {describe(exc)}")]
                    held: list[leases.Lease] = []
                    refused: list[dead_letters.Decision] = []
                    for one in batch:
                        got, bad = await self._lease([one], stop)
                        if got is None:
                            return None, []
                        held += got
                        refused += bad
                    return held, refused
                failures += 1
                if stop.is_set():
                    log.warning("lease acquire failed at shutdown", extra={"error": str(exc)})
                    return None, []
                delay = backoff(failures)
                log.warning("lease acquire failed; retrying", extra={"error": str(exc), "retry_in": delay})
                await wait_any(stop, None, delay)

    def _launch(
        self, held: list[leases.Lease], batch: list[tuple[str, Envelope]], refused: list[dead_letters.Decision]
    ) -> list[tuple[int, int]]:
        """Start a judge per lease and hand the batch's entries to the acker; returns the stale envelopes."""
        if held:
            failpoints.hit("worker.after_lease")
        # Judging starts at once; the entries are acked in the background once the leases are
        # durable (stale ones too: their staleness may rest on someone else's not-yet-durable lease).
        self._start_jobs(held)
        set_aside = {d.entry.entry_id for d in refused}
        kept = [(entry_id, env) for entry_id, env in batch if entry_id not in set_aside]
        pairs = [(env.submission, env.generation) for _, env in kept]
        self._acks.add([entry_id for entry_id, _ in kept], pairs)
        return unleased(pairs, [(x.submission, x.generation) for x in held])

    def _start_jobs(self, held: list[leases.Lease]) -> None:
        loop = self._loop or asyncio.get_running_loop()
        for lease in held:
            job = _Job(lease)
            self._jobs[lease.attempt] = job
            job.task = loop.create_task(self._run_job(job))
        self.stats.leased += len(held)

    def _give_up(self, entry_id: str, envelope: Envelope | None, reason: str) -> dead_letters.Decision:
        entry = streams.ClaimedEntry(entry_id, None, self.name, envelope.deliveries if envelope else 1)
        return dead_letters.Decision(entry, "dead_letter", reason[:1000], envelope)

    async def _dead_letter(self, poison: list[dead_letters.Decision]) -> None:
        """Dead-letter entries no retry can judge, at once (Postgres record first, then the DLQ).

        If either step fails the entries stay pending: the reaper dead-letters them after
        ``maxDeliveries`` as before, so nothing is lost; this worker moves on either way.
        """
        try:
            dead = await self.lane.give_up(self.pool, self.redis, self.queue, self.name, poison)
        except SERVER_ERRORS as exc:
            log.warning("dead-letter failed; left pending for the reaper", extra={"error": str(exc)})
            return
        self.stats.dead_lettered += dead
        for d in poison:
            log.error("entry dead-lettered", extra={"entry": d.entry.entry_id, "reason": d.reason})

    async def _count_stale(self, stale: list[tuple[int, int]]) -> None:
        self.stats.stale_envelopes += len(stale)
        try:
            reasons = await self.lane.stale_reasons(await self._intake.get(), stale)
        except DB_ERRORS:
            await self._intake.drop()
            reasons = ["unknown"] * len(stale)
        for reason in reasons:
            metrics.STALE_RESULTS_DROPPED.labels(self.queue, f"{self.lane.stale_prefix}envelope_{reason}").inc()
        log.info("stale envelopes acked", extra={"count": len(stale), "reasons": sorted(set(reasons))})

    # --- one job ----------------------------------------------------------------------------------

    async def _run_job(self, job: _Job) -> None:
        lease = job.lease
        self._m_in_flight.inc()
        started = time.monotonic()
        try:
            try:
                verdict = await judge_job(self.judge, leases.job_of(self.queue, lease), lease.payload)
                failpoints.hit("worker.after_judge")
                if not isinstance(verdict, Verdict):
                    raise TypeError(f"judge returned {type(verdict).__name__}, not a Verdict")
            except asyncio.CancelledError:
                if not (job.lost or job.releasing):
                    raise
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
                if job.lost:
                    self.stats.lost_leases += 1
                    metrics.STALE_RESULTS_DROPPED.labels(self.queue, f"{self.lane.stale_prefix}lease_lost").inc()
                    log.info("lease lost; judge cancelled", extra={"submission": lease.submission})
                return  # releasing: _shutdown gives the lease back
            except CallLater as later:
                job.phase = "writing"  # the heartbeat leaves it alone: the deferral is fenced itself
                instead = await deferral.defer(self.pool, self.queue, lease, later, shadow=self.lane.shadow)
                if instead is None:
                    return  # given back to be tried later: the slot is free now
                verdict = instead
            except Exception as exc:
                self.stats.judge_errors += 1
                log.exception("judge failed", extra={"submission": lease.submission})
                verdict = judge_failure(exc)
            if verdict.status == "SYSTEM_ERROR" and (fault := judge_fault(self.judge)) is not None:
                # The worker failed, not the submission: give the job back for another worker.
                job.phase = "releasing"
                await self._give_back_unfit(lease, fault)
                return
            job.phase = "writing"
            self._m_judge.observe(time.monotonic() - started)
            checked, doc, text = stored_verdict(verdict, lease, self.name)
            if checked.status != verdict.status:
                self.stats.judge_errors += 1
                log.warning(
                    "verdict not storable", extra={"submission": lease.submission, "reason": checked.details["reason"]}
                )
            verdict = checked
            write = leases.VerdictWrite(lease, verdict.status, doc, text)
            try:
                end_to_end = await self._writer.write(write)
            except WriteAbandoned as exc:
                log.warning("verdict not written", extra={"submission": lease.submission, "reason": str(exc)})
                return
            if end_to_end is None:
                self.stats.stale_results += 1
                metrics.STALE_RESULTS_DROPPED.labels(self.queue, f"{self.lane.stale_prefix}stale_verdict").inc()
                log.info("stale verdict dropped", extra={"submission": lease.submission})
                return
            self.stats.written += 1
            counter = self._m_verdicts.get(verdict.status)
            if counter is None:
                counter = self._m_verdicts[verdict.status] = self.lane.verdict_counter(self.queue, verdict.status)
            counter.inc()
            if not self.lane.shadow:  # a shadow verdict's seconds are its judging, not created -> verdict
                self._m_e2e.observe(end_to_end)
        finally:
            job.phase = "done"
            self._m_in_flight.dec()
            if not job.releasing:
                self._jobs.pop(lease.attempt, None)
            self._slot_freed.set()
            if self._offering is not None:
                self._offering.freed()

    async def _give_back_unfit(self, lease: leases.Lease, fault: str) -> None:
        """Release ``lease`` and stop taking jobs: the judge says this worker cannot judge any more."""
        if self.unfit is None:
            self.unfit = fault
            log.error("the judge cannot judge on this worker: giving jobs back and stopping", extra={"reason": fault})
            self._halt.set()
            self._slot_freed.set()
        await self._release([lease])

    # --- heartbeat --------------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        """Renew every held lease each ``lease_ttl / 3``; a lost lease cancels its judge."""
        interval = self.cfg.lease_ttl / 3
        while True:
            await asyncio.sleep(interval)
            jobs = [j for j in self._jobs.values() if j.phase != "done"]
            if not jobs:
                continue
            try:
                async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                    held = await self.lane.renew(conn, [j.lease for j in jobs], ttl=self.cfg.lease_ttl)
            except DB_ERRORS as exc:
                # Keep judging: the fence decides at write time whether the result still counts.
                self._m_renew_failures.inc()
                log.warning("lease renew failed", extra={"error": str(exc), "leases": len(jobs)})
                continue
            for job in jobs:
                if job.lease.attempt in held or job.phase != "judging":
                    continue  # a job already writing learns its fate from the verdict write
                self._m_renew_failures.inc()
                job.lost = True
                if job.task is not None:
                    job.task.cancel()

    # --- shutdown ---------------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Finish in-flight jobs within the grace period; cancel and release the rest."""
        grace = self.cfg.grace_period
        self._writer.flush(from_now_on=True)
        tasks = [j.task for j in self._jobs.values() if j.task is not None]
        if tasks:
            log.info("stopping: waiting for in-flight jobs", extra={"jobs": len(tasks), "grace": grace})
            await asyncio.wait(tasks, timeout=grace)
        unfinished = [j for j in self._jobs.values() if j.phase == "judging"]
        for job in unfinished:
            job.releasing = True
            if job.task is not None:
                job.task.cancel()
        cancelled = [j.task for j in unfinished if j.task is not None]
        if cancelled:
            await asyncio.wait(cancelled, timeout=5.0)
        if unfinished:
            await self._release([j.lease for j in unfinished])
        for job in unfinished:
            self._jobs.pop(job.lease.attempt, None)
        # Jobs caught writing their verdict get a little longer; the rest is the lease's business.
        writing = [j.task for j in self._jobs.values() if j.task is not None and not j.task.done()]
        if writing:
            await asyncio.wait(writing, timeout=SHUTDOWN_STEP)
        # Flush what can still be written and acked, side by side: each is bounded on its own.
        await asyncio.gather(self._writer.close(SHUTDOWN_STEP), self._acks.close(SHUTDOWN_STEP))
        for job in list(self._jobs.values()):
            if job.task is not None and not job.task.done():
                job.task.cancel()

    async def _release(self, held: list[leases.Lease]) -> None:
        """Give in-flight leases back so another worker takes the jobs at once; bounded, best effort.

        If the database does not answer within :data:`SHUTDOWN_STEP` the leases simply expire and
        the reaper rescues the jobs: slower, never lost.
        """
        deadline = asyncio.get_running_loop().time() + SHUTDOWN_STEP
        for attempt in range(3):
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                async with asyncio.timeout(left), self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                    released = await self.lane.release(conn, held)
                self.stats.released += len(released)
                log.info("released in-flight jobs", extra={"released": len(released), "asked": len(held)})
                return
            except DB_ERRORS as exc:
                log.warning("lease release failed", extra={"error": str(exc), "attempt": attempt + 1})
                await asyncio.sleep(min(backoff(attempt + 1), max(0.0, left)))
        log.error("could not release leases; they will expire and be rescued", extra={"leases": len(held)})


async def _follow(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()


def attach_package_cache(judge: Judge, pool: asyncpg.Pool) -> ProblemCache | None:
    """Give a judge that judges problem packages by reference its cache of them (judges never
    connect to Postgres themselves); None for judges that need none."""
    if not isinstance(judge, UsesPackages):
        return None
    directory, max_bytes = judge.package_cache()
    cache = ProblemCache(Path(directory), max_bytes, pool)
    judge.attach_packages(cache)
    return cache


async def run(settings: Settings, stop: asyncio.Event) -> None:
    """Entry point of the worker role: owns its connections and runs until ``stop`` is set."""
    judge = load_judge(settings.worker.judge)  # an unknown name fails before connecting anywhere

    def make(conns: Connections) -> Worker:
        attach_package_cache(judge, conns.pool)
        return Worker(conns.pool, conns.redis, settings, judge=judge)

    await serve(
        settings, stop, make, role="worker", pool_size=4, judge=settings.worker.judge,
        concurrency=settings.worker.concurrency,
    )  # fmt: skip
