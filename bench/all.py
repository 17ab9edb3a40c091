"""Every performance figure from one command, on one pair of private servers, with plots.

    .venv/bin/python -m bench.all [--quick] [--ref main] [--soak-minutes 0] [--out bench/out/all] [--plots docs/img]

In order, each beside the machine's limits and the peer measured in the same run:

1. CPU per judged job (``bench.cpu``): pgbench two-insert and redis-benchmark XADD limits;
   judgequeue at ``--rate`` (and ``--ref``'s roles, alternating, when given); PgQueuer;
2. end to end against the limit: ``--jobs`` submitted one per transaction (2 processes, 8
   connections), noop judge, 1 and 2 workers, best of two each, against pgbench two-insert
   measured again right before (target >= 65%), and PgQueuer's end to end on the same workload;
3. commit-to-start latency pairs against PgQueuer (``bench.latency``) at 200 and 1,000 jobs/s;
4. contest start (``bench.burst``);
5. optionally a soak (``bench.soak``) of ``--soak-minutes``.

Writes ``all.json`` and the plots (``burst.png``, ``soak.png``) and prints every table.
Durations: about 8-12 minutes by default, 5 with ``--quick``, plus the soak.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from bench import burst, cpu, e2e, latency, soak
from bench.cli import add_run_options, new_parser, reporter, run_on_servers

progress = reporter("all")


async def inner(args: argparse.Namespace) -> int:
    quick = args.quick
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_start": os.getloadavg()}
    cpu_args = cpu.parser().parse_args(
        ["--rate", str(args.rate), "--seconds", "8" if quick else "15", "--limit-seconds", "4" if quick else "8"]
        + (["--ref", args.ref, "--rounds", "1" if quick else "2"] if args.ref else [])
    )
    results["cpu"] = await cpu.inner(cpu_args)
    # The limit again, next to the figure it bounds: the machine's speed moves between phases (a
    # checkpoint, WAL of the phases before), and a ratio means most against a limit of the moment.
    progress("limits again, next to end to end")
    results["e2e_limits"] = await cpu.limits(4 if quick else 8)
    results["e2e"] = await e2e.end_to_end(3000 if quick else 10_000, [1, 2])
    results["latency_pairs"] = []
    for rate in (200.0, 1000.0):
        results["latency_pairs"] += await latency.pairs(rate, 2 if quick else 5, 5 if quick else 10)
    progress("contest start burst")
    b = await burst.burst(20_000 if quick else args.burst, 64, 4, 2)
    b["peak"] = max(x["rate"] for x in results["e2e"]["judgequeue"] if x["workers"] == 2)
    results["burst"] = b
    burst_png = burst.plot(b, args.plots / "burst.png")
    soak_text = ""
    if args.soak_minutes:
        rate = 0.5 * max(x["rate"] for x in results["e2e"]["judgequeue"] if x["workers"] == 1)
        progress(f"soak: {args.soak_minutes} min at {rate:.0f} jobs/s")
        s = await soak.run_soak(seconds=args.soak_minutes * 60, rate=rate, retention="60s", reaper_interval="5s")
        window = min(300.0, args.soak_minutes * 60 / 6)
        checks = soak.check(s["_samples"], s["latencies"], duration=args.soak_minutes * 60, window_s=window)
        soak_text = soak.report(s, checks)
        soak.plot(s, args.plots / "soak.png", f"soak: {args.soak_minutes:g} min at {rate:.0f} jobs/s, retention 60s")
        results["soak"] = {k: v for k, v in s.items() if not k.startswith("_") and k != "latencies"}
        results["soak"]["checks"] = [c.__dict__ for c in checks]
    results["loadavg_end"] = os.getloadavg()

    print("=== CPU per judged job (bench.cpu)")
    print(cpu.table(results["cpu"]))
    print("\n=== end to end, 1 submit per transaction, noop judge")
    print(e2e.report(results["e2e"], results["e2e_limits"]["pgbench_two_insert_tps"]))
    first = results["cpu"]["limits"]["pgbench_two_insert_tps"]
    print(f"(pgbench measured right before end to end; at the start of the run: {first:,.0f} tx/s)")
    print("\n=== commit-to-start latency pairs")
    print(latency.table(results["latency_pairs"]))
    print("\n=== contest start")
    print(burst.report(b))
    if soak_text:
        print("\n=== soak")
        print(soak_text)
    print(f"\nload average {results['loadavg_start']} -> {results['loadavg_end']}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "all.json").write_text(json.dumps(results, default=str))
    print(f"results: {args.out / 'all.json'}; plots: {burst_png} {args.plots / 'soak.png' if soak_text else ''}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = new_parser(__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rate", type=float, default=1000.0, help="offered load of the CPU measurement")
    p.add_argument("--ref", help="git revision whose roles are measured alongside (e.g. main)")
    p.add_argument("--burst", type=int, default=100_000, help="submissions in the contest-start burst")
    p.add_argument("--soak-minutes", type=float, default=0.0)
    return add_run_options(p, plots=True, out="bench/out/all")


def main() -> int:
    return run_on_servers("bench.all", parser(), inner)


if __name__ == "__main__":
    sys.exit(main())
