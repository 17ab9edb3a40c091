"""The chaos run at a larger size than CI's (same harness as tests/process/test_chaos.py).

    .venv/bin/python -m bench.chaos_run [--submissions 5000] [--seconds 120] [--seed 1]
    .venv/bin/python -m bench.chaos_run --server-faults [--submissions 3000] [--seconds 120] [--seed 1]

Creates a throwaway database and queue, runs every role as real processes killed at random
failpoints and random times, then prints the figures and the invariant check as JSON. With
``--server-faults`` the faults come from the servers instead: the run owns a Postgres
server and a redis-server, the roles reach them through TCP proxies, and backends are terminated,
``idle_session_timeout`` is lowered, Postgres restarts (fast and immediate), Redis clients are
killed and the proxies reset and stall connections. The last runs' figures are recorded in
docs/reliability.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.cli import new_parser
from bench.common import REDIS_URL, create_database, drop_database
from tests.support.chaos import Chaos, ChaosConfig, fault_targets
from tests.support.databases import delete_queue_keys


async def main() -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--submissions", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--server-faults", action="store_true", help="server-side faults instead of kills")
    parser.add_argument("--log-dir", type=Path, help="keep the roles' logs here (default: a temporary directory)")
    harsher = parser.add_argument_group("server faults, harsher than the defaults")
    harsher.add_argument("--stall-seconds", type=float, default=1.5, help="how long a proxy stall lasts")
    harsher.add_argument("--crash-outage", type=float, default=0.5, help="seconds down after an immediate stop")
    harsher.add_argument("--idle-session-timeout", default="300ms", help="the idle_session_timeout a fault sets")
    harsher.add_argument(
        "--fault-every", type=float, nargs=2, default=(1.0, 2.5), metavar=("MIN", "MAX"), help="pause between faults"
    )
    args = parser.parse_args()
    if args.server_faults:
        return await server_faults(args)

    dsn = await create_database("jq_chaos")
    queue = f"chaos-{uuid.uuid4().hex[:8]}"
    config = _config(args)
    try:
        with tempfile.TemporaryDirectory() as logs:
            report = await Chaos(dsn, REDIS_URL, queue, config, Path(logs)).run()
    finally:
        await drop_database(dsn)
        client = aioredis.Redis.from_url(REDIS_URL)
        await delete_queue_keys(client, queue)
        await client.aclose()
    print(json.dumps(report.as_dict(), indent=1))
    return 1 if report.violations else 0


def _config(args: argparse.Namespace, **more: Any) -> ChaosConfig:
    """The run's size from the command line, a drain deadline for it, and ``more``."""
    return ChaosConfig(
        submissions=args.submissions,
        chaos_seconds=args.seconds,
        seed=args.seed,
        workers=args.workers,
        drain_deadline=180,
        **more,
    )


async def server_faults(args: argparse.Namespace) -> int:
    """The server-fault run: its own servers (thrown away afterwards), so nothing to clean up."""
    queue = f"chaos-{uuid.uuid4().hex[:8]}"
    config = _config(
        args,
        server_faults=True,
        stall_seconds=args.stall_seconds,
        crash_outage_seconds=args.crash_outage,
        idle_session_timeout=args.idle_session_timeout,
        fault_every=(args.fault_every[0], args.fault_every[1]),
    )
    with tempfile.TemporaryDirectory() as tmp:
        logs = args.log_dir or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        async with fault_targets() as targets:
            report = await Chaos(targets.pg.dsn, targets.redis.url, queue, config, logs, targets).run()
    print(json.dumps(report.as_dict(), indent=1))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
