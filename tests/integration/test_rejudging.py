"""Rejudgings (a rejudge as a proposal) against real Postgres and Redis (docs/design.md, "Rejudgings").

A preview judges the selected submissions again on the side, by the queue's ordinary workers,
while every visible status, verdict and generation stays; ``show`` gives the exact old -> new
matrix; ``apply`` makes all proposed verdicts visible in one transaction (history cause
``applied``, one verdict event each), refused while some are missing unless partial; ``cancel``
discards it; a submission rejudged or cancelled while the preview is open keeps its own verdict
and is reported stale at apply. Bad input gets one clear error naming what was wrong.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import asyncpg
import pytest

from judgequeue.core import api
from judgequeue.core.base.errors import InvalidClass, RejudgingRefused, UnknownQueue, UnknownRejudging
from judgequeue.core.judges.builtin import SleepJudge
from judgequeue.core.store import outbox, rejudgings
from judgequeue.core.store.queues import create_queue
from tests.support.waiting import eventually
from tests.support.worker_harness import Harness


async def _judged(h: Harness, payloads: list[dict[str, Any]]) -> list[int]:
    """Submit ``payloads`` and wait for every verdict (a worker must be running)."""
    ids = await h.submit(*payloads)
    for sid in ids:
        await eventually(functools.partial(h.status_is, sid, *api.VERDICTS), what=f"submission {sid} judged")
    return ids


async def _fix_tests(h: Harness, ids: list[int], status: str) -> None:
    """The organiser fixes the problem: judged again, these submissions now get ``status`` (the
    sleep judge reads its verdict from the payload)."""
    async with h.pool.acquire() as conn:
        await conn.execute(
            "UPDATE judgequeue.submissions SET payload = payload || jsonb_build_object('status', $2::text)"
            " WHERE id = ANY($1::bigint[])",
            ids, status,
        )  # fmt: skip


async def _preview(h: Harness, **kw: Any) -> api.Preview:
    async with h.pool.acquire() as conn, conn.transaction():
        return await api.rejudging_preview(conn, h.queue, **kw)


async def _show(h: Harness, n: int) -> api.Report:
    async with h.pool.acquire() as conn:
        return await api.rejudging_show(conn, h.queue, n)


async def _apply(h: Harness, n: int, *, partial: bool = False) -> api.Application:
    async with h.pool.acquire() as conn, conn.transaction():
        return await api.rejudging_apply(conn, h.queue, n, partial=partial)


async def _cancel(h: Harness, n: int) -> api.Cancelled:
    async with h.pool.acquire() as conn, conn.transaction():
        return await api.rejudging_cancel(conn, h.queue, n)


async def _visible(h: Harness, ids: list[int]) -> dict[int, tuple[str, int, Any]]:
    async with h.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT id, status, generation, verdict FROM judgequeue.submissions WHERE id = ANY($1::bigint[])", ids
        )
    return {r["id"]: (r["status"], r["generation"], r["verdict"]) for r in rows}


async def _all_judged(h: Harness, n: int) -> bool:
    s = (await _show(h, n)).summary
    return s.judged == s.items


async def _count(h: Harness, sql: str, *args: Any) -> int:
    async with h.pool.acquire() as conn:
        return int(await conn.fetchval(sql, *args))


async def test_preview_show_apply(h: Harness) -> None:
    h.worker(SleepJudge())
    wa = await _judged(h, [{"problem": "p1", "status": "WRONG_ANSWER", "i": i} for i in range(4)])
    ac = await _judged(h, [{"problem": "p1", "status": "ACCEPTED", "i": i} for i in range(3)])
    other = await _judged(h, [{"problem": "p2", "status": "WRONG_ANSWER"}])
    await _fix_tests(h, wa[:3], "ACCEPTED")  # three wrong answers were right after all
    await _fix_tests(h, ac[:1], "TIME_LIMIT")  # and one accepted is too slow
    before = await _visible(h, wa + ac + other)
    last_event = await _count(h, "SELECT coalesce(max(id), 0) FROM judgequeue.verdict_events")

    opened = await _preview(h, problem="p1")
    assert (opened.previewed, opened.left_out) == (7, 0)
    await eventually(lambda: _all_judged(h, opened.rejudging), what="every proposal judged")
    # Judged on the side: nothing visible moved, no event and no history row for the probes.
    assert await _visible(h, wa + ac + other) == before
    report = await _show(h, opened.rejudging)
    assert report.summary.state == "OPEN" and report.summary.items == 7
    assert report.matrix == {
        ("WRONG_ANSWER", "ACCEPTED"): 3, ("WRONG_ANSWER", "WRONG_ANSWER"): 1,
        ("ACCEPTED", "TIME_LIMIT"): 1, ("ACCEPTED", "ACCEPTED"): 2,
    }  # fmt: skip
    assert sorted(c.submission_id for c in report.changed) == sorted(wa[:3] + ac[:1])
    change = next(c for c in report.changed if c.submission_id == ac[0])
    assert change.old_verdict is not None and change.old_verdict["status"] == "ACCEPTED"
    assert change.new_verdict is not None and change.new_verdict["status"] == "TIME_LIMIT"
    assert "details" in change.old_verdict and "details" in change.new_verdict
    assert not change.moved_on
    assert await _count(h, "SELECT count(*) FROM judgequeue.verdict_events WHERE id > $1", last_event) == 0
    probes = await _count(h, "SELECT count(*) FROM judgequeue.submissions WHERE rejudging = $1", opened.rejudging)
    assert probes == 7
    assert await _count(h, "SELECT count(*) FROM judgequeue.verdict_history h JOIN judgequeue.submissions s"
                        " ON s.id = h.submission_id WHERE s.rejudging IS NOT NULL") == 0  # fmt: skip

    done = await _apply(h, opened.rejudging)
    assert (done.applied, done.stale, done.missing, done.applied_now, done.stale_ids) == (7, 0, 0, True, ())
    after = await _visible(h, wa + ac + other)
    for sid in wa + ac:
        status, generation, verdict = after[sid]
        assert generation == before[sid][1] + 1
        want = "ACCEPTED" if sid in wa[:3] or sid in ac[1:] else "TIME_LIMIT" if sid == ac[0] else "WRONG_ANSWER"
        assert status == want, sid
        doc = json.loads(verdict)
        assert (doc["status"], doc["generation"], doc["rejudging"]) == (want, generation, opened.rejudging)
    assert after[other[0]] == before[other[0]]
    async with h.pool.acquire() as conn:
        history = await api.history(conn, h.queue, wa[0])
        events = await conn.fetch(
            "SELECT submission_id, generation, status FROM judgequeue.verdict_events"
            " WHERE kind = 'verdict' AND id > $1", last_event,
        )  # fmt: skip
    assert [(e.generation, e.status, e.cause) for e in history] == [
        (1, "WRONG_ANSWER", "judged"), (2, "ACCEPTED", "applied")
    ]
    # One event per applied verdict, as any verdict emits one.
    assert sorted((r["submission_id"], r["generation"], r["status"]) for r in events) == sorted(
        (sid, after[sid][1], after[sid][0]) for sid in wa + ac
    )
    assert (await _show(h, opened.rejudging)).summary.state == "APPLIED"
    # Applying again changes nothing; cancelling an applied rejudging is refused.
    again = await _apply(h, opened.rejudging)
    assert (again.applied, again.applied_now) == (7, False)
    assert await _visible(h, wa + ac) == {sid: after[sid] for sid in wa + ac}
    with pytest.raises(RejudgingRefused, match=f"rejudging {opened.rejudging} was applied"):
        await _cancel(h, opened.rejudging)


async def test_only_submissions_with_a_verdict_are_previewed(h: Harness) -> None:
    h.worker(SleepJudge())
    [judged, doomed] = await _judged(h, [{"problem": "p"}, {"problem": "p"}])
    async with h.pool.acquire() as conn:
        await api.cancel(conn, h.queue, doomed, "duplicate")
    [waiting] = await h.submit({"problem": "p", "hang": True})
    await eventually(lambda: h.status_is(waiting, "JUDGING"))
    opened = await _preview(h, ids=[judged, doomed, waiting])
    assert (opened.previewed, opened.left_out) == (1, 2)
    await eventually(lambda: _all_judged(h, opened.rejudging))
    assert [c for c in (await _show(h, opened.rejudging)).matrix] == [("ACCEPTED", "ACCEPTED")]


async def test_a_probe_is_not_rejudged_by_its_id(h: Harness) -> None:
    """A probe's verdict is its rejudging's proposal, judged once: rejudging the probe by its id is
    refused naming the rejudging, and the probe and the proposal are left as they were."""
    h.worker(SleepJudge())
    [sid] = await _judged(h, [{"problem": "p"}])
    opened = await _preview(h, ids=[sid])
    await eventually(lambda: _all_judged(h, opened.rejudging))
    async with h.pool.acquire() as conn:
        probe = await conn.fetchval("SELECT probe FROM judgequeue.rejudging_items WHERE rejudging = $1",
                                    opened.rejudging)  # fmt: skip
    before = await _visible(h, [sid, probe])
    async with h.pool.acquire() as conn:
        with pytest.raises(RejudgingRefused, match=f"submission {probe} is a probe of rejudging {opened.rejudging}"):
            await api.rejudge(conn, probe)
    assert await _visible(h, [sid, probe]) == before
    assert (await _apply(h, opened.rejudging)).applied == 1


async def test_apply_refused_while_missing_unless_partial(h: Harness) -> None:
    h.worker(SleepJudge())
    ids = await _judged(h, [{"problem": "p", "i": i} for i in range(5)])
    await _fix_tests(h, ids[:2], "WRONG_ANSWER")
    async with h.pool.acquire() as conn:  # two proposals will never come: their judging hangs
        await conn.execute(
            "UPDATE judgequeue.submissions SET payload = payload || '{\"hang\": true}' WHERE id = ANY($1::bigint[])",
            ids[3:],
        )
    before = await _visible(h, ids)
    opened = await _preview(h, problem="p")
    n = opened.rejudging

    async def three_judged() -> bool:
        return (await _show(h, n)).summary.judged == 3

    await eventually(three_judged, what="three proposals judged")
    with pytest.raises(RejudgingRefused, match=f"rejudging {n} is missing 2 of its 5 proposed verdicts"):
        await _apply(h, n)
    assert await _visible(h, ids) == before  # the refusal changed nothing
    done = await _apply(h, n, partial=True)
    assert (done.applied, done.stale, done.missing) == (3, 0, 2)
    after = await _visible(h, ids)
    assert [after[i][0] for i in ids] == ["WRONG_ANSWER", "WRONG_ANSWER", "ACCEPTED", "ACCEPTED", "ACCEPTED"]
    assert [after[i][1] for i in ids] == [2, 2, 2, 1, 1]  # the missing ones keep their generation
    # The probes that were still being judged are cancelled: their worker stops them.
    async with h.pool.acquire() as conn:
        statuses = await conn.fetch(
            "SELECT p.status FROM judgequeue.rejudging_items i JOIN judgequeue.submissions p ON p.id = i.probe"
            " WHERE i.rejudging = $1 AND i.outcome = 'missing'", n,
        )  # fmt: skip
    assert [r["status"] for r in statuses] == ["CANCELLED", "CANCELLED"]


async def test_cancel_leaves_every_visible_verdict(h: Harness) -> None:
    ids = await h.submit(*[{"problem": "p", "i": i} for i in range(4)])
    w = h.worker(SleepJudge())
    for sid in ids:
        await eventually(functools.partial(h.status_is, sid, "ACCEPTED"))
    await _fix_tests(h, ids, "WRONG_ANSWER")
    async with h.pool.acquire() as conn:  # half of them hang, so some probes are running at the cancel
        await conn.execute(
            "UPDATE judgequeue.submissions SET payload = payload || '{\"hang\": true}' WHERE id = ANY($1::bigint[])",
            ids[2:],
        )
    before = await _visible(h, ids)
    opened = await _preview(h, ids=ids)

    async def running() -> bool:
        return await _count(h, "SELECT count(*) FROM judgequeue.submissions WHERE rejudging = $1"
                            " AND status = 'JUDGING'", opened.rejudging) == 2  # fmt: skip

    await eventually(running, what="two probes being judged")
    gone = await _cancel(h, opened.rejudging)
    assert (gone.cancelled_now, gone.stopped) == (True, 2)
    assert await _visible(h, ids) == before
    await eventually(lambda: _in_flight_is(w, 0), what="the cancelled probes' judges stopped")
    again = await _cancel(h, opened.rejudging)
    assert (again.cancelled_now, again.stopped) == (False, 0)
    with pytest.raises(RejudgingRefused, match=f"rejudging {opened.rejudging} was cancelled"):
        await _apply(h, opened.rejudging)
    assert await _visible(h, ids) == before
    assert (await _show(h, opened.rejudging)).summary.state == "CANCELLED"


async def _in_flight_is(w: Any, n: int) -> bool:
    return bool(w.in_flight == n)


async def test_a_submission_that_moves_on_during_the_preview_is_stale(h: Harness) -> None:
    """The rule: a proposal is for the generation previewed. A submission rejudged (or cancelled,
    or applied from another rejudging) while the preview is open keeps what that gave it; apply
    skips its proposal and reports it stale; the others apply."""
    h.worker(SleepJudge())
    ids = await _judged(h, [{"problem": "p", "i": i} for i in range(4)])
    await _fix_tests(h, ids, "WRONG_ANSWER")
    first = await _preview(h, ids=ids)
    second = await _preview(h, ids=ids[3:])
    await eventually(lambda: _all_judged(h, first.rejudging))
    await eventually(lambda: _all_judged(h, second.rejudging))
    async with h.pool.acquire() as conn:
        await api.rejudge(conn, ids[0])
        await api.cancel(conn, h.queue, ids[1], "duplicate")
    await eventually(lambda: h.status_is(ids[0], "WRONG_ANSWER"), what="the normal rejudge's verdict")
    assert (await _apply(h, second.rejudging)).applied == 1  # ids[3] moves on too
    report = await _show(h, first.rejudging)
    assert sorted(c.submission_id for c in report.changed if c.moved_on) == [ids[0], ids[1], ids[3]]
    before = await _visible(h, ids)
    done = await _apply(h, first.rejudging)
    assert (done.applied, done.stale, done.missing) == (1, 3, 0)
    assert sorted(done.stale_ids) == [ids[0], ids[1], ids[3]]
    after = await _visible(h, ids)
    for sid in (ids[0], ids[1], ids[3]):
        assert after[sid] == before[sid]
    assert after[ids[2]][:2] == ("WRONG_ANSWER", before[ids[2]][1] + 1)
    assert after[ids[1]][0] == "CANCELLED"
    outcomes = {c.submission_id: c.outcome for c in (await _show(h, first.rejudging)).changed}
    assert outcomes == {ids[0]: "stale", ids[1]: "stale", ids[2]: "applied", ids[3]: "stale"}


async def test_bad_input_and_unknown_ids(h: Harness, pg_pool: asyncpg.Pool) -> None:
    with pytest.raises(UnknownRejudging, match=f"unknown rejudging 999999 in queue '{h.queue}'"):
        await _show(h, 999999)
    with pytest.raises(UnknownRejudging, match="unknown rejudging 999999"):
        await _apply(h, 999999)
    with pytest.raises(UnknownRejudging, match="unknown rejudging 999999"):
        await _cancel(h, 999999)
    with pytest.raises(UnknownRejudging, match="positive integer"):
        await _show(h, 0)
    with pytest.raises(InvalidClass, match="at least one of: ids, problem, since, until"):
        await _preview(h)
    with pytest.raises(InvalidClass, match="class 'nope' is not a class of queue"):
        await _preview(h, problem="p", job_class="nope")
    async with h.pool.acquire() as conn:
        with pytest.raises(UnknownQueue, match="unknown queue 'no-such-queue'"):
            await api.rejudging_preview(conn, "no-such-queue", problem="p")
    # A rejudging of another queue is unknown here.
    other = h.queue + "-b"
    async with h.pool.acquire() as conn:
        await create_queue(conn, other)
        opened = await api.rejudging_preview(conn, other, problem="p")
    with pytest.raises(UnknownRejudging, match=f"unknown rejudging {opened.rejudging} in queue"):
        await _show(h, opened.rejudging)
    async with h.pool.acquire() as conn:
        await conn.execute("UPDATE judgequeue.queues SET mode = 'shadow' WHERE name = $1", other)
        with pytest.raises(RejudgingRefused, match="is in shadow mode"):
            await api.rejudging_preview(conn, other, problem="p")
        assert await conn.fetchval("SELECT count(*) FROM judgequeue.rejudgings WHERE queue = $1", other) == 1


async def test_a_bulk_rejudge_never_selects_a_probe_and_retention_prunes(h: Harness) -> None:
    h.worker(SleepJudge())
    ids = await _judged(h, [{"problem": "p", "i": i} for i in range(3)])
    opened = await _preview(h, problem="p")
    await eventually(lambda: _all_judged(h, opened.rejudging))
    async with h.pool.acquire() as conn:
        again = await outbox.rejudge_many(conn, h.queue, problem="p")
    assert sorted(s for s, _ in again) == sorted(ids)
    async with h.pool.acquire() as conn:
        assert [s.rejudging for s in await api.rejudging_list(conn, h.queue)] == [opened.rejudging]
        assert await rejudgings.prune(conn, h.queue, retention=3600) == 0
        assert await rejudgings.prune(conn, h.queue, retention=0) == 1
        assert await api.rejudging_list(conn, h.queue) == []
        assert await conn.fetchval("SELECT count(*) FROM judgequeue.rejudging_items WHERE rejudging = $1",
                                   opened.rejudging) == 0  # fmt: skip
