"""Outbox benchmark: submit() and claim+mark against the machine's own pgbench limits, in one run.

    .venv/bin/python -m bench.outbox_bench [--seconds 8] [--clients 8] [--ref REV [--rounds 5]]

Prints submit transactions/s through ``submit()`` (wake-up mechanism active, i.e. the waiter check
runs in every submit; measured with no dispatcher asleep, as under load, and with one asleep, the
worst case where every commit notifies) next to a raw two-insert pgbench transaction on tables of the
same shape, and claim+mark rows/s next to pgbench's SKIP LOCKED claim-and-update of 50-row batches.
With ``--ref``, ``submit()`` through pgbench on this tree's schema against ``REV``'s (its own
migrations and function), in a queue nobody offers in, alternating round by round: what a submit
costs the database against that release.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

import asyncpg

from bench.common import create_database, drop_database, pgbench, ratio
from judgequeue.core.runtime import wakeup
from judgequeue.core.store import outbox
from judgequeue.core.store.queues import create_queue
from tests.support.revisions import migrate_as, ref_tree

RAW_SETUP = """
CREATE SCHEMA raw;
CREATE TABLE raw.submissions (LIKE judgequeue.submissions INCLUDING ALL);
CREATE TABLE raw.outbox (LIKE judgequeue.outbox INCLUDING ALL);
"""

RAW_SUBMIT = """
BEGIN;
INSERT INTO raw.submissions (queue, payload)
    VALUES ('bench', '{"language":"python","source":"print(1)"}') RETURNING id AS sid \\gset
INSERT INTO raw.outbox (queue, submission_id, generation) VALUES ('bench', :sid, 1);
END;
"""

# The same transaction through judgequeue's SQL API (what a non-Python application runs), so
# pgbench's C client measures submit's database cost against the raw inserts.
SQL_SUBMIT = """
BEGIN;
SELECT judgequeue.submit('bench', '{"language":"python","source":"print(1)"}');
END;
"""

RAW_CLAIM = """
WITH c AS (SELECT id FROM raw.outbox
            WHERE queue = 'bench' AND state IN ('PENDING', 'CLAIMED') AND next_attempt_at <= now()
            ORDER BY next_attempt_at, id LIMIT 50 FOR UPDATE SKIP LOCKED)
UPDATE raw.outbox o SET state = 'SENT', sent_at = now() FROM c WHERE o.id = c.id;
"""

PAYLOAD = {"language": "python", "source": "print(1)"}


async def _submit_loop(dsn: str, clients: int, seconds: float) -> int:
    conns = [await asyncpg.connect(dsn) for _ in range(clients)]
    deadline = time.monotonic() + seconds
    counts = [0] * clients

    async def loop(i: int) -> None:
        conn = conns[i]
        while time.monotonic() < deadline:
            async with conn.transaction():
                await outbox.submit(conn, "bench", PAYLOAD)
            counts[i] += 1

    await asyncio.gather(*(loop(i) for i in range(clients)))
    for c in conns:
        await c.close()
    return sum(counts)


def _submit_process(dsn: str, clients: int, seconds: float) -> int:
    return asyncio.run(_submit_loop(dsn, clients, seconds))


def submit_rate(dsn: str, clients: int, seconds: float, processes: int = 2) -> float:
    """Submits/s from ``processes`` client processes (like pgbench's -j 2 threads), ``clients`` in all."""
    with ProcessPoolExecutor(processes) as pool:
        pool.submit(int).result()  # start the workers before the clock
        started = time.monotonic()
        futures = [pool.submit(_submit_process, dsn, clients // processes, seconds) for _ in range(processes)]
        total = sum(f.result() for f in futures)
    return total / (time.monotonic() - started)


async def _claim_loop(dsn: str, clients: int, batch: int, tag: str) -> int:
    # Sessions as the dispatcher opens them (core.lifecycle, durable_commits=False): a lost claim or
    # mark is redone, so the dispatcher does not wait for the WAL flush.
    conns = [await asyncpg.connect(dsn, server_settings={"synchronous_commit": "off"}) for _ in range(clients)]
    total = [0] * clients

    async def loop(i: int) -> None:
        conn = conns[i]
        owner = f"bench-{tag}-{i}"
        while True:
            rows = await outbox.claim(conn, "bench", limit=batch, owner=owner, claim_ttl=30)
            if not rows:
                return
            await outbox.mark(
                conn,
                [outbox.Mark(r.outbox_id, "sent") for r in rows],
                owner=owner,
                retry=outbox.Retry(max_attempts=10, backoff_base=1, backoff_max=60),
            )
            total[i] += len(rows)

    await asyncio.gather(*(loop(i) for i in range(clients)))
    for c in conns:
        await c.close()
    return sum(total)


def _claim_process(dsn: str, clients: int, batch: int, tag: str) -> int:
    return asyncio.run(_claim_loop(dsn, clients, batch, tag))


def claim_mark_rate(dsn: str, clients: int, batch: int, processes: int = 2) -> float:
    """Rows/s claimed and marked by ``clients`` dispatch loops spread over ``processes`` processes."""
    with ProcessPoolExecutor(processes) as pool:
        pool.submit(int).result()  # start the workers before the clock
        started = time.monotonic()
        futures = [pool.submit(_claim_process, dsn, clients // processes, batch, str(p)) for p in range(processes)]
        total = sum(f.result() for f in futures)
    return total / (time.monotonic() - started)


async def submit_against_ref(rev: str, clients: int, seconds: int, rounds: int) -> dict[str, list[float]]:
    """pgbench's ``SQL_SUBMIT`` tx/s on this tree's schema and on ``rev``'s, ``rounds`` times each,
    the order swapped every round; both tables emptied before each run so neither grows ahead."""
    dsns = {"this tree": await create_database(), rev: await create_database(migrated=False)}
    rates: dict[str, list[float]] = {name: [] for name in dsns}
    try:
        migrate_as(dsns[rev], ref_tree(rev))
        for dsn in dsns.values():
            conn = await asyncpg.connect(dsn)
            # Only what every revision's queues table has (later ones add columns).
            await conn.execute("INSERT INTO judgequeue.queues (name) VALUES ('bench')")
            await conn.close()
        for k in range(rounds):
            for name in list(dsns)[:: 1 if k % 2 == 0 else -1]:
                conn = await asyncpg.connect(dsns[name])
                await conn.execute("TRUNCATE judgequeue.submissions, judgequeue.outbox")
                await conn.execute("CHECKPOINT")
                await conn.close()
                rates[name].append(pgbench(dsns[name], SQL_SUBMIT, clients=clients, seconds=seconds))
    finally:
        for dsn in dsns.values():
            await drop_database(dsn)
    return rates


def report_against_ref(rates: dict[str, list[float]]) -> str:
    """Medians, and this tree's time per submit over the reference's round by round (pure)."""
    (ours_name, ours), (ref_name, theirs) = rates.items()
    ratios = [ref / mine for mine, ref in zip(ours, theirs, strict=True)]
    return (
        f"submit() via pgbench, {len(ours)} alternating rounds, median tx/s: {ours_name}"
        f" {statistics.median(ours):,.0f}, {ref_name} {statistics.median(theirs):,.0f}; cost per submit against"
        f" {ref_name}'s, round by round: {', '.join(f'{r:.2f}' for r in ratios)}"
        f" (median {statistics.median(ratios):.2f}x)"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rows", type=int, default=200_000, help="rows preloaded for the claim benchmarks")
    parser.add_argument("--ref", help="also compare submit() with this git revision's (e.g. a release)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds against --ref")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.ref:
        print(report_against_ref(await submit_against_ref(args.ref, args.clients, args.seconds, args.rounds)))

    dsn = await create_database()
    try:
        conn = await asyncpg.connect(dsn)
        await conn.execute(RAW_SETUP)
        await create_queue(conn, "bench")

        raw_submit = pgbench(dsn, RAW_SUBMIT, clients=args.clients, seconds=args.seconds)
        ours_idle = submit_rate(dsn, args.clients, args.seconds)
        await wakeup.register_waiter(conn, "bench", "sleeping-dispatcher")
        ours_notify = submit_rate(dsn, args.clients, args.seconds)
        await wakeup.unregister_waiter(conn, "bench", "sleeping-dispatcher")

        # Fresh, equal backlogs for both claim runs.
        await conn.execute("TRUNCATE judgequeue.outbox, judgequeue.submissions, raw.outbox")
        await conn.execute(
            "INSERT INTO raw.outbox (queue, submission_id, generation)"
            " SELECT 'bench', i, 1 FROM generate_series(1, $1) i",
            args.rows,
        )
        await conn.execute("SELECT judgequeue.submit('bench', '{}'::jsonb) FROM generate_series(1, $1)", args.rows)
        await conn.execute("VACUUM ANALYZE raw.outbox")
        await conn.execute("VACUUM ANALYZE judgequeue.outbox")
        per_client = args.rows // 50 // args.clients
        raw_claim = 50 * pgbench(dsn, RAW_CLAIM, clients=args.clients, transactions=per_client)
        ours_claim = claim_mark_rate(dsn, args.clients, 50)
        await conn.close()
    finally:
        await drop_database(dsn)

    print(f"{'measure':<52}{'judgequeue':>12}{'limit':>12}{'ratio':>8}")
    print(
        f"{'submit tx/s (no dispatcher asleep: busy system)':<52}{ours_idle:>12.0f}{raw_submit:>12.0f}"
        f"{ratio(ours_idle, raw_submit):>8}"
    )
    print(
        f"{'submit tx/s (a dispatcher asleep: NOTIFY per commit)':<52}{ours_notify:>12.0f}{raw_submit:>12.0f}"
        f"{ratio(ours_notify, raw_submit):>8}"
    )
    print(
        f"{'claim+mark rows/s (batches of 50)':<52}{ours_claim:>12.0f}{raw_claim:>12.0f}"
        f"{ratio(ours_claim, raw_claim):>8}"
    )
    print(
        "limits: pgbench raw two-insert transaction; pgbench SKIP LOCKED claim-and-update of 50 rows;"
        f" {args.clients} clients each"
    )


if __name__ == "__main__":
    asyncio.run(main())
