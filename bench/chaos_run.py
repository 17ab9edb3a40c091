"""The chaos run at a larger size than CI's (same harness as tests/test_chaos.py).

    .venv/bin/python -m bench.chaos_run [--submissions 5000] [--seconds 120] [--seed 1]

Creates a throwaway database and queue, runs every role as real processes killed at random
failpoints and random times, then prints the figures and the invariant check as JSON. The last
run's figures are recorded in docs/reliability.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import uuid
from pathlib import Path

import redis.asyncio as aioredis

from bench.common import REDIS_URL, create_database, drop_database
from tests.chaos import Chaos, ChaosConfig


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submissions", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()

    dsn = await create_database("jq_chaos")
    queue = f"chaos-{uuid.uuid4().hex[:8]}"
    config = ChaosConfig(
        submissions=args.submissions,
        chaos_seconds=args.seconds,
        seed=args.seed,
        workers=args.workers,
        drain_deadline=180,
    )
    try:
        with tempfile.TemporaryDirectory() as logs:
            report = await Chaos(dsn, REDIS_URL, queue, config, Path(logs)).run()
    finally:
        await drop_database(dsn)
        client = aioredis.Redis.from_url(REDIS_URL)
        keys = [k async for k in client.scan_iter(match=f"jq:{{{queue}}}:*", count=1000)]
        for i in range(0, len(keys), 500):
            await client.delete(*keys[i : i + 500])
        await client.aclose()
    print(json.dumps(report.as_dict(), indent=1))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
