"""Verdict commit to webhook received, and the CPU a judged job costs with events on and off.

    .venv/bin/python -m bench.webhook_bench [--rates 200,1000] [--seconds 10] [--servers private|system]

For each offered rate, three runs on a fresh database each (dispatcher, 1 worker, reaper; noop
judge; default settings otherwise): *off* (the verdict-event trigger disabled), *events* (events
written, nobody delivering), *webhook* (events written and the reaper delivering every one to a
receiver in this process, whose own CPU is not counted).
Latency is the verdict's ``finished_at`` (database clock, the verdict transaction's start) to the
moment the receiver reads the POST (host clock; the same machine). CPU per job is the CPU seconds
of the role processes and of every Postgres process (private servers only: ``--servers private``)
over the run, divided by the jobs. Goals: p95 <= 100 ms; CPU on/off <= 1.1x.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from typing import Any

from aiohttp import web

from bench import pipeline, servers
from bench.cli import add_run_options, new_parser, reporter, run_on_servers

progress = reporter("webhook_bench")
SECRET = "bench-secret"


async def _receiver(received: dict[str, float], enough: asyncio.Event, want: list[int]) -> tuple[web.AppRunner, int]:
    async def hook(request: web.Request) -> web.Response:
        now = time.time()
        await request.read()
        received.setdefault(request.headers["Idempotency-Key"], now)
        if want and len(received) >= want[0]:
            enough.set()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = servers.free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


def _cpu(stack: pipeline.Stack) -> dict[str, float]:
    """CPU seconds so far of each role and of every Postgres process."""
    out = {role: sum(servers.cpu_seconds(p.pid) for p in procs if p.poll() is None)
           for role, procs in stack.procs.items()}  # fmt: skip
    postmaster = int(os.environ.get("BENCH_POSTMASTER_PID") or 0)
    out["postgres"] = servers.tree_cpu_seconds(postmaster) if postmaster else 0.0
    return out


#: The runs at each rate: the trigger off; events written (the feed's cost); events written and delivered.
MODES = ("off", "events", "webhook")


async def run(rate: float, seconds: float, *, mode: str) -> dict[str, Any]:
    events_on = mode == "webhook"
    received: dict[str, float] = {}
    enough, want = asyncio.Event(), list[int]()
    runner, port = await _receiver(received, enough, want)
    hooks = {"bench": {"url": f"http://127.0.0.1:{port}/hook", "secret": SECRET, "concurrency": 16}}
    try:
        async with pipeline.stack(concurrency="64") as s:
            if mode == "off":
                async with s.pool.acquire() as conn:
                    await conn.execute("ALTER TABLE judgequeue.submissions DISABLE TRIGGER submissions_verdict_event")
            s.start("dispatcher")
            s.start("worker")
            if events_on:
                s.start("reaper", webhooks=json.dumps(hooks))
            else:
                s.start("reaper")
            after = await pipeline.warm_up(s)
            await asyncio.sleep(1)  # the warm-up's deliveries out of the way of the measured ones
            cpu_before = _cpu(s)
            total = await pipeline._steady(s, rate, seconds, connections=1)
            await pipeline.wait_done(s.pool, after, total, 60)
            if events_on:
                want.append(after + total)  # the warm-up's and the run's, one key each
                if len(received) < want[0]:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(enough.wait(), 60)
            cpu_after = _cpu(s)
            cpu_by = {k: 1000 * (cpu_after[k] - cpu_before[k]) / total for k in cpu_after}
            cpu = sum(cpu_after.values()) - sum(cpu_before.values())
            async with s.pool.acquire() as conn:
                rows = await conn.fetch(
                    "SELECT id, extract(epoch FROM finished_at)::float8 AS done FROM judgequeue.submissions"
                    " WHERE id > $1", after)  # fmt: skip
    finally:
        await runner.cleanup()
    out: dict[str, Any] = {"rate": rate, "seconds": seconds, "mode": mode, "jobs": total,
                           "cpu_ms_per_job": 1000 * cpu / total, "cpu_ms_per_job_by": cpu_by}  # fmt: skip
    if events_on:
        lags = [1000 * (received[f"{s.queue}:{r['id']}:1"] - r["done"]) for r in rows
                if f"{s.queue}:{r['id']}:1" in received]  # fmt: skip
        out.update(delivered=len(lags), p50_ms=pipeline.percentile(lags, 0.5), p95_ms=pipeline.percentile(lags, 0.95),
                   max_ms=max(lags) if lags else None)  # fmt: skip
    return out


async def main(args: argparse.Namespace) -> int:
    results = []
    for rate in [float(r) for r in args.rates.split(",")]:
        for mode in args.modes.split(","):
            progress(f"{rate:g}/s, {mode}")
            result = await run(rate, args.seconds, mode=mode)
            progress(json.dumps(result))
            results.append(result)
    for rate in sorted({r["rate"] for r in results}):
        by = {r["mode"]: r for r in results if r["rate"] == rate}
        if set(by) != set(MODES):
            continue  # a partial run: its lines above say it all
        off, written, hooked = by["off"], by["events"], by["webhook"]
        base = off["cpu_ms_per_job"]
        print(
            f"{rate:g}/s: commit->webhook p50 {hooked['p50_ms']:.1f} ms, p95 {hooked['p95_ms']:.1f} ms (goal <= 100"
            f" ms), {hooked['delivered']}/{hooked['jobs']} delivered; CPU per job {base:.3f} ms without events,"
            f" {written['cpu_ms_per_job']:.3f} ms with events = {written['cpu_ms_per_job'] / base:.2f}x,"
            f" {hooked['cpu_ms_per_job']:.3f} ms with a webhook = {hooked['cpu_ms_per_job'] / base:.2f}x (goal <= 1.1x)"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "webhook_bench.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    parser = add_run_options(new_parser(__doc__))
    parser.add_argument("--rates", default="200,1000")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--modes", default=",".join(MODES), help="which runs (default: all of off,events,webhook)")
    sys.exit(run_on_servers("bench.webhook_bench", parser, main))
