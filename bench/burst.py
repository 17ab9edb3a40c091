"""Contest start: a burst of submissions from many application connections while workers judge.

    .venv/bin/python -m bench.burst [--submissions 100000] [--connections 64] [--processes 4]
                                    [--workers 2] [--peak-jobs 10000] [--peak-runs 3]
                                    [--servers private|system]

In one run: first the steady-state end-to-end peak with the same roles (``--peak-jobs`` submitted
one per transaction from 2 processes, 8 connections, as ``bench.run``; the best of ``--peak-runs``:
one short run on this VM may come out at two thirds of another, and a low peak would flatter the
ratio), then the burst: the
``--submissions`` committed as fast as ``--processes`` application processes with ``--connections``
connections in all can (one submit per transaction) while the dispatcher, ``--workers`` workers
(noop judge) and the reaper run. Every 0.5 s the harness samples committed, judged, the backlog
(committed and not yet judged), the outbox's waiting rows, stream length and PEL. Reports the
time to commit them all and to the last verdict, the drain rate (verdicts/s from the first commit
to the last verdict) against the peak, commit-to-verdict p50/p99, that every submission has a
verdict (nothing lost), and that outbox, stream and PEL are back to empty. Writes ``burst.json``
and ``burst.png`` (backlog and verdicts/s over time).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import pipeline
from bench.cli import add_counts, add_run_options, new_parser, reporter, run_on_servers
from bench.plots import headless_pyplot, save
from judgequeue.core.base.states import VERDICTS
from judgequeue.core.transport import streams

PROGRESS_SQL = (
    "SELECT (SELECT coalesce(max(id), $2) FROM judgequeue.submissions) - $2 AS committed,"
    " (SELECT count(*) FROM judgequeue.submissions WHERE queue = $1 AND finished_at IS NOT NULL AND id > $2)"
    " AS judged,"
    " (SELECT count(*) FROM judgequeue.outbox WHERE queue = $1 AND state IN ('PENDING', 'CLAIMED')) AS outbox"
)


progress = reporter("burst")


async def _sampler(s: pipeline.Stack, after: int, t0: float, out: list[dict[str, float]], stop: asyncio.Event) -> None:
    key = streams.stream_key(s.queue)
    while not stop.is_set():
        async with s.pool.acquire() as conn:
            row = await conn.fetchrow(PROGRESS_SQL, s.queue, after)
        assert row is not None
        pending: Any = await s.redis.xpending(key, streams.GROUP)
        out.append(
            {
                "t": time.monotonic() - t0,
                "committed": row["committed"],
                "judged": row["judged"],
                "outbox": row["outbox"],
                "stream": int(await s.redis.xlen(key)),
                "pel": int(pending["pending"]),
            }
        )
        await asyncio.sleep(0.5)  # the sampling period


async def burst(submissions: int, connections: int, processes: int, workers: int) -> dict[str, Any]:
    async with pipeline.stack() as s:
        s.start("dispatcher")
        s.start("worker", workers)
        s.start("reaper")
        after = await pipeline.warm_up(s)
        samples: list[dict[str, float]] = []
        stop = asyncio.Event()
        t0 = time.monotonic()
        sampler = asyncio.create_task(_sampler(s, after, t0, samples, stop))
        await pipeline.submit_many(s, submissions, connections, 1, processes)
        committed_in = time.monotonic() - t0
        progress(f"{submissions} committed in {committed_in:.1f}s; waiting for the last verdict")
        await pipeline.wait_done(s.pool, after, submissions, 600)
        judged_in = time.monotonic() - t0
        key = streams.stream_key(s.queue)
        deadline = time.monotonic() + 60
        while True:  # acks follow the verdicts in the background
            pending: Any = await s.redis.xpending(key, streams.GROUP)
            if (int(pending["pending"]) == 0 and await s.redis.xlen(key) == 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.6)  # one more sample once everything is empty
        stop.set()
        await sampler
        async with s.pool.acquire() as conn:
            span = await conn.fetchrow(
                "SELECT extract(epoch FROM max(finished_at) - min(created_at))::float8 AS judged,"
                " extract(epoch FROM max(created_at) - min(created_at))::float8 AS committed,"
                " count(*) AS n, count(*) FILTER (WHERE status = ANY($2::text[])) AS terminal,"
                " count(*) FILTER (WHERE status = 'SYSTEM_ERROR') AS system_errors"
                " FROM judgequeue.submissions WHERE id > $1",
                after,
                list(VERDICTS),
            )
            lat = await conn.fetch(
                "SELECT extract(epoch FROM finished_at - created_at)::float8 * 1000 AS ms"
                " FROM judgequeue.submissions WHERE id > $1",
                after,
            )
            outbox_left = await conn.fetchval(
                "SELECT count(*) FROM judgequeue.outbox WHERE state IN ('PENDING', 'CLAIMED')"
            )
        pending_end: Any = await s.redis.xpending(key, streams.GROUP)
        stream_end = int(await s.redis.xlen(key))
        memory = s.peak_memory()
    assert span is not None
    ms = [r["ms"] for r in lat]
    return {
        "submissions": submissions,
        "connections": connections,
        "processes": processes,
        "workers": workers,
        "commit_seconds": span["committed"],
        "commit_rate": submissions / span["committed"],
        "harness_commit_seconds": committed_in,
        "last_verdict_seconds": span["judged"],
        "harness_last_verdict_seconds": judged_in,
        "drain_rate": submissions / span["judged"],
        "p50_ms": pipeline.percentile(ms, 0.5),
        "p99_ms": pipeline.percentile(ms, 0.99),
        "max_ms": max(ms),
        "found": span["n"],
        "terminal": span["terminal"],
        "system_errors": span["system_errors"],
        "outbox_waiting_end": outbox_left,
        "stream_end": stream_end,
        "pel_end": int(pending_end["pending"]),
        "peak_rss_mb": memory,
        "samples": samples,
    }


def plot(r: dict[str, Any], path: Path) -> str | None:
    plt = headless_pyplot(progress)
    if plt is None:
        return None
    samples = r["samples"]
    ts = [x["t"] for x in samples]
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    a.plot(ts, [x["committed"] - x["judged"] for x in samples], label="backlog (committed, not judged)")
    a.plot(ts, [x["outbox"] for x in samples], label="outbox waiting")
    a.plot(ts, [x["stream"] for x in samples], label="stream length")
    a.plot(ts, [x["pel"] for x in samples], label="PEL")
    a.set_ylabel("jobs")
    a.legend(fontsize="small")
    a.grid(True, alpha=0.3)
    a.set_title(
        f"contest start: {r['submissions']:,} submissions, {r['connections']} connections, {r['workers']} workers"
    )
    rates_t, commits, verdicts = [], [], []
    for prev, cur in itertools.pairwise(samples):
        dt = cur["t"] - prev["t"]
        if dt > 0:
            rates_t.append(cur["t"])
            commits.append((cur["committed"] - prev["committed"]) / dt)
            verdicts.append((cur["judged"] - prev["judged"]) / dt)
    b.plot(rates_t, commits, label="commits/s")
    b.plot(rates_t, verdicts, label="verdicts/s")
    if r.get("peak"):
        b.axhline(r["peak"], color="grey", linestyle="--", label=f"steady-state peak {r['peak']:,.0f}/s")
    b.set_ylabel("per second")
    b.set_xlabel("seconds since the burst started")
    b.legend(fontsize="small")
    b.grid(True, alpha=0.3)
    return save(plt, fig, path)


def report(r: dict[str, Any]) -> str:
    peak = r.get("peak")
    ratio = f" = {r['drain_rate'] / peak:.0%} of the steady-state peak {peak:,.0f}/s (target >= 90%)" if peak else ""
    lost = r["found"] - r["terminal"]
    return "\n".join(
        [
            f"burst: {r['submissions']:,} submissions from {r['processes']} processes / {r['connections']} connections,"
            f" {r['workers']} worker(s), noop judge",
            f"all committed in {r['commit_seconds']:.1f}s ({r['commit_rate']:,.0f}/s);"
            f" last verdict {r['last_verdict_seconds']:.1f}s after the first commit",
            f"drain rate {r['drain_rate']:,.0f} verdicts/s{ratio}",
            f"commit->verdict during the burst: p50 {r['p50_ms']:,.0f} ms, p99 {r['p99_ms']:,.0f} ms,"
            f" max {r['max_ms']:,.0f} ms",
            f"nothing lost: {r['terminal']:,}/{r['submissions']:,} with a verdict ({lost} without,"
            f" {r['system_errors']} SYSTEM_ERROR); at the end outbox waiting {r['outbox_waiting_end']},"
            f" stream {r['stream_end']}, PEL {r['pel_end']}",
        ]
    )


async def inner(args: argparse.Namespace) -> int:
    peak = None
    if args.peak_jobs:
        progress(f"steady-state peak: {args.peak_jobs} jobs, {args.workers} worker(s), 1 submit per transaction,"
                 f" best of {args.peak_runs}")  # fmt: skip
        rates = [
            (await pipeline.end_to_end_throughput(args.workers, jobs=args.peak_jobs))["rate"]
            for _ in range(max(1, args.peak_runs))
        ]
        peak = max(rates)
        progress(f"peak {peak:,.0f} jobs/s (runs: {', '.join(f'{x:,.0f}' for x in rates)})")
    progress(f"burst of {args.submissions} from {args.processes} processes, {args.connections} connections")
    r = await burst(args.submissions, args.connections, args.processes, args.workers)
    r["peak"] = peak
    r["loadavg"] = os.getloadavg()
    print(report(r))
    png = plot(r, args.plots / "burst.png")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "burst.json").write_text(json.dumps(r))
    print(f"\nresults: {args.out / 'burst.json'}; plot: {png}")
    ok = r["terminal"] == r["submissions"] and r["pel_end"] == 0 and r["stream_end"] == 0
    return 0 if ok and r["outbox_waiting_end"] == 0 else 1


def parser() -> argparse.ArgumentParser:
    p = new_parser(__doc__)
    add_counts(p, submissions=100_000, connections=64, processes=4, workers=2)
    p.add_argument("--peak-jobs", type=int, default=10_000, help="jobs for the steady-state peak (0: skip)")
    p.add_argument("--peak-runs", type=int, default=3, help="runs of the peak; the best counts")
    return add_run_options(p, plots=True)


def main() -> int:
    return run_on_servers("bench.burst", parser(), inner)


if __name__ == "__main__":
    sys.exit(main())
