"""Roles through PgBouncer (transaction pooling) against the same roles connected directly.

Starts a throwaway PgBouncer (tests/pgbouncer.py) in front of the benchmark database, runs a
dispatcher, ``--workers`` workers (noop judge) and a reaper with ``JUDGEQUEUE_POSTGRES_POOLER=
transaction`` (and a direct LISTEN DSN), and measures end-to-end throughput and commit-to-verdict
latency as ``bench/pipeline.py`` does for direct connections. Applications submit directly in
both runs, so the difference is the roles' own cost.

    .venv/bin/python -m bench.pooler_bench --jobs 3000 --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from bench.common import span_seconds
from bench.pipeline import percentile, stack, submit_many, wait_done, warm_up
from tests.support.pgbouncer import pgbouncer


async def measure(jobs: int, workers: int, *, through_pooler: bool) -> dict[str, Any]:
    async with stack() as s:
        with pgbouncer(s.dsn, pool_size=4) as bouncer:
            if through_pooler:
                s.env.update(
                    {
                        "JUDGEQUEUE_POSTGRES_DSN": bouncer.dsn_for(s.dsn),
                        "JUDGEQUEUE_POSTGRES_POOLER": "transaction",
                        "JUDGEQUEUE_POSTGRES_LISTEN_DSN": s.dsn,
                    }
                )
            s.start("dispatcher")
            s.start("worker", workers)
            s.start("reaper")
            after = await warm_up(s)
            await submit_many(s, jobs, 8)
            await wait_done(s.pool, after, jobs, 300)
            async with s.pool.acquire() as conn:
                span = await span_seconds(conn, after)
                latencies = [
                    r["s"] * 1000
                    for r in await conn.fetch(
                        "SELECT extract(epoch FROM finished_at - created_at)::float8 AS s"
                        " FROM judgequeue.submissions WHERE id > $1",
                        after,
                    )
                ]
            s.stop()
    return {
        "through_pooler": through_pooler,
        "jobs": jobs,
        "workers": workers,
        "rate": round(jobs / span),
        "p50_ms_under_full_load": round(percentile(latencies, 0.5), 1),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    for through in (False, True):
        print(json.dumps(await measure(args.jobs, args.workers, through_pooler=through)))


if __name__ == "__main__":
    asyncio.run(main())
