"""Both worker intakes at fleet size: CPU per job, commit-to-start latency, NOTIFYs, statements and connections.

    .venv/bin/python -m bench.fleet [--workers 1,4,16,64] [--intakes stream,direct] [--judges noop,sleep]
                                    [--loads busy,idle] [--dispatchers 1,2,3,4] [--seconds 20] [--quick]
                                    [--max-connections 100] [--out bench/out/fleet] [--plots docs/img]

Decides the default ``JUDGEQUEUE_INTAKE`` by figures: ``stream`` (dispatcher -> Redis stream ->
worker) against ``direct`` (workers take outbox rows themselves; idle ones offer slots that submits
fill). Each cell is one ``bench.cpu`` window on the private servers (Postgres with
``pg_stat_statements.track=all``, Redis): a dispatcher (``--dispatchers`` at the largest fleet, for
stream), the workers at their default concurrency and pool, a reaper, all as processes, and an
application submitting at a paced rate over 8 connections. The cells:

* judges: ``noop`` (measures the queue) and ``sleep`` (``core/judges/builtin.py``; each payload asks
  for ``--sleep-ms``, so jobs hold slots as real ones do);
* loads: ``busy``, near but under what the fleet can carry (``--busy-rate`` for noop; for sleep
  half the fleet's slot capacity, ``workers x concurrency / sleep``, at most ``--busy-rate``), and
  ``idle``, a trickle (``--idle-rate``) where idle workers' polling and wake-ups show.

Per cell: CPU ms per judged job of the queue side (workers, dispatchers, reaper, their Postgres
backends, Redis) and, apart, Postgres's shared part (the application's backends, background
processes, exited backends) and the application; commit-to-start p50/p99; NOTIFYs per job
(``pg_notify`` calls, counted inside plpgsql too) and statements per job (top-level, and with the
nested ones); the most client connections held at once (in all and the workers' per worker);
jobs/s achieved. The application's 8 connections submit in turn (staggered), not in step, so a
few slots do not see bursts of 8.

The private cluster runs ``--max-connections`` (Postgres's default, 100, as a user would have): a
cell that runs out of connections reports that as its figure (its error and the connections held),
after its warm-up waits out 60 s. For the largest fleet's figures with room to spare, run it again
with e.g. ``--workers 64 --max-connections 400``.

Writes ``fleet.json`` to ``--out`` and ``fleet.png`` (CPU per job and p99 commit-to-start against
workers, one line per intake/judge) to ``--plots``, and prints the table (``fleet.json`` is
rewritten after every cell, so a stopped run keeps what it measured). The full matrix (4 fleet
sizes, 2 intakes, 2 judges, 2 loads, and the dispatcher sweep) is 38 cells: roughly 40 minutes, 15
with ``--quick`` (64-worker cells take a minute or two each: 64 processes start, and a cell out of
connections waits out its warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import cpu, plots
from bench.cli import add_run_options, new_parser, reporter, run_on_servers
from judgequeue.core.config import DispatcherSettings, WorkerSettings

progress = reporter("fleet")

#: The roles whose processes and backends are the queue side (``bench.cpu.Meter``'s names).
QUEUE_ROLES = ("worker", "dispatcher", "reaper")


@dataclass(frozen=True)
class Cell:
    """One measurement of the matrix."""

    intake: str
    judge: str
    load: str
    workers: int
    dispatchers: int
    rate: float

    @property
    def label(self) -> str:
        return f"{self.intake}/{self.judge}/{self.load} w={self.workers} d={self.dispatchers}"


def offered_rate(judge: str, load: str, workers: int, *, busy: float, idle: float, sleep_s: float) -> float:
    """The offered jobs/s of a cell (pure): ``idle`` for an idle load; for a busy one ``busy`` with the
    noop judge, and with the sleep judge half the fleet's slot capacity, at most ``busy``."""
    if load == "idle":
        return idle
    if judge == "sleep":
        return min(busy, 0.5 * workers * WorkerSettings().concurrency / sleep_s)
    return busy


def cells(
    workers: list[int],
    intakes: list[str],
    judges: list[str],
    loads: list[str],
    dispatchers: list[int],
    *,
    busy: float,
    idle: float,
    sleep_s: float,
) -> list[Cell]:
    """The matrix, in run order (pure): every fleet size x intake x judge x load with one dispatcher,
    then the stream intake at the largest fleet with each other dispatcher count (busy loads only:
    an idle trickle needs no more than one)."""
    out = []
    for w in sorted(workers):
        for judge in judges:
            for load in loads:
                rate = offered_rate(judge, load, w, busy=busy, idle=idle, sleep_s=sleep_s)
                out += [Cell(intake, judge, load, w, 1, rate) for intake in intakes]
    if "stream" in intakes and "busy" in loads:
        top = max(workers)
        for judge in judges:
            rate = offered_rate(judge, "busy", top, busy=busy, idle=idle, sleep_s=sleep_s)
            out += [Cell("stream", judge, "busy", top, d, rate) for d in sorted(dispatchers) if d != 1]
    return out


def summarise(cell: Cell, r: dict[str, Any]) -> dict[str, Any]:
    """The figures of one measured cell from ``bench.cpu.judgequeue_cpu``'s result (pure)."""
    per_job: dict[str, float] = r["cpu_ms_per_job"]
    roles = {role: per_job.get(role, 0.0) for role in QUEUE_ROLES}
    backends = sum(per_job.get(f"pg:{role}", 0.0) for role in QUEUE_ROLES)
    redis = per_job.get("redis", 0.0)
    queue = sum(roles.values()) + backends + redis
    statements = r.get("statements", [])
    conns = r.get("peak_connections", {})
    return {
        **asdict(cell),
        "jobs": r["jobs"],
        "achieved_per_s": r["achieved_per_s"],
        "cpu_ms_per_job": {
            **roles,
            "queue_backends": backends,
            "redis": redis,
            "queue": queue,
            "postgres_shared": per_job.get("postgres", 0.0) - backends,
            "application": per_job.get("application", 0.0),
        },
        "queue_cores": queue * r["jobs"] / 1000 / max(r["wall_s"], 1e-9),
        "start_p50_ms": r["commit_to_start_p50_ms"],
        "start_p99_ms": r["commit_to_start_p99_ms"],
        "notifies_per_job": sum(s["calls_per_job"] for s in statements if "pg_notify" in s["name"].lower()),
        "statements_per_job": sum(s["calls_per_job"] for s in statements if s["toplevel"]),
        "statements_per_job_nested": sum(s["calls_per_job"] for s in statements),
        "connections": conns,
        "connections_per_worker": conns.get("worker", 0) / cell.workers,
    }


def failed(cell: Cell, error: BaseException, peaks: cpu.ConnectionPeaks) -> dict[str, Any]:
    """A cell that did not finish: its error and the connections it held until then."""
    conns = {"total": peaks.total, **peaks.by_role, "max_connections": peaks.max_connections}
    return {
        **asdict(cell),
        "error": f"{type(error).__name__}: {error}"[:200],
        "connections": conns,
        "connections_per_worker": conns.get("worker", 0) / cell.workers,
    }


def table(rows: list[dict[str, Any]]) -> str:
    """One line per cell (pure): CPU per job by side, latency, NOTIFYs, statements, connections."""
    head = (
        f"{'intake':<7}{'judge':<6}{'load':<5}{'W':>3}{'D':>2}{'offer/s':>8}{'done/s':>8}"
        f"{'queue':>7}{'wkr':>7}{'disp':>6}{'pg(q)':>6}{'redis':>6}{'pg sh':>6}{'app':>6}{'cores':>6}"
        f"{'p50':>7}{'p99':>7}{'ntf/j':>6}{'st/j':>6}{'+nest':>6}{'conns':>6}{'/wkr':>5}"
    )
    lines = [
        head,
        "(CPU ms per judged job: queue = wkr + disp + reaper + pg(q) (their backends) + redis; pg sh = the"
        " application's backends and Postgres's own; cores = queue CPU / wall; p50/p99 commit-to-start ms)",
    ]
    for r in rows:
        conns = r["connections"]
        limit = conns.get("max_connections", 0)
        full = "!" if limit and conns.get("total", 0) >= limit else ""
        start = f"{r['intake']:<7}{r['judge']:<6}{r['load']:<5}{r['workers']:>3}{r['dispatchers']:>2}{r['rate']:>8.0f}"
        tail = f"{str(conns.get('total', 0)) + full:>6}{r['connections_per_worker']:>5.1f}"
        if "error" in r:
            lines.append(f"{start}  failed: {r['error'][:90]}{tail}")
            continue
        c = r["cpu_ms_per_job"]
        lines.append(
            f"{start}{r['achieved_per_s']:>8.0f}{c['queue']:>7.3f}{c['worker']:>7.3f}{c['dispatcher']:>6.3f}"
            f"{c['queue_backends']:>6.3f}{c['redis']:>6.3f}{c['postgres_shared']:>6.3f}{c['application']:>6.3f}"
            f"{r['queue_cores']:>6.2f}{r['start_p50_ms']:>7.1f}{r['start_p99_ms']:>7.1f}{r['notifies_per_job']:>6.2f}"
            f"{r['statements_per_job']:>6.2f}{r['statements_per_job_nested']:>6.2f}{tail}"
        )
    lines.append("conns: most client backends at once in the cluster (! = max_connections reached); /wkr: the workers'")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> str | None:
    """CPU per job (queue side) and p99 commit-to-start against workers, one line per intake/judge,
    a row of panels per load (one-dispatcher cells that finished)."""
    plt = plots.headless_pyplot(progress)
    if plt is None:
        return None
    ok = [r for r in rows if "error" not in r and r["dispatchers"] == 1]
    loads = sorted({r["load"] for r in ok})
    if not loads:
        return None
    fig, axes = plt.subplots(len(loads), 2, figsize=(11, 3.6 * len(loads)), squeeze=False)
    for i, load in enumerate(loads):
        for intake, judge in sorted({(r["intake"], r["judge"]) for r in ok if r["load"] == load}):
            line = sorted((r for r in ok if (r["load"], r["intake"], r["judge"]) == (load, intake, judge)),
                          key=lambda r: r["workers"])  # fmt: skip
            xs = [r["workers"] for r in line]
            style = "-" if intake == "stream" else "--"
            axes[i][0].plot(
                xs, [r["cpu_ms_per_job"]["queue"] for r in line], style, marker="o", label=f"{intake}/{judge}"
            )
            axes[i][1].plot(xs, [r["start_p99_ms"] for r in line], style, marker="o", label=f"{intake}/{judge}")
        sizes = sorted({r["workers"] for r in ok})
        for ax, what in zip(axes[i], ("queue-side CPU ms per job", "p99 commit-to-start, ms"), strict=True):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sizes, [str(n) for n in sizes])  # the fleet sizes measured, not powers of two
            ax.set_ylim(bottom=0)
            ax.set_xlabel("worker processes")
            ax.set_title(f"{what} ({load})")
            ax.legend(fontsize=8)
    return plots.save(plt, fig, path)


async def inner(args: argparse.Namespace) -> int:
    seconds = args.seconds if args.seconds is not None else (6.0 if args.quick else 20.0)
    warm_up = 500 if args.quick else cpu.WARM_UP_JOBS
    matrix = cells(
        [int(x) for x in args.workers.split(",")], args.intakes.split(","), args.judges.split(","),
        args.loads.split(","), [int(x) for x in args.dispatchers.split(",")],
        busy=args.busy_rate, idle=args.idle_rate, sleep_s=args.sleep_ms / 1000,
    )  # fmt: skip
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_start": load,
        "seconds": seconds,
        "sleep_ms": args.sleep_ms,
        "max_connections": args.max_connections,
        "concurrency": WorkerSettings().concurrency,
        "batch_size": DispatcherSettings().batch_size,
        "cells": [],
    }
    # The roles' own defaults (bench.pipeline.stack sets a larger concurrency and batch for its limits).
    concurrency, batch_size = str(WorkerSettings().concurrency), str(DispatcherSettings().batch_size)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    for k, cell in enumerate(matrix, 1):
        progress(f"cell {k}/{len(matrix)}: {cell.label}, {cell.rate:g} jobs/s for {seconds:g}s")
        peaks = cpu.ConnectionPeaks()
        try:
            r = await cpu.judgequeue_cpu(
                cell.rate, seconds, cell.workers, dispatchers=cell.dispatchers, warm_up_jobs=warm_up,
                payload={"seconds": args.sleep_ms / 1000} if cell.judge == "sleep" else {},
                connections=peaks, intake=cell.intake, judge=cell.judge, concurrency=concurrency,
                batch_size=batch_size, stagger=True,
            )  # fmt: skip
            row = summarise(cell, r)
        except Exception as exc:  # a cell that fails (out of connections, stalled) is a figure too
            progress(f"cell {cell.label} failed: {exc!r}")
            row = failed(cell, exc, peaks)
        results["cells"].append(row)
        (args.out / "fleet.json").write_text(json.dumps(results, indent=1))  # what a stopped run has so far
        print(table([row]).splitlines()[-2], flush=True)
    results["duration_s"] = time.monotonic() - t0
    results["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(table(results["cells"]))
    print(
        f"\n{len(matrix)} cells in {results['duration_s']:.0f} s; {seconds:g} s windows;"
        f" sleep judge {args.sleep_ms:g} ms; batch {batch_size};"
        f" concurrency {results['concurrency']}; Postgres max_connections {args.max_connections};"
        f" load average {results['loadavg_start']} -> {results['loadavg_end']}"
    )
    (args.out / "fleet.json").write_text(json.dumps(results, indent=1))
    png = plot(results["cells"], args.plots / "fleet.png")
    print(f"results: {args.out / 'fleet.json'}" + (f"; plot: {png}" if png else ""))
    return 0


def parser() -> argparse.ArgumentParser:
    p = new_parser(__doc__)
    p.add_argument("--workers", default="1,4,16,64", help="worker process counts")
    p.add_argument("--intakes", default="stream,direct")
    p.add_argument("--judges", default="noop,sleep")
    p.add_argument("--loads", default="busy,idle")
    p.add_argument("--dispatchers", default="1,2,3,4", help="dispatcher sweep (stream, busy, largest fleet)")
    p.add_argument("--seconds", type=float, default=None, help="length of each window (default 20, 6 with --quick)")
    p.add_argument("--quick", action="store_true", help="6 s windows and a 500-job warm-up")
    p.add_argument("--busy-rate", type=float, default=1000.0, help="offered jobs/s of a busy cell (noop)")
    p.add_argument("--idle-rate", type=float, default=20.0, help="offered jobs/s of an idle cell")
    p.add_argument("--sleep-ms", type=float, default=50.0, help="how long each sleep-judge job sleeps")
    p.add_argument("--max-connections", type=int, default=100, help="the private Postgres's (its default: 100)")
    return add_run_options(p, plots=True, out="bench/out/fleet")


def main() -> int:
    return run_on_servers("bench.fleet", parser(), inner)


if __name__ == "__main__":
    sys.exit(main())
