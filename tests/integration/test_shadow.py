"""Shadow judging against real Postgres and Redis: shadow workers, the fence on shadow verdicts, the
reaper's rescue of both, legacy verdicts (and their refusals), the agreement figures and retention.

A shadow worker is the worker of core/roles/worker/role.py in the shadow lane (JUDGEQUEUE_SHADOW=judge), so the
machinery under test is the live worker's; what these tests check is what differs: where its work
comes from, where its verdicts go (never the submission), and that every write is fenced.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core import api, status
from judgequeue.core.base import metrics
from judgequeue.core.base.agreement import classify
from judgequeue.core.base.errors import InvalidPayload, InvalidVerdict, NotShadowed, PayloadTooLarge, UnknownSubmission
from judgequeue.core.judges.builtin import SleepJudge
from judgequeue.core.roles.dispatcher import Dispatcher
from judgequeue.core.roles.reaper import Reaper
from judgequeue.core.roles.worker.role import Worker
from judgequeue.core.store import outbox, shadow
from judgequeue.core.store.queues import create_queue, set_cutover
from judgequeue.core.transport import streams
from tests.support.inprocess import GateJudge
from tests.support.queries import submission
from tests.support.waiting import eventually
from tests.support.worker_harness import Harness


class Shadow(Harness):
    """A queue in shadow mode, a dispatcher task, and helpers to start shadow workers and read rows."""

    async def start(self, *, dispatcher: bool = True) -> None:
        async with self.pool.acquire() as conn:
            await create_queue(conn, self.queue, mode="shadow")
        if dispatcher:
            self.spawn(Dispatcher(self.pool, self.redis, self.settings(schedule="50ms")).run)

    def shadow_worker(self, judge: Any, *, lane: str = "judge", **env: str) -> tuple[Worker, asyncio.Event]:
        env.setdefault("grace_period", "500ms")
        w = Worker(self.pool, self.redis, self.settings(shadow=lane, **env), judge=judge)
        return w, self.spawn(w.run)

    async def shadow_row(self, sid: int) -> asyncpg.Record | None:
        async with self.pool.acquire() as conn:
            row: asyncpg.Record | None = await conn.fetchrow(
                "SELECT * FROM judgequeue.shadow_verdicts WHERE submission_id = $1", sid)
            return row

    async def judged(self, sid: int, *statuses: str) -> bool:
        row = await self.shadow_row(sid)
        return row is not None and row["status"] in (statuses or tuple(api.VERDICTS))


@pytest.fixture
def harness_class() -> type[Harness]:
    """Every test here gets a :class:`Shadow` as ``h``."""
    return Shadow


def _counter(metric: Any, *labels: str) -> float:
    return float(metric.labels(*labels)._value.get())


async def _shadow_settled(redis: aioredis.Redis, queue: str) -> bool:
    key = streams.shadow_key(queue)
    pending: Any = await redis.xpending(key, streams.GROUP)
    return bool(await redis.xlen(key) == 0 and pending["pending"] == 0)


# --- shadow workers ---------------------------------------------------------------------------------


async def test_a_shadow_worker_writes_shadow_verdicts_never_the_submissions(h: Shadow) -> None:
    ids = await h.submit({"status": "ACCEPTED", "echo": 1}, {"status": "WRONG_ANSWER", "echo": 2})
    before = _counter(metrics.SHADOW_VERDICTS, h.queue, "WRONG_ANSWER")
    w, _ = h.shadow_worker(SleepJudge(), concurrency="2")
    for sid in ids:
        await eventually(lambda sid=sid: h.judged(sid), what=f"shadow verdict of {sid}")  # type: ignore[misc]
    rows = [await h.shadow_row(sid) for sid in ids]
    assert [r["status"] for r in rows if r] == ["ACCEPTED", "WRONG_ANSWER"]
    second = rows[1]
    assert second is not None and second["details"] is not None
    assert json.loads(second["details"]) == {"slept": 0.0, "echo": 2}
    assert (second["generation"], second["worker"], second["lease_expires_at"]) == (1, w.name, None)
    # The submissions are the legacy judge's: PENDING, no verdict, and api.result says so.
    for sid in ids:
        row = await submission(h.pool, sid)
        assert (row["status"], row["verdict"], row["attempt_id"]) == ("PENDING", None, None)
        async with h.pool.acquire() as conn:
            result = await api.result(conn, sid)
        assert (result.status, result.details, result.finished) == ("PENDING", None, False)
    await eventually(lambda: w.stats.written == 2, what="two shadow verdicts counted")
    assert _counter(metrics.SHADOW_VERDICTS, h.queue, "WRONG_ANSWER") == before + 1
    # Acked and deleted, with their shadow markers: nothing of them left in Redis.
    await eventually(lambda: _shadow_settled(h.redis, h.queue), what="shadow entries acked")
    assert [k async for k in h.redis.scan_iter(match=f"jq:{{{h.queue}}}:shadow-seen:*")] == []


async def test_live_and_shadow_workers_each_take_only_their_own_stream(h: Shadow) -> None:
    live_judge, shadow_judge = GateJudge(), GateJudge()
    live_judge.gate.set()
    shadow_judge.gate.set()
    h.shadow_worker(live_judge, lane="off")
    h.shadow_worker(shadow_judge)
    [in_shadow] = await h.submit({"i": 1})
    await eventually(lambda: h.judged(in_shadow))
    async with h.pool.acquire() as conn:
        await set_cutover(conn, h.queue, mode="live")
    [in_live] = await h.submit({"i": 2})
    await eventually(lambda: _status(h.pool, in_live, "ACCEPTED"))
    assert live_judge.started == [2] and shadow_judge.started == [1]
    assert await h.shadow_row(in_live) is None


async def _status(pool: asyncpg.Pool, sid: int, *statuses: str) -> bool:
    return (await submission(pool, sid))["status"] in statuses


async def test_a_stale_shadow_attempt_is_dropped_and_counted(h: Shadow) -> None:
    """A shadow lease that expires under a running judge is taken over by the next delivery; the old
    attempt's verdict then finds the fence and is dropped, the new one stays."""
    [sid] = await h.submit({"i": 7, "status": "WRONG_ANSWER"})
    old = GateJudge()
    w_old, _ = h.shadow_worker(old, lease_ttl="30s", concurrency="1")
    await eventually(lambda: old.started == [7])
    first = await h.shadow_row(sid)
    assert first is not None and first["status"] == "JUDGING"
    async with h.pool.acquire() as conn:
        await conn.execute("UPDATE judgequeue.shadow_verdicts SET lease_expires_at = now() - interval '1 s'")
        # The same envelope delivered again (what a reaper's re-send does): a new attempt takes over.
        [taken] = await shadow.acquire(conn, h.queue, [(sid, 1)], ttl=30, worker="another")
        written = await shadow.write_verdicts(conn, [_write(taken, "WRONG_ANSWER")])
    assert list(written) == [taken.attempt]
    before = _counter(metrics.STALE_RESULTS_DROPPED, h.queue, "shadow_stale_verdict")
    old.gate.set()
    await eventually(lambda: w_old.stats.stale_results == 1, what="the old attempt's verdict dropped")
    assert _counter(metrics.STALE_RESULTS_DROPPED, h.queue, "shadow_stale_verdict") == before + 1
    row = await h.shadow_row(sid)
    assert row is not None and (row["attempt"], row["worker"], row["status"]) == (taken.attempt, "another",
                                                                                 "WRONG_ANSWER")


def _write(lease: Any, status_: str) -> Any:
    from judgequeue.core.store.leases import VerdictWrite

    return VerdictWrite(lease, status_, {"status": status_, "details": {"by": "test"}})


async def test_a_lost_shadow_lease_cancels_the_judge(h: Shadow) -> None:
    [sid] = await h.submit({"i": 3})
    judge = GateJudge()
    w, _ = h.shadow_worker(judge, lease_ttl="600ms", concurrency="1")  # heartbeat every 200 ms
    await eventually(lambda: judge.started == [3])
    async with h.pool.acquire() as conn:  # a rejudge in shadow mode: a new generation, shadow-sent again
        await outbox.rejudge(conn, sid)
    await eventually(lambda: judge.cancelled == [3], within=5, what="the judge cancelled")
    judge.gate.set()
    await eventually(lambda: w.stats.lost_leases == 1)
    await eventually(lambda: h.judged(sid), what="generation 2 judged")
    row = await h.shadow_row(sid)
    assert row is not None and row["generation"] == 2
    assert judge.started == [3, 3]


async def test_a_shadow_worker_killed_mid_judge_is_rescued_by_the_reaper(h: Shadow) -> None:
    """A worker that died mid-judge, after its lease and ack (what a SIGKILL leaves: the chaos run
    does it to real processes): the reaper sends the entry again once the lease expires, another
    shadow worker judges it, and the dead attempt can never write."""
    [sid] = await h.submit({"i": 5, "status": "TIME_LIMIT"})
    await eventually(lambda: _xlen(h.redis, streams.shadow_key(h.queue)), what="the shadow entry sent")
    [delivery] = await streams.read(h.redis, h.queue, "dead-worker", count=1, block_ms=None, shadow=True)
    assert delivery.envelope is not None
    async with h.pool.acquire() as conn:
        [dead] = await shadow.acquire(conn, h.queue, [(sid, 1)], ttl=0.3, worker="dead-worker")
    await streams.ack(h.redis, h.queue, [delivery.entry_id], [(sid, 1)], shadow=True)
    assert await _shadow_settled(h.redis, h.queue)  # from now on only the lease stands for the job
    reaper = Reaper(h.pool, h.redis, h.settings(max_retries="5", redispatch_after="30s"))
    await eventually(lambda: _expired(h.pool, sid), within=5, what="the dead worker's lease expired")
    before = _counter(metrics.SHADOW_RESENT, h.queue)
    rescue = await reaper.rescue_shadow_leases()
    assert [(r.submission, r.generation) for r in rescue.resend] == [(sid, 1)] and rescue.failed == 0
    assert _counter(metrics.SHADOW_RESENT, h.queue) == before + 1
    waiting = await h.shadow_row(sid)
    assert waiting is not None and waiting["attempt"] is None and waiting["retry_count"] == 1
    assert await reaper.rescue_shadow_leases() == shadow.ShadowRescue([], 0)  # not again before redispatchAfter
    fresh = GateJudge()
    fresh.gate.set()
    h.shadow_worker(fresh)
    await eventually(lambda: h.judged(sid, "TIME_LIMIT"), what="judged by another worker")
    async with h.pool.acquire() as conn:  # the dead attempt, had it lived on, writes nothing
        assert await shadow.write_verdicts(conn, [_write(dead, "ACCEPTED")]) == {}
    row = await h.shadow_row(sid)
    assert row is not None and row["status"] == "TIME_LIMIT" and fresh.started == [5]


async def _expired(pool: asyncpg.Pool, sid: int) -> bool:
    return bool(await pool.fetchval(
        "SELECT lease_expires_at < now() FROM judgequeue.shadow_verdicts WHERE submission_id = $1", sid))


async def test_shadow_leases_that_keep_expiring_end_as_an_explained_system_error(h: Shadow) -> None:
    [sid] = await h.submit({"i": 1})
    async with h.pool.acquire() as conn:
        await shadow.acquire(conn, h.queue, [(sid, 1)], ttl=0.01, worker="gone")
    reaper = Reaper(h.pool, h.redis, h.settings(max_retries="2", redispatch_after="10ms"))
    rescued: list[int] = []
    for _ in range(2):
        await eventually(lambda: _expired(h.pool, sid), within=5)
        got = await reaper.rescue_shadow_leases()
        rescued.append(len(got.resend) + 10 * got.failed)
    assert rescued == [1, 10]
    row = await h.shadow_row(sid)
    assert row is not None and row["status"] == "SYSTEM_ERROR"
    assert json.loads(row["details"]) == {"reason": "shadow judging gave up after 2 lease expiries"}
    assert (await submission(h.pool, sid))["status"] == "PENDING"


async def test_a_stopping_shadow_worker_releases_its_leases_for_the_next(h: Shadow) -> None:
    [sid] = await h.submit({"i": 9})
    slow = GateJudge()
    w, stop = h.shadow_worker(slow, lease_ttl="30s")
    await eventually(lambda: slow.started == [9])
    stop.set()
    await eventually(lambda: w.stats.released == 1, what="the lease released")
    row = await h.shadow_row(sid)
    assert row is not None and row["attempt"] is None and row["status"] == "JUDGING"
    reaper = Reaper(h.pool, h.redis, h.settings())
    assert len((await reaper.rescue_shadow_leases()).resend) == 1  # expired at release: sent again at once
    fresh = GateJudge()
    fresh.gate.set()
    h.shadow_worker(fresh)
    await eventually(lambda: h.judged(sid, "ACCEPTED"))


async def test_the_reaper_gives_up_an_unacked_shadow_entry_without_touching_the_submission(h: Shadow) -> None:
    """A shadow entry nobody acks is re-delivered, then given up at maxDeliveries: a SYSTEM_ERROR
    shadow verdict naming why, the entry acked and deleted, no DLQ entry, the submission PENDING."""
    [sid] = await h.submit({"i": 1})
    await eventually(lambda: _xlen(h.redis, streams.shadow_key(h.queue)), what="the shadow entry sent")
    reaper = Reaper(h.pool, h.redis, h.settings(visibility_timeout="1ms", max_deliveries="2"))
    for expect in ("requeue", "give up"):
        got = await streams.read(h.redis, h.queue, "a-dying-worker", count=10, block_ms=None, shadow=True)
        assert len(got) == 1, expect
        await eventually(lambda: _idle(h.redis, h.queue), what="the entry idle")
        swept = await reaper.sweep_stream(shadow=True)
        assert (swept.requeued, swept.dead_lettered) == ((1, 0) if expect == "requeue" else (0, 1)), swept
    row = await h.shadow_row(sid)
    assert row is not None and row["status"] == "SYSTEM_ERROR"
    assert "not acknowledged after 2 deliveries" in json.loads(row["details"])["reason"]
    assert await _shadow_settled(h.redis, h.queue)
    assert await h.redis.xlen(streams.dlq_key(h.queue)) == 0
    assert (await submission(h.pool, sid))["status"] == "PENDING"


async def _xlen(redis: aioredis.Redis, key: str) -> int:
    return int(await redis.xlen(key))


async def _idle(redis: aioredis.Redis, queue: str) -> bool:
    pending = await redis.xpending_range(streams.shadow_key(queue), streams.GROUP, min="-", max="+", count=1)
    return bool(pending) and int(pending[0]["time_since_delivered"]) >= 1


async def test_a_malformed_shadow_entry_is_set_aside_at_once(h: Shadow) -> None:
    await h.redis.xadd(streams.shadow_key(h.queue), {"junk": "1"})
    judge = GateJudge()
    w, _ = h.shadow_worker(judge)
    await eventually(lambda: w.stats.malformed == 1 and w.stats.dead_lettered == 1)
    assert await _shadow_settled(h.redis, h.queue) and judge.started == []


# --- legacy verdicts -----------------------------------------------------------------------------


async def _legacy_rows(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    return [dict(r) for r in await conn.fetch("SELECT * FROM judgequeue.legacy_verdicts ORDER BY submission_id")]


async def test_legacy_verdicts_are_recorded_in_the_callers_transaction(h: Shadow) -> None:
    [sid] = await h.submit({"i": 1})
    async with h.pool.acquire() as conn:
        async with conn.transaction():
            tests = [{"test": 1, "verdict": "ACCEPTED"}, {"test": 2, "verdict": "WRONG_ANSWER"}]
            await api.report_legacy_verdict(conn, sid, "WRONG_ANSWER", {"tests": tests})
        with contextlib.suppress(RuntimeError):
            async with conn.transaction():  # rolled back with the application's own transaction
                await api.report_legacy_verdict(conn, sid, "ACCEPTED")
                raise RuntimeError("the application's transaction fails")
        rows = await _legacy_rows(conn)
        assert [(r["submission_id"], r["queue"], r["status"]) for r in rows] == [(sid, h.queue, "WRONG_ANSWER")]
        await conn.execute("SELECT judgequeue.report_legacy_verdict($1, 'TIME_LIMIT', NULL)", sid)  # SQL: replaces
        rows = await _legacy_rows(conn)
        assert [(r["status"], r["details"]) for r in rows] == [("TIME_LIMIT", None)]


#: Each refusal: (call, error class, SQLSTATE, words of the message).
REFUSALS: list[tuple[str, tuple[Any, str | None], type[Exception], str, str]] = [
    ("an unknown id", (10**12, "ACCEPTED"), UnknownSubmission, "JQ006", "unknown submission 1000000000000"),
    ("a bad verdict name", ("{sid}", "OK"), InvalidVerdict, "JQ008", "'OK' is not a verdict (one of ACCEPTED"),
    ("a lower-case verdict", ("{sid}", "accepted"), InvalidVerdict, "JQ008", "is not a verdict"),
    ("a missing verdict", ("{sid}", None), InvalidVerdict, "JQ008", "is not a verdict"),
    ("a live queue never shadowed", ("{live}", "ACCEPTED"), NotShadowed, "JQ007", "never sent it to shadow judging"),
]


@pytest.mark.parametrize(("case", "call", "error", "sqlstate", "words"), REFUSALS, ids=[r[0] for r in REFUSALS])
async def test_bad_legacy_verdicts_are_refused_with_nothing_written(
    h: Shadow, case: str, call: tuple[Any, str | None], error: type[Exception], sqlstate: str, words: str
) -> None:
    [sid] = await h.submit({"i": 1})
    live_queue = h.queue + "-live"
    async with h.pool.acquire() as conn:
        await create_queue(conn, live_queue)
        live = await outbox.submit(conn, live_queue, {"i": 2})
    ident = call[0] if isinstance(call[0], int) else int(call[0].format(sid=sid, live=live))
    async with h.pool.acquire() as conn:
        with pytest.raises(error, match=words.replace("(", r"\(")):  # the Python API
            await api.report_legacy_verdict(conn, ident, call[1])  # type: ignore[arg-type]
        with pytest.raises(asyncpg.PostgresError) as raw:  # raw SQL, as an application in any language calls it
            await conn.execute("SELECT judgequeue.report_legacy_verdict($1, $2, NULL)", ident, call[1])
        assert raw.value.sqlstate == sqlstate and words in str(raw.value)
        assert await _legacy_rows(conn) == []


async def test_bad_legacy_verdict_details_are_refused_with_nothing_written(h: Shadow) -> None:
    [sid] = await h.submit({"i": 1})
    async with h.pool.acquire() as conn:
        for details, error in (([1, 2], InvalidVerdict), ({"x": float("nan")}, InvalidPayload),
                               ({"blob": "x" * (1024 * 1024)}, PayloadTooLarge)):
            with pytest.raises(error):
                await api.report_legacy_verdict(conn, sid, "ACCEPTED", details)  # type: ignore[arg-type]
        big = json.dumps({"blob": "x" * 1048576})
        for text, sqlstate in (("[1, 2]", "JQ008"), ('"text"', "JQ008"), (big, "JQ003")):
            with pytest.raises(asyncpg.PostgresError) as raw:
                await conn.execute("SELECT judgequeue.report_legacy_verdict($1, 'ACCEPTED', $2::jsonb)", sid, text)
            assert raw.value.sqlstate == sqlstate
        assert await _legacy_rows(conn) == []


async def test_a_legacy_verdict_after_the_flip_is_taken_for_a_shadowed_submission(h: Shadow) -> None:
    [shadowed] = await h.submit({"i": 1})
    await eventually(lambda: _xlen(h.redis, streams.shadow_key(h.queue)), what="shadow-sent")
    async with h.pool.acquire() as conn:
        await set_cutover(conn, h.queue, mode="live")
        live = await outbox.submit(conn, h.queue, {"i": 2})
        await api.report_legacy_verdict(conn, shadowed, "ACCEPTED")
        with pytest.raises(NotShadowed, match=f"submission {live} is in queue '{h.queue}', which is live mode"):
            await api.report_legacy_verdict(conn, live, "ACCEPTED")
        assert [r["submission_id"] for r in await _legacy_rows(conn)] == [shadowed]


# --- agreement, diff, status, retention -----------------------------------------------------------


async def _scenario(h: Shadow) -> dict[str, list[int]]:
    """Shadow verdicts from a real shadow worker, legacy verdicts reported: 3 matched (2 ACCEPTED, 1
    WRONG_ANSWER), 2 mismatched (legacy WRONG_ANSWER, shadow ACCEPTED; legacy ACCEPTED, shadow
    TIME_LIMIT), 1 legacy only (still judging), 1 shadow only. Each pair is (shadow, legacy)."""
    plan: dict[str, list[tuple[str, str | None]]] = {
        "matched": [("ACCEPTED", "ACCEPTED"), ("ACCEPTED", "ACCEPTED"), ("WRONG_ANSWER", "WRONG_ANSWER")],
        "mismatched": [("ACCEPTED", "WRONG_ANSWER"), ("TIME_LIMIT", "ACCEPTED")],
        "shadow_only": [("RUNTIME_ERROR", None)],
    }
    judge = SleepJudge()
    h.shadow_worker(judge, concurrency="8")
    ids: dict[str, list[int]] = {}
    for kind, pairs in plan.items():
        ids[kind] = await h.submit(*({"status": s, "echo": {"tests": [{"test": 1, "verdict": s}]}} for s, _ in pairs))
        for sid, (_, legacy) in zip(ids[kind], pairs, strict=True):
            await eventually(lambda sid=sid: h.judged(sid))  # type: ignore[misc]
            if legacy is not None:
                async with h.pool.acquire() as conn:
                    await api.report_legacy_verdict(conn, sid, legacy, {"tests": [{"test": 1, "verdict": legacy}]})
    ids["legacy_only"] = await h.submit({"hang": True})
    await eventually(lambda: _judging(h, ids["legacy_only"][0]), what="the hanging submission being judged")
    async with h.pool.acquire() as conn:
        await api.report_legacy_verdict(conn, ids["legacy_only"][0], "ACCEPTED")
    return ids


async def _judging(h: Shadow, sid: int) -> bool:
    row = await h.shadow_row(sid)
    return row is not None and row["status"] == "JUDGING"


async def test_agreement_figures_diff_and_status_are_exact(h: Shadow) -> None:
    ids = await _scenario(h)
    async with h.pool.acquire() as conn:
        figures = await shadow.agreement(conn, h.queue)
        found = await shadow.mismatches(conn, h.queue, limit=10)
        everywhere = await shadow.mismatches(conn, None, limit=10)
        elsewhere = await shadow.mismatches(conn, "another-queue", limit=10)
        gathered = await status.gather(conn, None, h.queue)
    t = figures.total
    assert (t.matched, t.mismatched, t.legacy_only, t.shadow_only) == (3, 2, 1, 1)
    assert figures.samples == 5 and figures.percent == "60.00%"
    by = {v: c.as_dict() for v, c in figures.by_verdict.items()}
    assert by == {
        "ACCEPTED": {"matched": 2, "mismatched": 1, "legacy_only": 1, "shadow_only": 0},
        "WRONG_ANSWER": {"matched": 1, "mismatched": 1, "legacy_only": 0, "shadow_only": 0},
        "RUNTIME_ERROR": {"matched": 0, "mismatched": 0, "legacy_only": 0, "shadow_only": 1},
    }
    # The diff lists exactly the pairs agreement.classify calls mismatched, newest first, with details.
    assert sorted(m.submission for m in found) == sorted(ids["mismatched"]) and everywhere == found
    assert elsewhere == []
    assert all(classify(m.legacy, m.shadow) == "mismatched" for m in found)
    newest = found[0]
    assert (newest.legacy, newest.shadow) == ("ACCEPTED", "TIME_LIMIT")
    assert newest.legacy_details == {"tests": [{"test": 1, "verdict": "ACCEPTED"}]}
    assert newest.shadow_details == {"slept": 0.0, "echo": {"tests": [{"test": 1, "verdict": "TIME_LIMIT"}]}}
    assert gathered.shadow == figures
    doc = status.as_json(gathered, status.evaluate(gathered, status.Thresholds()))
    assert doc["shadow"]["agreement"] == "60.00%" and doc["shadow"]["mismatched"] == 2
    assert doc["shadow"]["by_verdict"]["WRONG_ANSWER"]["mismatched"] == 1
    text = status.render(gathered, status.evaluate(gathered, status.Thresholds()))
    assert ("shadow         agreement 60.00% over 5 compared (3 matched, 2 mismatched; 1 legacy only,"
            " 1 shadow only)") in text
    assert "ACCEPTED       matched=2  mismatched=1  legacy_only=1  shadow_only=0" in text


async def test_the_reaper_exports_the_figures(h: Shadow) -> None:
    await _scenario(h)
    reaper = Reaper(h.pool, h.redis, h.settings())
    await reaper.refresh_gauges()
    value = metrics.SHADOW_COMPARED.labels(h.queue, "ACCEPTED", "mismatched")._value.get()
    assert value == 1
    assert metrics.SHADOW_COMPARED.labels(h.queue, "PRESENTATION_ERROR", "matched")._value.get() == 0
    assert metrics.SHADOW_AGREEMENT.labels(h.queue)._value.get() == 0.6
    assert metrics.SHADOW_SAMPLES.labels(h.queue)._value.get() == 5


async def test_shadow_and_legacy_verdicts_are_pruned_with_the_retention(h: Shadow) -> None:
    ids = await _scenario(h)
    old = ids["matched"][0]
    async with h.pool.acquire() as conn:
        await conn.execute("UPDATE judgequeue.shadow_verdicts SET judged_at = now() - interval '2 days'"
                           " WHERE submission_id = $1", old)
        await conn.execute("UPDATE judgequeue.legacy_verdicts SET reported_at = now() - interval '2 days'"
                           " WHERE submission_id = ANY($1)", [old, ids["legacy_only"][0]])
    reaper = Reaper(h.pool, h.redis, h.settings(retention="1d"))
    await reaper.prune()
    assert reaper.pruned_shadow == 3
    async with h.pool.acquire() as conn:
        figures = await shadow.agreement(conn, h.queue)
        # the JUDGING row of the legacy-only submission is no final verdict: kept (its lease owns it)
        assert await h.shadow_row(ids["legacy_only"][0]) is not None
    t = figures.total
    assert (t.matched, t.mismatched, t.legacy_only, t.shadow_only) == (2, 2, 0, 1)


async def test_old_shadow_stream_entries_are_trimmed(h: Shadow) -> None:
    key = streams.shadow_key(h.queue)
    await h.redis.xadd(key, {"submission": "1", "generation": "1", "attempt": "1", "outbox": "1",
                              "enqueued_at": "0", "deliveries": "1"}, id="1-1")
    for _ in range(3):
        await h.redis.xadd(key, {"junk": "new"})
    reaper = Reaper(h.pool, h.redis, h.settings(retention="1d"))
    assert await reaper.trim_shadow_stream() == 1
    assert await h.redis.xlen(key) == 3 and b"1-1" not in [e[0] for e in await h.redis.xrange(key) or []]


async def test_a_shadow_workers_readiness_is_its_own_streams_group(h: Shadow) -> None:
    """A shadow worker needs the group on the shadow stream (it creates it at start, and /readyz says
    whether it exists); the work stream's group is not what it reads."""
    from judgequeue.core.runtime.lifecycle import open_connections
    from judgequeue.core.runtime.process import ReadinessProbe

    settings = h.settings(shadow="judge")
    probe = ReadinessProbe(settings, need_group=True, timeout=5)
    try:
        before = await probe()
        missing = f"group 'workers' missing on {streams.shadow_key(h.queue)}"
        assert not before.ready and before.checks["group"] == missing
        conns = await open_connections(settings, asyncio.Event(), pool_size=1)
        assert conns is not None
        await conns.pool.close()
        await conns.redis.aclose()
        after = await probe()
        assert after.checks["group"] == "ok", after
        assert not await h.redis.exists(streams.stream_key(h.queue))  # the work stream's group: not its business
    finally:
        await probe.close()
