"""Chaos harness: every role as a real process, killed at random failpoints and random times.

Used by ``tests/test_chaos.py`` (CI size) and ``bench/chaos_run.py`` (larger). The harness

1. creates the queue in shadow mode and submits "legacy" submissions (owned by another producer),
   then flips to live with a watermark, so invariant 4 is exercised by a real flip;
2. starts dispatchers, workers and reapers as ``judgequeue <role>`` processes with failpoints armed
   at random (``name%P``), submits the main set in bursts while SIGKILLing random processes and
   restarting whatever died, and pauses/resumes the queue a few times;
3. stops the chaos, lets the system drain, and checks every invariant of docs/design.md §6 from
   Postgres (an audit trigger records every status/generation transition) and Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from judgequeue.core import outbox, streams
from judgequeue.core.queues import create_queue, set_cutover
from tests.roles import JUDGEQUEUE, TERMINAL

JUDGE_STATUSES = ("ACCEPTED", "WRONG_ANSWER", "RUNTIME_ERROR")

FAILPOINTS = {
    "dispatcher": ["dispatcher.after_claim", "dispatcher.after_xadd", "dispatcher.after_mark"],
    "worker": ["worker.after_lease", "worker.after_ack", "worker.after_judge", "worker.after_verdict"],
    "reaper": ["reaper.after_claim", "reaper.dead_letter.after_postgres", "reaper.after_lease_rescue"],
}

AUDIT_SQL = """
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
CREATE FUNCTION public.chaos_audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.chaos_audit (submission, old_gen, new_gen, old_status, new_status, old_attempt, new_attempt)
    VALUES (NEW.id, OLD.generation, NEW.generation, OLD.status, NEW.status, OLD.attempt_id, NEW.attempt_id);
    RETURN NEW;
END $$;
CREATE TRIGGER chaos_audit AFTER UPDATE ON judgequeue.submissions FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.generation IS DISTINCT FROM NEW.generation)
    EXECUTE FUNCTION public.chaos_audit_fn();
"""


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
    role_env: dict[str, str] = field(
        default_factory=lambda: {
            "JUDGEQUEUE_JUDGE": "sleep",
            "JUDGEQUEUE_BATCH_SIZE": "50",
            "JUDGEQUEUE_SCHEDULE": "200ms",
            "JUDGEQUEUE_CLAIM_TTL": "1s",
            "JUDGEQUEUE_BACKOFF_BASE": "100ms",
            "JUDGEQUEUE_BACKOFF_MAX": "1s",
            "JUDGEQUEUE_MAX_ATTEMPTS": "50",
            "JUDGEQUEUE_LEASE_TTL": "1500ms",
            "JUDGEQUEUE_GRACE_PERIOD": "1s",
            "JUDGEQUEUE_REAPER_INTERVAL": "200ms",
            "JUDGEQUEUE_VISIBILITY_TIMEOUT": "1s",
            "JUDGEQUEUE_MAX_DELIVERIES": "20",
            "JUDGEQUEUE_MAX_RETRIES": "20",
            "JUDGEQUEUE_LOG_LEVEL": "INFO",
        }
    )


@dataclass
class Slot:
    role: str
    index: int
    proc: subprocess.Popen[bytes] | None = None
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
    longest_recovery_seconds: float = 0.0
    p50_latency_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    violations: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class Chaos:
    def __init__(self, pg_dsn: str, redis_url: str, queue: str, config: ChaosConfig, log_dir: Path) -> None:
        self.pg_dsn = pg_dsn
        self.redis_url = redis_url
        self.queue = queue
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.log_dir = log_dir
        self.slots = (
            [Slot("dispatcher", i) for i in range(config.dispatchers)]
            + [Slot("worker", i) for i in range(config.workers)]
            + [Slot("reaper", i) for i in range(config.reapers)]
        )
        self.report = ChaosReport(submissions=config.submissions, legacy=config.legacy)
        self.chaos_on = True
        self._legacy_extra: list[int] = []
        self._frozen: list[tuple[float, subprocess.Popen[bytes]]] = []

    # --- processes -----------------------------------------------------------------------------
    def _env(self, role: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JUDGEQUEUE_")}
        env.update(self.cfg.role_env)
        env.update(
            {
                "JUDGEQUEUE_POSTGRES_DSN": self.pg_dsn,
                "JUDGEQUEUE_REDIS_URL": self.redis_url,
                "JUDGEQUEUE_QUEUE": self.queue,
                "JUDGEQUEUE_METRICS_PORT": "0",
                "JUDGEQUEUE_CONCURRENCY": str(self.cfg.concurrency),
            }
        )
        if self.chaos_on and self.cfg.failpoint_probability > 0:
            chosen = self.rng.sample(FAILPOINTS[role], k=self.rng.randint(1, len(FAILPOINTS[role])))
            env["JUDGEQUEUE_FAILPOINTS"] = ",".join(f"{name}%{self.cfg.failpoint_probability}" for name in chosen)
        return env

    def _start(self, slot: Slot) -> None:
        log = open(self.log_dir / f"{slot.role}-{slot.index}-{slot.starts}.log", "wb")  # noqa: SIM115
        slot.proc = subprocess.Popen(
            [JUDGEQUEUE, slot.role], env=self._env(slot.role), stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        slot.starts += 1

    def _reap_dead(self) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is not None:
                if slot.proc.returncode == -signal.SIGKILL:
                    self.report.failpoint_deaths += 1  # corrected below for the kills we sent
                self._start(slot)
                self.report.restarts += 1

    def _freeze_or_kill_random(self) -> None:
        slot = self.rng.choice(self.slots)
        if slot.role == "worker" and slot.proc is not None and slot.proc.poll() is None and self.rng.random() < 0.3:
            # A stalled worker (GC pause, partition): it wakes after its leases expired and were
            # rescued, and must find its heartbeat and verdicts fenced out.
            slot.proc.send_signal(signal.SIGSTOP)
            self._frozen.append((time.monotonic() + 2.5, slot.proc))
            self.report.freezes += 1
            return
        if slot.proc is not None and slot.proc.poll() is None:
            slot.proc.kill()
            slot.proc.wait()
            self.report.kills += 1
            self.report.failpoint_deaths -= 1  # _reap_dead counts every SIGKILL; this one was ours

    def _thaw(self, everything: bool = False) -> None:
        now = time.monotonic()
        for due, proc in list(self._frozen):
            if everything or due <= now:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                self._frozen.remove((due, proc))

    def stop_all(self) -> None:
        self._thaw(everything=True)
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.send_signal(signal.SIGTERM)
        for slot in self.slots:
            if slot.proc is not None:
                try:
                    slot.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    slot.proc.kill()
                    slot.proc.wait()

    # --- the run -------------------------------------------------------------------------------
    async def run(self) -> ChaosReport:
        started = time.monotonic()
        pool = await asyncpg.create_pool(self.pg_dsn, min_size=2, max_size=4)
        assert pool is not None
        redis = aioredis.Redis.from_url(self.redis_url)
        try:
            async with pool.acquire() as conn:
                await conn.execute(AUDIT_SQL)
                await create_queue(conn, self.queue, mode="shadow")
                legacy_ids = [
                    await outbox.submit(conn, self.queue, {"legacy": True, "status": "ACCEPTED"})
                    for _ in range(self.cfg.legacy)
                ]
            for slot in self.slots:
                self._start(slot)
            await self._wait_for_state(pool, "SHADOW_SENT", self.cfg.legacy, within=30)
            async with pool.acquire() as conn:
                # Legacy rows still unsent at the flip are SKIPPED; new ones go live.
                await self._legacy_more(conn)
                watermark = await conn.fetchval("SELECT now()")
                await set_cutover(conn, self.queue, mode="live", watermark=watermark)
            expected = await self._submit_under_chaos(pool)
            self.chaos_on = False
            # Restart everything without failpoints so the drain is not interrupted.
            for slot in self.slots:
                if slot.proc is not None and slot.proc.poll() is None:
                    slot.proc.kill()
                    slot.proc.wait()
                self._start(slot)
            async with pool.acquire() as conn:
                await set_cutover(conn, self.queue, paused=False)
            await self._wait_drained(pool, list(expected))
            self.stop_all()
            self._count_from_logs()
            await self._check(pool, redis, expected, legacy_ids + self._legacy_extra)
        finally:
            self.stop_all()
            await redis.aclose()
            await pool.close()
        self.report.elapsed_seconds = round(time.monotonic() - started, 1)
        return self.report

    async def _legacy_more(self, conn: asyncpg.Connection) -> None:
        # A few legacy submissions right before the flip: some will be claimed after it.
        self._legacy_extra = [
            await outbox.submit(conn, self.queue, {"legacy": True, "status": "ACCEPTED"}) for _ in range(10)
        ]

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
                        payload = {"seconds": self.rng.uniform(0, 0.2), "status": status}
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
        while True:
            async with pool.acquire() as conn:
                left = await conn.fetchval(
                    "SELECT count(*) FROM judgequeue.submissions WHERE id = ANY($1) AND status <> ALL($2)",
                    ids,
                    list(TERMINAL),
                )
                active = await conn.fetchval(
                    "SELECT count(*) FROM judgequeue.outbox WHERE state IN ('PENDING', 'CLAIMED')"
                )
            if left == 0 and active == 0:
                return
            if time.monotonic() > deadline:
                self.report.violations.append(f"{left} submissions not terminal after the drain deadline")
                return
            self._reap_dead()
            await asyncio.sleep(0.1)

    def _count_from_logs(self) -> None:
        """Figures only the workers see (their metrics die with them): read from their JSON logs."""
        for path in self.log_dir.glob("worker-*.log"):
            for line in path.read_text(errors="replace").splitlines():
                if not line.startswith("{"):
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
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
