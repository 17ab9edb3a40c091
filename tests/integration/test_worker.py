"""The worker role in-process against real Postgres and Redis: leases, fence, heartbeat, shutdown."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core.base import metrics
from judgequeue.core.judges import UnknownJudge, Verdict
from judgequeue.core.judges.builtin import SleepJudge
from judgequeue.core.roles.dispatcher import Dispatcher
from judgequeue.core.roles.worker import cancels, lanes, verdicts
from judgequeue.core.roles.worker import role as worker
from judgequeue.core.roles.worker.role import Worker
from judgequeue.core.store import leases, outbox, sql
from judgequeue.core.transport import streams
from tests.support.databases import REDIS_URL
from tests.support.inprocess import GateJudge, running
from tests.support.queries import submission
from tests.support.settings import make_settings, stream_settings
from tests.support.waiting import eventually
from tests.support.worker_harness import Harness


def _stale(queue: str, reason: str) -> float:
    value = metrics.STALE_RESULTS_DROPPED.labels(queue, reason)._value.get()
    return float(value)


async def test_worker_judges_and_writes_verdicts(h: Harness) -> None:
    ids = await h.submit(*({"status": s, "echo": i} for i, s in enumerate(["ACCEPTED", "WRONG_ANSWER", "TIME_LIMIT"])))
    w = h.worker(SleepJudge(), concurrency="2")
    for sid in ids:
        await eventually(functools.partial(h.status_is, sid, "ACCEPTED", "WRONG_ANSWER", "TIME_LIMIT"))
    rows = [await h.row(sid) for sid in ids]
    assert [r["status"] for r in rows] == ["ACCEPTED", "WRONG_ANSWER", "TIME_LIMIT"]
    verdict = json.loads(rows[1]["verdict"])
    assert verdict["details"]["echo"] == 1 and verdict["worker"] == w.name and verdict["generation"] == 1
    assert all(r["lease_expires_at"] is None and r["finished_at"] is not None for r in rows)
    await eventually(lambda: w.stats.written == 3, what="three verdicts counted")  # counted after the commit
    # Acked and deleted once the leases are durable: nothing pending, nothing left in the stream.
    await eventually(lambda: _settled(h.redis, h.queue), what="entries acked")


async def _settled(redis_client: aioredis.Redis, queue: str) -> bool:
    pending: Any = await redis_client.xpending(streams.stream_key(queue), streams.GROUP)
    return bool(await redis_client.xlen(streams.stream_key(queue)) == 0 and pending["pending"] == 0)


async def test_judge_crash_is_an_explained_system_error(h: Harness) -> None:
    [sid] = await h.submit({"crash": True})
    h.worker(SleepJudge())
    await eventually(lambda: h.status_is(sid, "SYSTEM_ERROR"))
    assert "judge raised JudgeCrashed" in json.loads((await h.row(sid))["verdict"])["reason"]


async def test_stale_envelope_is_acked_and_counted_never_run(h: Harness, redis_client: aioredis.Redis) -> None:
    [sid] = await h.submit({"i": 1})
    # Deliver generation 1 to the stream, then rejudge before any worker reads it.
    await Dispatcher(h.pool, h.redis, h.settings()).cycle()
    async with h.pool.acquire() as conn:
        await outbox.rejudge(conn, sid)
    before = _stale(h.queue, "envelope_generation_moved")
    judge = GateJudge()
    judge.gate.set()
    w = h.worker(judge)
    await eventually(lambda: h.status_is(sid, "ACCEPTED"))
    assert judge.started == [1]  # judged once, for generation 2
    assert (await h.row(sid))["generation"] == 2
    await eventually(lambda: w.stats.stale_envelopes == 1)
    assert _stale(h.queue, "envelope_generation_moved") == before + 1
    await eventually(lambda: _settled(redis_client, h.queue), what="stale envelope acked")


async def test_stale_worker_cannot_write_and_is_counted(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rejudge bumps the generation under a running judge; its result is dropped, the new one wins.
    Nothing but the fence stops the stale attempt: the heartbeat is far away and so is the lease
    check of the cancellation watch (which would otherwise stop the judge within 5 s, before it
    writes, on a slow machine)."""
    monkeypatch.setattr(cancels, "LISTENING_CHECK", 3600.0)
    monkeypatch.setattr(cancels, "POLL", 3600.0)
    [sid] = await h.submit({"i": 7, "status": "WRONG_ANSWER"})
    old = GateJudge()
    # The heartbeat (every third of the lease) far past the test: the fence at write time must catch it.
    w_old = h.worker(old, lease_ttl="600s", concurrency="1")
    await eventually(lambda: old.started == [7])
    async with h.pool.acquire() as conn:
        await outbox.rejudge(conn, sid)
    new = GateJudge()
    new.gate.set()
    h.worker(new)
    # A worker starting beside a cold build and another test worker took over 10 s to judge it.
    await eventually(lambda: h.status_is(sid, "WRONG_ANSWER"), within=60, what="the new generation's verdict")
    first = await h.row(sid)
    before = _stale(h.queue, "stale_verdict")
    old.gate.set()  # the stale attempt now finishes and tries to write
    await eventually(lambda: w_old.stats.stale_results == 1)
    assert _stale(h.queue, "stale_verdict") == before + 1
    after = await h.row(sid)
    assert (after["generation"], after["attempt_id"], after["verdict"]) == (2, first["attempt_id"], first["verdict"])


async def test_rejudge_of_a_finished_submission(h: Harness) -> None:
    [sid] = await h.submit({"echo": "x"})
    h.worker(SleepJudge())
    await eventually(lambda: h.status_is(sid, "ACCEPTED"))
    first = await h.row(sid)
    async with h.pool.acquire() as conn:
        await outbox.rejudge(conn, sid)
    await eventually(lambda: h.status_is(sid, "ACCEPTED"))
    second = await h.row(sid)
    assert second["generation"] == 2 and second["attempt_id"] != first["attempt_id"]
    assert json.loads(second["verdict"])["generation"] == 2


async def test_rejudge_of_running_submission_cancels_judge_via_lost_lease(h: Harness) -> None:
    [sid] = await h.submit({"i": 3})
    judge = GateJudge()
    w = h.worker(judge, lease_ttl="600ms")  # heartbeat every 200 ms
    await eventually(lambda: judge.started == [3])
    async with h.pool.acquire() as conn:
        await outbox.rejudge(conn, sid)
    # The heartbeat finds the lease gone and cancels the running judge; the same worker (now free)
    # then judges generation 2.
    await eventually(lambda: judge.cancelled == [3], within=5)
    assert w.stats.lost_leases == 1
    judge.gate.set()
    await eventually(lambda: h.status_is(sid, "ACCEPTED"))
    assert (await h.row(sid))["generation"] == 2


async def test_heartbeat_keeps_a_long_job_alive_beyond_ttl(h: Harness) -> None:
    """A job that outlives its first lease still holds a live one: the heartbeat renewed it.

    Decided by the database's clock and the job's own state, not by racing a reaper loop: the judge
    is held until the server's ``now()`` has passed the first lease's expiry, and a rescue sweep run
    then finds nothing to rescue.
    """
    [sid] = await h.submit({"i": 1})
    judge = GateJudge()
    h.worker(judge, lease_ttl="3s")  # heartbeat every second
    await eventually(lambda: judge.started == [1])
    first_expiry = (await h.row(sid))["lease_expires_at"]

    async def outlived_first_lease() -> bool:
        async with h.pool.acquire() as conn:
            return bool(
                await conn.fetchval(
                    "SELECT now() > $2 AND lease_expires_at > now() FROM judgequeue.submissions"
                    " WHERE id = $1 AND status = 'JUDGING' AND generation = 1",
                    sid,
                    first_expiry,
                )
            )

    await eventually(outlived_first_lease, within=30, every=0.1, what="the job outliving its first lease")
    async with h.pool.acquire() as conn:
        assert await leases.rescue_expired_leases(conn, h.queue, max_retries=3) == leases.LeaseSweep(0, 0)
    judge.gate.set()
    await eventually(lambda: h.status_is(sid, "ACCEPTED"), within=10)
    row = await h.row(sid)
    assert row["generation"] == 1 and row["retry_count"] == 0


async def test_graceful_shutdown_releases_unfinished_jobs(h: Harness) -> None:
    ids = await h.submit({"i": 1}, {"i": 2}, {"i": 3, "seconds": 0})
    quick = GateJudge()
    slow = GateJudge()
    w = Worker(h.pool, h.redis, h.settings(concurrency="2", grace_period="300ms"), judge=slow)
    stop = h.spawn(w.run)
    await eventually(lambda: len(slow.started) == 2)
    held = sorted(slow.started)
    stop.set()
    await eventually(lambda: w.stats.released == 2, within=5)
    assert sorted(slow.cancelled) == held and w.in_flight == 0
    for i in held:
        row = await h.row(ids[i - 1])
        assert (row["status"], row["generation"], row["retry_count"]) == ("PENDING", 2, 1)
    # Another worker takes them at once (no lease expiry needed).
    quick.gate.set()
    h.worker(quick)
    for sid in ids:
        await eventually(functools.partial(h.status_is, sid, "ACCEPTED"), within=5)


async def test_graceful_shutdown_finishes_jobs_within_grace(h: Harness) -> None:
    [sid] = await h.submit({"seconds": 0.3})
    w = Worker(h.pool, h.redis, h.settings(grace_period="10s"), judge=SleepJudge())
    stop = h.spawn(w.run)
    await eventually(lambda: h.status_is(sid, "JUDGING"))
    stop.set()
    await eventually(lambda: h.status_is(sid, "ACCEPTED"), within=5)
    assert w.stats.released == 0


async def test_malformed_entry_is_dead_lettered_at_once_and_counted(h: Harness, redis_client: aioredis.Redis) -> None:
    await redis_client.xadd(streams.stream_key(h.queue), {"garbage": "1"})
    [sid] = await h.submit({})
    w = h.worker(SleepJudge())
    await eventually(lambda: h.status_is(sid, "ACCEPTED"))
    await eventually(lambda: w.stats.dead_lettered == 1)
    assert w.stats.malformed == 1
    pending = await redis_client.xpending(streams.stream_key(h.queue), streams.GROUP)
    assert pending["pending"] == 0  # no slot and no PEL entry beyond the one attempt
    entries: Any = await redis_client.xrange(streams.dlq_key(h.queue))
    [(_, dead)] = entries
    assert dead[b"reason"] == b"malformed entry: entry has no 'submission' field"
    assert dead[b"consumer"] == w.name.encode()
    assert dead[b"entry.garbage"] == b"1"


async def test_unknown_judge_is_a_clear_startup_error(pg_dsn: str, queue_name: str) -> None:
    settings = make_settings(pg_dsn, REDIS_URL, queue_name, judge="nope")
    with pytest.raises(UnknownJudge, match=r"'nope'.*available: .*noop.*program.*sleep"):
        await worker.run(settings, asyncio.Event())


async def _pending_entries(redis_client: aioredis.Redis, queue: str, n: int) -> list[str]:
    """``n`` entries read by a consumer and not acked: what a worker holds right after its leases."""
    await streams.ensure_group(redis_client, queue)
    for i in range(n):
        await redis_client.xadd(streams.stream_key(queue), {"i": str(i)})
    reply: Any = await redis_client.xreadgroup(streams.GROUP, "w", {streams.stream_key(queue): ">"}, count=n)
    return [entry_id.decode() for entry_id, _ in reply[0][1]]


async def _pending_count(redis_client: aioredis.Redis, queue: str) -> int:
    info: Any = await redis_client.xpending(streams.stream_key(queue), streams.GROUP)
    return int(info["pending"])


async def test_entries_are_acked_after_the_durability_barrier(
    pg_pool: asyncpg.Pool, redis_client: aioredis.Redis, queue_name: str
) -> None:
    ids = await _pending_entries(redis_client, queue_name, 3)
    acks = lanes.AckWhenDurable(pg_pool, redis_client, queue_name)
    acks.start()
    acks.add(ids[:2])
    acks.add(ids[2:])  # handed over while the first group may be in flight: acked too
    await acks.close(5.0)
    assert await _pending_count(redis_client, queue_name) == 0
    assert await redis_client.xlen(streams.stream_key(queue_name)) == 0  # XDEL with the XACK


async def test_entries_stay_pending_when_leases_cannot_be_made_durable(
    pg_dsn: str, redis_client: aioredis.Redis, queue_name: str
) -> None:
    ids = await _pending_entries(redis_client, queue_name, 2)
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=1)
    await pool.close()  # every acquire now fails, as with the database unreachable
    acks = lanes.AckWhenDurable(pool, redis_client, queue_name)
    acks.start()
    acks.add(ids)
    await asyncio.wait_for(acks._idle.wait(), 5)  # the attempt is over
    assert acks._task is not None and not acks._task.done(), "a failed barrier must not kill the acker"
    await acks.close(1.0)
    # Not acked: the reaper re-delivers them, and a worker then acks them as stale or leases again.
    assert await _pending_count(redis_client, queue_name) == 2


async def test_acker_survives_an_unexpected_error(
    pg_pool: asyncpg.Pool, redis_client: aioredis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = await _pending_entries(redis_client, queue_name, 2)
    real = leases.make_durable
    calls = 0

    async def flaky(conn: asyncpg.Connection) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug, not a database error")
        await real(conn)

    monkeypatch.setattr(leases, "make_durable", flaky)
    acks = lanes.AckWhenDurable(pg_pool, redis_client, queue_name)
    acks.start()
    acks.add(ids[:1])
    await asyncio.wait_for(acks._idle.wait(), 5)
    acks.add(ids[1:])
    await acks.close(5.0)
    assert calls == 2
    assert await _pending_count(redis_client, queue_name) == 1  # only the failed group's entry is left


class OddDetailsJudge:
    """A plugin judge whose verdict details JSON cannot carry (jsonb has no NaN, json no sets)."""

    async def judge(self, payload: Any) -> Verdict:
        if payload.get("odd") == "nan":
            return Verdict("ACCEPTED", {"score": float("nan")})
        if payload.get("odd") == "set":
            return Verdict("ACCEPTED", {"tags": {"a"}})
        if payload.get("odd") == "nul":
            return Verdict("WRONG_ANSWER", {"stdout": "a\x00b\udcff", "lines": ["\x00"]})
        return Verdict("ACCEPTED", {"fine": True})


async def test_unstorable_verdict_details_are_an_explained_system_error(h: Harness) -> None:
    # One worker, one job at a time: a write stuck on the first would hold up the others.
    ids = await h.submit({"odd": "nan"}, {"odd": "set"}, {"odd": "nul"}, {"odd": "no"})
    h.worker(OddDetailsJudge(), concurrency="1")
    terminal = ("ACCEPTED", "WRONG_ANSWER", "SYSTEM_ERROR")
    for sid in ids:
        await eventually(functools.partial(h.status_is, sid, *terminal), what=f"verdict of {sid}")
    rows = [await h.row(sid) for sid in ids]
    assert [r["status"] for r in rows] == ["SYSTEM_ERROR", "SYSTEM_ERROR", "WRONG_ANSWER", "ACCEPTED"]
    assert all("not storable" in json.loads(r["verdict"])["reason"] for r in rows[:2])
    assert json.loads(rows[2]["verdict"])["details"] == {"stdout": "a\ufffdb\ufffd", "lines": ["\ufffd"]}


async def test_a_verdict_the_database_refuses_does_not_hold_up_the_others(h: Harness) -> None:
    # Past the worker's own checks (a lone surrogate is invalid in jsonb): the group-commit writer
    # must not retry the batch forever; the refused verdict becomes an explained SYSTEM_ERROR.
    ids = await h.submit({"i": 1}, {"i": 2})
    async with h.pool.acquire() as conn:
        held = await leases.acquire(conn, h.queue, [(sid, 1) for sid in ids], ttl=30)
    bad, good = sorted(held, key=lambda x: x.submission)
    writer = verdicts.VerdictWriter(h.pool, linger=0.0)
    writer.start()
    results = await asyncio.wait_for(
        asyncio.gather(
            writer.write(leases.VerdictWrite(bad, "ACCEPTED", {"status": "ACCEPTED", "details": {"x": "\ud800"}})),
            writer.write(leases.VerdictWrite(good, "ACCEPTED", {"status": "ACCEPTED", "details": {}})),
        ),
        10,
    )
    await writer.close(1.0)
    assert all(r is not None for r in results)  # both written, neither dropped as stale
    bad_row, good_row = await h.row(bad.submission), await h.row(good.submission)
    assert (bad_row["status"], good_row["status"]) == ("SYSTEM_ERROR", "ACCEPTED")
    assert "refused by the database" in json.loads(bad_row["verdict"])["reason"]


async def test_verdict_writer_survives_an_unexpected_error(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = await h.submit({"i": 1}, {"i": 2})
    async with h.pool.acquire() as conn:
        first, second = sorted(
            await leases.acquire(conn, h.queue, [(sid, 1) for sid in ids], ttl=30), key=lambda x: x.submission
        )
    real = leases.write_verdicts
    calls = 0

    async def flaky(conn: asyncpg.Connection, writes: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug, not a database error")
        return await real(conn, writes)

    monkeypatch.setattr(leases, "write_verdicts", flaky)
    writer = verdicts.VerdictWriter(h.pool, linger=0.0)
    writer.start()
    with pytest.raises(verdicts.WriteAbandoned, match="a bug"):
        await asyncio.wait_for(writer.write(leases.VerdictWrite(first, "ACCEPTED", {"status": "ACCEPTED"})), 5)
    # The writer is still there for the next verdict; the first job is left to its lease expiry.
    written = await asyncio.wait_for(writer.write(leases.VerdictWrite(second, "ACCEPTED", {"status": "ACCEPTED"})), 5)
    assert written is not None
    await writer.close(1.0)
    assert ((await h.row(first.submission))["status"], (await h.row(second.submission))["status"]) == (
        "JUDGING",
        "ACCEPTED",
    )


async def test_verdicts_finishing_together_share_one_write(h: Harness) -> None:
    """Group commit: jobs that finish within the linger of each other are written by one statement
    (one round trip and one WAL flush for the group), and every verdict lands."""
    judge = GateJudge()
    ids = await h.submit(*({"i": i} for i in range(12)))
    w = h.worker(judge, concurrency="12")
    await eventually(lambda: len(judge.started) == 12, what="all twelve judging")
    judge.gate.set()
    for sid in ids:
        await eventually(functools.partial(h.status_is, sid, "ACCEPTED"), what=f"verdict of {sid}")
    await eventually(lambda: w.stats.written == 12, what="twelve verdicts counted")
    assert 1 <= w.verdict_statements <= 3, w.stats


async def test_a_full_worker_writes_its_verdicts_without_lingering(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The linger never holds a slot a job is waiting for: with a linger far beyond the test's
    deadline, a worker of one slot still judges a queue of jobs one after another."""
    monkeypatch.setattr(worker, "VERDICT_LINGER", 60.0)
    ids = await h.submit(*({"i": i} for i in range(4)))
    w = h.worker(SleepJudge(), concurrency="1")
    for sid in ids:
        await eventually(functools.partial(h.status_is, sid, "ACCEPTED"), within=10, what=f"verdict of {sid}")
    # Each written at once (the next job needed the slot); the count follows the commit the status
    # showed, so it is waited for, not read at once.
    await eventually(lambda: w.verdict_statements == 4, what="four verdict statements")


async def test_a_stopping_worker_writes_a_lingering_verdict_at_once(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verdict waiting for company (a minute of linger, the worker not full) is written as soon as
    the worker is told to stop, well within the shutdown's own bound."""
    monkeypatch.setattr(worker, "VERDICT_LINGER", 60.0)
    [sid] = await h.submit({"i": 0})
    w = Worker(h.pool, h.redis, h.settings(concurrency="4", grace_period="500ms"), judge=SleepJudge())
    stop = asyncio.Event()
    task = asyncio.ensure_future(w.run(stop))
    await eventually(lambda: w.stats.leased == 1 and w.in_flight == 1, what="the job judged, its verdict queued")
    assert (await h.row(sid))["status"] == "JUDGING"  # lingering: not written yet
    stop.set()
    await asyncio.wait_for(task, 5)
    assert (await h.row(sid))["status"] == "ACCEPTED" and w.verdict_statements == 1


#: Direct intake's statements (core/roles/worker/direct): the take, the offers' sync, and the waiter registration
#: a direct-intake worker makes (a dispatcher's own wake-up registers too: that one is the stream's).
DIRECT_INTAKE_STATEMENTS = {"lease_direct", "offers_sync"}
WORKER_WAKEUP_STATEMENTS = {"waiter_register", "waiter_unregister"}


async def _logged_pool(dsn: str, statements: list[str]) -> asyncpg.Pool:
    """A pool whose every statement's text is appended to ``statements``."""

    async def log_each(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda logged: statements.append(logged.query))

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4, init=log_each)
    assert pool is not None
    return pool


async def test_the_stream_intake_issues_no_direct_intake_statement(
    pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """A stream-intake worker and its dispatcher pay nothing for direct intake: judging a batch of
    jobs, the worker issues no take, no offers sync and no waiter registration, and the dispatcher
    no take and no offers sync (it registers as a waiter for its own wake-up, the stream's)."""
    by_worker: list[str] = []
    by_dispatcher: list[str] = []
    worker_pool = await _logged_pool(pg_dsn, by_worker)
    dispatcher_pool = await _logged_pool(pg_dsn, by_dispatcher)
    settings = stream_settings(pg_dsn, REDIS_URL, queue, schedule="50ms", concurrency="4")
    try:
        async with worker_pool.acquire() as conn:
            ids = [await outbox.submit(conn, queue, {"i": i}) for i in range(20)]
        by_worker.clear()  # the submits above are the application's
        dispatcher = Dispatcher(dispatcher_pool, redis_client, settings)
        async with running(dispatcher, Worker(worker_pool, redis_client, settings, judge=SleepJudge())):
            for sid in ids:
                await eventually(functools.partial(_status_of, worker_pool, sid, "ACCEPTED"), what=f"{sid} judged")
    finally:
        await worker_pool.close()
        await dispatcher_pool.close()
    names = {sql.query(name): name for name in DIRECT_INTAKE_STATEMENTS | WORKER_WAKEUP_STATEMENTS | {"lease_acquire"}}
    worker_used = {names[q] for q in by_worker if q in names}
    dispatcher_used = {names[q] for q in by_dispatcher if q in names}
    assert "lease_acquire" in worker_used, "the log sees the worker's statements by their text"
    assert worker_used & (DIRECT_INTAKE_STATEMENTS | WORKER_WAKEUP_STATEMENTS) == set(), worker_used
    assert dispatcher_used & DIRECT_INTAKE_STATEMENTS == set(), dispatcher_used


async def _status_of(pool: asyncpg.Pool, sid: int, status: str) -> bool:
    async with pool.acquire() as conn:
        row = await submission(conn, sid)
    return row is not None and row["status"] == status
