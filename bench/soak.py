"""Soak: a steady load for a long time with retention pruning, checking that nothing grows and nothing slows.

    .venv/bin/python -m bench.soak [--minutes 30] [--rate R | --peak-fraction 0.5] [--retention 60s]
                                   [--window-minutes 5] [--servers private|system] [--plots docs/img]

Dispatcher, worker(s) and reaper run as real processes with the noop judge and a short retention
(so the reaper prunes terminal outbox rows and submissions all along); one application process
offers ``--rate`` submits/s (default: ``--peak-fraction`` of the end-to-end peak measured first, in
the same run). Every ``--sample-seconds`` the harness records the verdicts finished since the
last sample (commit-to-verdict, database clock), the size (table + indexes + TOAST), live rows
and ``n_dead_tup`` of every ``judgequeue.*`` table, Redis ``used_memory``, stream length and PEL,
the outbox backlog, and every role's RSS. The checks (:func:`check`):

* commit-to-verdict p99 over the last window <= 1.5x the first window's (plus a small absolute
  floor, ``--latency-floor-ms``: at a few ms one scheduler hiccup on a shared machine is 1.5x);
* live rows of every table over the last window <= 1.5x their maximum over the first half of the
  run (without pruning they grow linearly and this fails);
* table + index bytes likewise, within ``--size-ratio`` (autovacuum must reclaim what is pruned;
  the CI run uses a looser ratio as it may see a single autovacuum pass);
* Redis memory, stream length and PEL likewise (with a 4 MB / 1,000-entry floor);
* every role's RSS at the end <= 1.1x its RSS at the end of the first window.

Prints the figures and checks, writes ``soak.json`` to ``--out`` and ``soak.png`` to ``--plots``.
The CI version is ``tests/process/test_soak.py`` (2 minutes, windows of 20 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import pipeline, servers
from bench.cli import add_run_options, new_parser, reporter, run_on_servers
from bench.cpu import paced_submit
from bench.plots import headless_pyplot, save
from judgequeue.core.transport import streams

TABLES_SQL = """
SELECT c.relname AS name, pg_total_relation_size(c.oid) AS bytes,
       coalesce(s.n_live_tup, 0) AS live, coalesce(s.n_dead_tup, 0) AS dead
  FROM pg_class c
  LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE c.relnamespace = 'judgequeue'::regnamespace AND c.relkind = 'r'
"""
ROWS_SQL = (
    "SELECT (SELECT count(*) FROM judgequeue.submissions) AS submissions,"
    " (SELECT count(*) FROM judgequeue.outbox) AS outbox,"
    " (SELECT count(*) FROM judgequeue.outbox WHERE state IN ('PENDING', 'CLAIMED')) AS backlog"
)
FINISHED_SQL = (
    "SELECT id, extract(epoch FROM finished_at)::float8 AS f,"
    " extract(epoch FROM finished_at - created_at)::float8 * 1000 AS ms"
    " FROM judgequeue.submissions"
    " WHERE queue = $1 AND finished_at IS NOT NULL AND finished_at > to_timestamp($2) AND id > $3"
)


progress = reporter("soak")


@dataclass
class Sample:
    t: float  # seconds since the load started
    bytes: dict[str, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)  # exact counts of the busy tables
    dead: dict[str, int] = field(default_factory=dict)  # n_dead_tup
    redis_memory: int = 0
    stream_length: int = 0
    pel: int = 0
    backlog: int = 0
    rss_mb: dict[str, float] = field(default_factory=dict)
    finished: int = 0  # verdicts in this sample
    p50_ms: float = 0.0
    p99_ms: float = 0.0


@dataclass
class Check:
    name: str
    value: float
    bound: float
    ok: bool


def window(samples: list[Sample], start: float, end: float) -> list[Sample]:
    """Samples with ``start <= t < end`` (pure)."""
    return [s for s in samples if start <= s.t < end]


def _bounded(name: str, early: float, late: float, ratio: float, floor: float) -> Check:
    bound = max(early * ratio, early + floor)
    return Check(name, late, bound, late <= bound)


def _per_table(
    half: list[Sample],
    tail: list[Sample],
    of: Callable[[Sample], dict[str, int]],
    name: str,
    ratio: float,
    floor: float,
) -> list[Check]:
    """Bound each table's peak in ``tail`` by its peak in ``half``; ``name`` is formatted with the table."""
    return [
        _bounded(
            name.format(table),
            max(of(s).get(table, 0) for s in half),
            max(of(s).get(table, 0) for s in tail),
            ratio,
            floor,
        )
        for table in sorted(of(tail[-1]))
    ]


def check(
    samples: list[Sample],
    latencies: list[tuple[float, float]],
    *,
    duration: float,
    window_s: float,
    latency_ratio: float = 1.5,
    latency_floor_ms: float = 5.0,
    size_ratio: float = 1.5,
    rss_ratio: float = 1.1,
) -> list[Check]:
    """The soak's bounds (pure): ``latencies`` are (seconds since start, commit-to-verdict ms)."""
    checks: list[Check] = []
    first = sorted(ms for t, ms in latencies if t < window_s)
    last = sorted(ms for t, ms in latencies if t >= duration - window_s)
    p99_first = pipeline.percentile(first, 0.99)
    p99_last = pipeline.percentile(last, 0.99)
    checks.append(
        _bounded("commit->verdict p99 last/first window (ms)", p99_first, p99_last, latency_ratio, latency_floor_ms)
    )
    checks.append(Check("verdicts in first / last window", len(first), len(last), bool(first) and bool(last)))
    half = window(samples, 0, duration / 2)
    tail = window(samples, duration - window_s, duration + 1e9)
    if not half or not tail:
        return [*checks, Check("samples in first half and last window", len(half), len(tail), False)]
    checks += _per_table(half, tail, lambda s: s.rows, "rows judgequeue.{}", 1.5, 100)
    checks += _per_table(half, tail, lambda s: s.bytes, "bytes judgequeue.{} (table+indexes)", size_ratio, 256 * 1024)
    checks.append(
        _bounded(
            "redis used_memory",
            max(s.redis_memory for s in half),
            max(s.redis_memory for s in tail),
            1.5,
            4 * 1024 * 1024,
        )
    )
    checks.append(
        _bounded("stream length", max(s.stream_length for s in half), max(s.stream_length for s in tail), 1.5, 1000)
    )
    checks.append(_bounded("PEL", max(s.pel for s in half), max(s.pel for s in tail), 1.5, 1000))
    base = window(samples, 0, window_s) or samples[:1]
    for role in sorted(tail[-1].rss_mb):
        early = base[-1].rss_mb.get(role, 0.0)
        late = tail[-1].rss_mb[role]
        checks.append(
            Check(f"RSS {role} (MB), end vs end of first window", late, early * rss_ratio, late <= early * rss_ratio)
        )
    return checks


async def _sample(s: pipeline.Stack, t0: float) -> Sample:
    sample = Sample(t=time.monotonic() - t0)
    async with s.pool.acquire() as conn:
        for r in await conn.fetch(TABLES_SQL):
            sample.bytes[r["name"]] = r["bytes"]
            sample.dead[r["name"]] = r["dead"]
        counts = await conn.fetchrow(ROWS_SQL)
    assert counts is not None
    sample.rows = {"submissions": counts["submissions"], "outbox": counts["outbox"]}
    sample.backlog = counts["backlog"]
    info: Any = await s.redis.info("memory")
    sample.redis_memory = int(info["used_memory"])
    key = streams.stream_key(s.queue)
    sample.stream_length = int(await s.redis.xlen(key))
    pending: Any = await s.redis.xpending(key, streams.GROUP)
    sample.pel = int(pending["pending"])
    for role, procs in s.procs.items():
        for i, p in enumerate(procs):
            sample.rss_mb[f"{role}{i if len(procs) > 1 else ''}"] = servers.rss_mb(p.pid)
    return sample


async def run_soak(
    *,
    seconds: float,
    rate: float,
    retention: str,
    workers: int = 1,
    reaper_interval: str = "1s",
    sample_every: float = 5.0,
) -> dict[str, Any]:
    """Run the soak; returns samples, latencies (seconds since start, ms) and the setup."""
    settings = {"retention": retention, "reaper_interval": reaper_interval}
    async with pipeline.stack(**settings) as s:
        s.start("dispatcher")
        s.start("worker", workers)
        s.start("reaper")
        after = await pipeline.warm_up(s)
        samples: list[Sample] = []
        latencies: list[tuple[float, float]] = []
        seen: dict[int, float] = {}
        async with s.pool.acquire() as conn:
            since = float(await conn.fetchval("SELECT extract(epoch FROM now())::float8"))
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        wall0 = time.time()
        with ProcessPoolExecutor(1) as ex:
            app = loop.run_in_executor(ex, paced_submit, "judgequeue", s.dsn, s.queue, rate, seconds, 8)
            next_at = t0
            while True:
                next_at += sample_every
                done = app.done()
                async with s.pool.acquire() as conn:
                    rows = await conn.fetch(FINISHED_SQL, s.queue, since - 2.0, after)
                fresh = [r for r in rows if r["id"] not in seen]
                for r in fresh:
                    seen[r["id"]] = r["f"]
                    latencies.append((r["f"] - wall0, r["ms"]))
                if rows:
                    since = max(since, max(r["f"] for r in rows))
                for sid in [k for k, f in seen.items() if f < since - 4.0]:
                    del seen[sid]
                sample = await _sample(s, t0)
                ms = sorted(r["ms"] for r in fresh)
                sample.finished = len(ms)
                sample.p50_ms = pipeline.percentile(ms, 0.5)
                sample.p99_ms = pipeline.percentile(ms, 0.99)
                samples.append(sample)
                if len(samples) % max(1, int(60 / sample_every)) == 0:
                    progress(
                        f"t={sample.t:.0f}s verdicts/s={sample.finished / sample_every:.0f} p99={sample.p99_ms:.1f}ms "
                        f"submissions={sample.rows['submissions']} backlog={sample.backlog} "
                        f"redis={sample.redis_memory / 1e6:.1f}MB"
                    )
                if done:
                    break
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))  # the sampling period
            submitted = await app
    return {
        "seconds": seconds,
        "rate": rate,
        "retention": retention,
        "workers": workers,
        "sample_every": sample_every,
        "submitted": submitted["jobs"],
        "samples": [asdict(x) for x in samples],
        "latencies": latencies,
        "_samples": samples,
    }


def plot(result: dict[str, Any], path: Path, title: str) -> str | None:
    plt = headless_pyplot(progress)
    if plt is None:
        return None
    samples: list[Sample] = result["_samples"]
    ts = [s.t / 60 for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    ax = axes[0]
    ax.plot(ts, [s.p50_ms for s in samples], label="p50")
    ax.plot(ts, [s.p99_ms for s in samples], label="p99")
    ax.set_ylabel("commit->verdict (ms)")
    ax.set_yscale("log")
    ax.legend()
    ax.grid(True, alpha=0.3)
    ax.set_title(title)
    ax = axes[1]
    for table in sorted(samples[-1].bytes):
        if max(s.bytes.get(table, 0) for s in samples) > 64 * 1024:
            ax.plot(ts, [s.bytes.get(table, 0) / 1e6 for s in samples], label=f"judgequeue.{table}")
    ax.plot(ts, [s.redis_memory / 1e6 for s in samples], label="redis used_memory", linestyle="--")
    ax.set_ylabel("MB (table + indexes)")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    ax = axes[2]
    ax.plot(ts, [s.rows.get("submissions", 0) for s in samples], label="submissions rows")
    ax.plot(ts, [s.dead.get("submissions", 0) for s in samples], label="submissions n_dead_tup")
    ax.plot(ts, [s.dead.get("outbox", 0) for s in samples], label="outbox n_dead_tup")
    ax.plot(ts, [s.backlog for s in samples], label="outbox backlog")
    ax.set_ylabel("rows")
    ax.set_xlabel("minutes")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    return save(plt, fig, path)


def report(result: dict[str, Any], checks: list[Check]) -> str:
    samples: list[Sample] = result["_samples"]
    last = samples[-1]
    lines = [
        f"soak: {result['seconds'] / 60:g} min at {result['rate']:.0f} jobs/s offered, retention {result['retention']},"
        f" {result['workers']} worker(s); {result['submitted']} submitted, {len(result['latencies'])} verdicts sampled",
        "n_dead_tup at the end: " + ", ".join(f"{k} {v}" for k, v in sorted(last.dead.items()) if v),
        "max n_dead_tup: " + ", ".join(f"{k} {max(s.dead.get(k, 0) for s in samples)}" for k in sorted(last.dead)),
        "",
        f"{'check':<58}{'value':>14}{'bound':>14}  ok",
    ]
    for c in checks:
        lines.append(f"{c.name:<58}{c.value:>14,.1f}{c.bound:>14,.1f}  {'ok' if c.ok else 'FAIL'}")
    return "\n".join(lines)


async def inner(args: argparse.Namespace) -> int:
    rate = args.rate
    peak = None
    if rate is None:
        progress("measuring the end-to-end peak (1 worker, 5,000 jobs, 1 submit per transaction)")
        peak = (await pipeline.end_to_end_throughput(args.workers, jobs=5000))["rate"]
        rate = args.peak_fraction * peak
        progress(f"peak {peak:,.0f} jobs/s: offering {rate:,.0f} jobs/s")
    seconds = args.minutes * 60
    window_s = args.window_minutes * 60
    result = await run_soak(
        seconds=seconds,
        rate=rate,
        retention=args.retention,
        workers=args.workers,
        reaper_interval=args.reaper_interval,
        sample_every=args.sample_seconds,
    )
    result["peak"] = peak
    checks = check(
        result["_samples"],
        result["latencies"],
        duration=seconds,
        window_s=window_s,
        latency_floor_ms=args.latency_floor_ms,
        size_ratio=args.size_ratio,
    )
    print(report(result, checks))
    args.out.mkdir(parents=True, exist_ok=True)
    png = plot(
        result, args.plots / "soak.png", f"soak: {args.minutes:g} min at {rate:.0f} jobs/s, retention {args.retention}"
    )
    out = {k: v for k, v in result.items() if not k.startswith("_")}
    out["checks"] = [asdict(c) for c in checks]
    out["loadavg"] = os.getloadavg()
    (args.out / "soak.json").write_text(json.dumps(out))
    print(f"\nresults: {args.out / 'soak.json'}; plot: {png}")
    return 0 if all(c.ok for c in checks) else 1


def parser() -> argparse.ArgumentParser:
    p = new_parser(__doc__)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--window-minutes", type=float, default=5.0)
    p.add_argument("--rate", type=float, help="offered jobs/s (default: --peak-fraction of the measured peak)")
    p.add_argument("--peak-fraction", type=float, default=0.5)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--retention", default="60s", help="the reaper's retention (JUDGEQUEUE_RETENTION)")
    p.add_argument("--reaper-interval", default="5s")
    p.add_argument("--sample-seconds", type=float, default=10.0)
    p.add_argument("--latency-floor-ms", type=float, default=5.0)
    p.add_argument("--size-ratio", type=float, default=1.5)
    return add_run_options(p, plots=True)


def main() -> int:
    return run_on_servers("bench.soak", parser(), inner)


if __name__ == "__main__":
    sys.exit(main())
