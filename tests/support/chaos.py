"""Chaos harness: every role as a real process, killed at random failpoints and random times.

Used by ``tests/test_chaos.py`` (CI size) and ``bench/chaos_run.py`` (larger). The harness

1. creates the queue in shadow mode and submits "legacy" submissions (owned by another producer),
   then flips to live with a watermark, so invariant 4 is exercised by a real flip;
2. starts dispatchers, workers and reapers as ``judgequeue <role>`` processes with failpoints armed
   at random (``name%P``), submits the main set in bursts while SIGKILLing random processes and
   restarting whatever died, and pauses/resumes the queue a few times;
3. stops the chaos, lets the system drain, and checks every invariant of docs/design.md §6 from
   Postgres (an audit trigger records every status/generation transition) and Redis.

With ``ChaosConfig.shadow_workers`` the legacy submissions are also judged by shadow workers
(``JUDGEQUEUE_SHADOW=judge`` processes, killed, frozen and failpointed like the others), each legacy
job sleeping up to ``legacy_seconds`` so that shadow judging runs on through the chaos after the flip.
The audit then covers ``judgequeue.shadow_verdicts`` too, and the run checks the same invariants
on the shadow side: every shadow-sent submission ends with exactly one shadow verdict (its payload's
status, or an explained SYSTEM_ERROR), no shadow verdict is written by a stale attempt, the
submissions stay the legacy judge's (PENDING), and the shadow stream and its PEL end empty.

With ``ChaosConfig.server_faults`` the faults come from the servers instead: the run owns
a Postgres server and a redis-server (:func:`fault_targets`), the roles reach both through TCP
proxies, and a fault loop terminates every backend, sets ``idle_session_timeout`` to a few hundred
milliseconds for a few seconds, restarts Postgres (fast, and immediate: a crash), kills every Redis
client, resets every proxied connection and stalls the proxies. No role is killed and no failpoint is
armed, so any role exit is a violation, and at the end every role must exit 0 on SIGTERM. The
harness submits directly (not through the proxies) and, like an application, retries a commit that
failed; only commits it saw succeed are expected. The report adds the faults of each kind and the
recovery time after each (from the fault's end to the next verdict written).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import json
import random
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from judgequeue.core.base.errors import DB_ERRORS
from judgequeue.core.store import outbox
from judgequeue.core.store.migrate import migrate
from judgequeue.core.store.queues import create_queue, set_cutover
from judgequeue.core.transport import streams
from tests.support.databases import connection
from tests.support.pg_servers import PostgresServer, postgres_server
from tests.support.queries import count_submissions
from tests.support.redis_servers import RedisServer, redis_server
from tests.support.roles import TERMINAL, RoleProcess, clean_env, json_events, last_error, role_env, stop_process
from tests.support.settings import FAST_ROLE_ENV
from tests.support.tcp_proxy import TcpProxy

JUDGE_STATUSES = ("ACCEPTED", "WRONG_ANSWER", "RUNTIME_ERROR")

FAILPOINTS = {
    "dispatcher": ["dispatcher.after_claim", "dispatcher.after_xadd", "dispatcher.after_mark"],
    "worker": ["worker.after_lease", "worker.after_ack", "worker.after_judge", "worker.after_verdict"],
    "reaper": ["reaper.after_claim", "reaper.dead_letter.after_postgres", "reaper.after_lease_rescue"],
}
FAILPOINTS["shadow-worker"] = FAILPOINTS["worker"]  # the same worker, in the shadow lane

#: The process each slot's role runs (a shadow worker is ``judgequeue worker`` with JUDGEQUEUE_SHADOW=judge).
COMMAND = {"dispatcher": "dispatcher", "worker": "worker", "reaper": "reaper", "shadow-worker": "worker"}

#: The server-side faults of a ``server_faults`` run, each injected by :meth:`Chaos._inject`.
SERVER_FAULTS = (
    "pg_terminate_backends",
    "pg_idle_session_timeout",
    "pg_restart_fast",
    "pg_restart_immediate",
    "redis_client_kill",
    "proxy_reset",
    "proxy_stall",
)

#: Every status/generation transition of a submission, recorded (the audit :func:`check_invariants` reads).
#: The triggers run as their owner (the test's superuser): the statements that fire them run as the
#: schema's owner role, which has no right on the audit tables (docs/security.md).
VERDICT_AUDIT_SQL = """
CREATE TABLE public.chaos_audit (
    seq          bigserial PRIMARY KEY,
    submission   bigint NOT NULL,
    old_gen      bigint NOT NULL,
    new_gen      bigint NOT NULL,
    old_status   text NOT NULL,
    new_status   text NOT NULL,
    old_attempt  uuid,
    new_attempt  uuid,
    at           timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION public.chaos_audit_fn() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO public.chaos_audit (submission, old_gen, new_gen, old_status, new_status, old_attempt, new_attempt)
    VALUES (NEW.id, OLD.generation, NEW.generation, OLD.status, NEW.status, OLD.attempt_id, NEW.attempt_id);
    RETURN NEW;
END $$;
CREATE TRIGGER chaos_audit AFTER UPDATE ON judgequeue.submissions FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.generation IS DISTINCT FROM NEW.generation)
    EXECUTE FUNCTION public.chaos_audit_fn();
"""
#: The same of the shadow verdicts (a schema from before shadow judging has no table to watch).
SHADOW_AUDIT_SQL = """
CREATE TABLE public.chaos_shadow_audit (
    seq          bigserial PRIMARY KEY,
    submission   bigint NOT NULL,
    old_gen      bigint,
    new_gen      bigint NOT NULL,
    old_status   text,
    new_status   text NOT NULL,
    old_attempt  uuid,
    new_attempt  uuid,
    at           timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION public.chaos_shadow_audit_fn() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO public.chaos_shadow_audit (submission, new_gen, new_status, new_attempt)
        VALUES (NEW.submission_id, NEW.generation, NEW.status, NEW.attempt);
    ELSE
        INSERT INTO public.chaos_shadow_audit (submission, old_gen, new_gen, old_status, new_status, old_attempt,
                                               new_attempt)
        VALUES (NEW.submission_id, OLD.generation, NEW.generation, OLD.status, NEW.status, OLD.attempt, NEW.attempt);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER chaos_shadow_audit AFTER INSERT OR UPDATE ON judgequeue.shadow_verdicts FOR EACH ROW
    EXECUTE FUNCTION public.chaos_shadow_audit_fn();
"""
AUDIT_SQL = VERDICT_AUDIT_SQL + SHADOW_AUDIT_SQL


@dataclass
class ChaosConfig:
    submissions: int = 1500
    legacy: int = 50
    chaos_seconds: float = 30.0
    kill_every: tuple[float, float] = (0.3, 1.2)
    failpoint_probability: float = 0.01
    dispatchers: int = 2
    workers: int = 3
    reapers: int = 2
    concurrency: int = 8
    drain_deadline: float = 90.0
    seed: int = 1
    #: Each job sleeps a random time up to this (the sleep judge).
    job_seconds: float = 0.2
    #: Shadow worker processes judging the legacy submissions (0: none, the legacy jobs do not sleep).
    shadow_workers: int = 0
    #: With shadow workers: each legacy job sleeps a random time up to this.
    legacy_seconds: float = 1.0
    #: Server-side faults instead of kills and failpoints (needs the ``targets`` of :func:`fault_targets`).
    server_faults: bool = False
    #: Pause between the end of one server fault and the start of the next.
    fault_every: tuple[float, float] = (1.0, 2.5)
    #: How long the proxies stall, and how long ``idle_session_timeout`` stays at ``idle_session_timeout``.
    stall_seconds: float = 1.5
    idle_timeout_seconds: float = 3.0
    idle_session_timeout: str = "300ms"
    #: How long a crashed (``-m immediate``) Postgres stays down before it is started again.
    crash_outage_seconds: float = 0.5
    #: The fast preset, with what chaos needs different: INFO logs (the report counts the workers'
    #: stale acks and lost leases from them), small claim batches, and fewer retries so a job the
    #: kills keep hitting ends (as SYSTEM_ERROR, explained) within the drain deadline.
    role_env: dict[str, str] = field(
        default_factory=lambda: {
            **FAST_ROLE_ENV,
            "JUDGEQUEUE_BATCH_SIZE": "50",
            "JUDGEQUEUE_MAX_ATTEMPTS": "50",
            "JUDGEQUEUE_MAX_DELIVERIES": "20",
            "JUDGEQUEUE_MAX_RETRIES": "20",
            "JUDGEQUEUE_LOG_LEVEL": "INFO",
        }
    )


@dataclass
class Slot:
    role: str
    index: int
    proc: RoleProcess | None = None
    starts: int = 0


@dataclass
class ChaosReport:
    submissions: int = 0
    legacy: int = 0
    kills: int = 0
    freezes: int = 0
    failpoint_deaths: int = 0
    restarts: int = 0
    pauses: int = 0
    generation_bumps: int = 0
    duplicate_deliveries: int = 0
    duplicate_executions: int = 0
    stale_writes_rejected: int = 0
    leases_lost: int = 0
    system_errors: int = 0
    stale_writes_accepted: int = 0
    lost_submissions: int = 0
    wrong_verdicts: int = 0
    prewatermark_live_dispatches: int = 0
    multiple_terminal_verdicts: int = 0
    leftover_stream_entries: int = 0
    leftover_pel: int = 0
    leftover_outbox_active: int = 0
    seen_keys_without_ttl: int = 0
    #: Outbox rows a worker took itself (direct intake) rather than a dispatcher.
    taken_by_workers: int = 0
    #: Of those, rows a submit handed to a worker's open offer (sent in the submit's transaction).
    filled_offers: int = 0
    # shadow judging (shadow_workers > 0)
    shadow_expected: int = 0
    shadow_judged: int = 0
    shadow_system_errors: int = 0
    shadow_lost: int = 0
    shadow_wrong: int = 0
    shadow_stale_writes_accepted: int = 0
    shadow_kills: int = 0  # shadow workers killed or frozen
    shadow_takeovers: int = 0  # a lease taken over from an attempt that died or froze (expired)
    shadow_rescued: int = 0  # a lease sent again by a reaper, or released by a stopping worker
    shadow_touched_submissions: int = 0
    leftover_shadow_entries: int = 0
    leftover_shadow_pel: int = 0
    # server-fault runs
    faults: dict[str, int] = field(default_factory=dict)
    backends_terminated: int = 0
    redis_clients_killed: int = 0
    failed_commits: int = 0
    role_warnings: int = 0
    unexpected_exits: int = 0
    nonzero_exit_codes: int = 0
    worst_fault_recovery_seconds: float = 0.0
    worst_fault_recovery_by_kind: dict[str, float] = field(default_factory=dict)
    worst_new_work_recovery_seconds: float = 0.0
    longest_verdict_gap_seconds: float = 0.0
    #: From the last verdict (and the outbox drained) to the stream and its PEL empty.
    stream_settle_seconds: float = 0.0
    longest_recovery_seconds: float = 0.0
    p50_latency_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    violations: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class FaultTargets:
    """The servers a server-fault run owns, and the proxies its roles reach them through.

    The harness itself talks to the servers directly (``pg.dsn``, ``redis.url``): a proxy fault is
    a fault of the roles' network, not of the application that submits.
    """

    pg: PostgresServer
    redis: RedisServer
    pg_proxy: TcpProxy
    redis_proxy: TcpProxy

    @property
    def role_pg_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_proxy.port}/postgres"

    @property
    def role_redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_proxy.port}/0"


@contextlib.asynccontextmanager
async def fault_targets() -> AsyncIterator[FaultTargets]:
    """A throwaway Postgres server (migrated) and redis-server, each behind a :class:`TcpProxy`."""
    with postgres_server() as pg, redis_server() as redis:
        async with connection(pg.dsn) as conn:
            await migrate(conn)
        pg_proxy, redis_proxy = TcpProxy(pg.port), TcpProxy(redis.port)
        await pg_proxy.start()
        await redis_proxy.start()
        try:
            yield FaultTargets(pg, redis, pg_proxy, redis_proxy)
        finally:
            await pg_proxy.close()
            await redis_proxy.close()


class Chaos:
    def __init__(
        self,
        pg_dsn: str,
        redis_url: str,
        queue: str,
        config: ChaosConfig,
        log_dir: Path,
        targets: FaultTargets | None = None,
    ) -> None:
        if config.server_faults and targets is None:
            raise ValueError("a server-fault run needs the servers it owns: pass targets=fault_targets()")
        self.pg_dsn = pg_dsn
        self.redis_url = redis_url
        self.targets = targets
        self.role_pg_dsn = targets.role_pg_dsn if targets is not None else pg_dsn
        self.role_redis_url = targets.role_redis_url if targets is not None else redis_url
        self.queue = queue
        self.cfg = config
        #: Every server fault injected: kind, wall-clock start and end (compared with server timestamps).
        self._fault_spans: list[tuple[str, float, float]] = []
        self.rng = random.Random(config.seed)
        self.log_dir = log_dir
        self.slots = (
            [Slot("dispatcher", i) for i in range(config.dispatchers)]
            + [Slot("worker", i) for i in range(config.workers)]
            + [Slot("reaper", i) for i in range(config.reapers)]
            + [Slot("shadow-worker", i) for i in range(config.shadow_workers)]
        )
        #: Legacy submissions and the status each one's payload asks the (shadow) judge for.
        self._legacy_status: dict[int, str] = {}
        self.report = ChaosReport(submissions=config.submissions, legacy=config.legacy)
        self.chaos_on = True
        self._legacy_extra: list[int] = []
        self._frozen: list[tuple[float, subprocess.Popen[bytes]]] = []

    # --- processes -----------------------------------------------------------------------------
    def _env(self, role: str) -> dict[str, str]:
        env = clean_env(**self.cfg.role_env)
        env.update(role_env(self.role_pg_dsn, self.queue, redis_url=self.role_redis_url,
                            JUDGEQUEUE_CONCURRENCY=str(self.cfg.concurrency)))  # fmt: skip
        if self.chaos_on and self.cfg.failpoint_probability > 0 and not self.cfg.server_faults:
            chosen = self.rng.sample(FAILPOINTS[role], k=self.rng.randint(1, len(FAILPOINTS[role])))
            env["JUDGEQUEUE_FAILPOINTS"] = ",".join(f"{name}%{self.cfg.failpoint_probability}" for name in chosen)
        if role == "shadow-worker":
            env["JUDGEQUEUE_SHADOW"] = "judge"
        return env

    def _start(self, slot: Slot) -> None:
        log = self.log_dir / f"{slot.role}-{slot.index}-{slot.starts}.log"
        slot.proc = RoleProcess(COMMAND[slot.role], self._env(slot.role), log)
        slot.starts += 1

    def _reap_dead(self) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is not None:
                if self.cfg.server_faults:
                    # Nothing kills a role in this mode: it exited by itself, which is the finding.
                    self.report.unexpected_exits += 1
                    self.report.violations.append(
                        f"{slot.role}-{slot.index} exited with {slot.proc.returncode} during the run: "
                        + last_error(slot.proc.log_path)
                    )
                if slot.proc.returncode == -signal.SIGKILL:
                    self.report.failpoint_deaths += 1  # corrected below for the kills we sent
                self._start(slot)
                self.report.restarts += 1

    def _freeze_or_kill_random(self) -> None:
        slot = self.rng.choice(self.slots)
        worker = slot.role in ("worker", "shadow-worker")
        if worker and slot.proc is not None and slot.proc.poll() is None and self.rng.random() < 0.3:
            # A stalled worker (GC pause, partition): it wakes after its leases expired and were
            # rescued, and must find its heartbeat and verdicts fenced out.
            slot.proc.send_signal(signal.SIGSTOP)
            self._frozen.append((time.monotonic() + 2.5, slot.proc))
            self.report.freezes += 1
            self.report.shadow_kills += slot.role == "shadow-worker"
            return
        if slot.proc is not None and slot.proc.poll() is None:
            slot.proc.kill()
            slot.proc.wait()
            self.report.kills += 1
            self.report.shadow_kills += slot.role == "shadow-worker"
            self.report.failpoint_deaths -= 1  # _reap_dead counts every SIGKILL; this one was ours

    def _thaw(self, everything: bool = False) -> None:
        now = time.monotonic()
        for due, proc in list(self._frozen):
            if everything or due <= now:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                self._frozen.remove((due, proc))

    def stop_all(self) -> dict[str, int]:
        """SIGTERM every role and wait for it (SIGKILL after 15 s); returns the exit code of each.

        Blocks: a server-fault run calls it in a thread, so the proxies on the event loop keep
        forwarding while the roles shut down through them.
        """
        self._thaw(everything=True)
        codes: dict[str, int] = {}
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.send_signal(signal.SIGTERM)
        for slot in self.slots:
            if slot.proc is not None:
                codes[f"{slot.role}-{slot.index}"] = stop_process(slot.proc, 15, terminate=False)
        return codes

    # --- the run -------------------------------------------------------------------------------
    async def run(self) -> ChaosReport:
        started = time.monotonic()
        # No connection floor under server faults: asyncpg would log every failed attempt to restore it.
        floor = 0 if self.cfg.server_faults else 2
        pool = await asyncpg.create_pool(self.pg_dsn, min_size=floor, max_size=4, timeout=5)
        assert pool is not None
        redis = aioredis.Redis.from_url(self.redis_url)
        try:
            async with pool.acquire() as conn:
                await conn.execute(AUDIT_SQL)
                await create_queue(conn, self.queue, mode="shadow")
                legacy_ids = [
                    await outbox.submit(conn, self.queue, self._legacy_payload()) for _ in range(self.cfg.legacy)
                ]
            for slot in self.slots:
                self._start(slot)
            await self._wait_for_state(pool, "SHADOW_SENT", self.cfg.legacy, within=30)
            async with pool.acquire() as conn:
                # Legacy rows still unsent at the flip are SKIPPED; new ones go live.
                await self._legacy_more(conn)
                watermark = await conn.fetchval("SELECT now()")
                await set_cutover(conn, self.queue, mode="live", watermark=watermark)
            if self.cfg.server_faults:
                expected = await self._submit_under_server_faults(pool)
            else:
                expected = await self._submit_under_chaos(pool)
            self.chaos_on = False
            if not self.cfg.server_faults:
                # Restart everything without failpoints so the drain is not interrupted.
                for slot in self.slots:
                    if slot.proc is not None and slot.proc.poll() is None:
                        slot.proc.kill()
                        slot.proc.wait()
                    self._start(slot)
            await self._retrying(pool, lambda conn: set_cutover(conn, self.queue, paused=False))
            await self._wait_drained(pool, list(expected))
            await self._wait_stream_settled(redis)
            if self.cfg.shadow_workers:
                await self._wait_shadow_settled(pool, redis)
            self._reap_dead()
            codes = await asyncio.to_thread(self.stop_all)
            if self.cfg.server_faults:
                bad = {name: code for name, code in codes.items() if code != 0}
                self.report.nonzero_exit_codes = len(bad)
                if bad:
                    self.report.violations.append(f"roles did not exit 0 on SIGTERM after the faults: {bad}")
            self._count_from_logs()
            await self._check(pool, redis, expected, legacy_ids + self._legacy_extra)
            if self.cfg.server_faults:
                await self._measure_recovery(pool)
        finally:
            await asyncio.to_thread(self.stop_all)
            await redis.aclose()
            await pool.close()
        self.report.elapsed_seconds = round(time.monotonic() - started, 1)
        return self.report

    async def _legacy_more(self, conn: asyncpg.Connection) -> None:
        # A few legacy submissions right before the flip: some will be claimed after it.
        self._legacy_extra = [await outbox.submit(conn, self.queue, self._legacy_payload()) for _ in range(10)]

    def _legacy_payload(self) -> dict[str, Any]:
        """A legacy submission's payload: with shadow workers, a job that takes a while (so kills find
        them mid-judge) and asks for a random status (which its shadow verdict must then carry)."""
        if not self.cfg.shadow_workers:
            return {"legacy": True, "status": "ACCEPTED"}
        return {"legacy": True, "status": self.rng.choice(JUDGE_STATUSES),
                "seconds": self.rng.uniform(0, self.cfg.legacy_seconds)}

    async def _submit_under_chaos(self, pool: asyncpg.Pool) -> dict[int, str]:
        expected: dict[int, str] = {}
        deadline = time.monotonic() + self.cfg.chaos_seconds
        per_tick = max(1, self.cfg.submissions // max(1, int(self.cfg.chaos_seconds / 0.1)))
        next_kill = time.monotonic() + self.rng.uniform(*self.cfg.kill_every)
        paused = False
        while time.monotonic() < deadline or len(expected) < self.cfg.submissions:
            want = min(per_tick, self.cfg.submissions - len(expected))
            if want > 0:
                async with pool.acquire() as conn, conn.transaction():
                    for _ in range(want):
                        status = self.rng.choice(JUDGE_STATUSES)
                        payload = {"seconds": self.rng.uniform(0, self.cfg.job_seconds), "status": status}
                        expected[await outbox.submit(conn, self.queue, payload)] = status
            now = time.monotonic()
            if now >= next_kill and now < deadline:
                self._freeze_or_kill_random()
                next_kill = now + self.rng.uniform(*self.cfg.kill_every)
                if self.rng.random() < 0.1:
                    paused = not paused
                    async with pool.acquire() as conn:
                        await set_cutover(conn, self.queue, paused=paused)
                    self.report.pauses += int(paused)
            self._thaw()
            self._reap_dead()
            await asyncio.sleep(0.1)  # pacing of the offered load, not synchronisation
        self._thaw(everything=True)
        return expected

    async def _retrying(self, pool: asyncpg.Pool, op: Any, within: float = 30.0) -> Any:
        """Run ``op(conn)`` on a pooled connection, retrying database errors like an application.

        After server faults a pooled connection may be one the server already ended; the pool
        replaces it on the next acquire.
        """
        deadline = time.monotonic() + within
        while True:
            try:
                async with pool.acquire() as conn:
                    return await op(conn)
            except DB_ERRORS:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)  # the application's retry pacing

    async def _submit_under_server_faults(self, pool: asyncpg.Pool) -> dict[int, str]:
        """Offer the load while the fault loop runs; a failed commit is retried at the next tick.

        Only ids whose commit returned are expected (a commit that failed may still have landed:
        that submission is not expected, but its outbox row must drain like any other).
        """
        expected: dict[int, str] = {}
        deadline = time.monotonic() + self.cfg.chaos_seconds
        per_tick = max(1, self.cfg.submissions // max(1, int(self.cfg.chaos_seconds / 0.1)))
        faults = asyncio.create_task(self._fault_loop(deadline))
        faults_done_at: float | None = None
        try:
            while True:
                now = time.monotonic()
                if faults.done() and faults_done_at is None:
                    faults.result()  # a harness error in the fault loop ends the run here
                    faults_done_at = now
                # Keep offering load for a while after the last fault, so its recovery is measured.
                if faults_done_at is not None and now > faults_done_at + 2.0 and len(expected) >= self.cfg.submissions:
                    break
                want = min(per_tick, self.cfg.submissions - len(expected)) or (1 if faults_done_at is None else 0)
                if want > 0:
                    batch: dict[int, str] = {}
                    try:
                        async with pool.acquire() as conn, conn.transaction():
                            for _ in range(want):
                                status = self.rng.choice(JUDGE_STATUSES)
                                payload = {"seconds": self.rng.uniform(0, self.cfg.job_seconds), "status": status}
                                batch[await outbox.submit(conn, self.queue, payload)] = status
                    except DB_ERRORS:
                        self.report.failed_commits += 1
                    else:
                        expected.update(batch)
                self._reap_dead()
                await asyncio.sleep(0.1)  # pacing of the offered load, not synchronisation
        finally:
            if not faults.done():
                faults.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await faults
        return expected

    async def _fault_loop(self, deadline: float) -> None:
        """Inject server faults until ``deadline``: in rounds, each kind once per round in random order.

        Rounds, and going on past the deadline until every kind was injected once, guarantee that even
        a short (CI) run on a loaded machine injects every kind; the order within a round and the
        pause between faults are random (seeded).
        """
        round_: list[str] = []
        while time.monotonic() < deadline or len(self.report.faults) < len(SERVER_FAULTS):
            if not round_:
                round_ = list(SERVER_FAULTS)
                self.rng.shuffle(round_)
            kind = round_.pop()
            began = time.time()
            await self._inject(kind)
            self._fault_spans.append((kind, began, time.time()))
            self.report.faults[kind] = self.report.faults.get(kind, 0) + 1
            await asyncio.sleep(self.rng.uniform(*self.cfg.fault_every))  # pacing of the faults

    async def _inject(self, kind: str) -> None:
        """One server fault; returns when it is over (the server is up again, the stall lifted).

        Blocking steps (``pg_ctl``) run in a thread so the proxies on this event loop keep forwarding.
        """
        t = self.targets
        assert t is not None
        if kind == "pg_terminate_backends":
            terminated = await self._admin(
                lambda c: c.fetchval(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
            self.report.backends_terminated += int(terminated or 0)
        elif kind == "pg_idle_session_timeout":
            await self._admin(self._set_idle_timeout(self.cfg.idle_session_timeout))
            await asyncio.sleep(self.cfg.idle_timeout_seconds)  # the duration of the fault
            await self._admin(self._set_idle_timeout(None))
        elif kind == "pg_restart_fast":
            await asyncio.to_thread(t.pg.restart, "fast")
        elif kind == "pg_restart_immediate":
            await asyncio.to_thread(t.pg.crash)
            await asyncio.sleep(self.cfg.crash_outage_seconds)  # the duration of the outage
            await asyncio.to_thread(t.pg.start)
        elif kind == "redis_client_kill":
            client = aioredis.Redis.from_url(self.redis_url)
            try:
                killed = await client.client_kill_filter(_type="normal", skipme=True)
            finally:
                await client.aclose()
            self.report.redis_clients_killed += int(killed)
        elif kind == "proxy_reset":
            t.pg_proxy.reset()
            t.redis_proxy.reset()
        elif kind == "proxy_stall":
            t.pg_proxy.stall(True)
            t.redis_proxy.stall(True)
            try:
                await asyncio.sleep(self.cfg.stall_seconds)  # the duration of the stall
            finally:
                t.pg_proxy.stall(False)
                t.redis_proxy.stall(False)
        else:
            raise ValueError(f"unknown server fault {kind!r}")

    @staticmethod
    def _set_idle_timeout(value: str | None) -> Any:
        async def op(conn: asyncpg.Connection) -> None:
            if value is None:
                await conn.execute("ALTER SYSTEM RESET idle_session_timeout")
            else:
                await conn.execute(f"ALTER SYSTEM SET idle_session_timeout = '{value}'")
            await conn.execute("SELECT pg_reload_conf()")

        return op

    async def _admin(self, op: Any, within: float = 30.0) -> Any:
        """Run ``op`` on a fresh direct connection (a pooled one may be the one a fault just ended)."""
        deadline = time.monotonic() + within
        while True:
            try:
                async with connection(self.pg_dsn, timeout=5) as conn:
                    return await op(conn)
            except DB_ERRORS:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)  # retry pacing

    async def _measure_recovery(self, pool: asyncpg.Pool) -> None:
        """For each fault, the time from its end to the next verdict written (and to the first verdict
        of a submission committed after it: the whole path, dispatcher to worker, working again).

        A fault after which no verdict was ever written is a violation. Fault ends are wall-clock
        times of this host; verdict times are the server's ``clock_timestamp()`` on the same host.
        """

        async def fetch(conn: asyncpg.Connection) -> tuple[list[Any], list[Any]]:
            verdicts = await conn.fetch(
                "SELECT at FROM public.chaos_audit WHERE new_status = ANY($1) ORDER BY at", list(TERMINAL)
            )
            finished = await conn.fetch(
                "SELECT created_at, finished_at FROM judgequeue.submissions WHERE finished_at IS NOT NULL"
            )
            return verdicts, finished

        verdict_rows, finished_rows = await self._retrying(pool, fetch)
        verdict_times = [_epoch(r["at"]) for r in verdict_rows]
        finished = [(_epoch(r["created_at"]), _epoch(r["finished_at"])) for r in finished_rows]
        r = self.report
        for kind, _began, ended in self._fault_spans:
            i = bisect.bisect_right(verdict_times, ended)
            if i == len(verdict_times):
                r.violations.append(f"no verdict written after the {kind} fault that ended at {ended:.3f}")
                continue
            recovery = round(verdict_times[i] - ended, 3)
            r.worst_fault_recovery_seconds = max(r.worst_fault_recovery_seconds, recovery)
            r.worst_fault_recovery_by_kind[kind] = max(r.worst_fault_recovery_by_kind.get(kind, 0.0), recovery)
            new_work = [done for created, done in finished if created >= ended]
            if new_work:
                r.worst_new_work_recovery_seconds = max(
                    r.worst_new_work_recovery_seconds, round(min(new_work) - ended, 3)
                )
        if self._fault_spans:
            # The longest time without any verdict while the faults went on: outage plus recovery.
            first, last = self._fault_spans[0][1], self._fault_spans[-1][2]
            during = [first] + [t for t in verdict_times if first <= t <= last] + [last]
            r.longest_verdict_gap_seconds = round(max(b - a for a, b in itertools.pairwise(during)), 3)

    async def _wait_for_state(self, pool: asyncpg.Pool, state: str, n: int, within: float) -> None:
        deadline = time.monotonic() + within
        while True:
            async with pool.acquire() as conn:
                got = await conn.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE state = $1", state)
            if got >= n:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"only {got}/{n} outbox rows reached {state} within {within}s")
            self._reap_dead()
            await asyncio.sleep(0.05)

    async def _wait_drained(self, pool: asyncpg.Pool, ids: list[int]) -> None:
        deadline = time.monotonic() + self.cfg.drain_deadline

        async def progress(conn: asyncpg.Connection) -> tuple[int, int]:
            left = await count_submissions(conn, ids=ids, not_status=TERMINAL)
            active = await conn.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE state IN ('PENDING', 'CLAIMED')")
            return int(left), int(active)

        while True:
            left, active = await self._retrying(pool, progress)
            if left == 0 and active == 0:
                return
            if time.monotonic() > deadline:
                self.report.violations.append(f"{left} submissions not terminal after the drain deadline")
                return
            self._reap_dead()
            await asyncio.sleep(0.1)

    async def _wait_shadow_settled(self, pool: asyncpg.Pool, redis: aioredis.Redis) -> None:
        """Wait until every shadow-sent submission has a final shadow verdict and the shadow stream and
        its PEL are empty (what is left at the drain deadline, :func:`check_shadow_invariants` counts)."""
        deadline = time.monotonic() + self.cfg.drain_deadline
        key = streams.shadow_key(self.queue)

        async def waiting(conn: asyncpg.Connection) -> int:
            return int(await conn.fetchval(
                "SELECT count(*) FROM judgequeue.outbox o LEFT JOIN judgequeue.shadow_verdicts v"
                " ON v.submission_id = o.submission_id AND v.generation = o.generation"
                " WHERE o.queue = $1 AND o.state = 'SHADOW_SENT' AND (v.status IS NULL OR v.status = 'JUDGING')",
                self.queue))

        while True:
            left = await self._retrying(pool, waiting)
            pending = await redis.xpending(key, streams.GROUP) if await redis.exists(key) else None
            in_pel = int(pending["pending"]) if pending else 0
            if left == 0 and int(await redis.xlen(key)) == 0 and in_pel == 0:
                return
            if time.monotonic() > deadline:
                return
            self._reap_dead()
            await asyncio.sleep(0.1)

    async def _wait_stream_settled(self, redis: aioredis.Redis) -> None:
        """Wait until the stream and its PEL are empty: once every verdict is written, duplicate and
        stale deliveries still pending are acked by the workers or, once idle past the visibility
        timeout, by a reaper. Entries still there at the drain deadline stay for :meth:`_check` to
        count, and the pending ones are described (consumer, idle time, deliveries) to say why."""
        began = time.monotonic()
        deadline = began + self.cfg.drain_deadline
        key = streams.stream_key(self.queue)
        while True:
            try:
                length = int(await redis.xlen(key))
                pending = await redis.xpending(key, streams.GROUP)
                in_pel = int(pending["pending"]) if pending else 0
                if length == 0 and in_pel == 0:
                    self.report.stream_settle_seconds = round(time.monotonic() - began, 3)
                    return
                if time.monotonic() > deadline:
                    detail = await redis.xpending_range(key, streams.GROUP, min="-", max="+", count=5)
                    self.report.violations.append(
                        f"stream not empty after the drain deadline: {length} entries, {in_pel} pending, e.g. {detail}"
                    )
                    return
            except aioredis.RedisError:
                if time.monotonic() > deadline:
                    raise
            self._reap_dead()
            await asyncio.sleep(0.1)

    def _count_from_logs(self) -> None:
        """Figures only the workers see (their metrics die with them): read from their JSON logs.

        Also the warnings every role logged (failed steps it retried): under server faults, evidence
        that the faults reached the roles.
        """
        for path in self.log_dir.glob("*.log"):
            self.report.role_warnings += path.read_text(errors="replace").count('"level":"WARNING"')
        for path in self.log_dir.glob("worker-*.log"):
            for event in json_events(path):
                msg = event.get("msg")
                if msg == "stale envelopes acked":
                    self.report.duplicate_deliveries += int(event.get("count", 0))
                elif msg == "stale verdict dropped":
                    self.report.stale_writes_rejected += 1
                elif msg == "lease lost; judge cancelled":
                    self.report.leases_lost += 1

    # --- invariants ----------------------------------------------------------------------------
    async def _check(
        self, pool: asyncpg.Pool, redis: aioredis.Redis, expected: dict[int, str], legacy: list[int]
    ) -> None:
        await check_invariants(pool, redis, self.queue, expected, self.report, legacy)
        if self.cfg.shadow_workers:
            await check_shadow_invariants(pool, redis, self.queue, legacy, self.report)


async def check_invariants(
    pool: asyncpg.Pool,
    redis: aioredis.Redis,
    queue: str,
    expected: dict[int, str],
    report: ChaosReport,
    legacy: list[int] | None = None,
) -> None:
    """Check DESIGN section 9 at the end of a run; counts and ``violations`` go into ``report``.

    ``expected`` maps every committed submission to the status its payload asks for; the audit
    table (:data:`AUDIT_SQL`) must have been installed before any job ran; ``legacy`` lists
    pre-watermark submissions that must never have been dispatched live.
    """
    r = report
    legacy = legacy or []
    ids = list(expected)
    async with pool.acquire() as conn:
        finals = {
            row["id"]: row
            for row in await conn.fetch(
                "SELECT id, status, generation, verdict, extract(epoch FROM finished_at - created_at) AS e2e"
                " FROM judgequeue.submissions WHERE id = ANY($1)",
                ids,
            )
        }
        audit = await conn.fetch("SELECT * FROM public.chaos_audit ORDER BY seq")
        r.leftover_outbox_active = await conn.fetchval(
            "SELECT count(*) FROM judgequeue.outbox WHERE state IN ('PENDING', 'CLAIMED')"
        )
        r.taken_by_workers = await conn.fetchval(
            "SELECT count(*) FROM judgequeue.outbox WHERE claimed_by LIKE 'worker-%'"
        )
        # A filled offer's row is written SENT by the submit itself: sent in the transaction that
        # created it (now() is the transaction's start on both), which no take can do.
        r.filled_offers = await conn.fetchval(
            "SELECT count(*) FROM judgequeue.outbox WHERE claimed_by LIKE 'worker-%' AND sent_at = created_at"
        )
        legacy_states = await conn.fetch(
            "SELECT state, count(*) FROM judgequeue.outbox WHERE submission_id = ANY($1) GROUP BY state", legacy
        )
    # 1. every committed submission: exactly one terminal verdict, correct or explained.
    for sid, want in expected.items():
        row = finals.get(sid)
        if row is None or row["status"] not in TERMINAL:
            r.lost_submissions += 1
        elif row["status"] == "SYSTEM_ERROR":
            r.system_errors += 1
            if not (row["verdict"] and json.loads(row["verdict"]).get("reason")):
                r.violations.append(f"submission {sid}: SYSTEM_ERROR without a reason")
        elif row["status"] != want:
            r.wrong_verdicts += 1
    latencies = sorted(float(row["e2e"]) for row in finals.values() if row["e2e"] is not None)
    if latencies:
        r.p50_latency_seconds = round(latencies[len(latencies) // 2], 3)
        r.longest_recovery_seconds = round(latencies[-1], 3)
    # 2. no verdict by a stale generation or attempt: every transition into a judged status came
    #    from JUDGING under the same generation and attempt; nothing leaves a terminal status
    #    except a generation bump.
    terminal_at_final: dict[int, int] = {}
    acquisitions: dict[tuple[int, int], int] = {}
    for a in audit:
        sid = a["submission"]
        if a["new_status"] == "JUDGING":
            key = (sid, a["new_gen"])
            acquisitions[key] = acquisitions.get(key, 0) + 1
        if a["new_gen"] != a["old_gen"]:
            r.generation_bumps += 1
        if a["new_status"] in TERMINAL and a["new_status"] != "SYSTEM_ERROR":
            fenced = (
                a["old_status"] == "JUDGING"
                and a["old_gen"] == a["new_gen"]
                and a["old_attempt"] == a["new_attempt"]
                and a["old_attempt"] is not None
            )
            if not fenced:
                r.stale_writes_accepted += 1
        if a["old_status"] in TERMINAL and a["new_status"] != "PENDING":
            r.stale_writes_accepted += 1  # a terminal verdict overwritten without a new generation
        if a["new_status"] in TERMINAL and sid in finals and a["new_gen"] == finals[sid]["generation"]:
            terminal_at_final[sid] = terminal_at_final.get(sid, 0) + 1
    r.multiple_terminal_verdicts = sum(1 for n in terminal_at_final.values() if n > 1)
    # 3. one generation is leased (executed) at most once; re-executions come from new generations.
    r.duplicate_executions = sum(n - 1 for n in acquisitions.values() if n > 1)
    executions_per_submission: dict[int, int] = {}
    for (sid, _gen), n in acquisitions.items():
        executions_per_submission[sid] = executions_per_submission.get(sid, 0) + n
    if r.duplicate_executions:
        r.violations.append(f"{r.duplicate_executions} generations leased twice")
    r.duplicate_executions = sum(n - 1 for n in executions_per_submission.values() if n > 1)
    # 4. no pre-watermark (legacy) submission was ever leased by our workers.
    legacy_set = set(legacy)
    r.prewatermark_live_dispatches = sum(1 for a in audit if a["submission"] in legacy_set)
    legacy_ok = {row["state"] for row in legacy_states} <= {"SHADOW_SENT", "SKIPPED"}
    if not legacy_ok:
        r.violations.append(f"legacy outbox rows in states {[dict(x) for x in legacy_states]}")
    # 5. nothing left behind in Redis or Postgres.
    r.leftover_stream_entries = await redis.xlen(streams.stream_key(queue))
    pending = await redis.xpending(streams.stream_key(queue), streams.GROUP)
    r.leftover_pel = int(pending["pending"]) if pending else 0
    async for key in redis.scan_iter(match=f"jq:{{{queue}}}:seen:*", count=1000):
        if await redis.ttl(key) < 0:
            r.seen_keys_without_ttl += 1
    for name in (
        "lost_submissions",
        "unexpected_exits",
        "nonzero_exit_codes",
        "stale_writes_accepted",
        "wrong_verdicts",
        "prewatermark_live_dispatches",
        "multiple_terminal_verdicts",
        "leftover_stream_entries",
        "leftover_pel",
        "leftover_outbox_active",
        "seen_keys_without_ttl",
    ):
        if getattr(r, name):
            r.violations.append(f"{name} = {getattr(r, name)}")


async def check_shadow_invariants(
    pool: asyncpg.Pool, redis: aioredis.Redis, queue: str, legacy: list[int], report: ChaosReport
) -> None:
    """The invariants on the shadow side (see the module docstring); counts and ``violations`` go into
    ``report``. Needs the shadow audit of :data:`AUDIT_SQL`."""
    r = report
    async with pool.acquire() as conn:
        sent = {row["submission_id"]: row["generation"] for row in await conn.fetch(
            "SELECT submission_id, generation FROM judgequeue.outbox WHERE queue = $1 AND state = 'SHADOW_SENT'"
            " AND submission_id = ANY($2)", queue, legacy)}
        rows = {row["submission_id"]: row for row in await conn.fetch(
            "SELECT v.*, s.payload->>'status' AS asked FROM judgequeue.shadow_verdicts v"
            " JOIN judgequeue.submissions s ON s.id = v.submission_id WHERE v.queue = $1", queue)}
        audit = await conn.fetch("SELECT * FROM public.chaos_shadow_audit ORDER BY seq")
        statuses = await conn.fetch("SELECT status, count(*) AS n FROM judgequeue.submissions WHERE id = ANY($1)"
                                    " GROUP BY status", legacy)
    r.shadow_expected = len(sent)
    for sid, generation in sent.items():
        row = rows.get(sid)
        if row is None or row["status"] == "JUDGING" or row["generation"] != generation:
            r.shadow_lost += 1
        elif row["status"] == "SYSTEM_ERROR":
            r.shadow_system_errors += 1
            if not (row["details"] and json.loads(row["details"]).get("reason")):
                r.violations.append(f"submission {sid}: shadow SYSTEM_ERROR without a reason")
        elif row["status"] != row["asked"]:
            r.shadow_wrong += 1
        else:
            r.shadow_judged += 1
    finals: dict[int, int] = {}
    for a in audit:
        final = a["new_status"] != "JUDGING"
        if final:
            finals[a["submission"]] = finals.get(a["submission"], 0) + 1
        if final and a["new_status"] != "SYSTEM_ERROR":
            fenced = (a["old_status"] == "JUDGING" and a["old_gen"] == a["new_gen"]
                      and a["old_attempt"] is not None and a["old_attempt"] == a["new_attempt"])
            if not fenced:
                r.shadow_stale_writes_accepted += 1
        if a["old_status"] not in (None, "JUDGING"):
            r.shadow_stale_writes_accepted += 1  # a final shadow verdict overwritten (no rejudge in a chaos run)
        moved_on = a["old_status"] == "JUDGING" and a["new_status"] == "JUDGING" and a["old_attempt"] is not None
        if moved_on and a["new_attempt"] is not None and a["old_attempt"] != a["new_attempt"]:
            r.shadow_takeovers += 1
        elif moved_on and a["new_attempt"] is None:
            r.shadow_rescued += 1
    twice = [sid for sid, n in finals.items() if n > 1]
    if twice:
        r.violations.append(f"{len(twice)} submissions got a final shadow verdict twice, e.g. {twice[:5]}")
    r.shadow_touched_submissions = sum(int(row["n"]) for row in statuses if row["status"] != "PENDING")
    key = streams.shadow_key(queue)
    r.leftover_shadow_entries = int(await redis.xlen(key))
    pending = await redis.xpending(key, streams.GROUP) if await redis.exists(key) else None
    r.leftover_shadow_pel = int(pending["pending"]) if pending else 0
    async for marker in redis.scan_iter(match=f"jq:{{{queue}}}:shadow-seen:*", count=1000):
        if await redis.ttl(marker) < 0:
            r.violations.append(f"shadow marker {marker!r} has no TTL")
    for name in ("shadow_lost", "shadow_wrong", "shadow_stale_writes_accepted", "shadow_touched_submissions",
                 "leftover_shadow_entries", "leftover_shadow_pel"):
        if getattr(r, name):
            r.violations.append(f"{name} = {getattr(r, name)}")


def _epoch(value: datetime) -> float:
    return value.timestamp()
