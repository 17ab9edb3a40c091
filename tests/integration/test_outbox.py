"""The Postgres outbox against the real database: submit, claim, mark, backoff, cutover, prune."""

from __future__ import annotations

import asyncio
import os
import subprocess
from datetime import timedelta

import asyncpg
import pytest

from judgequeue.core.base.errors import (
    InvalidPayload,
    InvalidQueueName,
    PayloadTooLarge,
    UnknownQueue,
    UnknownSubmission,
    WatermarkMovedBack,
)
from judgequeue.core.store import outbox
from judgequeue.core.store.queues import create_queue, get_queue, set_cutover
from tests.support.queries import count_submissions, submission
from tests.support.waiting import eventually

OWNER = "test-dispatcher"


async def counts(conn: asyncpg.Connection) -> tuple[int, int]:
    return (
        await count_submissions(conn),
        await conn.fetchval("SELECT count(*) FROM judgequeue.outbox"),
    )


async def claim(
    conn: asyncpg.Connection, queue: str, limit: int = 100, owner: str = OWNER, ttl: float = 30
) -> list[outbox.ClaimedRow]:
    return await outbox.claim(conn, queue, limit=limit, owner=owner, claim_ttl=ttl)


async def mark(
    conn: asyncpg.Connection, marks: list[outbox.Mark], owner: str = OWNER, max_attempts: int = 3
) -> dict[int, outbox.OutboxState]:
    return await outbox.mark(conn, marks, owner=owner, retry=outbox.Retry(max_attempts, backoff_base=1, backoff_max=60))


async def test_rolled_back_submit_leaves_nothing_committed_leaves_one_pending(pg: asyncpg.Connection) -> None:
    await create_queue(pg, "judge")
    with pytest.raises(RuntimeError):
        async with pg.transaction():
            await outbox.submit(pg, "judge", {"source": "print(1)"})
            raise RuntimeError("application failed after submitting")
    assert await counts(pg) == (0, 0)

    async with pg.transaction():
        sid = await outbox.submit(pg, "judge", {"source": "print(1)"})
    row = await pg.fetchrow("SELECT * FROM judgequeue.outbox")
    assert row["submission_id"] == sid and row["state"] == "PENDING" and row["generation"] == 1
    sub = await submission(pg, sid)
    assert sub["status"] == "PENDING" and sub["payload"] == '{"source": "print(1)"}'


def test_submit_through_psql(pg_dsn: str) -> None:
    """Any language can enqueue with plain SQL inside its own transaction."""
    script = """
    SELECT judgequeue.submit('judge', '{"x": 1}'::jsonb) \\gset
    BEGIN;
    SELECT judgequeue.submit('judge', '{"x": 2}'::jsonb);
    ROLLBACK;
    SELECT count(*) FROM judgequeue.outbox WHERE state = 'PENDING';
    """
    env = dict(os.environ)
    subprocess.run(
        ["psql", pg_dsn, "-v", "ON_ERROR_STOP=1", "-qAtc", "INSERT INTO judgequeue.queues (name) VALUES ('judge')"],
        check=True,
        env=env,
    )
    out = subprocess.run(
        ["psql", pg_dsn, "-v", "ON_ERROR_STOP=1", "-qAt"], input=script, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "1"
    bad = subprocess.run(
        ["psql", pg_dsn, "-qAtc", "SELECT judgequeue.submit('Bad_Name', '{}'::jsonb)"], capture_output=True, text=True
    )
    assert bad.returncode != 0 and "not a DNS label" in bad.stderr


@pytest.mark.parametrize(
    ("queue", "payload", "error"),
    [
        ("judge", {"x": object()}, InvalidPayload),
        ("judge", {"x": float("nan")}, InvalidPayload),
        ("judge", {"blob": "x" * (outbox.MAX_PAYLOAD_BYTES + 1)}, PayloadTooLarge),
        ("Not_A_Label", {}, InvalidQueueName),
        ("-leading-dash", {}, InvalidQueueName),
        ("a" * 64, {}, InvalidQueueName),
        ("missing", {}, UnknownQueue),
    ],
)
async def test_bad_input_raises_one_error_and_writes_nothing(
    pg: asyncpg.Connection, queue: str, payload: object, error: type[Exception]
) -> None:
    await create_queue(pg, "judge")
    async with pg.transaction():
        await outbox.submit(pg, "judge", {"ok": True})  # committed work must survive
    with pytest.raises(error):
        async with pg.transaction():
            await outbox.submit(pg, queue, payload)
    assert await counts(pg) == (1, 1)


async def test_sql_function_enforces_the_same_limits(pg: asyncpg.Connection) -> None:
    """A non-Python client that bypasses the Python checks still gets the typed errors."""
    await create_queue(pg, "judge")
    big = '{"blob": "' + "x" * outbox.MAX_PAYLOAD_BYTES + '"}'
    with pytest.raises(asyncpg.PostgresError) as info:
        await pg.fetchval("SELECT judgequeue.submit('judge', $1::jsonb)", big)
    assert info.value.sqlstate == "JQ003"
    with pytest.raises(asyncpg.PostgresError) as info:
        await pg.fetchval("SELECT judgequeue.submit('nope', '{}'::jsonb)")
    assert info.value.sqlstate == "JQ002"
    assert await counts(pg) == (0, 0)


async def test_rejudge_bumps_generation_and_writes_new_intent(pg: asyncpg.Connection) -> None:
    await create_queue(pg, "judge")
    sid = await outbox.submit(pg, "judge", {})
    await pg.execute(
        "UPDATE judgequeue.submissions SET status = 'ACCEPTED', verdict = '{}', finished_at = now() WHERE id = $1", sid
    )
    async with pg.transaction():
        assert await outbox.rejudge(pg, sid) == 2
    sub = await submission(pg, sid)
    assert (sub["status"], sub["generation"], sub["verdict"]) == ("PENDING", 2, None)
    gens = await pg.fetch("SELECT generation, state FROM judgequeue.outbox ORDER BY generation")
    assert [(r["generation"], r["state"]) for r in gens] == [(1, "PENDING"), (2, "PENDING")]
    with pytest.raises(UnknownSubmission):
        await outbox.rejudge(pg, 999_999)


async def test_concurrent_claimers_claim_every_row_exactly_once(pg_dsn: str, pg: asyncpg.Connection) -> None:
    await create_queue(pg, "judge")
    await pg.execute(
        "SELECT judgequeue.submit('judge', jsonb_build_object('i', i)) FROM generate_series(1, 10000) AS i"
    )
    claimed: dict[str, list[int]] = {}

    async def claimer(name: str) -> None:
        conn = await asyncpg.connect(pg_dsn)
        mine = claimed.setdefault(name, [])
        try:
            while True:
                rows = await claim(conn, "judge", limit=50, owner=name)
                if not rows:
                    return
                mine.extend(r.outbox_id for r in rows)
                await mark(conn, [outbox.Mark(r.outbox_id, "sent") for r in rows], owner=name)
        finally:
            await conn.close()

    await asyncio.gather(*(claimer(f"c{i}") for i in range(8)))
    every = [i for ids in claimed.values() for i in ids]
    assert len(every) == 10000 and len(set(every)) == 10000
    assert sum(1 for ids in claimed.values() if ids) > 1, "claimers should share the work"
    assert await pg.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE state = 'SENT'") == 10000


async def test_abandoned_claim_is_taken_over_after_ttl(pg: asyncpg.Connection) -> None:
    await create_queue(pg, "judge")
    await outbox.submit(pg, "judge", {})
    [first] = await claim(pg, "judge", owner="crashed", ttl=60)
    assert await claim(pg, "judge", owner="other") == []
    # Move the claim's expiry into the past on the DB clock instead of waiting a minute.
    await pg.execute("UPDATE judgequeue.outbox SET next_attempt_at = now() - interval '1 second'")
    [again] = await claim(pg, "judge", owner="other")
    assert again.outbox_id == first.outbox_id and again.attempts == 2
    # The crashed claimer's late mark is fenced out; the new owner's mark lands.
    assert await mark(pg, [outbox.Mark(first.outbox_id, "sent")], owner="crashed") == {}
    assert await mark(pg, [outbox.Mark(first.outbox_id, "sent")], owner="other") == {first.outbox_id: "SENT"}


async def test_claim_ttl_expires_on_the_db_clock(pg: asyncpg.Connection) -> None:
    await create_queue(pg, "judge")
    await outbox.submit(pg, "judge", {})
    await claim(pg, "judge", owner="crashed", ttl=0.2)

    async def taken() -> list[outbox.ClaimedRow]:
        return await claim(pg, "judge", owner="other")

    rows = await eventually(taken, within=5, what="claim takeover")
    assert rows[0].attempts == 2


async def test_backoff_grows_with_jitter_and_max_attempts_gives_dead(pg: asyncpg.Connection) -> None:
    await create_queue(pg, "judge")
    sids = [await outbox.submit(pg, "judge", {"i": i}) for i in range(20)]
    delays: list[list[float]] = []
    for attempt in range(1, 4):
        await pg.execute("UPDATE judgequeue.outbox SET next_attempt_at = now() WHERE state = 'PENDING'")
        rows = await claim(pg, "judge")
        assert len(rows) == 20 and all(r.attempts == attempt for r in rows)
        states = await mark(pg, [outbox.Mark(r.outbox_id, "retry", f"boom {attempt}") for r in rows], max_attempts=3)
        if attempt < 3:
            assert set(states.values()) == {"PENDING"}
            got = await pg.fetch(
                "SELECT extract(epoch FROM next_attempt_at - now())::float8 AS d FROM judgequeue.outbox"
            )
            delays.append([r["d"] for r in got])
        else:
            assert set(states.values()) == {"DEAD"}
    first, second = delays
    # base 1s, equal jitter: attempt 1 in [0.5, 1], attempt 2 in [1, 2]
    assert all(0.45 <= d <= 1.0 for d in first) and all(0.95 <= d <= 2.0 for d in second)
    assert len({round(d, 3) for d in second}) > 1, "jitter spreads retries"
    dead = await pg.fetch("SELECT state, last_error, attempts FROM judgequeue.outbox")
    assert {(r["state"], r["last_error"], r["attempts"]) for r in dead} == {("DEAD", "boom 3", 3)}
    subs = await pg.fetch(
        "SELECT status, verdict->>'reason' AS reason FROM judgequeue.submissions WHERE id = ANY($1)", sids
    )
    assert all(r["status"] == "SYSTEM_ERROR" and "boom 3" in r["reason"] for r in subs)


async def test_release_does_not_count_an_attempt(pg: asyncpg.Connection) -> None:
    await create_queue(pg, "judge")
    await outbox.submit(pg, "judge", {})
    for _ in range(5):
        await pg.execute("UPDATE judgequeue.outbox SET next_attempt_at = now()")
        [row] = await claim(pg, "judge")
        assert await mark(pg, [outbox.Mark(row.outbox_id, "release", "redis down")], max_attempts=2) == {
            row.outbox_id: "PENDING"
        }
    assert await pg.fetchval("SELECT attempts FROM judgequeue.outbox") == 0


async def test_modes_row_by_row_with_a_flip_between_claims(pg: asyncpg.Connection) -> None:
    await create_queue(pg, "judge", mode="shadow")
    await outbox.submit(pg, "judge", {"n": 1})
    [r1] = await claim(pg, "judge")
    assert (r1.state, r1.mode) == ("CLAIMED", "shadow")
    await mark(pg, [outbox.Mark(r1.outbox_id, "shadow_sent")])

    await outbox.submit(pg, "judge", {"n": 2})  # created before the watermark
    watermark = await pg.fetchval("SELECT now()")
    await asyncio.sleep(0.001)  # distinct DB timestamps, not synchronisation
    flags = await set_cutover(pg, "judge", mode="live", watermark=watermark)
    assert flags.config_version == 2
    await outbox.submit(pg, "judge", {"n": 3})  # created after it
    rows = {r.submission_id: r for r in await claim(pg, "judge")}
    states = {sid: (r.state, r.mode) for sid, r in rows.items()}
    assert sorted(states.values()) == [("CLAIMED", "live"), ("SKIPPED", "live")]
    skipped = next(r for r in rows.values() if r.state == "SKIPPED")
    assert (
        await pg.fetchval("SELECT payload->>'n' FROM judgequeue.submissions WHERE id = $1", skipped.submission_id)
    ) == "2"

    await set_cutover(pg, "judge", paused=True)
    await outbox.submit(pg, "judge", {"n": 4})  # submits still commit while paused
    assert await claim(pg, "judge") == []
    await set_cutover(pg, "judge", paused=False)
    [r4] = await claim(pg, "judge")
    assert r4.state == "CLAIMED"

    # Rollback is mode: shadow; the watermark stays.
    flags = await set_cutover(pg, "judge", mode="shadow")
    assert flags.watermark == watermark and flags.mode == "shadow"


async def test_watermark_never_moves_back(pg: asyncpg.Connection) -> None:
    await create_queue(pg, "judge")
    now = await pg.fetchval("SELECT now()")
    await set_cutover(pg, "judge", watermark=now)
    with pytest.raises(WatermarkMovedBack):
        await set_cutover(pg, "judge", watermark=now - timedelta(seconds=1))
    with pytest.raises(WatermarkMovedBack):
        await set_cutover(pg, "judge", watermark=None)
    # the same rule holds for writers that bypass the API
    with pytest.raises(asyncpg.PostgresError):
        await pg.execute("UPDATE judgequeue.queues SET watermark = watermark - interval '1 day'")
    assert (await get_queue(pg, "judge")).watermark == now
    later = await set_cutover(pg, "judge", watermark=now + timedelta(seconds=5))
    assert later.watermark == now + timedelta(seconds=5)


async def test_queue_create_is_idempotent_and_keeps_flags(pg: asyncpg.Connection) -> None:
    first = await create_queue(pg, "judge", mode="shadow")
    assert (first.mode, first.watermark, first.paused) == ("shadow", None, False)
    await set_cutover(pg, "judge", paused=True)
    again = await create_queue(pg, "judge")
    assert again.mode == "shadow" and again.paused
    fresh = await create_queue(pg, "other")
    assert fresh.mode == "live" and fresh.watermark is None
    with pytest.raises(InvalidQueueName):
        await create_queue(pg, "UPPER")


async def test_prune_deletes_old_terminal_rows_in_batches(pg: asyncpg.Connection) -> None:
    await create_queue(pg, "judge")
    await pg.execute("SELECT judgequeue.submit('judge', '{}'::jsonb) FROM generate_series(1, 250)")
    rows = await claim(pg, "judge", limit=200)
    await mark(pg, [outbox.Mark(r.outbox_id, "sent") for r in rows])
    await pg.execute("UPDATE judgequeue.outbox SET sent_at = now() - interval '2 days' WHERE state = 'SENT'")
    assert await outbox.prune(pg, "other", retention=86400, batch=30) == 0, "another queue's retention"
    assert await outbox.prune(pg, "judge", retention=86400, batch=30) == 200
    left = await pg.fetch("SELECT state, count(*) FROM judgequeue.outbox GROUP BY state")
    assert {r["state"]: r["count"] for r in left} == {"PENDING": 50}
    assert await outbox.prune(pg, "judge", retention=86400, batch=30) == 0


async def test_stats(pg: asyncpg.Connection) -> None:
    await create_queue(pg, "judge")
    await pg.execute("SELECT judgequeue.submit('judge', '{}'::jsonb) FROM generate_series(1, 3)")
    rows = await claim(pg, "judge", limit=1)
    await mark(pg, [outbox.Mark(rows[0].outbox_id, "sent")])
    stats = await outbox.stats(pg, "judge")
    assert stats.by_state == {
        "PENDING": 2, "CLAIMED": 0, "SENT": 1, "DEAD": 0, "SKIPPED": 0, "SHADOW_SENT": 0, "CANCELLED": 0
    }
    assert stats.oldest_pending_age >= 0
    cheap = await outbox.stats(pg, "judge", include_terminal=False)
    assert cheap.by_state == {"PENDING": 2, "CLAIMED": 0}


async def test_resend_stranded_only_touches_sent_and_never_leased(pg: asyncpg.Connection) -> None:
    await create_queue(pg, "judge")
    ids = [await outbox.submit(pg, "judge", {"i": i}) for i in range(4)]
    rows = await claim(pg, "judge", limit=4)
    await mark(pg, [outbox.Mark(r.outbox_id, "sent") for r in rows])
    # ids[0]: leased (JUDGING); ids[1]: finished; ids[2]: rejudged (old generation's row is stale);
    # ids[3]: sent and never leased: the only stranded one.
    await pg.execute("UPDATE judgequeue.submissions SET status = 'JUDGING' WHERE id = $1", ids[0])
    await pg.execute("UPDATE judgequeue.submissions SET status = 'ACCEPTED' WHERE id = $1", ids[1])
    await outbox.rejudge(pg, ids[2])
    assert await outbox.resend_stranded(pg, "judge", older_than=3600) == 0, "too recent"
    await pg.execute(
        "UPDATE judgequeue.outbox SET sent_at = sent_at - interval '2 hours';"
        "UPDATE judgequeue.submissions SET created_at = created_at - interval '2 hours'"
    )
    assert await outbox.resend_stranded(pg, "judge", older_than=3600) == 1
    row = await pg.fetchrow("SELECT submission_id, state, last_error FROM judgequeue.outbox WHERE state = 'PENDING'"
                            " AND generation = 1")
    assert row["submission_id"] == ids[3] and "never leased" in row["last_error"]
    assert await outbox.resend_stranded(pg, "judge", older_than=3600) == 0, "re-sent once, not again"
