"""Priority classes and fair share by key, against real Postgres and Redis (docs/design.md,
"Priority classes and fair share"; invariant 8).

Both intakes are checked where the order is decided: the direct take (a worker's own claim) and the
dispatcher's claim, whose batch goes to the stream in the claim's order; and end to end through a
real worker of each intake. Rescues keep the class; a class with a share progresses under an
unbroken higher backlog; keys take turns; bad names are refused with the valid list; a database of
the previous version is upgraded with its queued rows in the default class.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from judgequeue.core import api
from judgequeue.core.base.classes import JobClass, parse_class_list
from judgequeue.core.base.errors import InvalidClass
from judgequeue.core.judges import Verdict
from judgequeue.core.roles.dispatcher import Dispatcher
from judgequeue.core.roles.reaper import Reaper
from judgequeue.core.roles.worker.direct import takes
from judgequeue.core.roles.worker.role import Worker
from judgequeue.core.store import leases, outbox
from judgequeue.core.store.migrate import migrate
from judgequeue.core.store.queues import create_queue, database_now, get_classes, set_classes
from tests.support.databases import REDIS_URL, connection
from tests.support.inprocess import running
from tests.support.revisions import migrate_as, ref_tree
from tests.support.settings import make_settings, stream_settings
from tests.support.waiting import eventually

STRICT = (JobClass("contest"), JobClass("practice", 0), JobClass("rejudge", 0))


class Recorder:
    """A judge that records the order it ran payloads in and accepts each."""

    def __init__(self) -> None:
        self.ran: list[Any] = []

    async def judge(self, payload: Any) -> Verdict:
        self.ran.append(payload["i"])
        return Verdict("ACCEPTED", {})


async def _submit(conn: asyncpg.Connection, queue: str, tags: list[str], **kw: Any) -> list[int]:
    return [await outbox.submit(conn, queue, {"i": t}, **kw) for t in tags]


async def _payloads(conn: asyncpg.Connection, ids: list[int]) -> list[Any]:
    rows = await conn.fetch("SELECT id, payload->>'i' AS i FROM judgequeue.submissions WHERE id = ANY($1)", ids)
    by_id = {r["id"]: r["i"] for r in rows}
    return [by_id[i] for i in ids]


async def test_a_queue_has_one_class_until_it_declares_more(pg_pool: asyncpg.Pool, queue: str) -> None:
    async with pg_pool.acquire() as conn:
        assert await get_classes(conn, queue) == (JobClass("default"),)
        sid = await outbox.submit(conn, queue, {"i": 1})
        assert await outbox.submit(conn, queue, {"i": 2}, job_class="default") == sid + 1
        assert await set_classes(conn, queue, STRICT) is True
        assert await set_classes(conn, queue, STRICT) is False  # unchanged: no write
        assert await get_classes(conn, queue) == STRICT


async def test_the_direct_take_serves_classes_strictly_by_rank(pg_pool: asyncpg.Pool, queue: str) -> None:
    """Rejudge rows queued first, then practice, then contest: a take of k rows gets the contest ones
    first, then practice, and only then the rejudge backlog (each class oldest first)."""
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, STRICT)
        await _submit(conn, queue, [f"r{i}" for i in range(6)], job_class="rejudge")
        await _submit(conn, queue, ["p0", "p1"], job_class="practice")
        await _submit(conn, queue, ["c0", "c1", "c2"], job_class="contest")
        order = []
        for _ in range(4):
            take = await takes.take(conn, queue, "w-1", limit=3, ttl=30)
            order.append(sorted(x.payload["i"] for x in take.leases))
    assert order == [["c0", "c1", "c2"], ["p0", "p1", "r0"], ["r1", "r2", "r3"], ["r4", "r5"]]


async def test_the_dispatcher_claims_by_rank_and_streams_the_batch_in_that_order(
    pg_pool: asyncpg.Pool, queue: str
) -> None:
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, STRICT)
        rejudged = await _submit(conn, queue, ["r0", "r1", "r2"], job_class="rejudge")
        contest = await _submit(conn, queue, ["c0", "c1"])  # no class given: the first
        first = await outbox.claim(conn, queue, limit=3, owner="d-1", claim_ttl=30)
        rest = await outbox.claim(conn, queue, limit=10, owner="d-1", claim_ttl=30)
    assert [r.submission_id for r in first] == [*contest, rejudged[0]]
    assert [r.submission_id for r in rest] == rejudged[1:]
    assert [r.class_rank for r in first] == [0, 0, 2]


@pytest.mark.parametrize("intake", ["direct", "stream"])
async def test_a_worker_judges_the_higher_class_first_on_either_intake(
    pg_pool: asyncpg.Pool, redis_client: aioredis.Redis, pg_dsn: str, queue: str, intake: str
) -> None:
    """End to end through a real worker (one slot) of each intake, and on the stream intake a real
    dispatcher: a backlog of a lower class queued first is judged after the contest's jobs."""
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, STRICT)
        await _submit(conn, queue, [f"r{i}" for i in range(8)], job_class="rejudge")
        await _submit(conn, queue, [f"p{i}" for i in range(3)], job_class="practice")
        ids = await _submit(conn, queue, [f"c{i}" for i in range(4)], job_class="contest")
    recorder = Recorder()
    settings = make_settings(pg_dsn, REDIS_URL, queue, concurrency="1", intake=intake, schedule="50ms")
    roles: list[Any] = [Worker(pg_pool, redis_client, settings, judge=recorder)]
    if intake == "stream":
        roles.append(Dispatcher(pg_pool, redis_client, settings))
    async with running(*roles):
        await eventually(lambda: len(recorder.ran) == 15, within=30, what="every job judged")
    assert recorder.ran == [f"c{i}" for i in range(4)] + [f"p{i}" for i in range(3)] + [f"r{i}" for i in range(8)]
    assert len(ids) == 4


async def test_a_rescued_job_keeps_its_class(pg_pool: asyncpg.Pool, queue: str) -> None:
    """A contest job whose worker died is rescued ahead of the rejudge backlog that was waiting, and a
    rejudged job keeps the class it was rejudged in through its own rescue."""
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, STRICT)
        [contest] = await _submit(conn, queue, ["c0"], job_class="contest")
        lost = await takes.take(conn, queue, "w-dead", limit=1, ttl=0.05)
        assert [x.submission for x in lost.leases] == [contest]
        await _submit(conn, queue, [f"r{i}" for i in range(5)], job_class="rejudge")
        await eventually(lambda: _expired(conn, contest), what="the lease expired")
        sweep = await leases.rescue_expired_leases(conn, queue, max_retries=5)
        assert sweep.requeued == 1
        take = await takes.take(conn, queue, "w-2", limit=1, ttl=30)
        assert [(x.submission, x.generation) for x in take.leases] == [(contest, 2)]
        row = await conn.fetchrow(
            "SELECT class_rank FROM judgequeue.outbox WHERE submission_id = $1 AND generation = 2", contest
        )
        assert row["class_rank"] == 0
        # Rejudged into practice: its class from then on, a rescue of that generation included.
        assert await outbox.rejudge(conn, contest, job_class="practice") == 3
        await conn.execute("UPDATE judgequeue.outbox SET state = 'SENT' WHERE submission_id = $1", contest)
        await conn.execute(
            "UPDATE judgequeue.submissions SET status = 'JUDGING', attempt_id = gen_random_uuid(),"
            " lease_expires_at = now() - interval '1 second' WHERE id = $1",
            contest,
        )
        assert (await leases.rescue_expired_leases(conn, queue, max_retries=5)).requeued == 1
        ranks = await conn.fetch(
            "SELECT generation, class_rank FROM judgequeue.outbox WHERE submission_id = $1 ORDER BY generation",
            contest,
        )
        assert [(r["generation"], r["class_rank"]) for r in ranks] == [(1, 0), (2, 0), (3, 1), (4, 1)]


async def _expired(conn: asyncpg.Connection, sid: int) -> bool:
    return bool(await conn.fetchval("SELECT lease_expires_at < now() FROM judgequeue.submissions WHERE id = $1", sid))


async def test_a_rejudge_defaults_to_the_lowest_class(pg_pool: asyncpg.Pool, queue: str) -> None:
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, STRICT)
        [sid] = await _submit(conn, queue, ["x"])
        assert await api.rejudge(conn, sid) == 2
        row = await conn.fetchrow(
            "SELECT s.job_class, o.class_rank FROM judgequeue.submissions s JOIN judgequeue.outbox o"
            " ON o.submission_id = s.id AND o.generation = s.generation WHERE s.id = $1",
            sid,
        )
        assert (row["job_class"], row["class_rank"]) == ("rejudge", 2)


async def test_the_lowest_class_progresses_under_an_unbroken_higher_backlog(pg_pool: asyncpg.Pool, queue: str) -> None:
    """Bounded starvation: the contest class always has rows waiting, and still the rejudge class
    (share 10%) gets about a tenth of the takes; with share 0 (strict) it gets none."""
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, (JobClass("contest"), JobClass("rejudge", 10)))
        await _submit(conn, queue, [f"r{i}" for i in range(400)], job_class="rejudge")
        await _submit(conn, queue, [f"c{i}" for i in range(450)], job_class="contest")
        got: Counter[str] = Counter()
        first_rejudge = None
        for n in range(400):
            take = await takes.take(conn, queue, "w-1", limit=1, ttl=30)
            [lease] = take.leases
            got[lease.payload["i"][0]] += 1
            if first_rejudge is None and lease.payload["i"].startswith("r"):
                first_rejudge = n
        # 400 takes at p = 0.1: mean 40, standard deviation 6; the bounds are over 3 deviations out.
        assert 20 <= got["r"] <= 62, got
        assert first_rejudge is not None and first_rejudge < 80  # P(later) = 0.9^80 < 0.03%
        await set_classes(conn, queue, (JobClass("contest"), JobClass("rejudge", 0)))
        strict = [(await takes.take(conn, queue, "w-1", limit=1, ttl=30)).leases[0].payload["i"] for _ in range(40)]
        assert all(t.startswith("c") for t in strict)


async def test_shares_count_jobs_whatever_the_size_of_the_claims(pg_pool: asyncpg.Pool, queue: str) -> None:
    """A share is of the jobs: a take of 20 rows with shares 30 and 10 holds exactly 6 practice and
    2 rejudge jobs (20 x 30% and 20 x 10% are whole), every take, while every class has rows waiting;
    a take of 7 holds 2 or 3 practice jobs and 0 or 1 rejudge ones (rounding, at most one off)."""
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, (JobClass("contest"), JobClass("practice", 30), JobClass("rejudge", 10)))
        await _submit(conn, queue, [f"c{i}" for i in range(400)], job_class="contest")
        await _submit(conn, queue, [f"p{i}" for i in range(400)], job_class="practice")
        await _submit(conn, queue, [f"r{i}" for i in range(400)], job_class="rejudge")
        for _ in range(10):
            take = await takes.take(conn, queue, "w-1", limit=20, ttl=30)
            got = Counter(lease.payload["i"][0] for lease in take.leases)
            assert got == Counter({"c": 12, "p": 6, "r": 2}), got
        totals: Counter[str] = Counter()
        for _ in range(40):
            take = await takes.take(conn, queue, "w-1", limit=7, ttl=30)
            got = Counter(lease.payload["i"][0] for lease in take.leases)
            assert len(take.leases) == 7 and got["p"] in (2, 3) and got["r"] in (0, 1), got
            totals += got
        # 280 jobs: 84 practice and 28 rejudge on average, each take's rounding at most one off.
        assert 70 <= totals["p"] <= 98 and 16 <= totals["r"] <= 40, totals


async def test_a_class_that_runs_dry_leaves_its_rows_of_the_claim_to_the_others(
    pg_pool: asyncpg.Pool, queue: str
) -> None:
    """Work-conserving: with 3 rejudge jobs left and a share of 50%, a take of 20 gets those 3 and
    17 contest jobs, and the contest class alone fills a take once no rejudge is left."""
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, (JobClass("contest"), JobClass("rejudge", 50)))
        await _submit(conn, queue, [f"c{i}" for i in range(60)], job_class="contest")
        await _submit(conn, queue, [f"r{i}" for i in range(3)], job_class="rejudge")
        take = await takes.take(conn, queue, "w-1", limit=20, ttl=30)
        assert Counter(lease.payload["i"][0] for lease in take.leases) == Counter({"c": 17, "r": 3})
        take = await takes.take(conn, queue, "w-1", limit=20, ttl=30)
        assert Counter(lease.payload["i"][0] for lease in take.leases) == Counter({"c": 20})


async def _read_by_a_submit_after_a_burst(conn: asyncpg.Connection, queue: str, burst_key: str, relation: str) -> int:
    """In the caller's transaction: 2,000 submits of ``burst_key`` in one statement, then one of key
    ``contest-a``; the entries (an index) or rows by sequential scan (a table) of ``relation`` that
    last submit read."""
    await conn.execute(
        "SELECT judgequeue.submit($1, jsonb_build_object('i', g), NULL, $2) FROM generate_series(1, 2000) AS g",
        queue,
        burst_key,
    )
    read = "SELECT pg_stat_get_xact_tuples_returned($1::regclass)"
    before: int = await conn.fetchval(read, relation)
    await conn.execute("SELECT judgequeue.submit($1, '{}'::jsonb, NULL, 'contest-a')", queue)
    return int(await conn.fetchval(read, relation)) - before


async def test_a_keyed_submit_reads_one_entry_of_its_keys_line_however_long(pg_pool: asyncpg.Pool, queue: str) -> None:
    """fair_seq() reads the key's last waiting entry from the index's end even on a table never
    analysed (a new database): one more submit into a line of 2,000 returns a handful of index
    entries, not the line (a max() was planned as an aggregate over it there, 2,000 entries a
    submit, and a burst slowed its own submits as it grew)."""
    async with pg_pool.acquire() as conn, conn.transaction():
        read = await _read_by_a_submit_after_a_burst(conn, queue, "contest-a", "judgequeue.outbox_fair_key")
        assert read <= 5, read


async def test_a_keyed_burst_on_an_outbox_analysed_while_small_is_not_quadratic(
    pg_pool: asyncpg.Pool, queue: str
) -> None:
    """On an outbox analysed while it was small the planner read fair_seq()'s head (the class's
    lowest waiting turn) by a sequential scan and a sort of every waiting row of the class: a
    contest's start of 10,000 keyed submits in one statement took 33 s, not 0.6 s, and kept the
    offers it filled locked that long. One more submit into such a burst reads no row by a
    sequential scan of the outbox."""
    async with pg_pool.acquire() as conn:
        await conn.execute("SELECT judgequeue.submit($1, '{}'::jsonb) FROM generate_series(1, 50)", queue)
        await conn.execute("ANALYZE judgequeue.outbox")
        async with conn.transaction():
            read = await _read_by_a_submit_after_a_burst(conn, queue, "contest-b", "judgequeue.outbox")
            assert read == 0, read


async def test_keys_take_turns_within_a_class(pg_pool: asyncpg.Pool, queue: str) -> None:
    """Contest a bursts 200 jobs, then contest b submits 5: b's jobs are interleaved with a's next
    ones instead of waiting behind the 200; keys with nothing waiting start at the class's head."""
    async with pg_pool.acquire() as conn:
        a = await _submit(conn, queue, [f"a{i}" for i in range(200)], key="contest-a")
        first = await takes.take(conn, queue, "w-1", limit=20, ttl=30)
        assert sorted(x.submission for x in first.leases) == a[:20]
        b = await _submit(conn, queue, [f"b{i}" for i in range(5)], key="contest-b")
        taken = []
        for _ in range(10):
            taken += [x.payload["i"] for x in (await takes.take(conn, queue, "w-1", limit=1, ttl=30)).leases]
        assert taken == ["a20", "b0", "a21", "b1", "a22", "b2", "a23", "b3", "a24", "b4"]
        assert b  # submitted


async def test_keys_take_turns_on_the_dispatchers_claim(pg_pool: asyncpg.Pool, queue: str) -> None:
    async with pg_pool.acquire() as conn:
        await _submit(conn, queue, [f"a{i}" for i in range(50)], key="a")
        await _submit(conn, queue, [f"b{i}" for i in range(3)], key="b")
        claimed = await outbox.claim(conn, queue, limit=6, owner="d-1", claim_ttl=30)
        tags = await _payloads(conn, [r.submission_id for r in claimed])
    assert tags == ["a0", "b0", "a1", "b1", "a2", "b2"]


async def test_bad_class_names_are_refused_with_the_valid_list(pg_pool: asyncpg.Pool, queue: str) -> None:
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, STRICT)
        [sid] = await _submit(conn, queue, ["x"])
        before = await conn.fetchval("SELECT count(*) FROM judgequeue.outbox")
        valid = r"class 'contets' is not a class of queue .* \(one of contest, practice, rejudge\)"
        with pytest.raises(InvalidClass, match=valid):
            await outbox.submit(conn, queue, {}, job_class="contets")
        with pytest.raises(InvalidClass, match=r"one of contest, practice, rejudge"):
            await api.rejudge(conn, sid, job_class="urgent")
        with pytest.raises(InvalidClass, match=r"one of contest, practice, rejudge"):
            await api.rejudge_many(conn, queue, job_class="urgent", ids=[sid])
        with pytest.raises(InvalidClass, match="at least one of"):
            await api.rejudge_many(conn, queue)
        with pytest.raises(InvalidClass, match="fairness key"):
            await outbox.submit(conn, queue, {}, key="")
        assert await conn.fetchval("SELECT count(*) FROM judgequeue.outbox") == before
        with pytest.raises(InvalidClass, match=r"classes\[1\].name: 'Bad_Name' is not a DNS label"):
            await set_classes(conn, queue, (JobClass("a"), JobClass("Bad_Name")))
        with pytest.raises(InvalidClass, match="declared twice"):
            parse_class_list(["a", "a"])
        with pytest.raises(InvalidClass, match="sum to 120%"):
            parse_class_list(["a", "b:60", "c:60"])
        # The database refuses what Python would (any writer, plain SQL included).
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(
                "UPDATE judgequeue.queues SET classes = '{a,a}', class_shares = '{0,0}' WHERE name = $1", queue
            )


async def test_a_bulk_rejudge_is_one_statement_by_problem_ids_or_time(pg_pool: asyncpg.Pool, queue: str) -> None:
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, STRICT)
        mean = [await outbox.submit(conn, queue, {"problem": "mean", "i": i}) for i in range(5)]
        other = [await outbox.submit(conn, queue, {"problem": "other", "i": i}, key="k") for i in range(3)]
        cut = await database_now(conn)
        late = [await outbox.submit(conn, queue, {"problem": "other", "i": 9})]
        await conn.execute("UPDATE judgequeue.submissions SET status = 'ACCEPTED' WHERE queue = $1", queue)
        got = await api.rejudge_many(conn, queue, problem="mean")
        assert got == [(i, 2) for i in mean]
        got = await api.rejudge_many(conn, queue, job_class="practice", ids=[*other, *late], until=cut)
        assert got == [(i, 2) for i in other]
        got = await api.rejudge_many(conn, queue, since=cut)
        assert got == [(i, 2) for i in late]
        rows = await conn.fetch(
            "SELECT s.id, s.status, s.job_class, o.class_rank, o.fair_seq FROM judgequeue.submissions s"
            " JOIN judgequeue.outbox o ON o.submission_id = s.id AND o.generation = s.generation"
            " WHERE s.queue = $1 ORDER BY s.id",
            queue,
        )
        assert {r["status"] for r in rows} == {"PENDING"}
        assert [(r["job_class"], r["class_rank"]) for r in rows] == (
            [("rejudge", 2)] * 5 + [("practice", 1)] * 3 + [("rejudge", 2)]
        )
        # Keyed rows are numbered in turn within their key (the key's other rows were not waiting).
        assert [r["fair_seq"] for r in rows[5:8]] == [1, 2, 3]


async def test_a_bulk_rejudge_of_ten_thousand_waits_behind_the_contest(pg_pool: asyncpg.Pool, queue: str) -> None:
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, (JobClass("contest"), JobClass("rejudge", 0)))
        await conn.execute(
            "INSERT INTO judgequeue.submissions (queue, payload, status) SELECT $1, jsonb_build_object('problem', 'p'),"
            " 'ACCEPTED' FROM generate_series(1, 10000)",
            queue,
        )
        assert len(await api.rejudge_many(conn, queue, problem="p")) == 10_000
        contest = await _submit(conn, queue, ["c0", "c1"], job_class="contest")
        take = await takes.take(conn, queue, "w-1", limit=2, ttl=30)
        assert sorted(x.submission for x in take.leases) == contest


async def test_a_database_of_the_previous_version_is_upgraded_with_its_queued_rows(fresh_db: str) -> None:
    """The previous release's `judgequeue migrate` made the database and its submit queued rows; this
    version's migrate adds the columns with defaults: those rows are the default class, claimable,
    and the old two-argument submit() still works."""
    await asyncio.to_thread(migrate_as, fresh_db, ref_tree("c0f2fb8"))
    async with connection(fresh_db) as conn:
        await conn.execute("INSERT INTO judgequeue.queues (name) VALUES ('up')")
        old = [await conn.fetchval("SELECT judgequeue.submit('up', $1::jsonb)", f'{{"i": {i}}}') for i in range(3)]
        assert (await migrate(conn))[:2] == [18, 19]  # and any later ones
        assert await get_classes(conn, "up") == (JobClass("default"),)
        ranks = await conn.fetch("SELECT class_rank, fair_seq, fair_key FROM judgequeue.outbox ORDER BY id")
        assert [tuple(r) for r in ranks] == [(0, 0, None)] * 3
        new = await conn.fetchval("SELECT judgequeue.submit('up', '{}'::jsonb)")
        await set_classes(conn, "up", (JobClass("contest"), JobClass("rejudge", 5)))
        take = await takes.take(conn, "up", "w-1", limit=10, ttl=30)
        assert sorted(x.submission for x in take.leases) == [*old, new]


async def test_a_queue_created_after_classes_are_declared_elsewhere_keeps_its_own(pg_pool: asyncpg.Pool) -> None:
    async with pg_pool.acquire() as conn:
        await create_queue(conn, "other-q")
        await create_queue(conn, "own-q")
        await set_classes(conn, "own-q", STRICT)
        assert await get_classes(conn, "other-q") == (JobClass("default"),)
        with pytest.raises(InvalidClass, match=r"one of default\)"):
            await outbox.submit(conn, "other-q", {}, job_class="contest")


async def test_a_bulk_rejudge_wakes_the_registered_waiters(pg_pool: asyncpg.Pool, queue: str) -> None:
    """As a submit does: an idle worker (registered) hears of the rejudged rows at the commit."""
    heard: list[str] = []
    async with pg_pool.acquire() as listener, pg_pool.acquire() as conn:
        await listener.add_listener("judgequeue_wakeup", lambda *a: heard.append(a[3]))
        sid = await outbox.submit(conn, queue, {"problem": "p"})
        await conn.execute("INSERT INTO judgequeue.dispatch_waiters (queue, dispatcher) VALUES ($1, 'w-idle')", queue)
        assert await api.rejudge_many(conn, queue, ids=[sid]) == [(sid, 2)]
        await eventually(lambda: heard == [queue], what="the wake-up notification")


async def test_each_class_backlog_is_shown_and_exported(
    pg_pool: asyncpg.Pool, redis_client: aioredis.Redis, pg_dsn: str, queue: str
) -> None:
    """Per class: its waiting rows and the oldest one's age, as a store read and as the reaper's
    gauges (judgequeue_class_backlog, judgequeue_class_oldest_pending_age_seconds)."""
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, STRICT)
        await _submit(conn, queue, ["r0", "r1", "r2"], job_class="rejudge")
        await _submit(conn, queue, ["c0"])
        backlog = await outbox.class_backlog(conn, queue)
    assert [(b.name, b.rank, b.waiting) for b in backlog] == [("contest", 0, 1), ("practice", 1, 0), ("rejudge", 2, 3)]
    assert backlog[2].age >= backlog[0].age >= 0 and backlog[1].age == 0
    reaper = Reaper(pg_pool, redis_client, stream_settings(pg_dsn, REDIS_URL, queue), name="reaper-classes")
    await reaper.refresh_gauges()
    for name, n in (("contest", 1), ("practice", 0), ("rejudge", 3)):
        assert REGISTRY.get_sample_value("judgequeue_class_backlog", {"queue": queue, "class": name}) == n
    age = REGISTRY.get_sample_value("judgequeue_class_oldest_pending_age_seconds", {"queue": queue, "class": "rejudge"})
    assert age is not None and age >= 0


async def test_a_deferral_a_release_and_a_dispatch_retry_keep_class_and_key(pg_pool: asyncpg.Pool, queue: str) -> None:
    """Every other way a delivery is tried again: a judge's deferral (new generation, due later), a
    graceful release (new generation) and the dispatcher's retry of a failed append (same row)."""
    async with pg_pool.acquire() as conn:
        await set_classes(conn, queue, STRICT)
        [sid] = await _submit(conn, queue, ["p"], job_class="practice", key="c-1")
        [lease] = (await takes.take(conn, queue, "w-1", limit=1, ttl=30)).leases
        assert await leases.defer(conn, lease, delay=0, failed=False, reason="endpoint busy") == 2
        [lease] = (await takes.take(conn, queue, "w-1", limit=1, ttl=30)).leases
        assert lease.generation == 2
        assert await leases.release(conn, [lease]) == [sid]
        claimed = await outbox.claim(conn, queue, limit=1, owner="d-1", claim_ttl=30)
        assert [(r.submission_id, r.generation, r.class_rank) for r in claimed] == [(sid, 3, 1)]
        retry = outbox.Retry(max_attempts=5, backoff_base=0.0, backoff_max=0.0)
        await outbox.mark(conn, [outbox.Mark(claimed[0].outbox_id, "retry", "redis down")], owner="d-1", retry=retry)
        rows = await conn.fetch(
            "SELECT generation, state, class_rank, fair_key, fair_seq > 0 AS keyed FROM judgequeue.outbox"
            " WHERE submission_id = $1 ORDER BY generation",
            sid,
        )
    assert [tuple(r) for r in rows] == [
        (1, "SENT", 1, "c-1", True), (2, "SENT", 1, "c-1", True), (3, "PENDING", 1, "c-1", True)
    ]


async def test_with_direct_intake_a_queue_with_classes_is_served_by_takes_alone(
    pg_pool: asyncpg.Pool, queue: str
) -> None:
    """The dispatcher's hand-off: in a one-class queue it streams live rows the workers left for a
    schedule (as before classes); in a queue with several classes it streams none (the stream is
    read before the outbox and would serve its FIFO ahead of the classes' order and shares)."""
    async with pg_pool.acquire() as conn:
        await _submit(conn, queue, ["d0"])
        await conn.execute("UPDATE judgequeue.outbox SET next_attempt_at = now() - interval '10 seconds'")
        _, one_class = await outbox.mark_and_claim(
            conn, [], owner="d-1", retry=outbox.Retry(5, 1, 1), queue=queue, limit=10, claim_ttl=30, hand_off=1.0
        )
        assert len(one_class) == 1
        await set_classes(conn, queue, STRICT)
        await _submit(conn, queue, ["c0"], job_class="contest")
        await _submit(conn, queue, ["r0"], job_class="rejudge")
        await conn.execute(
            "UPDATE judgequeue.outbox SET next_attempt_at = now() - interval '10 seconds' WHERE state = 'PENDING'"
        )
        _, several = await outbox.mark_and_claim(
            conn, [], owner="d-1", retry=outbox.Retry(5, 1, 1), queue=queue, limit=10, claim_ttl=30, hand_off=1.0
        )
        assert several == []
        take = await takes.take(conn, queue, "w-1", limit=10, ttl=30)
        assert sorted(x.payload["i"] for x in take.leases) == ["c0", "r0"]
