"""Does shadow judging slow a live queue on the same machines? Live figures alone and beside shadow load.

    flock /tmp/jq-bench.lock .venv/bin/python -m bench.shadow_bench [--jobs 3000] [--rate 100] [--seconds 10]
        [--repeats 3] [--judge noop|program] [--shadow-cpu-shares N] [--agreement-rows N]
        [--servers private|system]

One database and one Redis hold two queues. The live queue runs a dispatcher, one worker and a reaper;
the shadow queue (mode shadow) a dispatcher and a reaper throughout, and one *shadow worker*
(``JUDGEQUEUE_SHADOW=judge``, its own process, as its own replicas would be) in the rounds that judge
it. For the live queue, in rotating order, ``--repeats`` times each: *alone*; beside the shadow queue
taking the same load at the same time, *sent* to the shadow stream only (shadow mode as it was before
shadow judging); and beside it *judged* by the shadow worker:

- throughput: ``--jobs`` submits as fast as 4 connections go, first submit to last verdict;
- latency: commit-to-verdict p50 and p99 (database clock) at ``--rate`` submits/s for ``--seconds``.

``--judge noop`` measures what shadow judging costs the queue machinery (Postgres, Redis, the roles);
``--judge program`` gives every job a Python solution that computes for about 20 ms in the sandbox, so
the shadow worker also competes for CPU. ``--shadow-cpu-shares N`` runs the shadow worker (and so its
sandboxes) in a cgroup v1 ``cpu`` group of its own with ``cpu.shares`` N, as Kubernetes runs a pod
whose CPU request is N/1024 of a core: what ``spec.worker.shadow.resources`` does on a shared node
(the live processes stay in the root group, weight 1024). Prints the medians and the ratios to *alone* (1.0: no effect)
and writes ``shadow_bench.json`` to ``--out``. With ``--agreement-rows N`` it also times the agreement
figures (``shadow.agreement``: what the operator reads on every pass while a queue is in shadow mode,
and the reaper once a minute) over N compared submissions, median of 5; ``--repeats 0`` skips the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from bench import pipeline
from bench.cli import add_counts, add_run_options, new_parser, reporter, run_on_servers
from judgequeue.core.store import outbox, shadow
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import streams

progress = reporter("shadow")

#: A job of about 20 ms of CPU for the program judge (a live judge's work, not a sleep).
PROGRAM = {
    "language": "python",
    "source": "n = int(input())\ns = 0\nfor i in range(n):\n    s += i * i % 7\nprint(s % 1000)\n",
    "limits": {"time": 5, "memory_mb": 256},
}


def _payload(judge: str) -> dict[str, Any]:
    if judge == "noop":
        return {}
    expected = sum(i * i % 7 for i in range(400000)) % 1000
    return {**PROGRAM, "tests": [{"input": "400000", "output": str(expected)}]}


async def _submit_fast(dsn: str, queue: str, n: int, payload: dict[str, Any], connections: int = 4) -> None:
    conns = [await asyncpg.connect(dsn) for _ in range(connections)]
    try:
        async def lane(conn: asyncpg.Connection, count: int) -> None:
            for _ in range(count):
                await outbox.submit(conn, queue, payload)

        share = [n // connections + (1 if i < n % connections else 0) for i in range(connections)]
        await asyncio.gather(*(lane(c, k) for c, k in zip(conns, share, strict=True)))
    finally:
        for c in conns:
            await c.close()


async def _submit_steady(dsn: str, queue: str, rate: float, seconds: float, payload: dict[str, Any]) -> int:
    total = int(rate * seconds)
    conn = await asyncpg.connect(dsn)
    try:
        start = time.monotonic()
        for i in range(total):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing of the offered load
            await outbox.submit(conn, queue, payload)
    finally:
        await conn.close()
    return total


LIVE_DONE = ("SELECT count(*) FROM judgequeue.submissions WHERE queue = $1 AND id > $2"
             " AND finished_at IS NOT NULL")
SHADOW_DONE = ("SELECT count(*) FROM judgequeue.shadow_verdicts WHERE queue = $1"
               " AND submission_id > $2 AND judged_at IS NOT NULL")


async def _wait_count(pool: asyncpg.Pool, count: str, what: str, queue: str, after: int, n: int, within: float) -> None:
    """Poll ``count`` (a query of the queue's rows past ``after``) until it reaches ``n``; a deadline
    names ``what`` fell short."""
    deadline = time.monotonic() + within
    while (done := await pool.fetchval(count, queue, after)) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {done}/{n} {what} within {within}s")
        await asyncio.sleep(0.05)


async def _live_done(pool: asyncpg.Pool, queue: str, after: int, n: int, within: float) -> None:
    await _wait_count(pool, LIVE_DONE, "live jobs finished", queue, after, n, within)


async def _shadow_done(pool: asyncpg.Pool, queue: str, after: int, n: int, within: float) -> None:
    await _wait_count(pool, SHADOW_DONE, "shadow jobs judged", queue, after, n, within)


async def _last_id(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT coalesce(max(id), 0) FROM judgequeue.submissions"))


CONDITIONS = ("alone", "sent", "judged")


async def _settle_shadow(s: pipeline.Stack, shadow_q: str, condition: str, after: int, n: int) -> None:
    """Start the next round with no shadow backlog: judged rounds wait for their shadow verdicts, sent
    rounds drop what the shadow stream got (nobody reads it in those)."""
    if condition == "judged":
        await _shadow_done(s.pool, shadow_q, after, n, 600)
    elif condition == "sent":
        await s.redis.delete(streams.shadow_key(shadow_q))


async def throughput(s: pipeline.Stack, shadow_q: str, jobs: int, payload: dict[str, Any], condition: str) -> float:
    after = await _last_id(s.pool)
    work = [_submit_fast(s.dsn, s.queue, jobs, payload)]
    if condition != "alone":
        work.append(_submit_fast(s.dsn, shadow_q, jobs, payload))
    await asyncio.gather(*work)
    await _live_done(s.pool, s.queue, after, jobs, 600)
    span = await s.pool.fetchval(
        "SELECT extract(epoch FROM max(finished_at) - min(created_at))::float8 FROM judgequeue.submissions"
        " WHERE queue = $1 AND id > $2", s.queue, after)
    await _settle_shadow(s, shadow_q, condition, after, jobs)
    return float(jobs / span)


async def latency(s: pipeline.Stack, shadow_q: str, rate: float, seconds: float, payload: dict[str, Any],
                  condition: str) -> dict[str, float]:
    after = await _last_id(s.pool)
    work = [_submit_steady(s.dsn, s.queue, rate, seconds, payload)]
    if condition != "alone":
        work.append(_submit_steady(s.dsn, shadow_q, rate, seconds, payload))
    total, *_ = await asyncio.gather(*work)
    await _live_done(s.pool, s.queue, after, total, 600)
    rows = await s.pool.fetch("SELECT extract(epoch FROM finished_at - created_at)::float8 * 1000 AS ms"
                              " FROM judgequeue.submissions WHERE queue = $1 AND id > $2", s.queue, after)
    await _settle_shadow(s, shadow_q, condition, after, total)
    samples = [r["ms"] for r in rows]
    return {"p50_ms": pipeline.percentile(samples, 0.5), "p99_ms": pipeline.percentile(samples, 0.99)}


CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")


def _cpu_group(shares: int) -> Path:
    """A cgroup v1 ``cpu`` group with ``cpu.shares`` ``shares`` (removed by :func:`_drop_group`)."""
    group = CPU_CGROUPS / f"jq-bench-shadow-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    (group / "cpu.shares").write_text(str(shares))
    return group


def _drop_group(group: Path | None) -> None:
    if group is not None:
        group.rmdir()  # empty: its processes were stopped


def _shadow_worker(s: pipeline.Stack, shadow_q: str, on: bool, group: Path | None = None) -> None:
    """Start the shadow worker (in ``group``'s ``cpu`` group, if any), or stop it (SIGTERM, as a
    scale-down would)."""
    if on:
        env = {**s.env, "JUDGEQUEUE_QUEUE": shadow_q, "JUDGEQUEUE_SHADOW": "judge"}
        procs = group / "cgroup.procs" if group is not None else None

        def join_group() -> None:  # in the child, before exec: its sandboxes inherit the group
            if procs is not None:
                procs.write_text(str(os.getpid()))

        s.procs.setdefault("shadow-worker", []).append(subprocess.Popen(
            [pipeline.JUDGEQUEUE, "worker"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=join_group))
        return
    for proc in s.procs.pop("shadow-worker", []):
        proc.terminate()
        proc.wait(timeout=60)


async def agreement_cost(s: pipeline.Stack, rows: int) -> dict[str, float]:
    """Milliseconds of one ``shadow.agreement`` over ``rows`` submissions, each with a legacy and a shadow
    verdict (1 in 100 differing), written straight into the tables; median of 5 after one warm-up."""
    q = f"figures-{uuid.uuid4().hex[:8]}"
    async with s.pool.acquire() as conn:
        await create_queue(conn, q, mode="shadow")
        await conn.execute(
            "WITH s AS (INSERT INTO judgequeue.submissions (queue, payload) SELECT $1, '{}' FROM generate_series(1, $2)"
            " RETURNING id), v AS (INSERT INTO judgequeue.shadow_verdicts (submission_id, queue, generation, status,"
            " judged_at) SELECT id, $1, 1, CASE WHEN id % 100 = 0 THEN 'WRONG_ANSWER' ELSE 'ACCEPTED' END, now()"
            " FROM s RETURNING submission_id) INSERT INTO judgequeue.legacy_verdicts (submission_id, queue, status)"
            " SELECT submission_id, $1, 'ACCEPTED' FROM v", q, rows)
        await conn.execute("ANALYZE judgequeue.shadow_verdicts")
        await conn.execute("ANALYZE judgequeue.legacy_verdicts")
        times = []
        for _ in range(6):
            started = time.perf_counter()
            figures = await shadow.agreement(conn, q)
            times.append((time.perf_counter() - started) * 1000)
        assert figures.samples == rows, figures
    return {"rows": rows, "median_ms": float(statistics.median(times[1:])), "max_ms": max(times[1:])}


async def inner(args: argparse.Namespace) -> int:
    payload = _payload(args.judge)
    concurrency = "8" if args.judge == "program" else "64"
    results: dict[str, list[Any]] = {f"{m}_{c}": [] for m in ("throughput", "latency") for c in CONDITIONS}
    group = _cpu_group(args.shadow_cpu_shares) if args.shadow_cpu_shares else None
    try:
        return await _run(args, payload, concurrency, group, results)
    finally:
        _drop_group(group)


async def _run(args: argparse.Namespace, payload: dict[str, Any], concurrency: str, group: Path | None,
               results: dict[str, list[Any]]) -> int:
    async with pipeline.stack(judge=args.judge, concurrency=concurrency) as s:
        shadow_q = f"shadow-{uuid.uuid4().hex[:8]}"
        async with s.pool.acquire() as conn:
            await create_queue(conn, shadow_q, mode="shadow")
        for role in ("dispatcher", "worker", "reaper"):
            s.start(role)
            if role != "worker":
                s.start(role, queue=shadow_q)
        _shadow_worker(s, shadow_q, True, group)
        warm = await _last_id(s.pool)
        await _submit_fast(s.dsn, s.queue, 20, payload)
        await _submit_fast(s.dsn, shadow_q, 20, payload)
        await _live_done(s.pool, s.queue, warm, 20, 120)
        await _shadow_done(s.pool, shadow_q, warm, 20, 120)
        _shadow_worker(s, shadow_q, False)
        if args.agreement_rows:
            progress(f"agreement figures over {args.agreement_rows} compared submissions")
            results["agreement"] = [await agreement_cost(s, args.agreement_rows)]
        for k in range(args.repeats):
            for condition in CONDITIONS[k % 3:] + CONDITIONS[: k % 3]:
                _shadow_worker(s, shadow_q, condition == "judged", group)
                progress(f"round {k + 1}/{args.repeats}: throughput, {condition}")
                results[f"throughput_{condition}"].append(
                    await throughput(s, shadow_q, args.jobs, payload, condition))
                progress(f"round {k + 1}/{args.repeats}: latency, {condition}")
                results[f"latency_{condition}"].append(
                    await latency(s, shadow_q, args.rate, args.seconds, payload, condition))
                _shadow_worker(s, shadow_q, False)
        async with s.pool.acquire() as conn:
            # What the judges said: a starved shadow run must not change its verdict (docs/performance.md).
            results["verdicts"] = [{
                "live": {r["status"]: r["n"] for r in await conn.fetch(
                    "SELECT status, count(*) AS n FROM judgequeue.submissions WHERE queue = $1 GROUP BY 1", s.queue)},
                "shadow": {r["status"]: r["n"] for r in await conn.fetch(
                    "SELECT status, count(*) AS n FROM judgequeue.shadow_verdicts WHERE queue = $1 GROUP BY 1",
                    shadow_q)},
            }]
    if args.repeats:
        print(report(results, args))
        print(f"verdicts: {results['verdicts'][0]}")
    for cost in results.get("agreement", []):
        print(f"agreement figures over {cost['rows']:,} compared submissions: median {cost['median_ms']:.1f} ms,"
              f" max {cost['max_ms']:.1f} ms")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shadow_bench.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                            **results}, indent=1))
    return 0


def report(results: dict[str, list[Any]], args: argparse.Namespace) -> str:
    """Medians over the rounds of each condition, with their ratios to *alone* (pure)."""
    def med(values: list[float]) -> float:
        return float(statistics.median(values))

    lines = [f"judge {args.judge}, {args.repeats} rounds, medians; the live queue alone, beside a shadow queue"
             " under the same load sent only, and judged by a shadow worker"
             + (f" (cpu.shares {args.shadow_cpu_shares})" if args.shadow_cpu_shares else "")]
    t = {c: med(results[f"throughput_{c}"]) for c in CONDITIONS}
    lines.append(f"throughput ({args.jobs} jobs/round): alone {t['alone']:,.0f} jobs/s; sent {t['sent']:,.0f}"
                 f" ({t['sent'] / t['alone']:.2f}); judged {t['judged']:,.0f} ({t['judged'] / t['alone']:.2f})")
    for q in ("p50_ms", "p99_ms"):
        m = {c: med([x[q] for x in results[f"latency_{c}"]]) for c in CONDITIONS}
        lines.append(f"latency {q[:3]} at {args.rate:g}/s: alone {m['alone']:.1f} ms; sent {m['sent']:.1f} ms"
                     f" ({m['sent'] / m['alone']:.2f}); judged {m['judged']:.1f} ms ({m['judged'] / m['alone']:.2f})")
    return "\n".join(lines)


def main() -> int:
    p = new_parser(__doc__)
    add_counts(p, jobs=3000, repeats=3)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--judge", choices=("noop", "program"), default="noop")
    p.add_argument("--agreement-rows", type=int, default=0)
    p.add_argument("--shadow-cpu-shares", type=int, default=0)
    add_run_options(p)
    return run_on_servers("bench.shadow_bench", p, inner)


if __name__ == "__main__":
    sys.exit(main())
