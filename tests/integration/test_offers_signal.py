"""A mode that is off costs nothing: ``judgequeue.submit()`` in a queue without offers.

The queue row says until when a worker's offer may be open there (``queues.offers_until``, kept by
the offers sync, core/store/sql/queries.sql ``offers_sync``); a submit reads it with its queue check and
looks for an offer only before it. Pinned here against real Postgres: what a submit in such a queue
runs and touches (the statements of a submit from before offers), that offers still fill while the
signal stands, how the sync keeps it (at most one write per ``tuning.OFFER_VALIDITY``, never
waiting for the queue row, never a flag change), and that an offer the signal missed is harmless.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Awaitable
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core.judges import Verdict
from judgequeue.core.roles.worker.direct import offers, tuning
from judgequeue.core.roles.worker.role import Worker
from judgequeue.core.store import outbox
from judgequeue.core.store.queues import get_queue
from tests.support.databases import REDIS_URL
from tests.support.inprocess import running
from tests.support.settings import make_settings
from tests.support.waiting import eventually

WORKER = "w-signal"


async def _offer(conn: asyncpg.Connection, queue: str, slots: list[int], **kw: Any) -> offers.Synced:
    kw.setdefault("withdraw", False)
    return await offers.sync(
        conn, queue, WORKER, channel="jq_offers_signal", lease_ttl=30, open_slots=slots, seen=[], **kw
    )


async def _until(conn: asyncpg.Connection | asyncpg.Pool, queue: str) -> Any:
    return await conn.fetchval("SELECT offers_until FROM judgequeue.queues WHERE name = $1", queue)


class Explained:
    """A connection that reports the statements it runs, nested ones (inside SQL functions) too,
    as the text auto_explain logs for each, whitespace collapsed (notices at level NOTICE, which
    reach the client after the statement's answer: markers, not timing, delimit a call's). A
    session's first call of a function plans its statements, which runs the immutable SQL functions
    they call once (constant folding): the tests measure a later call, as a running system makes."""

    START, END = "SELECT 'jq statements start'", "SELECT 'jq statements end'"

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self._texts: list[str] = []
        self._ended = asyncio.Event()

    def heard(self, _conn: object, message: Any) -> None:
        text = str(message.message)
        if "plan:" in text:
            statement = " ".join(json.loads(text.split("plan:", 1)[1])["Query Text"].split())
            self._texts.append(statement)
            if statement == self.END:
                self._ended.set()

    async def statements(self, call: Awaitable[Any]) -> tuple[Any, list[str]]:
        """What ``call`` returned, and the statements it ran (its own top level one last)."""
        self._texts.clear()
        self._ended.clear()
        await self.conn.execute(self.START)
        result = await call
        await self.conn.execute(self.END)
        await asyncio.wait_for(self._ended.wait(), 5)
        texts = self._texts
        return result, texts[texts.index(self.START) + 1 : texts.index(self.END)]


@pytest.fixture
async def explained(pg_dsn: str) -> AsyncIterator[Explained]:
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute("LOAD 'auto_explain'")
        for setting, value in (
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_nested_statements", "on"),
            ("auto_explain.log_format", "json"),
            ("auto_explain.log_level", "notice"),
        ):
            await conn.execute("SELECT set_config($1, $2, false)", setting, value)
        explained = Explained(conn)
        conn.add_log_listener(explained.heard)
        yield explained
    finally:
        await conn.close()


#: The statements of a submit in a queue without offers: those of the release before offers
#: existed, no more (the PL/pgSQL conditions between them are expressions, not statements; the
#: queue check also reads the queue's classes, and the INSERTs write the class and key columns).
STREAM_SUBMIT = [
    "SELECT offers_until > clock_timestamp(), classes FROM judgequeue.queues WHERE name = p_queue",
    "INSERT INTO judgequeue.submissions (queue, payload, job_class, fair_key) "
    "VALUES (p_queue, p_payload, p_class, p_key) RETURNING id",
    "INSERT INTO judgequeue.outbox (queue, submission_id, generation, class_rank, fair_key, fair_seq) "
    "VALUES (p_queue, v_id, 1, v_rank, p_key, v_seq)",
    "SELECT 1 FROM judgequeue.dispatch_waiters WHERE queue = p_queue LIMIT 1",
]

#: Per table, what one such submit does to it: (reads, inserts, updates, deletes).
STREAM_TABLES = {
    "queues": (1, 0, 0, 0),
    "submissions": (0, 1, 0, 0),
    "outbox": (0, 1, 0, 0),
    "dispatch_waiters": (1, 0, 0, 0),
}

_TABLE_STATS = """
    SELECT relname, seq_scan + coalesce(idx_scan, 0), n_tup_ins, n_tup_upd + n_tup_hot_upd, n_tup_del
      FROM pg_stat_xact_user_tables WHERE schemaname = 'judgequeue'"""
_FUNCTION_CALLS = "SELECT funcname, calls FROM pg_stat_xact_user_functions WHERE schemaname = 'judgequeue'"


def _touched(before: list[asyncpg.Record], after: list[asyncpg.Record]) -> dict[str, tuple[int, ...]]:
    """Per table, how its counters moved, for the tables whose counters did. The counters of
    ``pg_stat_xact_*`` also hold earlier transactions' not yet reported (flushed about once a
    second): only the difference is this transaction's."""
    was = {r[0]: tuple(r[1:]) for r in before}
    moved = {r[0]: tuple(a - b for a, b in zip(r[1:], was.get(r[0], (0,) * 4), strict=True)) for r in after}
    return {name: counts for name, counts in moved.items() if any(counts)}


async def test_a_submit_in_a_queue_without_offers_runs_the_statements_of_before_offers(
    explained: Explained, queue: str
) -> None:
    """No worker offers in the queue (the stream intake): the queue check, the two INSERTs, the
    waiters check; worker_offers untouched, no flip interlock, no other function called."""
    conn = explained.conn
    await outbox.submit(conn, queue, {})  # plans the function's statements (see Explained)
    async with conn.transaction():
        # The counters of this transaction alone (pg_stat_xact_*), functions written in PL/pgSQL too.
        await conn.execute("SET LOCAL track_functions = 'all'")
        tables, functions = await conn.fetch(_TABLE_STATS), await conn.fetch(_FUNCTION_CALLS)
        sid, ran = await explained.statements(outbox.submit(conn, queue, {"source": "print(1)"}))
        touched = _touched(tables, await conn.fetch(_TABLE_STATS))
        called = dict(list(r) for r in functions)
        calls = {r[0]: r[1] - called.get(r[0], 0) for r in await conn.fetch(_FUNCTION_CALLS)}
        locks = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'"
        )
    assert touched == STREAM_TABLES
    assert {name: n for name, n in calls.items() if n} == {"submit": 1}
    assert locks == 0
    # The submit's own statement (the top level one) comes last: the nested ones end before it.
    assert ran[:-1] == STREAM_SUBMIT and ran[-1].startswith("SELECT judgequeue.submit(")
    row = await conn.fetchrow("SELECT status, attempt_id FROM judgequeue.submissions WHERE id = $1", sid)
    assert (row["status"], row["attempt_id"]) == ("PENDING", None)


async def test_an_expired_signal_is_read_as_no_offers(explained: Explained, queue: str) -> None:
    """Offers came and went: once offers_until is past, a submit runs the statements of a queue
    that never had offers, and an open offer row left behind (the signal forgot it) stays open,
    unfilled: the submission is PENDING like any other."""
    conn = explained.conn
    await _offer(conn, queue, [0])
    await conn.execute("UPDATE judgequeue.queues SET offers_until = now() - interval '1 second' WHERE name = $1", queue)
    await outbox.submit(conn, queue, {})  # plans the function's statements (see Explained)
    sid, ran = await explained.statements(outbox.submit(conn, queue, {}))
    assert ran[:-1] == STREAM_SUBMIT
    assert await conn.fetchval("SELECT status FROM judgequeue.submissions WHERE id = $1", sid) == "PENDING"
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM judgequeue.worker_offers WHERE submission IS NULL AND expires_at > now()"
        )
        == 1
    )


async def test_offers_fill_while_the_signal_stands(pg_pool: asyncpg.Pool, queue: str) -> None:
    """The sync that opens offers raises the signal in the same statement (no submit can see the
    offers without it); the next submit fills one, the submission id drawn for it. A submit
    outside READ COMMITTED, or after every offer is filled, writes a PENDING row."""
    async with pg_pool.acquire() as conn:
        assert await _until(conn, queue) is None  # a new queue: no worker ever offered in it
        await _offer(conn, queue, [0])
        ahead = await conn.fetchval(
            "SELECT $1::timestamptz - now() FROM judgequeue.queues WHERE name = $2", await _until(conn, queue), queue
        )
        assert timedelta(seconds=2 * tuning.OFFER_VALIDITY - 1) < ahead <= timedelta(seconds=2 * tuning.OFFER_VALIDITY)
        async with conn.transaction(isolation="repeatable_read"):
            held = await outbox.submit(conn, queue, {})
        filled = await outbox.submit(conn, queue, {})
        pending = await outbox.submit(conn, queue, {})
        rows = {
            r["id"]: r["status"]
            for r in await conn.fetch(
                "SELECT id, status FROM judgequeue.submissions WHERE id = ANY($1)", [held, filled, pending]
            )
        }
        offer = await conn.fetchrow("SELECT submission FROM judgequeue.worker_offers")
    assert rows == {held: "PENDING", filled: "JUDGING", pending: "PENDING"}
    assert offer["submission"] == filled
    assert held < filled < pending


async def test_the_sync_keeps_the_signal_with_few_writes_and_never_as_a_flag(pg_pool: asyncpg.Pool, queue: str) -> None:
    """Refreshes while the signal ends more than OFFER_VALIDITY from now leave the queue row alone
    (N workers refreshing every second do not write it N times a second); one due moves it again. A
    withdrawal leaves it while another worker still has an open offer, and ends it (now) once none
    is left, so the submits stop looking for offers as soon as no worker makes them. None of these is
    a flag change: config_version and updated_at stay."""
    async with pg_pool.acquire() as conn:
        flags = await get_queue(conn, queue)
        await _offer(conn, queue, [0, 1])
        first = await _until(conn, queue)
        version = await conn.fetchval("SELECT xmin::text FROM judgequeue.queues WHERE name = $1", queue)
        for slots in ([0, 1], [2]):  # a refresh, a top-up: the signal still covers them
            await _offer(conn, queue, slots, refresh=slots == [0, 1])
        assert await conn.fetchval("SELECT xmin::text FROM judgequeue.queues WHERE name = $1", queue) == version

        other = functools.partial(
            offers.sync, conn, queue, "w-signal-other", channel="jq_offers_other", lease_ttl=30, seen=[]
        )
        await other(open_slots=[0], withdraw=False, refresh=False)
        await _offer(conn, queue, [], withdraw=True)
        assert await _until(conn, queue) == first, "another worker's open offer keeps the signal"
        await other(open_slots=[], withdraw=True)
        ended = await _until(conn, queue)
        assert ended <= await conn.fetchval("SELECT now()")
        sid = await outbox.submit(conn, queue, {})
        assert await conn.fetchval("SELECT status FROM judgequeue.submissions WHERE id = $1", sid) == "PENDING"
        await _offer(conn, queue, [], withdraw=True)  # nothing left to end: the row is not written again
        assert await _until(conn, queue) == ended

        await _offer(conn, queue, [0])  # offers again: the signal is due, and moves
        assert await _until(conn, queue) > first
        # Due again: it would end within OFFER_VALIDITY of now.
        await conn.execute(
            "UPDATE judgequeue.queues SET offers_until = now() + interval '1 second' WHERE name = $1", queue
        )
        due = await _until(conn, queue)
        await _offer(conn, queue, [0], refresh=True)
        assert await _until(conn, queue) > due
        assert await get_queue(conn, queue) == flags


async def test_the_sync_never_waits_for_a_locked_queue_row(pg_dsn: str, queue: str) -> None:
    """A flip (or another worker's write) holding the queue row: the sync writes the offers and
    leaves the signal, without waiting (a lock wait would fail it)."""
    holder, worker = await asyncpg.connect(pg_dsn), await asyncpg.connect(pg_dsn)
    try:
        await worker.execute("SET lock_timeout = '200ms'")
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM judgequeue.queues WHERE name = $1 FOR NO KEY UPDATE", queue)
        synced = await _offer(worker, queue, [0])
        await tx.rollback()
        assert synced.present == {0}
        assert await _until(worker, queue) is None
        await _offer(worker, queue, [0], refresh=True)  # the next one writes it
        assert await _until(worker, queue) is not None
    finally:
        await holder.close()
        await worker.close()


class Accepting:
    async def judge(self, payload: Any) -> Verdict:
        return Verdict("ACCEPTED", {})


async def _judged(pool: asyncpg.Pool, sid: int) -> bool:
    return bool(await pool.fetchval("SELECT status = 'ACCEPTED' FROM judgequeue.submissions WHERE id = $1", sid))


async def test_an_offer_the_signal_missed_strands_nothing(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose only slot is offered while the signal says "no offers" (here every sync of
    its ends the signal in the same transaction): the submit writes a PENDING row, whose
    wake-up makes the worker take the offer back and the row in, as for a rejudge. No poll does it
    (schedule 30 s)."""
    real_sync = offers.sync

    async def forgetful_sync(conn: asyncpg.Connection, queue: str, *args: Any, **kw: Any) -> offers.Synced:
        async with conn.transaction():  # no submit sees the signal between the two
            synced = await real_sync(conn, queue, *args, **kw)
            await conn.execute(
                "UPDATE judgequeue.queues SET offers_until = now() - interval '1 second' WHERE name = $1", queue
            )
        return synced

    monkeypatch.setattr(offers, "sync", forgetful_sync)
    settings = make_settings(
        pg_dsn, REDIS_URL, queue, intake="direct", concurrency="1", offers="1", schedule="30s", grace_period="1s"
    )
    w = Worker(pg_pool, redis_client, settings, judge=Accepting())
    async with running(w):
        await eventually(
            lambda: pg_pool.fetchval("SELECT count(*) = 1 FROM judgequeue.worker_offers WHERE submission IS NULL"),
            what="the one slot offered",
        )
        async with pg_pool.acquire() as conn, conn.transaction():
            # Read as the submit wrote it, before its commit: once committed, its wake-up may bring
            # the worker's take in before a read outside could see it PENDING.
            sid = await outbox.submit(conn, queue, {})
            assert await conn.fetchval("SELECT status FROM judgequeue.submissions WHERE id = $1", sid) == "PENDING"
        await eventually(functools.partial(_judged, pg_pool, sid), within=10, what="judged through a take")
