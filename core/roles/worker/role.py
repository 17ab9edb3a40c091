"""The worker role: judge jobs from the stream and write fenced verdicts (docs/design.md §1, §4).

:meth:`Worker.run` is the loop of docs/design.md §1: read only as many entries as there are free
slots (``XREADGROUP COUNT=free``), lease the whole batch in one statement (which returns the
payloads), start one judge per lease, and ack the batch (XACK+XDEL) in the background once the
leases are durable (:class:`~judgequeue.core.roles.worker.lanes.AckWhenDurable`). From then on the lease owns
recovery:

* a heartbeat renews every held lease every ``lease_ttl / 3`` in one fenced statement; a lease that
  is gone (rejudged, rescued) cancels its running judge;
* a cancelled submission's judge is stopped at once (:mod:`judgequeue.core.roles.worker.cancels`: a
  notification, or a lease check where the worker cannot listen);
* verdicts are stored by :mod:`judgequeue.core.roles.worker.verdicts`: a group-commit writer, fenced; a stale
  result is dropped and counted;
* on ``stop`` the worker stops reading, lets in-flight jobs finish within ``grace_period``, then
  cancels the rest and releases their leases (new generation + outbox row) so another worker takes
  them at once.

Jobs come from the worker's *intake* (:mod:`judgequeue.core.roles.worker.stream`), chosen once: the outbox
itself (:class:`judgequeue.core.roles.worker.direct.DirectIntake`, ``JUDGEQUEUE_INTAKE=direct``, the default) or
the stream (:class:`~judgequeue.core.roles.worker.stream.StreamIntake`). A *shadow worker*
(``JUDGEQUEUE_SHADOW=judge``) runs the same loop in the shadow lane (:mod:`judgequeue.core.roles.worker.lanes`),
always from the stream.

A stale envelope (generation moved on, already judging or terminal) is acked and counted, never
judged. An entry that can never be judged (it does not parse, or the database refuses its lease for
its values) is dead-lettered at once with the reason, so a poison entry holds no slot beyond one
attempt. Postgres and Redis errors are logged and retried with backoff; nothing is lost: an entry
stays pending until its lease is held, and the reaper rescues a lease whose worker disappeared.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from ...base import failpoints, metrics
from ...base.errors import RoleUnfit, describe, is_permanent, reason
from ...config import Settings
from ...judges import (
    NO_PROGRESS,
    CallLater,
    Judge,
    Verdict,
    attach_redis,
    judge_failure,
    judge_fault,
    judge_job,
    load_judge,
)
from ...runtime.lifecycle import (
    DB_ERRORS,
    SHUTDOWN_STEP,
    Connections,
    HeldSession,
    backoff,
    cancel_within,
    instance_id,
    serve,
    unless_stopped,
    wait_any,
)
from ...store import giving_up, leases
from ...store.problems import attach_package_cache
from ...transport import streams
from ...transport.envelope import Envelope
from . import deferral
from .cancels import CancelWatch
from .direct import DirectIntake
from .lanes import LIVE_LANE, SHADOW_LANE, AckWhenDurable, Lane
from .progress import JobProgress, ProgressWriter
from .running import RunningJob, StartPacer, WorkerStats, dead_letter, keep_leases, release_leases
from .stream import Intake, StreamIntake
from .verdicts import VERDICT_LINGER, VerdictWriter, WriteAbandoned, stored_verdict

log = logging.getLogger("judgequeue.worker")


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
        attach_redis(self.judge, redis, settings.worker.concurrency)  # the http-call judge's endpoint slots
        self.name = name or instance_id("worker")
        self.block_ms = block_ms
        self.stats = WorkerStats()
        self._jobs: dict[uuid.UUID, RunningJob] = {}
        self._slot_freed = asyncio.Event()
        #: The shadow lane (JUDGEQUEUE_SHADOW=judge) judges the shadow stream only, into shadow verdicts.
        self.lane: Lane = SHADOW_LANE if self.cfg.shadow == "judge" else LIVE_LANE
        self._writer = VerdictWriter(pool, linger=VERDICT_LINGER, lane=self.lane)
        self._pacer = StartPacer()
        #: Live progress events (JUDGEQUEUE_PROGRESS=on; never in the shadow lane, whose verdicts are not events).
        self.progress: ProgressWriter | None = (
            ProgressWriter(pool, interval=self.cfg.progress_interval)
            if self.cfg.progress == "on" and not self.lane.shadow
            else None
        )
        self._session = HeldSession(pool)  # the read loop's leases: one session, not one per batch
        self._acks = AckWhenDurable(pool, redis, self.queue, shadow=self.lane.shadow)
        self.intake: Intake = self._open_intake()  # where this worker's jobs come from
        #: Stops the jobs of cancelled submissions (the live lane's; a shadow verdict is fenced by the
        #: cancellation's generation bump, and judging it to its end changes nothing of the submission).
        self.cancels: CancelWatch | None = None
        if not self.lane.shadow:
            self.cancels = CancelWatch(
                pool, settings.listen_dsn, self.queue, running=self._running_leases, stop=self._stop_job
            )
        #: Set when the judge reports this worker unfit (:func:`~judgequeue.core.judges.judge_fault`): why it stops.
        self.unfit: str | None = None
        self._halt = asyncio.Event()  # set by stop, or by the worker itself when unfit
        self._loop: asyncio.AbstractEventLoop | None = None  # run()'s, for the tasks started per job
        q = self.queue
        self._m_judge = metrics.JUDGE_DURATION.labels(q)
        self._m_e2e = metrics.END_TO_END.labels(q)
        self._m_in_flight = metrics.JOBS_IN_FLIGHT.labels(q)
        self._m_renew_failures = metrics.LEASE_RENEW_FAILURES.labels(q)
        # Every worker exports judgequeue_verdicts_total at zero for each verdict, as documented (a shadow
        # worker never counts one there); its own lane's counters, the shadow ones for a shadow worker.
        metrics.verdict_series(q)
        self._m_verdicts: dict[str, Any] = self.lane.verdict_counters(q)

    def _open_intake(self) -> Intake:
        """The one place the intake is chosen: direct intake (``JUDGEQUEUE_INTAKE=direct``, never in
        the shadow lane, whose rows only the dispatcher sends), else the stream."""
        if self.cfg.intake == "direct" and not self.lane.shadow:
            return DirectIntake(
                self.pool, self.redis, self.settings, self.name, session=self._session, jobs=lambda: len(self._jobs),
                start_jobs=self._start_jobs, start_deliveries=self._start, count_stale=self._count_stale,
                running=self._jobs.keys, flush=lambda: self._writer.flush(),
            )  # fmt: skip
        return StreamIntake(self.redis, self.queue, self.name, self.block_ms, self.lane.shadow, start=self._start)

    # --- public -----------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._jobs)

    @property
    def verdict_statements(self) -> int:
        """Verdict statements issued so far (each a group of verdicts, see ``VERDICT_LINGER``)."""
        return self._writer.statements

    async def run(self, stop: asyncio.Event) -> None:
        """Judge until ``stop`` is set, then shut down gracefully (finish or release in-flight jobs)."""
        self._loop = asyncio.get_running_loop()
        self._writer.start()
        if self.progress is not None:
            self.progress.start()
        self._acks.start()
        follow = asyncio.create_task(_follow(stop, self._halt), name="worker-stop")
        stopping = self._halt  # asked to stop, or stopping itself (unfit)
        # Every held lease renewed each lease_ttl / 3; a lost lease cancels its judge.
        heartbeat = asyncio.create_task(
            keep_leases(self.pool, self.lane, self._jobs.values, self.cfg.lease_ttl, self._m_renew_failures.inc),
            name="lease-heartbeat",
        )
        if self.cancels is not None:
            self.cancels.start()
        self.intake.start()
        ended = False
        try:
            # Once stopping, the loop ends by itself unless a step is stuck on a stalled server
            # (a connect, a take, a LISTEN, an offers sync): it gets a second, then is cut.
            ended = await unless_stopped(stopping, self._intake_loop(stopping), grace=SHUTDOWN_STEP) is True
        finally:
            await self.intake.close()
            # A loop cut short may leave the held session mid-statement: close it, don't reuse it.
            await (self._session.release() if ended else self._session.drop())
            await self._shutdown()
            await cancel_within(heartbeat, SHUTDOWN_STEP)
            if self.progress is not None:
                await self.progress.close()
            if self.cancels is not None:
                await self.cancels.close()
            follow.cancel()
        if self.unfit is not None:
            raise RoleUnfit(f"the worker cannot judge any more, its jobs were given back: {self.unfit}")

    async def _intake_loop(self, stopping: asyncio.Event) -> bool:
        """Bring jobs in while there are free slots, until ``stopping`` is set; True once it has ended."""
        while not stopping.is_set():
            self._slot_freed.clear()
            free = self.cfg.concurrency - len(self._jobs)
            if free <= 0:
                self._writer.flush()  # a slot is held by a verdict waiting for company
                await self.intake.full()
                await wait_any(stopping, self._slot_freed, 1.0)
            else:
                await self.intake.step(free, stopping)
        return True

    # --- intake -----------------------------------------------------------------------------------

    async def _start(self, deliveries: Sequence[streams.Delivery], stop: asyncio.Event) -> None:
        """Lease, ack and launch a batch of deliveries; set aside what can never be judged."""
        good: list[tuple[str, Envelope]] = []
        poison: list[giving_up.Decision] = []
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
    ) -> tuple[list[leases.Lease] | None, list[giving_up.Decision]]:
        """Leases for ``batch``, retrying transient errors; envelopes the database refuses for good.

        A batch refused for its values (:func:`~judgequeue.core.base.errors.is_permanent`) is leased one
        envelope at a time, so the envelope at fault is found and set aside on this first attempt
        and the others are judged. Returns ``(None, [])`` if ``stop`` is set while retrying.
        """
        failures = 0
        while True:
            try:
                conn = await self._session.get()
                pairs = [(env.submission, env.generation) for _, env in batch]
                got = await unless_stopped(
                    stop, self.lane.acquire(conn, self.queue, pairs, ttl=self.cfg.lease_ttl, worker=self.name)
                )
                if got is None:
                    # Stopping while the statement hung: the entries stay pending for the reaper,
                    # and a lease it did take expires and is rescued like a crashed worker's.
                    await self._session.drop()
                    return None, []
                return got, []
            except DB_ERRORS as exc:
                await self._session.drop()
                if is_permanent(exc):
                    if len(batch) == 1:
                        entry_id, env = batch[0]
                        log.error("lease refused by the database", extra={"entry": entry_id, "error": describe(exc)})
                        return [], [self._give_up(entry_id, env, f"lease refused by the database: {describe(exc)}")]
                    held: list[leases.Lease] = []
                    refused: list[giving_up.Decision] = []
                    for one in batch:
                        got, bad = await self._lease([one], stop)
                        if got is None:
                            return None, []
                        held += got
                        refused += bad
                    return held, refused
                failures += 1
                if stop.is_set():
                    log.warning("lease acquire failed at shutdown", extra={"error": reason(exc)})
                    return None, []
                delay = backoff(failures)
                log.warning("lease acquire failed; retrying", extra={"error": reason(exc), "retry_in": delay})
                await wait_any(stop, None, delay)

    def _launch(
        self, held: list[leases.Lease], batch: list[tuple[str, Envelope]], refused: list[giving_up.Decision]
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
        return leases.unleased(pairs, [(x.submission, x.generation) for x in held])

    def _start_jobs(self, held: list[leases.Lease]) -> None:
        loop = self._loop or asyncio.get_running_loop()
        if self.cancels is not None and held:
            # A filled offer's job whose cancellation was heard first: never started.
            doomed = [x for x in held if self.cancels.cancelled(x)]
            if doomed:
                self._count_cancelled(len(doomed))
                held = [x for x in held if x not in doomed]
                self._slot_freed.set()  # their slots (an offer's) are free again
                self.intake.freed()
        for lease in held:
            job = RunningJob(lease)
            self._jobs[lease.attempt] = job
            job.task = loop.create_task(self._run_job(job))
        self.stats.leased += len(held)

    def _give_up(self, entry_id: str, envelope: Envelope | None, reason: str) -> giving_up.Decision:
        entry = streams.ClaimedEntry(entry_id, None, self.name, envelope.deliveries if envelope else 1)
        return giving_up.Decision(entry, "dead_letter", reason[:1000], envelope)

    async def _dead_letter(self, poison: list[giving_up.Decision]) -> None:
        self.stats.dead_lettered += await dead_letter(self.lane, self.pool, self.redis, self.queue, self.name, poison)

    async def _count_stale(self, stale: list[tuple[int, int]]) -> None:
        self.stats.stale_envelopes += len(stale)
        try:
            reasons = await self.lane.stale_reasons(await self._session.get(), stale)
        except DB_ERRORS:
            await self._session.drop()
            reasons = ["unknown"] * len(stale)
        for why in reasons:
            metrics.STALE_RESULTS_DROPPED.labels(self.queue, f"{self.lane.stale_prefix}envelope_{why}").inc()
        log.info("stale envelopes acked", extra={"count": len(stale), "reasons": sorted(set(reasons))})

    # --- one job ----------------------------------------------------------------------------------

    async def _run_job(self, job: RunningJob) -> None:
        lease = job.lease
        self._m_in_flight.inc()
        started = time.monotonic()
        reporter: JobProgress | None = self.progress.job(lease) if self.progress is not None else None
        try:
            try:
                if self.intake.reserve_open() and not self.intake.reserved(lease.attempt):
                    await self._pacer.admit()  # a reserved offer's job starts between the others
                verdict = await judge_job(
                    self.judge, leases.job_of(self.queue, lease), lease.payload, reporter or NO_PROGRESS
                )
                failpoints.hit("worker.after_judge")
                if not isinstance(verdict, Verdict):
                    raise TypeError(f"judge returned {type(verdict).__name__}, not a Verdict")
            except asyncio.CancelledError:
                if not (job.lost or job.releasing or job.cancelled):
                    raise
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
                if job.cancelled:
                    self._count_cancelled(1)
                    log.info("submission cancelled; judge stopped", extra={"submission": lease.submission})
                elif job.lost:
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
            if (fault := judge_fault(self.judge)) is not None:
                # The worker failed, not the submission, whatever the verdict says (a box emptied
                # under a running program reads as its runtime error): give the job back.
                job.phase = "releasing"
                await self._give_back_unfit(lease, fault)
                return
            job.phase = "writing"
            self._m_judge.observe(time.monotonic() - started)
            if reporter is not None and self.progress is not None:
                await self.progress.finish(reporter)  # its progress rows commit before its verdict
            checked, doc, text = stored_verdict(verdict, lease, self.name)
            if checked.status != verdict.status:
                self.stats.judge_errors += 1
                log.warning(
                    "verdict not storable", extra={"submission": lease.submission, "reason": checked.details["reason"]}
                )
            verdict = checked
            write = leases.VerdictWrite(lease, verdict.status, doc, text)
            try:
                end_to_end = await self._writer.write(
                    write, at_once=self.intake.reserved(lease.attempt) or self.intake.needs_slots()
                )
            except WriteAbandoned as exc:
                log.warning("verdict not written", extra={"submission": lease.submission, "reason": str(exc)})
                return
            if end_to_end is None:
                self.stats.stale_results += 1
                metrics.STALE_RESULTS_DROPPED.labels(self.queue, f"{self.lane.stale_prefix}stale_verdict").inc()
                log.info("stale verdict dropped", extra={"submission": lease.submission})
                return
            self.stats.written += 1
            self._count_verdict(verdict.status)
            if not self.lane.shadow:  # a shadow verdict's seconds are its judging, not created -> verdict
                self._m_e2e.observe(end_to_end)
        finally:
            if reporter is not None and self.progress is not None:
                self.progress.drop(reporter)
            job.phase = "done"
            self._m_in_flight.dec()
            if not job.releasing:
                self._jobs.pop(lease.attempt, None)
            self._slot_freed.set()
            self.intake.freed()

    def _count_verdict(self, status: str) -> None:
        counter = self._m_verdicts.get(status)
        if counter is None:
            counter = self._m_verdicts[status] = self.lane.verdict_counter(self.queue, status)
        counter.inc()

    async def _give_back_unfit(self, lease: leases.Lease, fault: str) -> None:
        """Release ``lease`` and stop taking jobs: the judge says this worker cannot judge any more."""
        if self.unfit is None:
            self.unfit = fault
            log.error("the judge cannot judge on this worker: giving jobs back and stopping", extra={"reason": fault})
            self._halt.set()
            self._slot_freed.set()
        await self._release([lease])

    # --- cancellations ----------------------------------------------------------------------------

    def _running_leases(self) -> list[leases.Lease]:
        return [j.lease for j in self._jobs.values() if j.phase == "judging"]

    def _stop_job(self, attempt: uuid.UUID, cancelled: bool) -> None:
        """Stop a job still judging: its submission was cancelled, or its lease is gone."""
        job = self._jobs.get(attempt)
        if job is None or job.phase != "judging" or job.lost or job.cancelled or job.releasing:
            return
        if cancelled:
            job.cancelled = True
        else:
            self._m_renew_failures.inc()
            job.lost = True
        if job.task is not None:
            job.task.cancel()

    def _count_cancelled(self, n: int) -> None:
        self.stats.cancelled += n
        metrics.JOBS_CANCELLED.labels(self.queue).inc(n)

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
        self.stats.released += await release_leases(self.pool, self.lane, held)


async def _follow(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()


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
