"""Is a slow endpoint kept busy on every call its fleet-wide bound allows, and never more?

    flock /tmp/jq-bench.lock .venv/bin/python -m bench.endpoints [--jobs 100] [--slots 4 8] [--bound 4]

One throwaway database, the system Redis, and per round a dispatcher, ``--workers`` workers (each
with ``--slots`` slots, the http-call judge) and a reaper, each its own process as each would be its
own pod. The endpoint is a small HTTP server in this process (tests/support/counting_server.py):
every call takes ``--delay`` seconds, and it records how many calls are in progress at each
instant. The endpoint is declared with ``concurrency: --bound``, counted across the fleet.

Each round submits ``--jobs`` jobs at once and reports, per slot count:

* the endpoint's peak concurrency (must never exceed the bound);
* how busy it was: the time-weighted mean of its calls in progress over the bound, from the first
  call's start to the last call's start (while jobs were still waiting for it, every allowed call
  could have been in progress);
* jobs/s, first submit to last verdict (the roles' start included), and from the first call to the
  last verdict, against its ceiling: bound / delay;
* the deferrals: jobs that found no room to wait and were given back for later.

Writes ``endpoints.json`` to ``--out``. The machine is shared and loaded: read the busy fraction.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from bench.cli import new_parser, reporter
from judgequeue.core.store import outbox
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import streams
from judgequeue.core.transport.endpoint_slots import EndpointSlots
from tests.support.counting_server import CountingServer, counting_server
from tests.support.databases import REDIS_URL, create_database, delete_queue_keys, drop_database
from tests.support.roles import Roles

progress = reporter("endpoints")

#: The roles' settings in every round (a short lease: a killed worker's jobs are rescued quickly).
ROLE_ENV = {
    "JUDGEQUEUE_JUDGE": "http-call",
    "JUDGEQUEUE_SCHEDULE": "100ms",
    "JUDGEQUEUE_LEASE_TTL": "3s",
    "JUDGEQUEUE_VISIBILITY_TIMEOUT": "5s",
    "JUDGEQUEUE_MAX_RETRIES": "50",
    "JUDGEQUEUE_LOG_LEVEL": "WARNING",
}


@dataclass
class Round:
    """One round's figures (see the module)."""

    slots: int
    workers: int
    bound: int
    delay: float
    jobs: int
    seconds: float
    jobs_per_second: float
    calling_jobs_per_second: float
    ceiling_jobs_per_second: float
    peak: int
    busy: float
    calls: int
    deferrals: int
    statuses: dict[str, int]


async def submit(pool: asyncpg.Pool, queue: str, jobs: int, tag: str) -> list[int]:
    async with pool.acquire() as conn, conn.transaction():
        return [await outbox.submit(conn, queue, {"endpoint": "slow", "body": {"i": i, "tag": tag}})
                for i in range(jobs)]  # fmt: skip


async def statuses(pool: asyncpg.Pool, ids: list[int]) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT status, count(*) AS n FROM judgequeue.submissions WHERE id = ANY($1::bigint[]) GROUP BY status", ids
    )
    return {r["status"]: r["n"] for r in rows}


async def fleet_round(
    pool: asyncpg.Pool, dsn: str, queue: str, log_dir: Path, server: CountingServer, *, jobs: int, slots: int,
    workers: int, bound: int, within: float = 600, during: Callable[[Roles], Coroutine[Any, Any, None]] | None = None,
) -> Round:  # fmt: skip
    """Run ``jobs`` jobs for the slow endpoint through a fresh fleet on ``queue``; its figures.
    ``during``, if given, runs beside the round once the jobs are submitted (a test kills a worker)."""
    calls = json.dumps({"slow": {"url": server.url, "concurrency": bound, "deadline": 60, "tries": 5}})
    roles = Roles.on(dsn, queue, log_dir, **ROLE_ENV, JUDGEQUEUE_CONCURRENCY=str(slots),
                     JUDGEQUEUE_CALL_ENDPOINTS=calls)  # fmt: skip
    roles.start("dispatcher")
    roles.start("worker", workers)
    roles.start("reaper")
    try:
        start = time.monotonic()
        ids = await submit(pool, queue, jobs, queue)
        side = asyncio.create_task(during(roles)) if during is not None else None
        while True:
            done = await statuses(pool, ids)
            if done.get("PENDING", 0) + done.get("JUDGING", 0) == 0:
                break
            if time.monotonic() - start > within:
                raise RuntimeError(f"jobs without a verdict after {within}s: {done}\n{roles.logs()}")
            await asyncio.sleep(0.05)
        ended = time.monotonic()
        seconds = ended - start
        if side is not None:
            await side
        deferrals = int(await pool.fetchval(
            "SELECT coalesce(sum(generation - 1), 0) FROM judgequeue.submissions WHERE id = ANY($1::bigint[])", ids
        ))
    finally:
        await asyncio.to_thread(roles.stop)
    first, last = (min(server.starts), max(server.starts)) if server.starts else (0.0, 0.0)
    return Round(
        slots=slots, workers=workers, bound=bound, delay=server.delay, jobs=jobs, seconds=seconds,
        jobs_per_second=jobs / seconds, calling_jobs_per_second=jobs / (ended - first) if first else 0.0,
        ceiling_jobs_per_second=bound / server.delay, peak=server.peak,
        busy=server.mean_between(first, last) / bound, calls=sum(server.calls.values()), deferrals=deferrals,
        statuses=done,
    )  # fmt: skip


async def run(jobs: int, slot_counts: list[int], *, workers: int, bound: int, delay: float) -> list[Round]:
    dsn = await create_database("jq_endpoints_bench")
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=10)
    redis = aioredis.Redis.from_url(REDIS_URL)
    log_dir = Path(tempfile.mkdtemp(prefix="endpoints-bench-"))
    rounds: list[Round] = []
    queues: list[str] = []
    try:
        for slots in slot_counts:
            queue = f"ep-{uuid.uuid4().hex[:8]}"
            queues.append(queue)
            async with pool.acquire() as conn:
                await create_queue(conn, queue)
            await streams.ensure_group(redis, queue)
            async with counting_server(delay) as server:
                got = await fleet_round(pool, dsn, queue, log_dir, server, jobs=jobs, slots=slots, workers=workers,
                                        bound=bound)  # fmt: skip
            left = await EndpointSlots(redis).holders(queue, "slow")
            progress(f"{workers} workers x {slots} slots: peak {got.peak} of {bound}, busy {got.busy:.1%}, "
                     f"{got.jobs_per_second:.2f} jobs/s (ceiling {got.ceiling_jobs_per_second:.2f}), "
                     f"slots held after: {left}")  # fmt: skip
            rounds.append(got)
        return rounds
    finally:
        for queue in queues:
            await delete_queue_keys(redis, queue)
        await redis.aclose()
        await pool.close()
        await drop_database(dsn)


def main(argv: list[str] | None = None) -> None:
    parser = new_parser(__doc__)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--slots", type=int, nargs="+", default=[4, 8], help="slots per worker, one round each")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bound", type=int, default=4, help="the endpoint's concurrency, across the fleet")
    parser.add_argument("--delay", type=float, default=0.5, help="seconds each call takes")
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args: argparse.Namespace = parser.parse_args(argv)
    rounds = asyncio.run(run(args.jobs, args.slots, workers=args.workers, bound=args.bound, delay=args.delay))
    args.out.mkdir(parents=True, exist_ok=True)
    doc: list[dict[str, Any]] = [asdict(r) for r in rounds]
    (args.out / "endpoints.json").write_text(json.dumps(doc, indent=2))
    print(f"{'workers x slots':>16} {'peak/bound':>10} {'busy':>6} {'jobs/s':>7} {'calling':>8} {'ceiling':>8}"
          f" {'calls':>6} {'deferrals':>9}")
    for r in rounds:
        print(f"{f'{r.workers} x {r.slots}':>16} {f'{r.peak}/{r.bound}':>10} {r.busy:>6.1%} "
              f"{r.jobs_per_second:>7.2f} {r.calling_jobs_per_second:>8.2f} {r.ceiling_jobs_per_second:>8.2f} "
              f"{r.calls:>6} {r.deferrals:>9}")  # fmt: skip


if __name__ == "__main__":
    main()
