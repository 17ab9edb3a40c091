"""Leases and the generation/attempt fence against real Postgres (docs/design.md §1)."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from judgequeue.core.store import leases, outbox, sql
from judgequeue.core.store.leases import Lease, VerdictWrite
from judgequeue.core.store.queues import create_queue
from tests.support.queries import count_submissions, status_of, submission, submissions


async def _submit(conn: asyncpg.Connection, queue: str, n: int = 1) -> list[int]:
    await create_queue(conn, queue)
    return [await outbox.submit(conn, queue, {"i": i}) for i in range(n)]


async def _expire(conn: asyncpg.Connection, ids: list[int]) -> None:
    """Move leases into the past on the DB clock (stands in for waiting out the TTL)."""
    await conn.execute(
        "UPDATE judgequeue.submissions SET lease_expires_at = now() - interval '1 second' WHERE id = ANY($1)", ids
    )


def _write(lease: Lease, status: str = "ACCEPTED") -> VerdictWrite:
    return VerdictWrite(lease, status, {"status": status})


async def test_acquire_returns_payload_and_fences_generation(pg: asyncpg.Connection, queue_name: str) -> None:
    [sid] = await _submit(pg, queue_name)
    assert await leases.acquire(pg, queue_name, [(sid, 2)], ttl=30) == []  # wrong generation
    [lease] = await leases.acquire(pg, queue_name, [(sid, 1)], ttl=30)
    assert (lease.submission, lease.generation, lease.payload) == (sid, 1, {"i": 0})
    assert await leases.acquire(pg, queue_name, [(sid, 1)], ttl=30) == []  # already JUDGING
    assert await leases.stale_reasons(pg, [(sid, 1), (sid, 2), (999999, 1)]) == [
        "already_judging",
        "generation_moved",
        "unknown_submission",
    ]
    row = await submission(pg, sid)
    assert row["status"] == "JUDGING" and row["attempt_id"] == lease.attempt
    assert await pg.fetchval("SELECT $1::timestamptz > now()", row["lease_expires_at"]), "the lease is live"


async def test_acquire_ignores_other_queues(pg: asyncpg.Connection, queue_name: str) -> None:
    [sid] = await _submit(pg, queue_name)
    assert await leases.acquire(pg, "other-queue", [(sid, 1)], ttl=30) == []


async def test_verdict_write_is_fenced_on_generation_and_attempt(pg: asyncpg.Connection, queue_name: str) -> None:
    a, b = await _submit(pg, queue_name, 2)
    la, lb = await leases.acquire(pg, queue_name, [(a, 1), (b, 1)], ttl=30)
    forged = Lease(lb.submission, lb.generation, la.attempt, None, lb.created_at)  # wrong attempt
    await outbox.rejudge(pg, a)  # a's generation moves on under its lease
    written = await leases.write_verdicts(pg, [_write(la), _write(forged), _write(lb, "WRONG_ANSWER")])
    assert set(written) == {lb.attempt} and 0 <= written[lb.attempt] < 60
    rows = await submissions(pg)
    assert rows[a]["status"] == "PENDING" and rows[a]["generation"] == 2 and rows[a]["verdict"] is None
    assert rows[b]["status"] == "WRONG_ANSWER"
    # A second write of the same attempt finds the row terminal: exactly one verdict.
    assert await leases.write_verdicts(pg, [_write(lb, "ACCEPTED")]) == {}
    assert await status_of(pg, b) == "WRONG_ANSWER"


async def test_renew_reports_lost_leases(pg: asyncpg.Connection, queue_name: str) -> None:
    a, b = await _submit(pg, queue_name, 2)
    la, lb = await leases.acquire(pg, queue_name, [(a, 1), (b, 1)], ttl=30)
    await outbox.rejudge(pg, b)
    assert await leases.renew(pg, [la, lb], ttl=60) == {la.attempt}
    left = await pg.fetchval(
        "SELECT extract(epoch FROM lease_expires_at - now()) FROM judgequeue.submissions WHERE id = $1", a
    )
    assert 55 < left <= 60


async def test_release_bumps_generation_and_writes_outbox_row(pg: asyncpg.Connection, queue_name: str) -> None:
    a, b = await _submit(pg, queue_name, 2)
    la, lb = await leases.acquire(pg, queue_name, [(a, 1), (b, 1)], ttl=30)
    await leases.write_verdicts(pg, [_write(lb)])
    assert await leases.release(pg, [la, lb]) == [a]  # b already has its verdict
    row = await submission(pg, a)
    assert (row["status"], row["generation"], row["retry_count"], row["attempt_id"]) == ("PENDING", 2, 1, None)
    assert await pg.fetchval(
        "SELECT count(*) FROM judgequeue.outbox WHERE submission_id = $1 AND generation = 2 AND state = 'PENDING'", a
    ) == 1
    assert await leases.release(pg, [la]) == []  # a second release of the same attempt does nothing


async def test_rescue_requeues_then_gives_up_at_max_retries(pg: asyncpg.Connection, queue_name: str) -> None:
    [sid] = await _submit(pg, queue_name)
    live = await _submit(pg, queue_name + "-x")  # another queue's expired lease is not ours to rescue
    for generation in (1, 2):
        await leases.acquire(pg, queue_name, [(sid, generation)], ttl=30)
        assert await leases.rescue_expired_leases(pg, queue_name, max_retries=3) == leases.LeaseSweep(0, 0)
        await _expire(pg, [sid])
        assert await leases.rescue_expired_leases(pg, queue_name, max_retries=3) == leases.LeaseSweep(1, 0)
        assert await pg.fetchval(
            "SELECT count(*) FROM judgequeue.outbox WHERE submission_id = $1 AND generation = $2", sid, generation + 1
        ) == 1
    await leases.acquire(pg, queue_name, [(sid, 3)], ttl=30)
    await leases.acquire(pg, queue_name + "-x", [(live[0], 1)], ttl=30)
    await _expire(pg, [sid, live[0]])
    assert await leases.rescue_expired_leases(pg, queue_name, max_retries=3) == leases.LeaseSweep(0, 1)
    row = await submission(pg, sid)
    assert row["status"] == "SYSTEM_ERROR" and row["retry_count"] == 3
    assert "gave up after 3 lease expiries" in row["verdict"]
    assert await pg.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE submission_id = $1", sid) == 3
    assert await status_of(pg, live[0]) == "JUDGING"


async def test_concurrent_rescues_bump_each_lease_once(pg_pool: asyncpg.Pool, queue_name: str) -> None:
    async with pg_pool.acquire() as conn:
        ids = await _submit(conn, queue_name, 200)
        await leases.acquire(conn, queue_name, [(i, 1) for i in ids], ttl=30)
        await _expire(conn, ids)

    async def sweep() -> leases.LeaseSweep:
        async with pg_pool.acquire() as conn:
            return await leases.rescue_expired_leases(conn, queue_name, max_retries=5, batch=37)

    total = 0
    while True:
        results = await asyncio.gather(*(sweep() for _ in range(4)))
        moved = sum(r.requeued for r in results)
        if moved == 0:
            break
        total += moved
    assert total == 200
    async with pg_pool.acquire() as conn:
        assert await count_submissions(conn, generation=2) == 200
        assert await conn.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE generation = 2") == 200


async def test_lease_acquire_looks_ids_up_even_with_a_large_backlog(pg: asyncpg.Connection) -> None:
    """Regression: a partial index on pending rows once made the planner scan the whole backlog
    for every lease batch (hundreds of ms each); the acquire must stay a primary-key lookup."""
    await create_queue(pg, "judge")
    await pg.execute("SELECT judgequeue.submit('judge', '{}'::jsonb) FROM generate_series(1, 20000)")
    await pg.execute("ANALYZE judgequeue.submissions")
    ids = list(range(1, 257))
    plan = await pg.fetch(
        "EXPLAIN " + sql.QUERIES["lease_acquire"], ids, [1] * len(ids), [uuid.uuid4() for _ in ids], "judge", 30.0
    )
    text = "\n".join(r[0] for r in plan)
    assert "submissions_pkey" in text and "Seq Scan on submissions" not in text, text
