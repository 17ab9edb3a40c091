"""End to end against the machine's limit: jobs/s from the first submit to the last verdict.

    .venv/bin/python -m bench.e2e [--jobs 10000] [--workers 1,2] [--skip-peer] [--submit-alone] [--intake stream|direct]

In one run: pgbench's raw two-insert transaction (8 clients: the limit judgequeue is measured against), then for each
worker count judgequeue (dispatcher, workers and a reaper as processes, noop judge, ``--jobs``
submitted one per transaction from 2 application processes over 8 connections; best of two) and
PgQueuer on the same workload. Prints each rate and its share of the limit (target >= 65%).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bench import cpu, peer, pipeline
from bench.cli import add_run_options, new_parser, reporter, run_on_servers

progress = reporter("e2e")


async def end_to_end(jobs: int, workers: list[int], *, with_peer: bool = True) -> dict[str, Any]:
    """Best of two runs per worker count, judgequeue then (``with_peer``) PgQueuer."""
    ours, theirs = [], []
    for w in workers:
        runs = []
        for k in range(2):
            progress(f"judgequeue, {w} worker(s), run {k + 1}/2")
            runs.append(await pipeline.end_to_end_throughput(w, jobs=jobs))
        ours.append(max(runs, key=lambda x: float(x["rate"])))
        if not with_peer:
            continue
        runs = []
        for k in range(2):
            progress(f"PgQueuer, {w} worker(s), run {k + 1}/2")
            runs.append(await peer.peer_throughput(jobs=jobs, submitters=8, workers=w))
        best = max(runs, key=lambda x: float(x["jobs_per_s"]))
        theirs.append({"workers": w, "rate": best["jobs_per_s"]})
    return {"judgequeue": ours, "pgqueuer": theirs}


def report(e2e: dict[str, Any], limit: float) -> str:
    lines = []
    theirs = {x["workers"]: x["rate"] for x in e2e["pgqueuer"]}
    for ours in e2e["judgequeue"]:
        peer_rate = theirs.get(ours["workers"])
        lines.append(
            f"{ours['workers']} worker(s): judgequeue {ours['rate']:,.0f} jobs/s"
            f" = {ours['rate'] / limit:.0%} of pgbench two-insert {limit:,.0f} tx/s (target >= 65%)"
            + (f"; PgQueuer {peer_rate:,.0f} jobs/s" if peer_rate is not None else "")
        )
        if "paths" in ours:
            paths = ", ".join(f"{name} {count:,}" for name, count in ours["paths"].items())
            lines.append(f"  submitted in {ours['submit_s']:.2f} s; reached the worker by {paths}")
    return "\n".join(lines)


async def inner(args: argparse.Namespace) -> int:
    progress("limit: pgbench two-insert")
    limit = (await cpu.limits(args.limit_seconds))["pgbench_two_insert_tps"]
    e2e = await end_to_end(args.jobs, [int(w) for w in args.workers.split(",")], with_peer=not args.skip_peer)
    print(f"judgequeue intake: {args.intake}")
    print(report(e2e, limit))
    if args.submit_alone:
        progress("the submits alone, no role running")
        alone = await pipeline.submit_throughput(args.jobs)
        print(f"submits alone (no role running): {alone:,.0f}/s = {alone / limit:.0%} of pgbench two-insert")
    return 0


def parser() -> argparse.ArgumentParser:
    p = new_parser(__doc__)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--limit-seconds", type=int, default=8, help="pgbench run length")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--submit-alone", action="store_true", help="also the submit side's rate with no role running")
    return add_run_options(p)


def main() -> int:
    return run_on_servers("bench.e2e", parser(), inner)


if __name__ == "__main__":
    sys.exit(main())
