"""The CPU a judged job costs with live progress events on and off.

    .venv/bin/python -m bench.progress_bench [--rate 100] [--seconds 10] [--job-seconds 1] [--tests 20]
                                             [--interval 1s] [--rounds 1]

Two runs on a fresh database each (dispatcher, 1 worker, reaper; default settings otherwise, so a
progress interval of 1 s): *off* and *progress* (``JUDGEQUEUE_PROGRESS=on``). Every job is the
sleep judge's ``{"seconds": S, "tests": N}``: N tests in S seconds, each reported started and
finished as a program judge reports them, with no CPU of its own, so the figure is what reporting
costs the queue, not the judging (against a real judge's work per test it is far smaller). The
offered rate keeps rate x S jobs judging at once. CPU per job is the CPU seconds of the role
processes and of every Postgres process (private servers only: ``--servers private``) over the run,
divided by the jobs. Goal: progress/off <= 1.1x.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bench import pipeline
from bench.cli import add_run_options, new_parser, reporter, run_on_servers
from bench.webhook_bench import _cpu
from judgequeue.core.store import outbox

progress = reporter("progress_bench")
MODES = ("off", "progress")


async def _offer(s: pipeline.Stack, rate: float, seconds: float, payload: dict[str, Any]) -> int:
    """Offer ``rate`` submits/s for ``seconds`` on one connection (each its own transaction)."""
    return await pipeline.offer_paced(s, rate, seconds, lambda conn: outbox.submit(conn, s.queue, payload))


async def run(rate: float, seconds: float, job: dict[str, Any], *, mode: str, interval: str | None) -> dict[str, Any]:
    settings = {"judge": "sleep", **({"progress": "on"} if mode == "progress" else {})}
    if interval is not None and mode == "progress":
        settings["progress_interval"] = interval
    async with pipeline.stack(**settings) as s:
        s.start("dispatcher")
        s.start("worker")
        s.start("reaper")
        after = await pipeline.warm_up(s)
        cpu_before = _cpu(s)
        total = await _offer(s, rate, seconds, job)
        await pipeline.wait_done(s.pool, after, total, 120)
        cpu_after = _cpu(s)
        async with s.pool.acquire() as conn:
            rows = await conn.fetchval(
                "SELECT count(*) FROM judgequeue.verdict_events WHERE kind = 'progress' AND submission_id > $1", after
            )
    cpu = sum(cpu_after.values()) - sum(cpu_before.values())
    return {
        "mode": mode, "rate": rate, "seconds": seconds, "job": job, "jobs": total,
        "progress_rows_per_job": rows / total, "cpu_ms_per_job": 1000 * cpu / total,
        "cpu_ms_per_job_by": {k: 1000 * (cpu_after[k] - cpu_before[k]) / total for k in cpu_after},
    }  # fmt: skip


async def main(args: argparse.Namespace) -> int:
    job = {"seconds": args.job_seconds, "tests": args.tests}
    results: dict[str, dict[str, Any]] = {}
    for _ in range(args.rounds):
        for mode in MODES:
            progress(f"{args.rate:g}/s, {mode}, job {json.dumps(job)}")
            result = await run(args.rate, args.seconds, job, mode=mode, interval=args.interval)
            progress(json.dumps(result))
            best = results.get(mode)
            # The least CPU of the rounds: the busy shared machine only ever adds.
            if best is None or result["cpu_ms_per_job"] < best["cpu_ms_per_job"]:
                results[mode] = result
    off, on = results["off"], results["progress"]
    ratio = on["cpu_ms_per_job"] / off["cpu_ms_per_job"]
    print(
        f"{args.rate:g}/s, {args.tests} tests in {args.job_seconds:g}s per job, interval {args.interval or '1s'}:"
        f" CPU per job {off['cpu_ms_per_job']:.3f} ms without progress,"
        f" {on['cpu_ms_per_job']:.3f} ms with progress ({on['progress_rows_per_job']:.1f} rows per job)"
        f" = {ratio:.2f}x (goal <= 1.1x)"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "progress_bench.json").write_text(json.dumps(list(results.values()), indent=2))
    return 0


if __name__ == "__main__":
    parser = add_run_options(new_parser(__doc__))
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--job-seconds", type=float, default=1.0)
    parser.add_argument("--tests", type=int, default=20)
    parser.add_argument("--interval", default=None, help="JUDGEQUEUE_PROGRESS_INTERVAL (default: the role's, 1s)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each mode; the least CPU of each is kept")
    sys.exit(run_on_servers("bench.progress_bench", parser, main))
