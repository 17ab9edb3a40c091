"""Commit-to-start latency against PgQueuer in alternating pairs, at several offered rates.

    .venv/bin/python -m bench.latency [--rates 200,1000] [--pairs 5] [--seconds 10] [--servers private|system]

Each pair runs judgequeue (``bench.pipeline.end_to_end_latency``: dispatcher, 1 worker, reaper,
noop judge) and then PgQueuer (``bench.peer.peer_latency``: 1 worker process) with the same offered
load over one application connection, so a noisy moment on a shared machine hits one pair, not one
system. Commit-to-start is the peer's own measure: the row's ``created_at``/``created`` (database
clock, the enqueue transaction's start) to the moment the job's code runs (host clock). Target:
judgequeue's p50 and p99 each <= 0.8x PgQueuer's in at least 4 of 5 pairs, at each rate.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bench import pipeline
from bench.cli import add_run_options, new_parser, reporter, run_on_servers

progress = reporter("latency")


async def pairs(rate: float, count: int, seconds: float) -> list[dict[str, Any]]:
    from bench import peer

    out = []
    for k in range(count):
        progress(f"{rate:g}/s pair {k + 1}/{count}: judgequeue")
        ours = await pipeline.end_to_end_latency(rate, seconds)
        progress(f"{rate:g}/s pair {k + 1}/{count}: PgQueuer")
        theirs = await peer.peer_latency(rate=rate, seconds=seconds, workers=1)
        out.append(
            {
                "rate": rate,
                "judgequeue_p50_ms": ours["start_p50_ms"],
                "judgequeue_p99_ms": ours["start_p99_ms"],
                "judgequeue_verdict_p50_ms": ours["p50_ms"],
                "judgequeue_verdict_p99_ms": ours["p99_ms"],
                "judgequeue_filled_share": ours["filled_share"],
                "pgqueuer_p50_ms": theirs["p50_ms"],
                "pgqueuer_p99_ms": theirs["p99_ms"],
                "pgqueuer_achieved_per_s": theirs["achieved_per_s"],
            }
        )
    return out


def met(p: dict[str, Any], factor: float = 0.8) -> bool:
    """Both percentiles at or under ``factor`` times the peer's (pure)."""
    return bool(
        p["judgequeue_p50_ms"] <= factor * p["pgqueuer_p50_ms"]
        and p["judgequeue_p99_ms"] <= factor * p["pgqueuer_p99_ms"]
    )


def table(results: list[dict[str, Any]]) -> str:
    head = f"{'rate':>6} {'pair':>4}  {'jq p50':>8} {'peer p50':>8} {'ratio':>6}"
    lines = [head + f"  {'jq p99':>8} {'peer p99':>8} {'ratio':>6}  <=0.8x  offers"]
    for rate in sorted({p["rate"] for p in results}):
        these = [p for p in results if p["rate"] == rate]
        for i, p in enumerate(these, 1):
            lines.append(
                f"{rate:>6.0f} {i:>4}  {p['judgequeue_p50_ms']:>8.2f} {p['pgqueuer_p50_ms']:>8.2f}"
                f" {p['judgequeue_p50_ms'] / p['pgqueuer_p50_ms']:>6.2f}  {p['judgequeue_p99_ms']:>8.2f}"
                f" {p['pgqueuer_p99_ms']:>8.2f} {p['judgequeue_p99_ms'] / p['pgqueuer_p99_ms']:>6.2f}"
                f"  {'yes' if met(p) else 'no':<6}  {p.get('judgequeue_filled_share', 0):.0%}"
            )
        wins = sum(met(p) for p in these)
        lines.append(f"{rate:>6.0f}: {wins} of {len(these)} pairs with p50 and p99 <= 0.8x PgQueuer (target >= 4 of 5)")
    return "\n".join(lines)


async def inner(args: argparse.Namespace) -> int:
    results: list[dict[str, Any]] = []
    for rate in (float(x) for x in args.rates.split(",")):
        results += await pairs(rate, args.pairs, args.seconds)
    print(f"judgequeue intake: {args.intake}")
    print(table(results))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latency_pairs.json").write_text(json.dumps(results, indent=1))
    return 0


def parser() -> argparse.ArgumentParser:
    p = new_parser(__doc__)
    p.add_argument("--rates", default="200,1000")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--seconds", type=float, default=10.0)
    return add_run_options(p)


def main() -> int:
    return run_on_servers("bench.latency", parser(), inner)


if __name__ == "__main__":
    sys.exit(main())
