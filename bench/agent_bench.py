"""Do a hung endpoint and a 429/503 storm keep other endpoints and queues from their throughput?

    flock /tmp/jq-bench.lock .venv/bin/python -m bench.agent_bench [--jobs 200] [--repeats 3]

One throwaway database, the system Redis, and per queue a dispatcher, a worker and a reaper, each
its own process as each would be its own pod. Three example tool servers
(examples/agent/tool_server.py) on loopback: *good* (each call 50 ms), *storm* (every call answered
429 or 503 with ``Retry-After: 1``) and *hung* (never answers). The queue under test, ``agents``,
runs the http-call judge, worker concurrency 8, with endpoints good (bound 8), storm (bound 2, 100
tries) and hung (bound 2, deadline 10 min); a second queue, ``other``, runs a worker of its own
with the noop judge on the same servers.

Each round submits ``--jobs`` jobs for *good* and as many for ``other`` at once and measures each
queue's throughput, first submit to last verdict, after a warm-up round. ``--repeats`` *calm* rounds (nothing else) come
first, then as many *faults* rounds: 20 jobs for *storm* and 10 for *hung* are submitted before them
and keep failing and hanging through every one (the hung ones hold the hung endpoint's 2 slots, the
others wait out of any slot and come back; the storm's back off). ``--hung-bound 8 --hung-deadline 10``
shows the same rounds without the bound in effect (the hung endpoint may take every slot, each call
for its 10 s deadline). Prints the medians and the ratio
faults/calm (1.0: no effect) and writes ``agent_bench.json`` to ``--out``. The machine is shared
and loaded: read the ratios, not the rates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from bench.cli import new_parser, reporter
from judgequeue.core.store import outbox
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import streams
from tests.support.databases import REDIS_URL, create_database, delete_queue_keys, drop_database
from tests.support.roles import Roles
from tests.support.tool_server import ToolServer

progress = reporter("agent")


async def _wait_terminal(pool: asyncpg.Pool, ids: list[int], within: float = 600) -> float:
    """Seconds from now until every one of ``ids`` has a verdict."""
    start = time.monotonic()
    while True:
        left = await pool.fetchval(
            "SELECT count(*) FROM judgequeue.submissions WHERE id = ANY($1::bigint[])"
            " AND status IN ('PENDING', 'JUDGING')", ids,
        )  # fmt: skip
        if left == 0:
            return time.monotonic() - start
        if time.monotonic() - start > within:
            raise RuntimeError(f"{left} jobs without a verdict after {within}s")
        await asyncio.sleep(0.05)


def _calls(server: ToolServer) -> int:
    return sum(server.effects()["calls"].values())


async def _until(check: Any, what: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {within}s")
        await asyncio.sleep(0.05)


async def _submit(pool: asyncpg.Pool, queue: str, payloads: list[dict[str, Any]]) -> list[int]:
    async with pool.acquire() as conn:
        ids = []
        for payload in payloads:
            async with conn.transaction():
                ids.append(await outbox.submit(conn, queue, payload))
        return ids


async def _throughput(pool: asyncpg.Pool, queue: str, payloads: list[dict[str, Any]]) -> float:
    start = time.monotonic()
    ids = await _submit(pool, queue, payloads)
    await _wait_terminal(pool, ids)
    return len(ids) / (time.monotonic() - start)


async def run(jobs: int, repeats: int, *, hung_bound: int = 2, hung_deadline: float = 600) -> dict[str, Any]:
    dsn = await create_database("jq_agent_bench")
    tag = uuid.uuid4().hex[:6]
    agents, other = f"agents-{tag}", f"other-{tag}"
    servers = [ToolServer("--delay", "0.05"), ToolServer("--storm"), ToolServer("--hang")]
    good, storm, hung = servers
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=20)
    redis = aioredis.Redis.from_url(REDIS_URL)
    fleets: list[Roles] = []
    log_dir = Path(tempfile.mkdtemp(prefix="agent-bench-"))
    try:
        async with pool.acquire() as conn:
            for q in (agents, other):
                await create_queue(conn, q)
                await streams.ensure_group(redis, q)
        calls = json.dumps({
            "good": {"url": good.url, "concurrency": 8},
            "storm": {"url": storm.url, "concurrency": 2, "tries": 100},
            "hung": {"url": hung.url, "concurrency": hung_bound, "deadline": hung_deadline, "tries": 100},
        })  # fmt: skip
        common = {"JUDGEQUEUE_SCHEDULE": "100ms", "JUDGEQUEUE_CONCURRENCY": "8", "JUDGEQUEUE_LEASE_TTL": "10s",
                  "JUDGEQUEUE_VISIBILITY_TIMEOUT": "20s", "JUDGEQUEUE_MAX_RETRIES": "50",
                  "JUDGEQUEUE_LOG_LEVEL": "WARNING"}  # fmt: skip
        for q, judge in ((agents, "http-call"), (other, "noop")):
            roles = Roles.on(dsn, q, log_dir, **common, JUDGEQUEUE_JUDGE=judge, JUDGEQUEUE_CALL_ENDPOINTS=calls)
            roles.start_all()
            fleets.append(roles)
        figures: dict[str, list[float]] = {"calm_good": [], "calm_other": [], "faults_good": [], "faults_other": []}
        # A warm-up round, not counted: the roles' first jobs pay for connections, caches, the group.
        await asyncio.gather(
            _throughput(pool, agents, [{"endpoint": "good", "body": {"warm": i}} for i in range(jobs)]),
            _throughput(pool, other, [{"warm": i} for i in range(jobs)]),
        )
        for kind in ("calm", "faults"):
            if kind == "faults":
                # Submitted once: they keep failing (storm) and hanging (hung) through every later round.
                await _submit(pool, agents, [{"endpoint": "storm", "body": {}}] * 20
                              + [{"endpoint": "hung", "body": {}}] * 10)
                await _until(lambda: _calls(hung) >= min(hung_bound, 10), "the hung endpoint's calls to start")
            for round_no in range(repeats):
                good_payloads = [{"endpoint": "good", "body": {"i": i, "kind": kind, "round": round_no}}
                                 for i in range(jobs)]
                a, b = await asyncio.gather(
                    _throughput(pool, agents, good_payloads),
                    _throughput(pool, other, [{"i": i} for i in range(jobs)]),
                )
                figures[f"{kind}_good"].append(a)
                figures[f"{kind}_other"].append(b)
                progress(f"{kind} round {round_no}: good endpoint {a:.1f} jobs/s, other queue {b:.1f} jobs/s")
        storm_calls = _calls(storm)
        hung_calls = _calls(hung)
        medians = {k: statistics.median(v) for k, v in figures.items() if v}
        result = {
            "jobs": jobs, "repeats": repeats, "hung_bound": hung_bound, "hung_deadline": hung_deadline,
            "medians": medians,
            "ratio_good": medians["faults_good"] / medians["calm_good"],
            "ratio_other": medians["faults_other"] / medians["calm_other"],
            "storm_calls": storm_calls, "hung_calls_in_flight": hung_calls,
        }  # fmt: skip
        return result
    finally:
        for roles in fleets:
            await asyncio.to_thread(roles.stop)
        for q in (agents, other):
            await delete_queue_keys(redis, q)
        await redis.aclose()
        await pool.close()
        for server in servers:
            server.close()
        await drop_database(dsn)


def main(argv: list[str] | None = None) -> None:
    parser = new_parser(__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    parser.add_argument("--hung-bound", type=int, default=2,
                        help="the hung endpoint's concurrency bound (8, the worker's slots: no bound in effect)")
    parser.add_argument("--hung-deadline", type=float, default=600, help="seconds before a hung call is abandoned")
    args: argparse.Namespace = parser.parse_args(argv)
    result = asyncio.run(run(args.jobs, args.repeats, hung_bound=args.hung_bound, hung_deadline=args.hung_deadline))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "agent_bench.json").write_text(json.dumps(result, indent=2))
    m = result["medians"]
    print(f"good endpoint: calm {m['calm_good']:.1f} jobs/s, beside a storm and a hang {m['faults_good']:.1f} jobs/s"
          f" (ratio {result['ratio_good']:.2f})")
    print(f"other queue:   calm {m['calm_other']:.1f} jobs/s, beside a storm and a hang {m['faults_other']:.1f} jobs/s"
          f" (ratio {result['ratio_other']:.2f})")
    print(f"meanwhile: {result['storm_calls']} calls answered 429/503, {result['hung_calls_in_flight']} calls to the"
          f" hung endpoint (bound {args.hung_bound}, deadline {args.hung_deadline:g}s)")


if __name__ == "__main__":
    main()
