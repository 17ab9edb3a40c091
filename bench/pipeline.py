"""Measurements that need the roles running as real processes (``judgequeue <role>``).

Each function builds a throwaway database and queue, starts the roles it needs exactly as a
Deployment would, measures, reads the roles' peak memory (VmHWM) before stopping them, and cleans
up. Latencies are taken on one clock wherever possible: the database's (``created_at`` to
``finished_at``), or, for commit-to-enqueue, the row's ``created_at`` against the stream entry id's
millisecond timestamp (Postgres and Redis run on this host and share its clock).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from bench.cli import DEFAULT_INTAKE, INTAKE_VARIABLE, OFFERS_VARIABLE
from bench.common import REDIS_URL, create_database, drop_database, span_seconds
from judgequeue.core.runtime.process import event_loop_factory
from judgequeue.core.store import outbox
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import streams
from tests.support.revisions import migrate_as

JUDGEQUEUE = str(Path(sys.executable).parent / "judgequeue")


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; 0 for no values (pure)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def peak_rss_mb(pid: int) -> float:
    """VmHWM (peak resident set) of a live process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Stack:
    dsn: str
    queue: str
    pool: asyncpg.Pool
    redis: aioredis.Redis
    env: dict[str, str]
    procs: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)

    def start(self, role: str, count: int = 1, **extra: str) -> None:
        env = dict(self.env)
        env.update({f"JUDGEQUEUE_{k.upper()}": v for k, v in extra.items()})
        for _ in range(count):
            self.procs.setdefault(role, []).append(
                subprocess.Popen([JUDGEQUEUE, role], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )

    def peak_memory(self) -> dict[str, float]:
        """The largest VmHWM per role among its live processes."""
        return {
            role: max((peak_rss_mb(p.pid) for p in procs if p.poll() is None), default=0.0)
            for role, procs in self.procs.items()
        }

    def stop(self) -> None:
        for procs in self.procs.values():
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
        for procs in self.procs.values():
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


@asynccontextmanager
async def stack(*, schema_from: str | None = None, **settings: str) -> AsyncIterator[Stack]:
    """Roles' database, queue and servers; ``schema_from``: a tree (PYTHONPATH) whose migrations to apply
    instead of this tree's, so a reference revision's roles run on the schema they were written for."""
    dsn = await create_database("jq_bench", migrated=schema_from is None)
    if schema_from is not None:
        migrate_as(dsn, schema_from)
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=16)
    assert pool is not None
    redis = aioredis.Redis.from_url(REDIS_URL)
    async with pool.acquire() as conn:
        if schema_from is None:
            await create_queue(conn, queue)
        else:
            # A reference revision's schema may predate columns this tree's queue statements name
            # (owner, 0011): only what every revision has.
            await conn.execute("INSERT INTO judgequeue.queues (name) VALUES ($1)", queue)
    await streams.ensure_group(redis, queue)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUDGEQUEUE_")}
    env.update(
        {
            "JUDGEQUEUE_POSTGRES_DSN": dsn,
            "JUDGEQUEUE_REDIS_URL": REDIS_URL,
            "JUDGEQUEUE_QUEUE": queue,
            "JUDGEQUEUE_METRICS_PORT": "0",
            "JUDGEQUEUE_LOG_LEVEL": "WARNING",
            "JUDGEQUEUE_JUDGE": "noop",
            "JUDGEQUEUE_BATCH_SIZE": "500",
            "JUDGEQUEUE_CONCURRENCY": "256",
        }
    )
    env["JUDGEQUEUE_INTAKE"] = os.environ.get(INTAKE_VARIABLE, DEFAULT_INTAKE)  # the run's --intake
    if OFFERS_VARIABLE in os.environ:
        env["JUDGEQUEUE_OFFERS"] = os.environ[OFFERS_VARIABLE]  # the run's --offers
    env.update({f"JUDGEQUEUE_{k.upper()}": v for k, v in settings.items()})
    s = Stack(dsn, queue, pool, redis, env)
    try:
        yield s
    finally:
        s.stop()
        await pool.close()
        keys = [k async for k in redis.scan_iter(match=f"jq:{{{queue}}}:*", count=1000)]
        for i in range(0, len(keys), 500):
            await redis.delete(*keys[i : i + 500])
        await redis.aclose()
        await drop_database(dsn)


async def _count_done(pool: asyncpg.Pool, after: int) -> int:
    async with pool.acquire() as conn:
        n: int = await conn.fetchval(
            "SELECT count(*) FROM judgequeue.submissions WHERE id > $1 AND finished_at IS NOT NULL", after
        )
    return n


async def wait_done(pool: asyncpg.Pool, after: int, n: int, within: float) -> None:
    deadline = time.monotonic() + within
    while (done := await _count_done(pool, after)) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {done}/{n} jobs finished within {within}s")
        await asyncio.sleep(0.05)


async def offer_paced(
    s: Stack, rate: float, seconds: float, submit: Callable[[asyncpg.Connection], Awaitable[object]]
) -> int:
    """Offer ``rate`` submits a second for ``seconds`` on one connection, each ``submit(conn)`` its
    own transaction, at their times whatever the previous one took; how many."""
    total = int(rate * seconds)
    start = time.monotonic()
    async with s.pool.acquire() as conn:
        for i in range(total):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing of the offered load
            await submit(conn)
    return total


async def warm_up(s: Stack, n: int = 50) -> int:
    """Push a few jobs through (processes started, connections open); returns the last id."""
    async with s.pool.acquire() as conn:
        for _ in range(n):
            await outbox.submit(conn, s.queue, {})
        last: int = await conn.fetchval("SELECT max(id) FROM judgequeue.submissions")
    await wait_done(s.pool, 0, n, 60)
    return last


async def _submit_lanes(dsn: str, queue: str, n: int, connections: int, per_transaction: int) -> None:
    per = n // connections

    async def one(conn: asyncpg.Connection, count: int) -> None:
        if per_transaction == 1:
            # One statement is its own transaction: one round trip, as the peer's enqueue.
            for _ in range(count):
                await outbox.submit(conn, queue, {})
            return
        done = 0
        while done < count:
            k = min(per_transaction, count - done)
            async with conn.transaction():
                for _ in range(k):
                    await outbox.submit(conn, queue, {})
            done += k

    conns = [await asyncpg.connect(dsn) for _ in range(connections)]
    try:
        await asyncio.gather(*(one(c, per + (1 if i < n % connections else 0)) for i, c in enumerate(conns)))
    finally:
        for c in conns:
            await c.close()


def _submit_process(dsn: str, queue: str, n: int, connections: int, per_transaction: int) -> None:
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(_submit_lanes(dsn, queue, n, connections, per_transaction))


async def submit_many(s: Stack, n: int, connections: int, per_transaction: int = 1, processes: int = 2) -> None:
    """``n`` submits from ``processes`` application processes, ``connections`` connections in all.

    Several processes, like the web servers of a real judge: one Python process alone would measure
    its own interpreter, not the queue.
    """
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(processes) as pool:
        share = [n // processes + (1 if i < n % processes else 0) for i in range(processes)]
        await asyncio.gather(
            *(
                loop.run_in_executor(
                    pool, _submit_process, s.dsn, s.queue, k, max(1, connections // processes), per_transaction
                )
                for k in share
            )
        )


async def submit_throughput(jobs: int, submitters: int = 8) -> float:
    """Submits/s of :func:`submit_many` with no role running: the submit side alone, the ceiling
    of end to end on a machine whose cores the roles share."""
    async with stack() as s:
        async with s.pool.acquire() as conn:
            first = await conn.fetchval("SELECT coalesce(max(id), 0) FROM judgequeue.submissions")
        await submit_many(s, jobs, submitters)
        async with s.pool.acquire() as conn:
            seconds: float = await conn.fetchval(
                "SELECT extract(epoch FROM max(created_at) - min(created_at))::float8"
                " FROM judgequeue.submissions WHERE id > $1",
                first,
            )
    return jobs / seconds


#: How the jobs after ``$1`` reached a worker, and how long their submits took: a filled offer
#: writes its outbox row already sent in the submit's transaction (same now()); a worker's take
#: claims it under the worker's name; the dispatcher's hand-off under its own.
DELIVERY_PATHS = """
SELECT count(*) FILTER (WHERE o.sent_at = o.created_at) AS offers,
       count(*) FILTER (WHERE o.sent_at <> o.created_at AND o.claimed_by LIKE 'worker-%') AS takes,
       count(*) FILTER (WHERE o.sent_at <> o.created_at AND o.claimed_by NOT LIKE 'worker-%') AS stream,
       extract(epoch FROM max(o.created_at) - min(o.created_at))::float8 AS submit_s
  FROM judgequeue.outbox o WHERE o.submission_id > $1
"""


async def end_to_end_throughput(
    workers: int, *, jobs: int, submitters: int = 8, per_transaction: int = 1
) -> dict[str, Any]:
    """Jobs/s from the first submit to the last verdict (noop judge), plus each role's peak memory."""
    async with stack() as s:
        s.start("dispatcher")
        s.start("worker", workers)
        s.start("reaper")
        after = await warm_up(s)
        await submit_many(s, jobs, submitters, per_transaction)
        await wait_done(s.pool, after, jobs, 300)
        async with s.pool.acquire() as conn:
            span = await span_seconds(conn, after)
            paths = await conn.fetchrow(DELIVERY_PATHS, after)
        memory = s.peak_memory()
    return {
        "workers": workers,
        "jobs": jobs,
        "per_transaction": per_transaction,
        "rate": jobs / span,
        "submit_s": paths["submit_s"],
        "paths": {k: paths[k] for k in ("offers", "takes", "stream")},
        "peak_rss_mb": memory,
    }


async def _steady(s: Stack, rate: float, seconds: float, connections: int = 4) -> int:
    """Offer ``rate`` submits/s for ``seconds`` (each its own transaction); returns how many."""
    total = int(rate * seconds)
    interval = connections / rate
    start = time.monotonic()

    async def lane(k: int) -> None:
        async with s.pool.acquire() as conn:
            for i in range(k, total, connections):
                delay = start + (i / connections) * interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)  # pacing of the offered load
                await outbox.submit(conn, s.queue, {})

    await asyncio.gather(*(lane(k) for k in range(connections)))
    return total


async def end_to_end_latency(rate: float, seconds: float, workers: int = 1) -> dict[str, Any]:
    """Commit-to-verdict latency (DB clock) at a steady offered load."""
    async with stack(concurrency="64") as s:
        s.start("dispatcher")
        s.start("worker", workers)
        s.start("reaper")
        after = await warm_up(s)
        total = await _steady(s, rate, seconds, connections=1)
        await wait_done(s.pool, after, total, 60)
        async with s.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT extract(epoch FROM finished_at - created_at)::float8 AS s,"
                " (verdict->'details'->>'started_at')::float8 - extract(epoch FROM created_at)::float8 AS start"
                " FROM judgequeue.submissions WHERE id > $1",
                after,
            )
            # A filled offer writes its outbox row already sent, in the submit's transaction (same
            # now()); a take or the dispatcher sends it later: the share of jobs the offers carried.
            filled = await conn.fetchval(
                "SELECT (count(*) FILTER (WHERE sent_at = created_at))::float8 / greatest(count(*), 1)"
                " FROM judgequeue.outbox WHERE submission_id > $1",
                after,
            )
    samples = [r["s"] * 1000 for r in rows]
    # The noop judge notes when it ran: commit-to-start is the peer's measure (host clock, as the peer's).
    starts = [r["start"] * 1000 for r in rows if r["start"] is not None]
    return {
        "rate": rate,
        "seconds": seconds,
        "p50_ms": percentile(samples, 0.5),
        "p99_ms": percentile(samples, 0.99),
        "max_ms": max(samples),
        "samples_ms": samples,
        "start_p50_ms": percentile(starts, 0.5),
        "start_p99_ms": percentile(starts, 0.99),
        "start_samples_ms": starts,
        "filled_share": filled,
    }


async def commit_to_enqueue(rate: float, seconds: float) -> dict[str, Any]:
    """Commit-to-append latency at a steady submit rate: row ``created_at`` to the entry id's time."""
    async with stack() as s:
        s.start("dispatcher")
        after = await warm_up_dispatch_only(s)
        total = await _steady(s, rate, seconds, connections=8)
        deadline = time.monotonic() + 60
        key = streams.stream_key(s.queue)
        while await s.redis.xlen(key) < total + 50:
            if time.monotonic() > deadline:
                raise RuntimeError("dispatch did not keep up")
            await asyncio.sleep(0.05)
        appended: dict[int, float] = {}
        entries: Any = await s.redis.xrange(key)
        for entry_id, fields in entries:
            ms = int(entry_id.decode().split("-")[0])
            appended[int(fields[b"submission"])] = ms / 1000
        async with s.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT id, extract(epoch FROM created_at)::float8 AS c FROM judgequeue.submissions WHERE id > $1",
                after,
            )
    samples = [(appended[r["id"]] - r["c"]) * 1000 for r in rows if r["id"] in appended]
    return {
        "rate": rate,
        "p50_ms": percentile(samples, 0.5),
        "p99_ms": percentile(samples, 0.99),
        "samples_ms": samples,
    }


async def warm_up_dispatch_only(s: Stack, n: int = 50) -> int:
    async with s.pool.acquire() as conn:
        for _ in range(n):
            await outbox.submit(conn, s.queue, {})
        last: int = await conn.fetchval("SELECT max(id) FROM judgequeue.submissions")
    deadline = time.monotonic() + 30
    while await s.redis.xlen(streams.stream_key(s.queue)) < n:
        if time.monotonic() > deadline:
            raise RuntimeError("dispatcher did not start")
        await asyncio.sleep(0.05)
    return last


async def recovery_after_sigkill(lease_ttl: float = 3.0, jobs: int = 8) -> dict[str, Any]:
    """Seconds from SIGKILL of a worker holding leases to another worker holding them all again."""
    settings = {"judge": "sleep", "lease_ttl": f"{lease_ttl}s", "reaper_interval": "250ms", "concurrency": "16"}
    async with stack(**settings) as s:
        s.start("dispatcher")
        s.start("reaper")
        s.start("worker")
        async with s.pool.acquire() as conn:
            ids = [await outbox.submit(conn, s.queue, {"seconds": 60}) for _ in range(jobs)]
        await _wait_status(s.pool, ids, "JUDGING", 1, 30)
        port = _free_port()
        s.start("worker", metrics_port=str(port))  # the survivor: measured once it is ready
        await _wait_ready(port, 30)
        victim = s.procs["worker"][0]
        killed_at = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        await _wait_status(s.pool, ids, "JUDGING", 2, lease_ttl + 30)
        recovered = time.monotonic() - killed_at
    return {"lease_ttl": lease_ttl, "seconds": recovered, "target": lease_ttl + 2}


async def _wait_status(pool: asyncpg.Pool, ids: list[int], status: str, generation: int, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        async with pool.acquire() as conn:
            n = await conn.fetchval(
                "SELECT count(*) FROM judgequeue.submissions WHERE id = ANY($1) AND status = $2 AND generation = $3",
                ids,
                status,
                generation,
            )
        if n == len(ids):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n}/{len(ids)} at {status} generation {generation} within {within}s")
        await asyncio.sleep(0.01)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _wait_ready(port: int, within: float) -> None:
    """Poll the role's /readyz until it answers 200 (Postgres, Redis and the group reachable)."""
    deadline = time.monotonic() + within

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    while not await asyncio.to_thread(ready):
        if time.monotonic() > deadline:
            raise RuntimeError(f"role on port {port} not ready within {within}s")
        await asyncio.sleep(0.05)
