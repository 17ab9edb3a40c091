"""Reserved slots for a queue's first class (docs/design.md, "Priority classes and fair share"),
against real Postgres and Redis: a direct-intake worker of a queue with several classes keeps a few
slots out of its takes and offers them to first-class submits only (``JUDGEQUEUE_RESERVE_PERCENT``,
``worker_offers.max_rank``), so a contest job committed while every other slot is busy with a
bulk rejudge starts at once, without waiting for the worker's next take.

What must hold besides: the lower classes never occupy the reserved slots and still progress in the
others; a reserved offer takes only a first-class job that nothing of its class is ahead of (the
order of the class and its keys is kept); a queue with one class offers and takes exactly as
before.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core.base.classes import JobClass
from judgequeue.core.judges import Verdict
from judgequeue.core.roles.worker import role as worker_role
from judgequeue.core.roles.worker import running as worker_running
from judgequeue.core.roles.worker.direct import DirectIntake, offers
from judgequeue.core.roles.worker.role import Worker
from judgequeue.core.store import outbox
from judgequeue.core.store.queues import set_classes
from tests.support.databases import REDIS_URL
from tests.support.inprocess import running
from tests.support.settings import make_settings
from tests.support.waiting import eventually

CLASSES = (JobClass("contest"), JobClass("rejudge", 5))


class HeldJudge:
    """A judge whose jobs with ``"hold": true`` wait for :attr:`gate`; the others end at once.
    Records each job's tag as it starts, and the most held jobs at once."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.held = 0
        self.most_held = 0
        self.gate = asyncio.Event()

    async def judge(self, payload: Any) -> Verdict:
        self.started.append(payload["i"])
        if payload.get("hold"):
            self.held += 1
            self.most_held = max(self.most_held, self.held)
            try:
                await self.gate.wait()
            finally:
                self.held -= 1
        return Verdict("ACCEPTED", {"i": payload["i"]})


def _worker(pool: asyncpg.Pool, redis: aioredis.Redis, dsn: str, queue: str, judge: Any, **env: str) -> Worker:
    env.setdefault("schedule", "30s")  # offers and notifications, not polls, must do the work
    env.setdefault("grace_period", "1s")
    return Worker(pool, redis, make_settings(dsn, REDIS_URL, queue, intake="direct", **env), judge=judge)


async def _reserved_open(pool: asyncpg.Pool, n: int) -> bool:
    """Whether ``n`` reserved offers are open: fillable by a submit now (unfilled and unexpired), as
    the submit's own lookup sees them; an offer whose refresh is late is in the table but not open."""
    got = await pool.fetchval(
        "SELECT count(*) FROM judgequeue.worker_offers"
        " WHERE submission IS NULL AND max_rank = 0 AND expires_at > clock_timestamp()"
    )
    return bool(got == n)


async def _status(pool: asyncpg.Pool | asyncpg.Connection, sid: int) -> str:
    return str(await pool.fetchval("SELECT status FROM judgequeue.submissions WHERE id = $1", sid))


async def _statuses(pool: asyncpg.Pool, ids: list[int]) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT status, count(*) AS n FROM judgequeue.submissions WHERE id = ANY($1) GROUP BY status", ids
    )
    return {r["status"]: r["n"] for r in rows}


async def _has(pool: asyncpg.Pool, ids: list[int], want: dict[str, int]) -> bool:
    return await _statuses(pool, ids) == want


async def _held_rejudge_backlog(pool: asyncpg.Pool, queue: str, n: int) -> list[int]:
    """Declare the classes and queue ``n`` rejudge jobs that hold their slots until the judge's gate opens."""
    async with pool.acquire() as conn:
        await set_classes(conn, queue, CLASSES)
        return [await outbox.submit(conn, queue, {"i": f"r{i}", "hold": True}, job_class="rejudge") for i in range(n)]


async def _submit_through_reserved_offer(conn: asyncpg.Connection, queue: str, i: str, key: str | None = None) -> int:
    """Submit a contest job and check, before its commit (after it, the job may be judged already),
    that the submit wrote it already leased: it filled a reserved offer."""
    async with conn.transaction():
        sid = await outbox.submit(conn, queue, {"i": i}, job_class="contest", key=key)
        assert await _status(conn, sid) == "JUDGING", "filled a reserved offer in the submit"
    return sid


def test_the_reserve_is_a_share_of_the_slots_rounded_up_and_never_all() -> None:
    assert offers.reserved_slots(64, 12) == 8
    assert offers.reserved_slots(4, 12) == 1
    assert offers.reserved_slots(2, 50) == 1
    assert offers.reserved_slots(1, 50) == 0  # a worker of one slot keeps it for every class
    assert offers.reserved_slots(64, 0) == 0


async def test_a_worker_busy_with_a_rejudge_starts_a_contest_job_through_its_reserved_offer(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """Eight slots, two reserved (25%): a rejudge backlog fills the six others and waits there; the
    two reserved slots stay offered to the contest class alone. A contest submit is written already
    leased to the worker (JUDGING when the submit returns: no take of the worker's stands between
    its commit and its judge), and judged while every rejudge job still holds its slot; the next
    contest job takes the offer again. Rejudge jobs never exceed the six."""
    judge = HeldJudge()
    backlog = await _held_rejudge_backlog(pg_pool, queue, 20)
    w = _worker(pg_pool, redis_client, pg_dsn, queue, judge, concurrency="8", reserve_percent="25")
    direct = w.intake
    assert isinstance(direct, DirectIntake) and direct.reserve == 2
    async with running(w):
        await eventually(lambda: judge.held == 6, what="six rejudge jobs running")
        await eventually(lambda: _reserved_open(pg_pool, 2), what="the two reserved slots offered")
        assert await _statuses(pg_pool, backlog) == {"JUDGING": 6, "PENDING": 14}
        takes = direct.takes_issued
        async with pg_pool.acquire() as conn:
            for k in range(3):
                sid = await _submit_through_reserved_offer(conn, queue, f"c{k}", key="contest-a")
                await eventually(functools.partial(_has, pg_pool, [sid], {"ACCEPTED": 1}), what="judged")
                await eventually(lambda: _reserved_open(pg_pool, 2), what="the reserved offer open again")
        assert judge.held == 6 and judge.most_held == 6, "no rejudge job in a reserved slot"
        assert direct.takes_issued - takes <= 3, "the contest jobs came through offers, not takes"
        judge.gate.set()
        await eventually(lambda: _has(pg_pool, backlog, {"ACCEPTED": 20}), what="the backlog judged")
    assert judge.most_held <= 6
    assert await _reserved_open(pg_pool, 0), "a stopped worker takes its reserved offers back"


async def _reserved_unfilled(pool: asyncpg.Pool) -> int:
    """Reserved offers in the table and not filled, expired or not (a late refresh changes nothing here)."""
    return int(await pool.fetchval(
        "SELECT count(*) FROM judgequeue.worker_offers WHERE submission IS NULL AND max_rank = 0"
    ))  # fmt: skip


async def test_the_reserved_offers_are_topped_up_once_half_are_filled(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """Eight reserved slots (16 at 50%) kept open beside a held rejudge backlog: each contest job
    fills one, and ending does not reopen it while more than half stay open (one offer sync per few
    first-class jobs, not one each); the job that leaves half brings all eight back."""
    judge = HeldJudge()
    backlog = await _held_rejudge_backlog(pg_pool, queue, 12)
    w = _worker(pg_pool, redis_client, pg_dsn, queue, judge, concurrency="16", reserve_percent="50")
    direct = w.intake
    assert isinstance(direct, DirectIntake) and direct.reserve == 8
    async with running(w):
        await eventually(lambda: judge.held == 8, what="eight rejudge jobs running")
        await eventually(lambda: _reserved_open(pg_pool, 8), what="the eight reserved slots offered")
        async with pg_pool.acquire() as conn:
            for k in range(1, 4):
                sid = await _submit_through_reserved_offer(conn, queue, f"c{k}")
                await eventually(functools.partial(_has, pg_pool, [sid], {"ACCEPTED": 1}), what="judged")
                assert await _reserved_unfilled(pg_pool) == 8 - k, "reopened with more than half still open"
            sid = await _submit_through_reserved_offer(conn, queue, "c4")
        await eventually(lambda: _reserved_open(pg_pool, 8), what="all eight offered again once half were filled")
        assert await _has(pg_pool, [sid], {"ACCEPTED": 1})
        judge.gate.set()
        await eventually(lambda: _has(pg_pool, backlog, {"ACCEPTED": 12}), what="the backlog judged")


async def _offers_by_kind(pool: asyncpg.Pool) -> tuple[int, int]:
    """Unfilled offers in the table: (any job's, reserved)."""
    row = await pool.fetchrow(
        "SELECT count(*) FILTER (WHERE max_rank IS DISTINCT FROM 0) AS general,"
        " count(*) FILTER (WHERE max_rank = 0) AS reserved"
        " FROM judgequeue.worker_offers WHERE submission IS NULL"
    )
    assert row is not None
    return int(row["general"]), int(row["reserved"])


async def _offers_are(pool: asyncpg.Pool, want: tuple[int, int]) -> bool:
    return await _offers_by_kind(pool) == want


async def _idle_offers(pool: asyncpg.Pool) -> bool:
    general, reserved = await _offers_by_kind(pool)
    return general > 0 and reserved == 0


async def test_the_reserve_is_open_while_a_backlog_waits_behind_busy_slots_and_closed_once_it_is_drained(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """Reserved offers cost every submit a lookup and every fill a NOTIFY and a verdict written
    alone, so they are open only where a first-class arrival would otherwise wait for a slot. An
    idle worker offers its slots to any job and keeps no reserved offer; a rejudge burst that fills
    those offers and leaves jobs waiting opens the reserve (its slots held by long jobs: no take
    comes to show the backlog); once the backlog is judged, a take that finds fewer rows than its
    room closes it again, and the worker, idle, offers its slots to any job."""
    judge = HeldJudge()
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, CLASSES)
    w = _worker(pg_pool, redis_client, pg_dsn, queue, judge, concurrency="8", reserve_percent="25")
    async with running(w):
        await eventually(lambda: _offers_are(pg_pool, (6, 0)), what="idle: six slots offered, none reserved")
        async with pg_pool.acquire() as conn:
            burst = [await outbox.submit(conn, queue, {"i": f"r{i}", "hold": True}, job_class="rejudge")
                     for i in range(20)]  # fmt: skip
        await eventually(lambda: judge.held == 6, what="the six slots busy with the burst")
        await eventually(lambda: _reserved_open(pg_pool, 2), what="the reserve opened behind the busy slots")
        async with pg_pool.acquire() as conn:
            sid = await outbox.submit(conn, queue, {"i": "c"}, job_class="contest")
        assert await _status(pg_pool, sid) in ("JUDGING", "ACCEPTED"), "the contest job filled a reserved offer"
        judge.gate.set()
        await eventually(functools.partial(_has, pg_pool, [*burst, sid], {"ACCEPTED": 21}), what="all judged")
        # Idle again: its slots offered to any job (topped up once three quarters are filled), none reserved.
        await eventually(lambda: _idle_offers(pg_pool), what="the reserve closed, the idle worker's offers open")


async def test_a_reserved_offer_takes_only_a_first_class_job_nothing_of_its_class_is_ahead_of(
    pg_pool: asyncpg.Pool, queue: str
) -> None:
    """The submit's side, one reserved offer open: a rejudge-class job never fills it; a contest job
    behind a waiting one of its key (or, without a key, behind any waiting keyless one) does not
    either; a contest job of a key with nothing waiting does, beside another key's backlog."""
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, CLASSES)
        await offers.sync(conn, queue, "w-reserved", channel="jq_offers_reserved", lease_ttl=30,
                          open_slots=[4], seen=[], withdraw=False, reserved_from=4)  # fmt: skip
        lower = await outbox.submit(conn, queue, {"i": "r"}, job_class="rejudge")
        # Another contest's burst (key b): only its first job has nothing of its class ahead.
        b = [await outbox.submit(conn, queue, {"i": f"b{i}"}, job_class="contest", key="b") for i in range(3)]
        assert await _status(pg_pool, b[0]) == "JUDGING", "the first of b's burst: nothing ahead of it"
        assert {await _status(pg_pool, sid) for sid in b[1:]} == {"PENDING"}
        # The filled offer opened again (as the worker's next sync does).
        await conn.execute(
            "UPDATE judgequeue.worker_offers SET submission = NULL, attempt = NULL WHERE queue = $1", queue
        )
        keyless = await outbox.submit(conn, queue, {"i": "k0"}, job_class="contest")
        assert await _status(pg_pool, keyless) == "JUDGING", "keyless, none waiting: first in its class"
        await conn.execute(
            "UPDATE judgequeue.worker_offers SET submission = NULL, attempt = NULL WHERE queue = $1", queue
        )
        more_b = await outbox.submit(conn, queue, {"i": "b3"}, job_class="contest", key="b")
        a = await outbox.submit(conn, queue, {"i": "a0"}, job_class="contest", key="a")
        assert await _status(pg_pool, lower) == "PENDING"
        assert await _status(pg_pool, more_b) == "PENDING", "b has jobs waiting ahead of this one"
        assert await _status(pg_pool, a) == "JUDGING", "a had nothing waiting: its turn is the head"
        # A keyless job waiting: the next keyless one is behind it.
        await conn.execute(
            "UPDATE judgequeue.worker_offers SET submission = NULL, attempt = NULL WHERE queue = $1", queue
        )
        await conn.execute(
            "UPDATE judgequeue.worker_offers SET expires_at = now() - interval '1 second' WHERE queue = $1", queue
        )
        waiting = await outbox.submit(conn, queue, {"i": "k1"}, job_class="contest")
        await conn.execute(
            "UPDATE judgequeue.worker_offers SET expires_at = now() + interval '30 seconds' WHERE queue = $1", queue
        )
        behind = await outbox.submit(conn, queue, {"i": "k2"}, job_class="contest")
        assert (await _status(pg_pool, waiting), await _status(pg_pool, behind)) == ("PENDING", "PENDING")


async def test_the_lowest_class_progresses_in_the_slots_the_reserve_leaves(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """A steady contest trickle through the reserved offers and a rejudge backlog: the rejudge is
    judged all the same, in the slots the reserve leaves."""
    judge = HeldJudge()
    judge.gate.set()
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, CLASSES)
        backlog = [await outbox.submit(conn, queue, {"i": f"r{i}"}, job_class="rejudge") for i in range(200)]
    w = _worker(pg_pool, redis_client, pg_dsn, queue, judge, concurrency="4", reserve_percent="25")
    async with running(w):
        async with pg_pool.acquire() as conn:
            contest = [await outbox.submit(conn, queue, {"i": f"c{i}"}, job_class="contest") for i in range(50)]
        await eventually(lambda: _has(pg_pool, backlog + contest, {"ACCEPTED": 250}), within=60,
                         what="everything judged")  # fmt: skip


async def test_a_queue_with_one_class_keeps_no_reserved_slot(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """One class: every slot is the takes' and the ordinary offers' (none with max_rank), as before;
    the busy worker offers nothing."""
    judge = HeldJudge()
    async with pg_pool.acquire() as conn:
        backlog = [await outbox.submit(conn, queue, {"i": f"r{i}", "hold": True}) for i in range(20)]
    w = _worker(pg_pool, redis_client, pg_dsn, queue, judge, concurrency="8", reserve_percent="25")
    async with running(w):
        await eventually(lambda: judge.held == 8, what="every slot taken")
        async with pg_pool.acquire() as conn:
            sid = await outbox.submit(conn, queue, {"i": "c"})
        assert await _status(pg_pool, sid) == "PENDING"
        assert await pg_pool.fetchval("SELECT count(*) FROM judgequeue.worker_offers") == 0
        judge.gate.set()
        await eventually(lambda: _has(pg_pool, [*backlog, sid], {"ACCEPTED": 21}), what="all judged")


async def test_a_first_class_submit_beside_a_burst_reads_no_row_by_a_sequential_scan(
    pg_pool: asyncpg.Pool, queue: str
) -> None:
    """Whether a job is behind others of its class (the reserved offer's rule) is one index probe
    even on an outbox analysed while small: another contest's 2,000 waiting jobs are not read by
    each submit of this one (at 100 submits a second beside a 20,000-job burst that was 2 million
    rows a second)."""
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, CLASSES)
        # An outbox of 50 rows, all handed out (none is ahead of anything), analysed as such.
        await conn.execute("SELECT judgequeue.submit($1, '{}'::jsonb) FROM generate_series(1, 50)", queue)
        await conn.execute("UPDATE judgequeue.outbox SET state = 'SENT' WHERE queue = $1", queue)
        await conn.execute("ANALYZE judgequeue.outbox")
        await offers.sync(conn, queue, "w-reserved", channel="jq_offers_reserved", lease_ttl=30,
                          open_slots=[4], seen=[], withdraw=False, reserved_from=4)  # fmt: skip
        async with conn.transaction():
            await conn.execute(
                "SELECT judgequeue.submit($1, jsonb_build_object('i', g), 'contest', 'b')"
                " FROM generate_series(1, 2000) AS g",
                queue,
            )
            await conn.execute(
                "UPDATE judgequeue.worker_offers SET submission = NULL, attempt = NULL WHERE queue = $1", queue
            )
            read = "SELECT pg_stat_get_xact_tuples_returned('judgequeue.outbox'::regclass)"
            before = await conn.fetchval(read)
            a = await outbox.submit(conn, queue, {"i": "a0"}, job_class="contest", key="a")
            assert await conn.fetchval(read) - before == 0, await conn.fetchval(read) - before
        assert await _status(pg_pool, a) == "JUDGING", "a had nothing waiting: the reserved offer took it"


async def test_a_worker_keeping_reserved_slots_does_not_hold_its_others_for_verdicts_company(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With reserved slots kept free a worker never looks full, so nothing flushed the verdicts of
    its other slots: they waited out the whole linger for company every round (at 56 of 64 slots a
    drain ran at half of one class's speed). A linger of a minute, six slots that takes may fill:
    a backlog of 24 rejudge jobs is judged well inside the test's bound."""
    monkeypatch.setattr(worker_role, "VERDICT_LINGER", 60.0)
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, CLASSES)
        ids = [await outbox.submit(conn, queue, {"i": f"r{i}"}, job_class="rejudge") for i in range(24)]
    w = _worker(pg_pool, redis_client, pg_dsn, queue, HeldJudge(), concurrency="8", reserve_percent="25")
    async with running(w):
        await eventually(functools.partial(_has, pg_pool, ids, {"ACCEPTED": 24}), what="the backlog judged")


class TurnJudge:
    """Ends every job at once, recording the turn of the event loop it started in (a ticker task
    counts the turns: it runs once in each) and whether the worker kept its reserve open then."""

    def __init__(self) -> None:
        self.turn = 0
        self.starts: list[tuple[int, bool]] = []
        self.reserve_open: Any = lambda: False

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.turn += 1

    async def judge(self, payload: Any) -> Verdict:
        self.starts.append((self.turn, bool(self.reserve_open())))
        return Verdict("ACCEPTED", {"i": payload["i"]})


async def test_while_the_reserve_is_open_a_takes_jobs_start_a_few_per_turn_of_the_event_loop(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """A reserved offer's job is started by its fill's notification, which the worker reads between
    turns of its event loop: a take of 56 jobs started in one turn (each judge's first step, the
    whole of a quick judge and its verdict's serialisation) made it wait for all of them. While the
    reserve is open the worker's other jobs start at most
    :data:`~judgequeue.core.roles.worker.running.START_PER_TURN` a turn; every job still runs."""
    judge = TurnJudge()
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, CLASSES)
        await conn.execute(
            "SELECT judgequeue.submit($1, jsonb_build_object('i', g), 'rejudge') FROM generate_series(1, 2000) AS g",
            queue,
        )
    w = _worker(pg_pool, redis_client, pg_dsn, queue, judge, concurrency="64")
    direct = w.intake
    assert isinstance(direct, DirectIntake) and direct.reserve == 8
    judge.reserve_open = direct.reserve_open
    ticker = asyncio.create_task(judge.tick())
    try:
        async with running(w):
            await eventually(lambda: len(judge.starts) >= 2000, within=60, what="the backlog judged")
    finally:
        ticker.cancel()
    per_turn: dict[int, int] = {}
    for turn, reserve_open in judge.starts:
        if reserve_open:
            per_turn[turn] = per_turn.get(turn, 0) + 1
    assert sum(per_turn.values()) > 1000, "the reserve was open while most of the backlog drained"
    assert max(per_turn.values()) <= worker_running.START_PER_TURN, sorted(per_turn.values())[-5:]
