"""Priority classes: a contest's commit-to-start latency with and without a 10,000-job rejudge or another
contest's 20,000-job burst queued first, and the throughput of a queue with classes and fairness keys against one class.

    .venv/bin/python -m bench.priority [--rate 100] [--seconds 10] [--rejudge 10000] [--burst 20000]
                                       [--rounds 3] [--pairs 7] [--only contest|throughput] [--profile]

Every phase runs the roles as processes (dispatcher, 1 worker, reaper; noop judge; the bench
stack's settings and the run's ``--intake``) on a fresh database, one after another in the same run:

1. ``alone``: contest submissions at ``--rate`` for ``--seconds``, nothing else queued.
2. ``rejudge, classes``: the queue declares ``contest > rejudge`` (the rejudge class's default share,
   5%); once the roles serve, ``--rejudge`` finished submissions of one problem are written (and the
   tables analysed, as a database in service has statistics) and rejudged in one statement
   (``rejudge_many``, class rejudge) a moment before the same contest load starts.
3. ``rejudge, one class``: the same, in a queue with one class (the rejudge first come, first served).
4. ``other contest's burst``: as 2, but instead of the rejudge another contest's start, ``--burst``
   jobs of the contest class under another fairness key, submitted in one statement.

The measured contest's jobs carry a fairness key of their own (``contest-a``) in the phases with
classes. Commit-to-start is the submission's ``created_at`` (database clock) to the moment the noop
judge ran it (host clock), per contest job. The four phases run ``--rounds`` times, in reverse order
every other round; each round's p99 is printed, and the targets are judged on each phase's jobs of
every round together: phase 2's and phase 4's p99 within 1.5x of phase 1's.

Then shares: ``--shares`` jobs in each of three classes (contest, practice share 30, rejudge share 10:
weights 60/30/10), all queued before the roles start; each class's share of the first third of the
starts (while none has run dry). Target: each within +-10% of its weight.

Then throughput: ``--burst`` jobs submitted over 4 connections as fast as they go, into a queue with
three classes and two fairness keys (a third each, keys alternating), and into a queue with one
class: first submit to last verdict, jobs/s; ``--pairs`` pairs, alternating which runs first, as
one pair's ratio moves by more than the difference measured. Target: the medians' ratio, classes
at >= 0.9x of one class. ``--profile`` adds where each run's CPU went: milliseconds per job of every
process (the roles, this process, the Postgres cluster by whom it served, Redis) and the costliest
statements' execution time per job.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import Counter
from typing import Any

import asyncpg

from bench import cpu, pipeline
from bench.cli import add_run_options, new_parser, reporter, run_on_servers
from bench.common import span_seconds
from judgequeue.core.base.classes import JobClass
from judgequeue.core.store import outbox
from judgequeue.core.store.queues import set_classes

progress = reporter("priority")

CONTEST = (JobClass("contest"), JobClass("rejudge", 5))
THREE = (JobClass("contest"), JobClass("practice", 5), JobClass("rejudge", 5))


async def _contest(
    s: pipeline.Stack, rate: float, seconds: float, job_class: str | None, key: str | None = None
) -> int:
    """Offer ``rate`` contest submits/s for ``seconds`` on one connection (fairness ``key``); how many."""
    return await pipeline.offer_paced(
        s, rate, seconds, lambda conn: outbox.submit(conn, s.queue, {"contest": True}, job_class=job_class, key=key)
    )


async def _serving(s: pipeline.Stack, classes: tuple[JobClass, ...] | None) -> int:
    """Declare ``classes`` (None: one class), start the roles and return once they serve (the last
    warm-up id)."""
    if classes is not None:
        async with s.pool.acquire() as conn:
            await set_classes(conn, s.queue, classes)
    for role in ("dispatcher", "worker", "reaper"):
        s.start(role)
    return await pipeline.warm_up(s)


async def _starts(pool: asyncpg.Pool, after: int) -> list[tuple[float, bool]]:
    """Each contest job's commit-to-start (ms) and whether its submit filled an offer (its outbox row
    was sent in the submit's own transaction) rather than a take or the stream bringing it."""
    rows = await pool.fetch(
        "SELECT (s.verdict->'details'->>'started_at')::float8 - extract(epoch FROM s.created_at)::float8 AS start,"
        " coalesce(o.sent_at = s.created_at, false) AS offered"
        " FROM judgequeue.submissions s"
        " LEFT JOIN judgequeue.outbox o ON o.submission_id = s.id AND o.generation = 1"
        " WHERE s.id > $1 AND s.payload ? 'contest'",
        after,
    )
    return [(r["start"] * 1000, r["offered"]) for r in rows if r["start"] is not None]


async def contest_phase(
    rate: float, seconds: float, rejudge: int, classes: bool, *, other_contest: int = 0
) -> dict[str, Any]:
    """The measured contest's commit-to-start at ``rate`` for ``seconds``, after ``rejudge`` judged
    submissions were rejudged in one statement, or ``other_contest`` jobs of another contest (same
    class, another fairness key) were submitted in one statement, a moment before it starts."""
    async with pipeline.stack(concurrency="64") as s:
        after = await _serving(s, CONTEST if classes else None)
        if rejudge:  # the judged submissions of a problem, as a contest's past leaves them
            await s.pool.execute(
                "INSERT INTO judgequeue.submissions (queue, payload, status, finished_at)"
                " SELECT $1, jsonb_build_object('problem', 'p1'), 'ACCEPTED', now() FROM generate_series(1, $2)",
                s.queue,
                rejudge,
            )
        # A database in service has planner statistics (the reaper analyses a new one only after its
        # first writes): without them the 10,000 rows arrive under plans made for an empty outbox.
        await s.pool.execute("ANALYZE judgequeue.outbox")
        await s.pool.execute("ANALYZE judgequeue.submissions")
        rejudged, statement_ms = 0, 0.0
        if rejudge:
            async with s.pool.acquire() as conn:
                began = time.monotonic()
                rejudged = len(await outbox.rejudge_many(conn, s.queue, problem="p1"))
                statement_ms = (time.monotonic() - began) * 1000
        burst_ms = 0.0
        if other_contest:  # the other contest's start: its whole burst queued at once
            began = time.monotonic()
            await s.pool.execute(
                "SELECT judgequeue.submit($1, '{}'::jsonb, 'contest', 'contest-b') FROM generate_series(1, $2)",
                s.queue,
                other_contest,
            )
            burst_ms = (time.monotonic() - began) * 1000
        key = "contest-a" if classes else None
        submitted = await _contest(s, rate, seconds, "contest" if classes else None, key)
        await pipeline.wait_done(s.pool, 0, 50 + rejudge + other_contest + submitted, 300)
        both = await _starts(s.pool, after)
    return {
        "rejudge": rejudged,
        "classes": classes,
        **_start_figures(both),
        "starts": both,
        "rejudge_statement_ms": statement_ms,
        "other_contest": other_contest,
        "other_contest_statement_ms": burst_ms,
    }


def _start_figures(both: list[tuple[float, bool]]) -> dict[str, Any]:
    """Commit-to-start figures of contest jobs (ms, whether by an offer): count, p50, p99, and the
    p99 of those an offer started and of the rest (pure)."""
    starts = [ms for ms, _ in both]
    offered = [ms for ms, by_offer in both if by_offer]
    taken = [ms for ms, by_offer in both if not by_offer]
    return {
        "contest_jobs": len(starts),
        "start_p50_ms": pipeline.percentile(starts, 0.5),
        "start_p99_ms": pipeline.percentile(starts, 0.99),
        "by_offer": len(offered),
        "by_offer_p99_ms": pipeline.percentile(offered, 0.99) if offered else None,
        "by_take_p99_ms": pipeline.percentile(taken, 0.99) if taken else None,
    }


def pooled(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each phase's figures over its contest jobs of every round (pure), phases in the first round's
    order: one round's p99 is its tenth-worst start, and the alone phase's moved between 1.3 and
    3.2 ms across runs of one tree, more than the 1.5x the targets allow, so the targets are judged
    on every round's jobs together."""
    names = [p["phase"] for p in rounds[0]]
    return [
        {"phase": name, **_start_figures([s for r in rounds for p in r if p["phase"] == name for s in p["starts"]])}
        for name in names
    ]


#: The contest phases: label, whether a rejudge is queued first, classes on, whether the other
#: contest's burst is (the sizes are the run's --rejudge and --burst).
PHASES = (
    ("alone", 0, True, 0),
    ("rejudge, classes", 1, True, 0),
    ("rejudge, one class", 1, False, 0),
    ("other contest's burst", 0, True, 1),
)

WEIGHTED = (JobClass("contest"), JobClass("practice", 30), JobClass("rejudge", 10))


async def shares(per_class: int) -> dict[str, Any]:
    """Every class backlogged (``per_class`` jobs each, queued before the roles start) under
    :data:`WEIGHTED` (contest the rest: 60%): each class's share of the first third of the starts,
    while none has run dry."""
    async with pipeline.stack(concurrency="64") as s:
        async with s.pool.acquire() as conn:
            await set_classes(conn, s.queue, WEIGHTED)
            for c in WEIGHTED:
                await conn.execute(
                    "SELECT judgequeue.submit($1, jsonb_build_object('class', $2::text), $2)"
                    " FROM generate_series(1, $3)",
                    s.queue,
                    c.name,
                    per_class,
                )
            await conn.execute("ANALYZE judgequeue.outbox")
        s.start("dispatcher")
        s.start("worker")
        s.start("reaper")
        await pipeline.wait_done(s.pool, 0, 3 * per_class, 600)
        rows = await s.pool.fetch(
            "SELECT payload->>'class' AS c FROM judgequeue.submissions"
            " ORDER BY (verdict->'details'->>'started_at')::float8 LIMIT $1",
            per_class,
        )
    first = Counter(r["c"] for r in rows)
    want = {c.name: (c.share or 100 - sum(x.share for x in WEIGHTED)) / 100 for c in WEIGHTED}
    return {c: {"share": first[c] / len(rows), "weight": w} for c, w in want.items()}


async def throughput(n: int, classes: bool, keys: bool | None = None, profile: bool = False) -> dict[str, Any]:
    keys = classes if keys is None else keys
    async with pipeline.stack(concurrency="64") as s:
        after = await _serving(s, THREE if classes else None)
        names = [c.name for c in THREE]

        async def lane(k: int) -> None:
            async with s.pool.acquire() as conn:
                for i in range(k, n, 4):
                    await outbox.submit(conn, s.queue, {}, job_class=names[i % 3] if classes else None,
                                        key=f"k{(i // 3) % 2}" if keys else None)

        meter = None
        statements = False
        if profile:
            meter = cpu.Meter({role: [p.pid for p in ps] for role, ps in s.procs.items()} | {"app": [os.getpid()]})
            async with s.pool.acquire() as conn:
                statements = await cpu.statements_available(conn)
                if statements:
                    await conn.execute("SELECT pg_stat_statements_reset()")
            meter.begin()
        began = time.monotonic()
        await asyncio.gather(*(lane(k) for k in range(4)))
        submitted = time.monotonic() - began
        await pipeline.wait_done(s.pool, after, n, 600)
        span = await span_seconds(s.pool, after)
        got: dict[str, Any] = {"classes": classes, "jobs": n, "seconds": span, "jobs_per_s": n / span,
                               "submit_seconds": submitted}
        if meter is not None:
            got["cpu_ms_per_job"] = {k: 1000 * v / n for k, v in sorted(meter.end().items()) if v}
        if statements:
            async with s.pool.acquire() as conn:
                got["statements"] = (await cpu.read_statements(conn, n))[:12]
    return got


def _print_throughput(runs: list[dict[str, Any]]) -> None:
    """Each round's pair and ratio, then the medians' ratio against the target."""
    on = [r["jobs_per_s"] for r in runs if r["classes"]]
    off = [r["jobs_per_s"] for r in runs if not r["classes"]]
    for i, (a, b) in enumerate(zip(on, off, strict=True)):
        print(f"throughput pair {i + 1}: three classes and two keys {a:.0f} jobs/s, one class {b:.0f} jobs/s:"
              f" {a / b:.2f}x")
    ratio = statistics.median(on) / statistics.median(off)
    print(f"throughput, median of {len(on)} pairs: three classes and two keys {statistics.median(on):.0f} jobs/s,"
          f" one class {statistics.median(off):.0f} jobs/s: {ratio:.2f}x"
          f" (target >= 0.9x): {'met' if ratio >= 0.9 else 'NOT met'}")  # fmt: skip


def _print_profile(runs: list[dict[str, Any]]) -> None:
    """CPU ms per job of each process and the costliest statements' execution µs per job, run by run."""
    for run in runs:
        if "cpu_ms_per_job" not in run:
            continue
        label = "three classes and two keys" if run["classes"] else "one class"
        print(f"throughput, {label}: CPU ms per job " + ", ".join(
            f"{k} {v:.3f}" for k, v in run["cpu_ms_per_job"].items()))
        for st in run.get("statements", []):
            print(f"  {st['name'][:60]:<60} {st['calls_per_job']:5.2f} calls/job {st['exec_us_per_job']:7.1f} us/job"
                  f" {st['exec_us_per_call']:7.1f} us/call")  # fmt: skip


def _print_phases(rounds: list[list[dict[str, Any]]], args: argparse.Namespace) -> None:
    """Each round's p99 per phase, then the contest phases' table over every round's jobs and the
    two targets judged on it."""
    for i, phases in enumerate(rounds):
        print(f"contest round {i + 1}: start p99 ms " + ", ".join(
            f"{p['phase']} {p['start_p99_ms']:.1f}" for p in phases))  # fmt: skip
    phases = pooled(rounds)
    alone, with_classes, other = (phases[i]["start_p99_ms"] for i in (0, 1, 3))
    print(f"over the {len(rounds)} rounds' contest jobs:")
    print(f"{'phase':<22} {'contest jobs':>12} {'start p50 ms':>12} {'start p99 ms':>12} {'p99 / alone':>11}"
          f" {'by offer':>8} {'offer p99':>9} {'take p99':>9}")  # fmt: skip
    for p in phases:
        print(f"{p['phase']:<22} {p['contest_jobs']:>12} {p['start_p50_ms']:>12.1f} {p['start_p99_ms']:>12.1f}"
              f" {p['start_p99_ms'] / alone:>11.2f} {p['by_offer'] / max(1, p['contest_jobs']):>8.1%}"
              f" {_ms(p['by_offer_p99_ms']):>9} {_ms(p['by_take_p99_ms']):>9}")  # fmt: skip
    statements = ", ".join(f"{r[1]['rejudge_statement_ms']:.0f}" for r in rounds)
    print(f"bulk rejudge of {args.rejudge} in one statement: {statements} ms")
    print(f"contest p99 with a {args.rejudge}-job rejudge queued first: {with_classes / alone:.2f}x alone "
          f"(target <= 1.5x): {'met' if with_classes <= 1.5 * alone else 'NOT met'}")  # fmt: skip
    print(f"contest p99 with another contest's {args.burst}-job burst queued first (fairness keys): "
          f"{other / alone:.2f}x alone (target <= 1.5x): {'met' if other <= 1.5 * alone else 'NOT met'}")  # fmt: skip


async def inner(args: argparse.Namespace) -> int:
    rounds: list[list[dict[str, Any]]] = []
    for round_ in range(args.rounds if args.only != "throughput" else 0):
        phases = []
        order = PHASES if round_ % 2 == 0 else PHASES[::-1]  # alternating: the machine's drift falls on all
        for label, rejudge, classes, other in order:
            rejudge, other = rejudge and args.rejudge, other and args.burst
            progress(f"contest round {round_ + 1}/{args.rounds} at {args.rate:g}/s for {args.seconds:g}s: {label}")
            got = await contest_phase(args.rate, args.seconds, rejudge, classes, other_contest=other)
            phases.append({"phase": label, **got})
        rounds.append(sorted(phases, key=lambda p: [name for name, *_ in PHASES].index(p["phase"])))
    weighted: dict[str, Any] = {}
    runs = []
    if args.only == "all":
        progress(f"shares: {args.shares} jobs in each of three weighted classes")
        weighted = await shares(args.shares)
    for round_ in range(args.pairs if args.only != "contest" else 0):
        for classes in (True, False) if round_ % 2 == 0 else (False, True):  # alternating: neither always first
            progress(f"throughput pair {round_ + 1}/{args.pairs}, {args.burst} jobs,"
                     f" {'three classes and two keys' if classes else 'one class'}")
            runs.append(await throughput(args.burst, classes, profile=args.profile))
    print(f"judgequeue intake: {args.intake}")
    if rounds:
        _print_phases(rounds, args)
    for name, w in weighted.items():
        off_by = (w["share"] - w["weight"]) / w["weight"]
        print(f"class {name:<9} share {w['share']:6.1%} of the starts, weight {w['weight']:4.0%}: {off_by:+.0%}"
              f" ({'within' if abs(off_by) <= 0.1 else 'NOT within'} +-10%)")  # fmt: skip
    if runs:
        _print_throughput(runs)
        _print_profile(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "priority.json").write_text(
        json.dumps({"rounds": rounds, "phases": pooled(rounds) if rounds else [], "shares": weighted,
                    "throughput": runs}, indent=1)
    )
    return 0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    p = new_parser(__doc__)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rejudge", type=int, default=10_000)
    p.add_argument("--burst", type=int, default=20_000)
    p.add_argument("--shares", type=int, default=4_000)
    p.add_argument("--only", choices=("contest", "throughput", "all"), default="all",
                   help="contest: only the four contest phases (no shares, no throughput); throughput: only that")
    p.add_argument("--rounds", type=_at_least_one, default=3,
                   help="rounds of the contest phases, every other one in reverse order (the targets judged on"
                        " every round's jobs)")
    p.add_argument("--pairs", type=_at_least_one, default=7,
                   help="throughput pairs, alternating which runs first (the medians' ratio counts: one pair's"
                        " ratio moves by more than the difference measured)")
    p.add_argument("--profile", action="store_true",
                   help="throughput runs: CPU per job of each process and the costliest statements"
                        " (pg_stat_statements)")
    return add_run_options(p)


def main() -> int:
    return run_on_servers("bench.priority", parser(), inner)


if __name__ == "__main__":
    sys.exit(main())
