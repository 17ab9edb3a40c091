"""Verdict events (docs/events.md): one event row written in the transaction of every verdict
stored, whatever path stores it; none for a stale or rolled back write; and the feed
(``api.verdict_events``) that gives every event once, in order, across terminated connections
and transactions that commit out of their numbering order."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from judgequeue.core import api
from judgequeue.core.store import events, leases, outbox
from judgequeue.core.store.queues import create_queue

DEADLINE = 60.0


async def _events(conn: asyncpg.Connection, queue: str) -> list[tuple[int, int, str]]:
    return [(e.submission_id, e.generation, e.status) for e in await events.read(conn, events.START, queue=queue)]


async def _judged(conn: asyncpg.Connection, queue: str, sid: int, generation: int, status: str,
                  score: Any = None) -> bool:  # fmt: skip
    """Lease ``sid`` at ``generation`` and store ``status`` through the worker's fenced write."""
    [lease] = await leases.acquire(conn, queue, [(sid, generation)], ttl=30)
    written = await leases.write_verdicts(
        conn, [leases.VerdictWrite(lease, status, {"status": status, "details": {"score": score}})]
    )
    return bool(written)


async def test_every_path_that_stores_a_verdict_writes_one_event(pg: asyncpg.Connection, queue_name: str) -> None:
    await create_queue(pg, queue_name)
    a, b, c, d = [await outbox.submit(pg, queue_name, {"n": i}) for i in range(4)]
    assert await _events(pg, queue_name) == []  # a submit is no verdict
    # A worker's verdict, through the fence, with its score.
    assert await _judged(pg, queue_name, a, 1, "ACCEPTED", score=100)
    # A dead-letter (the reaper giving up on a stream entry) stores an explained SYSTEM_ERROR.
    await pg.fetch("SELECT * FROM judgequeue.record_dead_letters($1, $2, $3)", [b], [1], ["poison"])
    # The lease reaper giving up: an expired lease at maxRetries.
    [lease_c] = await leases.acquire(pg, queue_name, [(c, 1)], ttl=30)
    await pg.execute("UPDATE judgequeue.submissions SET lease_expires_at = now() - interval '1s' WHERE id = $1", c)
    assert await leases.rescue_expired_leases(pg, queue_name, max_retries=1) == leases.LeaseSweep(0, 1)
    # Plain SQL storing a verdict is recorded too (the trigger, not the caller, writes the event).
    await pg.execute("UPDATE judgequeue.submissions SET status = 'WRONG_ANSWER' WHERE id = $1", d)
    got = await events.read(pg, events.START, queue=queue_name)
    assert [(e.submission_id, e.generation, e.status) for e in got] == [
        (a, 1, "ACCEPTED"), (b, 1, "SYSTEM_ERROR"), (c, 1, "SYSTEM_ERROR"), (d, 1, "WRONG_ANSWER")
    ]  # fmt: skip
    assert got[0].score == 100 and got[0].key == f"{queue_name}:{a}:1"
    assert got[1].reason == "poison" and got[2].reason == "gave up after 1 lease expiries"
    assert [e.position for e in got] == sorted(e.position for e in got)
    # The same dead letter recorded again changes nothing and writes nothing.
    await pg.fetch("SELECT * FROM judgequeue.record_dead_letters($1, $2, $3)", [b], [1], ["poison"])
    assert len(await _events(pg, queue_name)) == 4
    assert lease_c.submission == c


async def test_a_delivery_the_dispatcher_gives_up_on_is_an_event(pg: asyncpg.Connection, queue_name: str) -> None:
    await create_queue(pg, queue_name)
    sid = await outbox.submit(pg, queue_name, {})
    [row] = await outbox.claim(pg, queue_name, limit=10, owner="d1", claim_ttl=30)
    retry = outbox.Retry(max_attempts=1, backoff_base=0.1, backoff_max=1.0)
    assert await outbox.mark(pg, [outbox.Mark(row.outbox_id, "retry", "redis down")], owner="d1", retry=retry) == {
        row.outbox_id: "DEAD"
    }
    [event] = await events.read(pg, events.START, queue=queue_name)
    assert (event.submission_id, event.generation, event.status) == (sid, 1, "SYSTEM_ERROR")
    assert event.reason == "dispatch failed after 1 attempts: redis down"


async def test_rejudge_fences_and_only_verdicts_are_events(pg: asyncpg.Connection, queue_name: str) -> None:
    await create_queue(pg, queue_name)
    sid = await outbox.submit(pg, queue_name, {})
    [stale] = await leases.acquire(pg, queue_name, [(sid, 1)], ttl=30)
    assert await leases.renew(pg, [stale], ttl=30)  # a heartbeat is no event
    async with pg.transaction():
        assert await outbox.rejudge(pg, sid) == 2  # no verdict yet: nothing to announce
    # The old attempt's verdict is stale: fenced out, no event.
    assert not await leases.write_verdicts(pg, [leases.VerdictWrite(stale, "ACCEPTED", {"status": "ACCEPTED"})])
    assert await _events(pg, queue_name) == []
    # A release (a new generation of the same request) is no event either.
    [lease2] = await leases.acquire(pg, queue_name, [(sid, 2)], ttl=30)
    assert await leases.release(pg, [lease2]) == [sid]
    assert await _events(pg, queue_name) == []
    # A verdict rolled back never happened.
    tx = pg.transaction()
    await tx.start()
    assert await _judged(pg, queue_name, sid, 3, "ACCEPTED")
    await tx.rollback()
    assert await _events(pg, queue_name) == []
    assert await _judged(pg, queue_name, sid, 3, "WRONG_ANSWER")
    async with pg.transaction():
        assert await outbox.rejudge(pg, sid) == 4
    assert await _judged(pg, queue_name, sid, 4, "ACCEPTED")
    assert await _events(pg, queue_name) == [(sid, 3, "WRONG_ANSWER"), (sid, 4, "ACCEPTED")]


async def test_a_late_commit_is_never_jumped_over(pg_dsn: str, queue_name: str) -> None:
    """Transaction A takes its event id first and commits last: a reader that saw B's event still gets A's."""
    first, second, reader = [await asyncpg.connect(pg_dsn) for _ in range(3)]
    try:
        await create_queue(first, queue_name)
        sa, sb = [await outbox.submit(first, queue_name, {}) for _ in range(2)]
        tx_a = first.transaction()
        await tx_a.start()
        assert await _judged(first, queue_name, sa, 1, "ACCEPTED")  # A: xid and event first, open
        assert await _judged(second, queue_name, sb, 1, "WRONG_ANSWER")  # B commits
        # B's event is held while A runs: a reader is told so, and given nothing to move past A.
        assert await events.read(reader, events.START, queue=queue_name) == []
        assert await events.held(reader, queue=queue_name)
        await tx_a.commit()
        got = await events.read(reader, events.START, queue=queue_name)
        assert {e.submission_id for e in got} == {sa, sb}
        assert not await events.held(reader, queue=queue_name)
    finally:
        for conn in (first, second, reader):
            await conn.close()


async def _collect(feed: AsyncIterator[events.VerdictEvent], into: list[events.VerdictEvent]) -> None:
    async for event in feed:
        into.append(event)


async def _until(check: Any, what: str, deadline: float = DEADLINE) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not check():
        if loop.time() > end:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_the_feed_gives_every_event_once_across_terminated_connections(
    pg_dsn: str, pg_pool: asyncpg.Pool, queue_name: str
) -> None:
    """Writers store verdicts and rejudge them in overlapping transactions (some held open while
    others commit) while the feed's connection is terminated again and again: the feed gives each
    event exactly once, each submission's in generation order, ending at the last generation's."""
    async with pg_pool.acquire() as conn:
        await create_queue(conn, queue_name)
        ids = [await outbox.submit(conn, queue_name, {"n": i}) for i in range(40)]
    received: list[events.VerdictEvent] = []
    feed = api.verdict_events(pg_dsn, queue=queue_name)
    reader = asyncio.ensure_future(_collect(feed, received))
    rounds = 3
    expected: dict[tuple[int, int], str] = {}

    async def writer(part: list[int]) -> None:
        rng = random.Random(part[0])
        for generation in range(1, rounds + 1):
            for sid in part:
                status = rng.choice(["ACCEPTED", "WRONG_ANSWER", "TIME_LIMIT"])
                async with pg_pool.acquire() as conn, conn.transaction():
                    assert await _judged(conn, queue_name, sid, generation, status)
                    if rng.random() < 0.3:
                        await asyncio.sleep(rng.uniform(0, 0.05))  # held open while others commit
                expected[(sid, generation)] = status
                if generation < rounds:
                    async with pg_pool.acquire() as conn, conn.transaction():
                        await outbox.rejudge(conn, sid)

    kills = 0

    async def killer() -> None:
        nonlocal kills
        async with pg_pool.acquire() as conn:
            while True:
                killed = await conn.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND query LIKE '%q_events_%' AND query NOT LIKE '%pg_stat_activity%'"  # the feed's statements
                )
                kills += killed
                await asyncio.sleep(0.05)

    killing = asyncio.ensure_future(killer())
    try:
        await asyncio.gather(*(writer(ids[i::4]) for i in range(4)))
        await _until(lambda: kills >= 3, "the feed's connection to be terminated a few times")
        killing.cancel()
        await _until(lambda: len(received) >= len(expected), "every event")
        await asyncio.sleep(0.3)  # and nothing more comes
    finally:
        killing.cancel()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await feed.aclose()  # type: ignore[attr-defined]
    keys = [(e.submission_id, e.generation) for e in received]
    assert len(keys) == len(set(keys)), "an event given twice"
    assert {k: e.status for k, e in zip(keys, received, strict=True)} == expected
    for sid in ids:
        assert [g for s, g in keys if s == sid] == list(range(1, rounds + 1))
    positions = [e.position for e in received]
    assert positions == sorted(positions)


async def test_a_feed_resumes_from_a_position_and_head_skips_the_past(pg_dsn: str, queue_name: str) -> None:
    conn = await asyncpg.connect(pg_dsn)
    try:
        await create_queue(conn, queue_name)
        ids = [await outbox.submit(conn, queue_name, {}) for _ in range(4)]
        for sid in ids[:2]:
            assert await _judged(conn, queue_name, sid, 1, "ACCEPTED")
        head = await api.events_head(conn)
        got: list[events.VerdictEvent] = []
        feed = api.verdict_events(pg_dsn, queue=queue_name)
        async for event in feed:
            got.append(event)
            if len(got) == 1:
                break
        await feed.aclose()  # type: ignore[attr-defined]
        # A restarted application passes the position of the last event it applied (as text here).
        rest = api.verdict_events(pg_dsn, after=str(got[0].position), queue=queue_name)
        second = await anext(rest)
        await rest.aclose()  # type: ignore[attr-defined]
        assert (got[0].submission_id, second.submission_id) == (ids[0], ids[1])
        for sid in ids[2:]:
            assert await _judged(conn, queue_name, sid, 1, "WRONG_ANSWER")
        later = api.verdict_events(pg_dsn, after=head, queue=queue_name)
        assert [(await anext(later)).submission_id for _ in range(2)] == ids[2:]
        await later.aclose()  # type: ignore[attr-defined]
    finally:
        await conn.close()


def test_a_bad_position_is_refused_naming_it() -> None:
    with pytest.raises(api.InvalidPosition, match="'12x'"):
        api.verdict_events("postgresql://unused", after="12x")
    assert events.Position.parse("812-4031") == events.Position(812, 4031)
    assert str(events.Position(812, 4031)) == "812-4031"


async def test_events_are_pruned_with_the_verdicts_retention(pg: asyncpg.Connection, queue_name: str) -> None:
    await create_queue(pg, queue_name)
    sid = await outbox.submit(pg, queue_name, {})
    assert await _judged(pg, queue_name, sid, 1, "ACCEPTED")
    other = f"{queue_name}-o"
    await create_queue(pg, other)
    oid = await outbox.submit(pg, other, {})
    assert await _judged(pg, other, oid, 1, "ACCEPTED")
    assert await events.prune(pg, queue_name, retention=3600) == 0
    await pg.execute("UPDATE judgequeue.verdict_events SET created_at = now() - interval '2 hours'")
    assert await events.prune(pg, queue_name, retention=3600) == 1
    assert await _events(pg, queue_name) == []
    assert len(await _events(pg, other)) == 1  # another queue's retention is its own


def test_events_tail_prints_the_events_and_where_to_go_on(
    pg_dsn: str, queue_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from judgequeue.core.cli import main

    async def judge_two() -> list[int]:
        conn = await asyncpg.connect(pg_dsn)
        try:
            await create_queue(conn, queue_name)
            ids = [await outbox.submit(conn, queue_name, {}) for _ in range(2)]
            assert await _judged(conn, queue_name, ids[0], 1, "ACCEPTED", score=7)
            await conn.fetch("SELECT * FROM judgequeue.record_dead_letters($1, $2, $3)", [ids[1]], [1], ["poison"])
            return ids
        finally:
            await conn.close()

    a, b = asyncio.run(judge_two())
    assert main(["events", "tail", "--postgres-dsn", pg_dsn, "--queue", queue_name]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 2
    assert f"submission={a} generation=1  ACCEPTED score=7" in lines[0]
    assert f"submission={b} generation=1  SYSTEM_ERROR  poison" in lines[1]
    position = lines[1].split()[0]
    assert err.strip() == f"next: --after {position}"
    assert main(["events", "tail", "--postgres-dsn", pg_dsn, "--after", position, "--json"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"next: --after {position}"
    assert main(["events", "tail", "--postgres-dsn", pg_dsn, "--after", lines[0].split()[0], "--json"]) == 0
    [event] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (event["submission"], event["status"], event["reason"]) == (b, "SYSTEM_ERROR", "poison")
    assert main(["events", "tail", "--postgres-dsn", pg_dsn, "--after", "soon"]) == 2
    assert "--after: event position 'soon'" in capsys.readouterr().err
