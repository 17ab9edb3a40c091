"""End-to-end benchmark (not a test): submit -> dispatcher -> worker (noop judge) -> fenced verdict.

Every role runs as a real OS process (one dispatcher, N workers); submitters run in this process
over several connections, each submit its own transaction. Two measurements on a fresh database:

1. throughput: ``--jobs`` submissions as fast as the submitters go, for each worker count; rate =
   jobs / (first submit -> last verdict, DB clock);
2. latency: a steady ``--rate`` jobs/s offered for ``--seconds``; commit-to-verdict per job is
   ``finished_at - created_at`` on the DB clock (p50/p99).

    .venv/bin/python -m bench.e2e_bench --workers 1,2,4 --jobs 10000 --rate 200 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import redis.asyncio as aioredis

from judgequeue.core import outbox, streams
from judgequeue.core.migrate import migrate
from judgequeue.core.queues import create_queue

ADMIN_DSN = os.environ.get("JUDGEQUEUE_BENCH_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("JUDGEQUEUE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
ROLE_MAIN = (
    "import asyncio, os, sys\n"
    "from judgequeue.core import dispatcher, worker\n"
    "from judgequeue.core.config import load_settings\n"
    "role = {'dispatcher': dispatcher, 'worker': worker}[sys.argv[1]]\n"
    "asyncio.run(role.run(load_settings(os.environ), asyncio.Event()))\n"
)


def _dsn(database: str) -> str:
    return urlunsplit(urlsplit(ADMIN_DSN)._replace(path="/" + database))


def spawn(role: str, env: dict[str, str]) -> asyncio.Future[asyncio.subprocess.Process]:
    quiet = asyncio.subprocess.DEVNULL
    return asyncio.ensure_future(
        asyncio.create_subprocess_exec(sys.executable, "-c", ROLE_MAIN, role, env=env, stdout=quiet, stderr=quiet)
    )


async def warm_up(pool: asyncpg.Pool, queue: str, n: int = 50) -> int:
    """Push a few jobs through every role (processes started, connections open); returns the last id."""
    await submit_many(pool, queue, n, 1)
    await wait_done(pool, n, 60)
    async with pool.acquire() as conn:
        last: int = await conn.fetchval("SELECT max(id) FROM judgequeue.submissions")
    return last


async def submit_many(pool: asyncpg.Pool, queue: str, n: int, connections: int) -> None:
    async def submitter(count: int) -> None:
        async with pool.acquire() as conn:
            for _ in range(count):
                await outbox.submit(conn, queue, {})

    share = [n // connections + (1 if i < n % connections else 0) for i in range(connections)]
    await asyncio.gather(*(submitter(c) for c in share))


async def wait_done(pool: asyncpg.Pool, n: int, within: float) -> None:
    deadline = time.monotonic() + within
    async with pool.acquire() as conn:
        while time.monotonic() < deadline:
            done = await conn.fetchval("SELECT count(*) FROM judgequeue.submissions WHERE finished_at IS NOT NULL")
            if done >= n:  # ids are dense here: n finished means every job so far
                return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"only part of {n} jobs finished within {within}s")


async def scenario(workers: int, concurrency: int, body: str, args: argparse.Namespace) -> str:
    name = f"jq_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(ADMIN_DSN)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    queue = f"bench-{uuid.uuid4().hex[:6]}"
    conn = await asyncpg.connect(_dsn(name))
    await migrate(conn)
    await create_queue(conn, queue)
    await conn.close()
    redis = aioredis.Redis.from_url(REDIS_URL)
    await streams.ensure_group(redis, queue)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "JUDGEQUEUE_POSTGRES_DSN": _dsn(name),
        "JUDGEQUEUE_REDIS_URL": REDIS_URL,
        "JUDGEQUEUE_QUEUE": queue,
        "JUDGEQUEUE_JUDGE": "noop",
        "JUDGEQUEUE_CONCURRENCY": str(concurrency),
        "JUDGEQUEUE_BATCH_SIZE": "500",
        "JUDGEQUEUE_LOG_LEVEL": "WARNING",
    }
    procs = [await spawn("dispatcher", env)] + [await spawn("worker", env) for _ in range(workers)]
    pool = await asyncpg.create_pool(_dsn(name), min_size=args.submitters, max_size=args.submitters + 1)
    assert pool is not None
    try:
        after = await warm_up(pool, queue)
        if body in ("throughput", "drain"):
            if body == "drain":  # one transaction commits the whole backlog: measures the pipeline alone
                async with pool.acquire() as c:
                    await c.execute(
                        "SELECT judgequeue.submit($1, '{}'::jsonb) FROM generate_series(1, $2)", queue, args.jobs
                    )
            else:
                await submit_many(pool, queue, args.jobs, args.submitters)
            await wait_done(pool, after + args.jobs, 120)
            async with pool.acquire() as c:
                span = await c.fetchval(
                    "SELECT extract(epoch FROM max(finished_at) - min(created_at))::float8"
                    "  FROM judgequeue.submissions WHERE id > $1",
                    after,
                )
            rate = args.jobs / span
            what = "submitted one per transaction" if body == "throughput" else "committed in one transaction"
            head = f"{body}: workers={workers} concurrency={concurrency}: {args.jobs} jobs ({what})"
            return f"{head} in {span:.2f}s = {rate:,.0f} jobs/s"
        total = int(args.rate * args.seconds)
        interval = 1.0 / args.rate
        start = time.monotonic()
        async with pool.acquire() as c:
            for i in range(total):
                delay = start + i * interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await outbox.submit(c, queue, {})
        await wait_done(pool, after + total, 60)
        async with pool.acquire() as c:
            row = await c.fetchrow(
                """
                WITH l AS (SELECT extract(epoch FROM finished_at - created_at)::float8 AS s
                             FROM judgequeue.submissions WHERE id > $1)
                SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s) AS p50,
                       percentile_cont(0.99) WITHIN GROUP (ORDER BY s) AS p99, max(s) AS worst
                  FROM l
                """,
                after,
            )
        achieved = total / (time.monotonic() - start)
        return (
            f"workers={workers} offered {args.rate}/s for {args.seconds}s ({achieved:.0f}/s achieved): commit->verdict "
            f"p50={row['p50'] * 1000:.1f}ms p99={row['p99'] * 1000:.1f}ms max={row['worst'] * 1000:.1f}ms"
        )
    finally:
        for p in procs:
            p.kill()
            await p.wait()
        await pool.close()
        keys = [k async for k in redis.scan_iter(match=f"jq:{{{queue}}}:*", count=1000)]
        for i in range(0, len(keys), 500):
            await redis.delete(*keys[i : i + 500])
        await redis.aclose()
        admin = await asyncpg.connect(ADMIN_DSN)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2,4", help="worker process counts to measure")
    parser.add_argument("--concurrency", type=int, default=64, help="JUDGEQUEUE_CONCURRENCY of each worker")
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--submitters", type=int, default=8, help="concurrent submitting connections")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--latency-workers", type=int, default=1)
    args = parser.parse_args()
    print(f"cpus={os.cpu_count()} roles as processes (1 dispatcher + N workers), noop judge")
    for n in (int(x) for x in args.workers.split(",") if x):
        print(await scenario(n, args.concurrency, "throughput", args), flush=True)
        print(await scenario(n, args.concurrency, "drain", args), flush=True)
    print(await scenario(args.latency_workers, args.concurrency, "latency", args), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
