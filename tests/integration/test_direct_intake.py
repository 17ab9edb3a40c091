"""Direct intake (``JUDGEQUEUE_INTAKE=direct``) against real Postgres and Redis: a worker leases ready
outbox rows itself; the dispatcher sends only what no worker took within the hand-off.

The invariants of docs/design.md §9 hold on this path too: one lease per row whatever the
concurrency, the queue's flags read in the take's own statement, a dead worker's lease rescued by
the reaper and its late verdict fenced out. ``tests/process/test_chaos.py`` kills real processes
running it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core.judges import Verdict
from judgequeue.core.judges.builtin import SleepJudge
from judgequeue.core.roles.dispatcher import Dispatcher
from judgequeue.core.roles.worker.direct import DirectIntake, takes, tuning
from judgequeue.core.roles.worker.role import Worker
from judgequeue.core.store import leases, outbox, sql
from judgequeue.core.store.privileges import ROLES
from judgequeue.core.store.queues import database_now, set_cutover
from judgequeue.core.transport import streams
from tests.support.databases import REDIS_URL
from tests.support.inprocess import GateJudge, running
from tests.support.queries import generic_plan
from tests.support.settings import make_settings
from tests.support.waiting import eventually


class Recorder:
    """A judge that records what it ran and accepts it."""

    def __init__(self) -> None:
        self.ran: list[Any] = []

    async def judge(self, payload: Any) -> Verdict:
        self.ran.append(payload["i"])
        return Verdict("ACCEPTED", {"i": payload["i"]})


async def _submit(pool: asyncpg.Pool, queue: str, n: int, start: int = 0) -> list[int]:
    async with pool.acquire() as conn:
        return [await outbox.submit(conn, queue, {"i": i}) for i in range(start, start + n)]


async def _statuses(pool: asyncpg.Pool, ids: list[int]) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT status, count(*) AS n FROM judgequeue.submissions WHERE id = ANY($1) GROUP BY status", ids
    )
    return {r["status"]: r["n"] for r in rows}




async def test_take_leases_marks_sent_and_returns_payloads(pg_pool: asyncpg.Pool, queue: str) -> None:
    ids = await _submit(pg_pool, queue, 5)
    async with pg_pool.acquire() as conn:
        take = await takes.take(conn, queue, "w-1", limit=3, ttl=30)
    assert [x.submission for x in take.leases] == ids[:3]  # oldest first
    assert [x.payload for x in take.leases] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert take.stale == [] and take.skipped == 0
    rows = await pg_pool.fetch(
        "SELECT o.submission_id, o.state, o.claimed_by, o.sent_at IS NOT NULL AS sent, s.status, s.attempt_id"
        " FROM judgequeue.outbox o JOIN judgequeue.submissions s ON s.id = o.submission_id ORDER BY o.id"
    )
    assert [(r["state"], r["claimed_by"], r["sent"], r["status"]) for r in rows[:3]] == [
        ("SENT", "w-1", True, "JUDGING")
    ] * 3
    assert {r["attempt_id"] for r in rows[:3]} == {x.attempt for x in take.leases}
    assert [(r["state"], r["status"]) for r in rows[3:]] == [("PENDING", "PENDING")] * 2


async def test_concurrent_takes_never_lease_a_row_twice(pg_dsn: str, queue: str, pg_pool: asyncpg.Pool) -> None:
    ids = await _submit(pg_pool, queue, 300)
    conns = [await asyncpg.connect(pg_dsn) for _ in range(6)]
    taken: list[int] = []

    async def taker(conn: asyncpg.Connection, k: int) -> None:
        while True:
            take = await takes.take(conn, queue, f"w-{k}", limit=7, ttl=30)
            if not take.rows:
                return
            taken.extend(x.submission for x in take.leases)

    try:
        await asyncio.gather(*(taker(c, k) for k, c in enumerate(conns)))
    finally:
        for c in conns:
            await c.close()
    assert sorted(taken) == ids  # every row once, none twice
    assert await _statuses(pg_pool, ids) == {"JUDGING": 300}


async def test_take_reads_the_queues_flags_in_its_own_statement(pg_pool: asyncpg.Pool, queue: str) -> None:
    async with pg_pool.acquire() as conn:
        await set_cutover(conn, queue, paused=True)
    before = await _submit(pg_pool, queue, 2)
    async with pg_pool.acquire() as conn:
        paused = await takes.take(conn, queue, "w", limit=10, ttl=30)
        assert (paused.rows, paused.live) == (0, False)
        await set_cutover(conn, queue, paused=False, mode="shadow")
        shadow = await takes.take(conn, queue, "w", limit=10, ttl=30)
        assert (shadow.rows, shadow.live) == (0, False)  # shadow rows are the dispatcher's
        watermark = await database_now(conn) + timedelta(microseconds=1)
        await set_cutover(conn, queue, mode="live", watermark=watermark)
    after = await _submit(pg_pool, queue, 1, start=2)
    async with pg_pool.acquire() as conn:
        take = await takes.take(conn, queue, "w", limit=10, ttl=30)
    # Rows created before the watermark were the legacy path's: SKIPPED, never leased (invariant 4).
    assert take.skipped == 2 and [x.submission for x in take.leases] == after
    states = await pg_pool.fetch("SELECT submission_id, state FROM judgequeue.outbox ORDER BY id")
    assert [r["state"] for r in states] == ["SKIPPED", "SKIPPED", "SENT"]
    assert await _statuses(pg_pool, before) == {"PENDING": 2}


async def test_a_row_whose_submission_moved_on_is_marked_and_counted_stale(pg_pool: asyncpg.Pool, queue: str) -> None:
    [sid] = await _submit(pg_pool, queue, 1)
    async with pg_pool.acquire() as conn:
        await outbox.rejudge(conn, sid)  # generation 2 and its own outbox row; generation 1's row is stale
        take = await takes.take(conn, queue, "w", limit=10, ttl=30)
    assert take.stale == [(sid, 1)]
    assert [(x.submission, x.generation) for x in take.leases] == [(sid, 2)]


async def test_a_dead_workers_lease_is_rescued_and_its_verdict_fenced(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """A worker takes a row and dies: the reaper's rescue gives it a new generation, a live direct
    worker judges it once, and the dead attempt's late verdict is refused (invariants 1 and 2)."""
    [sid] = await _submit(pg_pool, queue, 1)
    async with pg_pool.acquire() as conn:
        [dead] = (await takes.take(conn, queue, "dead-worker", limit=1, ttl=0.2)).leases
        await eventually(lambda: _expired(pg_pool, sid), what="the dead worker's lease expired on the database clock")
        assert (await leases.rescue_expired_leases(conn, queue, max_retries=3)).requeued == 1
    settings = make_settings(pg_dsn, REDIS_URL, queue, intake="direct", schedule="30s")
    judge = Recorder()
    async with running(Worker(pg_pool, redis_client, settings, judge=judge)):
        await eventually(lambda: _is(pg_pool, sid, "ACCEPTED"), what="the rescued generation judged")
    async with pg_pool.acquire() as conn:
        late = leases.VerdictWrite(dead, "WRONG_ANSWER", {"status": "WRONG_ANSWER"})
        assert await leases.write_verdicts(conn, [late]) == {}  # fenced: the stale attempt writes nothing
        row = await conn.fetchrow("SELECT status, generation, verdict FROM judgequeue.submissions WHERE id = $1", sid)
    assert (row["status"], row["generation"]) == ("ACCEPTED", 2)
    assert json.loads(row["verdict"])["generation"] == 2 and judge.ran == [0]


async def _expired(pool: asyncpg.Pool, sid: int) -> bool:
    return bool(await pool.fetchval("SELECT lease_expires_at < now() FROM judgequeue.submissions WHERE id = $1", sid))


async def _is(pool: asyncpg.Pool, sid: int, status: str) -> bool:
    return bool(await pool.fetchval("SELECT status = $2 FROM judgequeue.submissions WHERE id = $1", sid, status))


async def test_direct_workers_judge_everything_without_the_stream(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """Roles running direct intake: submits wake the workers, which judge every job; the dispatcher
    (hand-off of a 30 s schedule) sends nothing, and Redis never sees an entry."""
    settings = make_settings(pg_dsn, REDIS_URL, queue, intake="direct", schedule="30s", concurrency="3")
    workers = [Worker(pg_pool, redis_client, settings, judge=SleepJudge()) for _ in range(2)]
    async with running(Dispatcher(pg_pool, redis_client, settings), *workers):
        await eventually(lambda: _waiters(pg_pool, 2), what="both idle workers registered as waiters")
        ids: list[int] = []
        for k in range(4):  # trickles, each after the workers went back to sleep
            ids += await _submit(pg_pool, queue, 5, start=5 * k)
            await eventually(functools.partial(_all_done, pg_pool, list(ids)), within=10, what=f"trickle {k} judged")
    assert await _statuses(pg_pool, ids) == {"ACCEPTED": 20}
    assert sum(w.stats.leased for w in workers) == 20
    assert await redis_client.xlen(streams.stream_key(queue)) == 0
    info: Any = await redis_client.xinfo_stream(streams.stream_key(queue))
    assert info["entries-added"] == 0
    claimed_by = await pg_pool.fetch("SELECT DISTINCT claimed_by FROM judgequeue.outbox")
    assert {r["claimed_by"] for r in claimed_by} <= {w.name for w in workers}
    assert await _waiters(pg_pool, 0)  # stopped workers unregister


async def _waiters(pool: asyncpg.Pool, n: int) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM judgequeue.dispatch_waiters") == n)


async def _all_done(pool: asyncpg.Pool, ids: list[int]) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT count(*) FROM judgequeue.submissions WHERE id = ANY($1) AND finished_at IS NOT NULL", ids
        )
        == len(ids)
    )


async def test_rows_no_worker_takes_go_through_the_stream_after_the_hand_off(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """With no worker running, the dispatcher leaves a live row for one schedule, then sends it; a
    direct worker started later finds it in the stream (its outbox is empty) and judges it. Shadow
    rows are not held back."""
    settings = make_settings(pg_dsn, REDIS_URL, queue, intake="direct", schedule="300ms")
    dispatcher = Dispatcher(pg_pool, redis_client, settings)
    [sid] = await _submit(pg_pool, queue, 1)
    assert (await dispatcher.cycle()).claimed == 0  # still the workers' to take
    async with running(dispatcher):
        await eventually(lambda: _stream_has(redis_client, queue, 1), within=5, what="the row sent after the hand-off")
    judge = Recorder()
    worker = Worker(pg_pool, redis_client, settings, judge=judge)
    async with running(worker):
        await eventually(lambda: _is(pg_pool, sid, "ACCEPTED"), what="judged from the stream")
        await eventually(lambda: _pending(redis_client, queue, 0), what="the entry acked")
    assert judge.ran == [0] and worker.stats.leased == 1

    async with pg_pool.acquire() as conn:
        await set_cutover(conn, queue, mode="shadow")
    await _submit(pg_pool, queue, 1, start=1)
    result = await dispatcher.cycle()
    assert result.by_result == {"shadow_sent": 1}  # at once


async def _stream_has(client: aioredis.Redis, queue: str, n: int) -> bool:
    return bool(await client.xlen(streams.stream_key(queue)) == n)


async def _pending(client: aioredis.Redis, queue: str, n: int) -> bool:
    pending: Any = await client.xpending(streams.stream_key(queue), streams.GROUP)
    return bool(pending["pending"] == n)


async def test_an_idle_direct_worker_is_woken_by_the_submit(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """The wake-up is the submit's notification, not the poll: with a 30 s schedule a job committed
    after the worker went to sleep is still judged at once."""
    settings = make_settings(pg_dsn, REDIS_URL, queue, intake="direct", schedule="30s")
    judge = Recorder()
    async with running(Worker(pg_pool, redis_client, settings, judge=judge)):
        await eventually(lambda: _waiters(pg_pool, 1), what="the worker registered")
        [sid] = await _submit(pg_pool, queue, 1)
        await eventually(lambda: _is(pg_pool, sid, "ACCEPTED"), within=5, what="judged without waiting for the poll")
    assert judge.ran == [0]


def test_an_unknown_intake_is_one_clear_error() -> None:
    from judgequeue.core.base.errors import ConfigError
    from judgequeue.core.config import load_settings

    env = {
        "JUDGEQUEUE_POSTGRES_DSN": "postgresql://u@h/db",
        "JUDGEQUEUE_REDIS_URL": "redis://h:6379/0",
        "JUDGEQUEUE_QUEUE": "q",
        "JUDGEQUEUE_INTAKE": "fast",
    }
    with pytest.raises(ConfigError, match="JUDGEQUEUE_INTAKE") as err:
        load_settings(env)
    assert "stream" in str(err.value) and "direct" in str(err.value)




async def test_a_full_worker_unregisters_so_submits_stop_notifying(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """Registered while idle; taking its last free slot unregisters it (a registered waiter makes
    every submit send a NOTIFY, which serialises commits); free again and idle, it registers."""
    settings = make_settings(pg_dsn, REDIS_URL, queue, intake="direct", schedule="30s", concurrency="1")
    judge = GateJudge()
    async with running(Worker(pg_pool, redis_client, settings, judge=judge)):
        await eventually(lambda: _waiters(pg_pool, 1), what="the idle worker registered")
        [sid] = await _submit(pg_pool, queue, 1)
        await eventually(lambda: judge.started == [0], what="the job taken")
        await eventually(lambda: _waiters(pg_pool, 0), what="the full worker unregistered")
        judge.gate.set()
        await eventually(lambda: _is(pg_pool, sid, "ACCEPTED"))
        await eventually(lambda: _waiters(pg_pool, 1), what="idle again: registered")


async def test_a_worker_with_a_backlog_never_registers(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """While takes keep finding rows the worker loops unregistered: no submit pays a NOTIFY at a busy
    queue. It registers only once a take finds nothing (the outbox is empty)."""
    async with pg_pool.acquire() as conn:
        ids = [await outbox.submit(conn, queue, {"i": i, "seconds": 0.02}) for i in range(30)]
    settings = make_settings(pg_dsn, REDIS_URL, queue, intake="direct", schedule="30s", concurrency="2")
    samples: list[tuple[int, int]] = []
    async with running(Worker(pg_pool, redis_client, settings, judge=SleepJudge())):
        while not await _all_done(pg_pool, ids):
            row = await pg_pool.fetchrow(
                "SELECT (SELECT count(*) FROM judgequeue.outbox WHERE state = 'PENDING') AS ready,"
                " (SELECT count(*) FROM judgequeue.dispatch_waiters) AS waiters"
            )
            samples.append((row["ready"], row["waiters"]))
            await asyncio.sleep(0.005)  # sampling interval of the observation, not synchronisation
        await eventually(lambda: _waiters(pg_pool, 1), what="registered once the outbox is empty")
    while_ready = [waiters for ready, waiters in samples if ready > 0]
    assert len(while_ready) > 10 and set(while_ready) == {0}, samples


async def test_a_busy_worker_paces_its_takes_so_each_brings_several_rows(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While rows keep arriving (takes in a row find rows and leave slots free) the worker waits
    TAKE_PACE between takes, so each take brings what came meanwhile instead of a statement per row
    or two. A long pace makes that visible whatever the machine's speed; without it the takes
    would keep up with one submitting connection at about a row each."""
    monkeypatch.setattr(tuning, "TAKE_PACE", 0.25)
    monkeypatch.setattr(tuning, "PACE_TAKES_ABOVE", 1.0)  # one connection's submits count as fast here
    settings = make_settings(pg_dsn, REDIS_URL, queue, intake="direct", schedule="30s", concurrency="1000", offers="0")
    w = Worker(pg_pool, redis_client, settings, judge=Recorder())
    done_submitting = asyncio.Event()
    ids: list[int] = []

    async def submit_until_told() -> None:
        async with pg_pool.acquire() as conn:
            while not done_submitting.is_set():
                ids.append(await outbox.submit(conn, queue, {"i": len(ids)}))

    async with running(w):
        submitter = asyncio.ensure_future(submit_until_told())
        await eventually(lambda: w.stats.leased >= 200, within=60, what="200 jobs taken while submits flow")
        done_submitting.set()
        await submitter
        await eventually(functools.partial(_all_done, pg_pool, ids), within=30, what="every job judged")
    assert w.stats.leased == len(ids)
    assert isinstance(w.intake, DirectIntake) and w.stats.leased >= 5 * w.intake.takes_issued, w.stats


async def test_direct_intake_judges_with_redis_unreachable(pg_pool: asyncpg.Pool, pg_dsn: str, queue: str) -> None:
    """Only the stream's part needs Redis: with nothing listening at the Redis address the worker
    says so and keeps judging from the outbox."""
    dead = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5, socket_timeout=0.5)
    settings = make_settings(pg_dsn, "redis://127.0.0.1:1/0", queue, intake="direct", schedule="200ms")
    judge = Recorder()
    try:
        async with running(Worker(pg_pool, dead, settings, judge=judge)):
            ids = await _submit(pg_pool, queue, 5)
            await eventually(functools.partial(_all_done, pg_pool, ids), within=10, what="judged without Redis")
    finally:
        await dead.aclose()
    assert await _statuses(pg_pool, ids) == {"ACCEPTED": 5} and sorted(judge.ran) == [0, 1, 2, 3, 4]


async def test_a_worker_of_a_paused_or_shadow_queue_polls_and_never_registers(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """Registered, it would make every submit send a NOTIFY for rows it may not take; it polls each
    schedule instead, and finds the queue live again after the flip."""
    async with pg_pool.acquire() as conn:
        await set_cutover(conn, queue, paused=True)
    settings = make_settings(pg_dsn, REDIS_URL, queue, intake="direct", schedule="200ms")
    judge = Recorder()
    worker = Worker(pg_pool, redis_client, settings, judge=judge)
    direct = worker.intake
    assert isinstance(direct, DirectIntake)
    async with running(worker):
        ids = await _submit(pg_pool, queue, 3)
        await eventually(lambda: direct.takes_issued >= 4, what="several polls of the paused queue")
        assert await _waiters(pg_pool, 0), "a worker of a paused queue must not ask submits to notify"
        assert judge.ran == []
        async with pg_pool.acquire() as conn:
            await set_cutover(conn, queue, paused=False)
        await eventually(functools.partial(_all_done, pg_pool, ids), within=10, what="judged after the flip")
        await eventually(lambda: _waiters(pg_pool, 1), what="idle and live: registered")


async def test_the_take_carries_the_wake_up_registration(pg_pool: asyncpg.Pool, queue: str) -> None:
    """An empty take of a live queue registers its worker (no statement of its own); one that finds
    rows does not, nor does one of a paused queue; a take asked to leave does so only when it finds
    rows (work is flowing), else the registration stays."""
    async with pg_pool.acquire() as conn:
        idle = await takes.take(conn, queue, "w", limit=5, ttl=30, register_if_idle=True)
        assert (idle.rows, idle.registered, idle.unregistered) == (0, True, False)
        assert await _waiters(pg_pool, 1)
        stays = await takes.take(conn, queue, "w", limit=5, ttl=30, unregister_if_busy=True)
        assert (stays.rows, stays.unregistered) == (0, False) and await _waiters(pg_pool, 1)
        await _submit(pg_pool, queue, 2)
        busy = await takes.take(conn, queue, "w", limit=5, ttl=30, unregister_if_busy=True)
        assert (busy.rows, busy.unregistered) == (2, True) and await _waiters(pg_pool, 0)
        await _submit(pg_pool, queue, 1, start=2)
        found = await takes.take(conn, queue, "w", limit=5, ttl=30, register_if_idle=True)
        assert (found.rows, found.registered) == (1, False) and await _waiters(pg_pool, 0)
        await set_cutover(conn, queue, paused=True)
        paused = await takes.take(conn, queue, "w", limit=5, ttl=30, register_if_idle=True)
        assert (paused.live, paused.registered) == (False, False) and await _waiters(pg_pool, 0)
        with pytest.raises(ValueError, match="not both"):
            await takes.take(conn, queue, "w", limit=5, ttl=30, unregister_if_busy=True, register_if_idle=True)


async def test_the_take_reaches_rows_by_key_under_a_generic_plan(pg_pool: asyncpg.Pool, queue: str) -> None:
    """Postgres may serve the prepared take with its generic plan, which cannot know the LIMIT: that
    plan must still reach the outbox and the submissions by key, never scan either table."""
    async with pg_pool.acquire() as conn:
        # A backlog a production queue can have (on a table of a few pages any plan is a scan).
        await conn.execute("SELECT judgequeue.submit($1, '{}') FROM generate_series(1, 5000)", queue)
        await conn.execute("ANALYZE judgequeue.outbox, judgequeue.submissions")
        types = ["text", "text", "int", "float8", "bool", "bool"]
        # The queue name is a DNS label: a literal needs no quoting beyond the quotes.
        plan = await generic_plan(conn, "lease_direct", types, [f"'{queue}'", "'w'", "2", "30", "false", "true"])
    assert "Seq Scan on outbox" not in plan and "Seq Scan on submissions" not in plan, plan


async def test_a_new_databases_tables_are_analysed_once_they_have_rows(pg_pool: asyncpg.Pool, queue: str) -> None:
    """Before a table's first ANALYZE the take's claim is a bitmap scan that walks every row taken so
    far; the reaper's sweep analyses ``outbox`` and ``submissions`` once they have rows, so the take
    is a plain index scan from the first thousand writes, not from autovacuum's first pass."""
    async with pg_pool.acquire() as conn:
        assert await outbox.analyze_new_tables(conn) == []  # a new database's empty tables: nothing yet
        await conn.execute("SELECT judgequeue.submit($1, '{}') FROM generate_series(1, 1500)", queue)
        while (await takes.take(conn, queue, "w", limit=500, ttl=30)).rows:
            pass
        await conn.execute("SELECT judgequeue.submit($1, '{}') FROM generate_series(1, 5)", queue)

    async def counted() -> bool:  # a backend reports its table counts within a second of idling
        rows = await pg_pool.fetch(
            "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE schemaname = 'judgequeue'"
            " AND relname IN ('outbox', 'submissions')"
        )
        return len(rows) == 2 and all(r["n_mod_since_analyze"] >= outbox.ANALYZE_AFTER for r in rows)

    await eventually(counted, within=10, what="the writes in the statistics")
    async with pg_pool.acquire() as conn:
        assert await outbox.analyze_new_tables(conn) == ["outbox", "submissions"]
        assert await outbox.analyze_new_tables(conn) == []  # once: autovacuum keeps them from here
        rows = await conn.fetch("EXPLAIN " + sql.QUERIES["lease_direct"], queue, "w", 64, 30.0, False, True)
    plan = "\n".join(r[0] for r in rows)  # explained, not run
    # The claim walks outbox_claim in order (a bitmap scan of it is what walked the taken rows);
    # the updates then reach the picked rows by primary key, by index or bitmap as sizes go.
    assert "Index Scan using outbox_claim" in plan and "Bitmap Index Scan on outbox_claim" not in plan, plan
    assert "Seq Scan on outbox" not in plan and "Seq Scan on submissions" not in plan, plan


async def test_a_reapers_role_analyses_as_the_schemas_owner_and_the_caller_tries_once(
    pg_pool: asyncpg.Pool, pg_dsn: str, queue: str
) -> None:
    """A reaper's login user owns no table: ANALYZE runs through its function, as the schema's owner
    (docs/security.md), and what it has analysed it passes as ``skip`` so it does not analyse again."""
    role = f"jq_t_{uuid.uuid4().hex[:10]}"
    await pg_pool.execute(f"CREATE ROLE {role} LOGIN IN ROLE {ROLES['reaper'].name}")  # as a reaper's user is
    try:
        await pg_pool.execute("SELECT judgequeue.submit($1, '{}') FROM generate_series(1, 1500)", queue)

        async def counted() -> bool:
            n = await pg_pool.fetchval(
                "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE schemaname = 'judgequeue'"
                " AND relname = 'outbox'"
            )
            return bool(n and n >= outbox.ANALYZE_AFTER)

        await eventually(counted, within=10, what="the writes in the statistics")
        other = await asyncpg.connect(pg_dsn.replace("postgresql://postgres@", f"postgresql://{role}@"))
        try:
            tried = await outbox.analyze_new_tables(other)
            assert "outbox" in tried
            assert await outbox.analyze_new_tables(other, skip=tried) == []
        finally:
            await other.close()
        assert await pg_pool.fetchval(
            "SELECT last_analyze FROM pg_stat_user_tables WHERE schemaname = 'judgequeue' AND relname = 'outbox'"
        ) is not None
    finally:
        await pg_pool.execute(f"DROP ROLE {role}")
