"""outbox.mark_and_claim: the previous batch's marks and the next claim in one statement.

It must have exactly the effects of ``mark`` then ``claim``: marks fenced on the claim owner, DEAD
ends the submission, and a row being marked is never claimed again by the same statement.
"""

from __future__ import annotations

import asyncpg

from judgequeue.core.store import outbox
from judgequeue.core.store.queues import create_queue
from tests.support.queries import generic_plan

OWNER = "dispatcher-a"
KW = {"owner": OWNER, "retry": outbox.Retry(1, 1.0, 10.0), "queue": "judge", "claim_ttl": 30.0}


async def test_marks_previous_batch_and_claims_the_next(pg: asyncpg.Connection) -> None:
    await create_queue(pg, "judge")
    await pg.execute("SELECT judgequeue.submit('judge', '{}'::jsonb) FROM generate_series(1, 25)")
    first = await outbox.claim(pg, "judge", limit=10, owner=OWNER, claim_ttl=30)
    marks = [outbox.Mark(r.outbox_id, "sent") for r in first[:8]]
    marks.append(outbox.Mark(first[8].outbox_id, "retry", "boom"))  # attempts 1 >= max 1: DEAD
    marks.append(outbox.Mark(first[9].outbox_id, "release"))
    applied, second = await outbox.mark_and_claim(pg, marks, limit=10, **KW)  # type: ignore[arg-type]
    assert [applied[r.outbox_id] for r in first] == ["SENT"] * 8 + ["DEAD", "PENDING"]
    claimed = {r.outbox_id for r in second}
    assert len(second) == 10 and not claimed & {r.outbox_id for r in first}, "marked rows are not claimed again"
    assert all(r.state == "CLAIMED" for r in second)
    dead = await pg.fetchrow(
        "SELECT s.status, s.verdict->>'reason' AS reason FROM judgequeue.submissions s WHERE s.id = $1",
        first[8].submission_id,
    )
    assert dead is not None and dead["status"] == "SYSTEM_ERROR" and "boom" in dead["reason"]
    # The released row comes back after its backoff; the rest are claimed next.
    applied, third = await outbox.mark_and_claim(
        pg,
        [outbox.Mark(r.outbox_id, "sent") for r in second],
        limit=10,
        **KW,  # type: ignore[arg-type]
    )
    assert set(applied.values()) == {"SENT"} and len(third) == 5


async def test_marks_are_fenced_on_the_claim_owner(pg: asyncpg.Connection) -> None:
    await create_queue(pg, "judge")
    await pg.execute("SELECT judgequeue.submit('judge', '{}'::jsonb) FROM generate_series(1, 3)")
    rows = await outbox.claim(pg, "judge", limit=3, owner="someone-else", claim_ttl=30)
    applied, claimed = await outbox.mark_and_claim(
        pg,
        [outbox.Mark(r.outbox_id, "sent") for r in rows],
        limit=10,
        **KW,  # type: ignore[arg-type]
    )
    assert applied == {} and claimed == []
    states = await pg.fetch("SELECT DISTINCT state FROM judgequeue.outbox")
    assert [r["state"] for r in states] == ["CLAIMED"]


async def test_the_generic_plan_reaches_rows_by_key(pg: asyncpg.Connection) -> None:
    """The dispatcher's prepared statement may run on its generic plan, which knows neither the
    LIMIT nor the marks' arrays: it must still mark and claim by key, never scan the outbox."""
    await create_queue(pg, "judge")
    await pg.execute("SELECT judgequeue.submit('judge', '{}'::jsonb) FROM generate_series(1, 5000)")
    await pg.execute("ANALYZE judgequeue.outbox, judgequeue.submissions")
    types = ["bigint[]", "text[]", "text[]", "int", "float8", "float8", "text", "text", "int", "float8", "float8"]
    literals = ["'{1,2}'", "'{sent,retry}'", "'{NULL,boom}'", "3", "1", "10", "'d'", "'judge'", "50", "30", "0"]
    plan = await generic_plan(pg, "outbox_mark_claim", types, literals)
    assert "Seq Scan on outbox" not in plan, plan
