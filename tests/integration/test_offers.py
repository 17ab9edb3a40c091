"""Offers (core/store/sql/schema.sql, core/roles/worker/direct/offers.py and offer_keeper.py) against real
Postgres and Redis: an idle direct-intake worker's open slots, which the submits fill in their own transactions.

What must hold is what holds for any lease: one terminal verdict per submission, no verdict from a
stale attempt, no live dispatch of a pre-watermark row (a flag flip and a filling submit exclude
each other), nothing lost when a notification is (the worker's sync makes it up), and a worker never
holds more jobs than its slots. ``tests/process/test_chaos.py`` runs the roles with offers under
kills, freezes and flips.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core.base.errors import CutoverBlocked
from judgequeue.core.judges import Verdict
from judgequeue.core.roles.worker.direct import DirectIntake, offer_keeper, offers, takes, tuning
from judgequeue.core.roles.worker.role import Worker
from judgequeue.core.runtime import wakeup
from judgequeue.core.store import outbox
from judgequeue.core.store.queues import database_now, get_queue, set_cutover
from tests.support.databases import REDIS_URL
from tests.support.inprocess import GateJudge, running
from tests.support.settings import make_settings
from tests.support.waiting import eventually

WORKER = "w-offers"


async def _offer(conn: asyncpg.Connection, queue: str, slots: list[int], *, channel: str = "jq_offers_test") -> None:
    await offers.sync(conn, queue, WORKER, channel=channel, lease_ttl=30, open_slots=slots, seen=[], withdraw=False)


async def _row(pool: asyncpg.Pool | asyncpg.Connection, sid: int) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT s.status, s.attempt_id, s.lease_expires_at - now() AS lease, o.state, o.claimed_by"
        " FROM judgequeue.submissions s JOIN judgequeue.outbox o ON o.submission_id = s.id WHERE s.id = $1",
        sid,
    )
    assert row is not None
    return row


class Listener:
    """A connection LISTENing on a channel, collecting its notifications."""

    def __init__(self, conn: asyncpg.Connection, channel: str) -> None:
        self.conn, self.channel, self.got = conn, channel, asyncio.Queue[str]()

    async def __aenter__(self) -> Listener:
        await self.conn.add_listener(self.channel, lambda _c, _p, _ch, payload: self.got.put_nowait(payload))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()

    async def next(self) -> str:
        return await asyncio.wait_for(self.got.get(), 5)


# --- the submit's side ---------------------------------------------------------------------------


async def test_a_submit_fills_an_open_offer_in_its_own_transaction(
    pg_pool: asyncpg.Pool, pg_dsn: str, queue: str
) -> None:
    """Filled: the submission is written leased to the worker (JUDGING, a fresh attempt, a lease of
    the offer's TTL), its outbox row SENT to it, and that worker alone is notified with the job."""
    async with pg_pool.acquire() as conn:
        await _offer(conn, queue, [0])
    async with Listener(await asyncpg.connect(pg_dsn), "jq_offers_test") as heard:
        async with pg_pool.acquire() as conn:
            sid = await outbox.submit(conn, queue, {"source": "print(1)"})
        filled = offers.parse_notification(await heard.next())
    row = await _row(pg_pool, sid)
    assert (row["status"], row["state"], row["claimed_by"]) == ("JUDGING", "SENT", WORKER)
    assert timedelta(seconds=25) < row["lease"] <= timedelta(seconds=30)
    assert (filled.submission, filled.attempt, filled.slot) == (sid, row["attempt_id"], 0)
    assert filled.has_payload and filled.payload == {"source": "print(1)"}
    # The next submit finds no open offer: a PENDING row, as without offers.
    async with pg_pool.acquire() as conn:
        later = await outbox.submit(conn, queue, {})
    assert (await _row(pg_pool, later))["status"] == "PENDING"


async def test_only_open_live_offers_are_filled(pg_pool: asyncpg.Pool, queue: str) -> None:
    """Expired offers, and any offer of a paused or shadow queue or before the watermark, are left
    alone (the row is PENDING, the offer still open): the flags decide in the submit's statement."""
    async with pg_pool.acquire() as conn:
        await _offer(conn, queue, [0])
        await conn.execute("UPDATE judgequeue.worker_offers SET expires_at = now() - interval '1 second'")
        assert (await _row(conn, await outbox.submit(conn, queue, {})))["status"] == "PENDING"
        await _offer(conn, queue, [0])  # refreshed: open again
        await set_cutover(conn, queue, paused=True)
        assert (await _row(conn, await outbox.submit(conn, queue, {})))["status"] == "PENDING"
        await set_cutover(conn, queue, paused=False, mode="shadow")
        assert (await _row(conn, await outbox.submit(conn, queue, {})))["status"] == "PENDING"
        future = await database_now(conn) + timedelta(hours=1)
        await set_cutover(conn, queue, mode="live", watermark=future)
        assert (await _row(conn, await outbox.submit(conn, queue, {})))["status"] == "PENDING"
        open_ = await conn.fetchval("SELECT count(*) FROM judgequeue.worker_offers WHERE submission IS NULL")
    assert open_ == 1


async def test_a_large_payload_is_left_for_the_sync(pg_pool: asyncpg.Pool, pg_dsn: str, queue: str) -> None:
    """A notification carries payloads up to 7,000 bytes; a larger one comes without it, and the
    worker's next sync reports the filled offer with the job."""
    big = {"source": "x" * 20_000}
    async with pg_pool.acquire() as conn:
        await _offer(conn, queue, [0])
    async with Listener(await asyncpg.connect(pg_dsn), "jq_offers_test") as heard:
        async with pg_pool.acquire() as conn:
            sid = await outbox.submit(conn, queue, big)
        filled = offers.parse_notification(await heard.next())
    assert filled.submission == sid and not filled.has_payload
    async with pg_pool.acquire() as conn:
        synced = await offers.sync(
            conn, queue, WORKER, channel="jq_offers_test", lease_ttl=30, open_slots=[0], seen=[], withdraw=False
        )
    [again] = synced.filled
    assert (again.submission, again.attempt, again.payload) == (sid, filled.attempt, big)


async def test_concurrent_submits_never_fill_one_offer_twice_nor_wait(pg_dsn: str, queue: str) -> None:
    """An offer being filled by an open transaction is skipped, not waited for: the next submit
    fills another, or writes a PENDING row; nothing blocks (a lock timeout would fail it)."""
    first, second = await asyncpg.connect(pg_dsn), await asyncpg.connect(pg_dsn)
    try:
        await _offer(first, queue, [0, 1])
        await second.execute("SET lock_timeout = '200ms'")
        tx = first.transaction()
        await tx.start()
        a = await outbox.submit(first, queue, {})  # fills one offer, uncommitted
        b = await outbox.submit(second, queue, {})  # the other
        c = await outbox.submit(second, queue, {})  # none left open: PENDING
        await tx.commit()
        rows = {sid: await _row(second, sid) for sid in (a, b, c)}
        slots = await second.fetch("SELECT slot, submission FROM judgequeue.worker_offers ORDER BY slot")
    finally:
        await first.close()
        await second.close()
    assert [rows[s]["status"] for s in (a, b, c)] == ["JUDGING", "JUDGING", "PENDING"]
    assert sorted(r["submission"] for r in slots) == sorted([a, b])


async def test_a_submit_without_an_offer_wakes_a_registered_waiter_only(
    pg_pool: asyncpg.Pool, pg_dsn: str, queue: str
) -> None:
    """No open offer: a PENDING row, and one wake-up notification when a waiter (a dispatcher or
    a worker with direct intake) is registered; none when nobody is, so a busy queue's commits
    carry no NOTIFY."""
    async with Listener(await asyncpg.connect(pg_dsn), wakeup.WAKEUP_CHANNEL) as heard:
        async with pg_pool.acquire() as conn:
            quiet = await outbox.submit(conn, queue, {})
            # Notifications of one session arrive in commit order: a wake-up of the quiet submit
            # would come before this marker.
            await conn.execute("SELECT pg_notify($1, 'marker')", wakeup.WAKEUP_CHANNEL)
            assert await heard.next() == "marker"
            await wakeup.register_waiter(conn, queue, "dispatcher-1")
            woken = await outbox.submit(conn, queue, {})
        assert await heard.next() == queue
    assert (await _row(pg_pool, quiet))["status"] == (await _row(pg_pool, woken))["status"] == "PENDING"


async def test_a_rolled_back_submit_leaves_its_offer_open_and_notifies_nobody(
    pg_pool: asyncpg.Pool, pg_dsn: str, queue: str
) -> None:
    async with pg_pool.acquire() as conn:
        await _offer(conn, queue, [0])
    async with Listener(await asyncpg.connect(pg_dsn), "jq_offers_test") as heard:
        async with pg_pool.acquire() as conn:
            with contextlib.suppress(RuntimeError):
                async with conn.transaction():
                    await outbox.submit(conn, queue, {})
                    raise RuntimeError("the application changed its mind")
            sid = await outbox.submit(conn, queue, {"after": True})
        filled = offers.parse_notification(await heard.next())
    assert filled.submission == sid and filled.payload == {"after": True}  # the first sent nothing
    assert heard.got.empty()


async def test_a_flip_waits_for_filling_submits_and_submits_never_wait_for_a_flip(pg_dsn: str, queue: str) -> None:
    """Invariant 4 with offers: a submit decides on the flags it read, at its commit. A flip that
    starts while such a submit is open waits for its commit (so no live dispatch lands after a
    watermark that excludes it); a submit that comes while a flip is under way does not fill an
    offer and does not wait either: it writes a PENDING row, which the flags judge later."""
    filler, flipper, other = [await asyncpg.connect(pg_dsn) for _ in range(3)]
    try:
        await _offer(filler, queue, [0, 1])
        tx = filler.transaction()
        await tx.start()
        await outbox.submit(filler, queue, {})  # fills an offer; holds the flip lock (shared)
        flip = asyncio.ensure_future(set_cutover(flipper, queue, paused=True))
        await eventually(lambda: _waits_on_a_lock(other, flipper), what="the flip waits for the filling submit")
        await other.execute("SET lock_timeout = '200ms'")
        during = await outbox.submit(other, queue, {})  # the flip is waiting: no fill, no wait
        assert (await _row(other, during))["status"] == "PENDING"
        assert not flip.done()
        await tx.commit()
        await asyncio.wait_for(flip, 5)
        after = await outbox.submit(other, queue, {})
        assert (await _row(other, after))["status"] == "PENDING"  # paused now: no fill
    finally:
        for c in (filler, flipper, other):
            await c.close()


async def test_a_flip_gives_up_after_its_wait_and_changes_nothing(pg_dsn: str, queue: str) -> None:
    """An application transaction that filled an offer and stays open would hold a flip (an
    emergency pause) for as long as it likes: the flip waits at most its ``wait``, then says why,
    changes nothing and leaves the session's own lock timeout as it was; once that transaction
    ends, the same flip goes through."""
    filler, flipper = [await asyncpg.connect(pg_dsn) for _ in range(2)]
    try:
        await _offer(filler, queue, [0])
        tx = filler.transaction()
        await tx.start()
        await outbox.submit(filler, queue, {})
        with pytest.raises(CutoverBlocked, match=r"waited 0.2s for 1 open transaction"):
            await set_cutover(flipper, queue, paused=True, wait=0.2)
        assert (await get_queue(flipper, queue)).paused is False
        assert await flipper.fetchval("SHOW lock_timeout") == "0"
        async with flipper.transaction():  # inside the caller's own transaction: its setting is kept
            await flipper.execute("SET LOCAL lock_timeout = '7s'")
            with pytest.raises(CutoverBlocked):
                await set_cutover(flipper, queue, paused=True, wait=0.2)
            assert await flipper.fetchval("SHOW lock_timeout") == "7s"
        await tx.commit()
        assert (await set_cutover(flipper, queue, paused=True, wait=0.2)).paused is True
    finally:
        for c in (filler, flipper):
            await c.close()


@pytest.mark.parametrize("isolation", ["repeatable_read", "serializable"])
async def test_a_submit_outside_read_committed_never_fills_an_offer(pg_dsn: str, queue: str, isolation: str) -> None:
    """The interlock reads the flags after its lock with a snapshot of its own, which only READ
    COMMITTED takes per statement. A REPEATABLE READ or SERIALIZABLE transaction whose snapshot
    predates a flip would fill an offer under the old flags (a live dispatch after a pause), and
    one whose snapshot predates an offer's refresh would fail with 40001: such submits write a
    PENDING row, as without offers, and fail on nothing new."""
    app, operator = [await asyncpg.connect(pg_dsn) for _ in range(2)]
    try:
        await _offer(operator, queue, [0])
        for flip in (True, False):
            tx = app.transaction(isolation=isolation)
            await tx.start()
            await app.fetchval("SELECT 1")  # the transaction's snapshot is taken here
            await _offer(operator, queue, [0])  # the offer refreshed after that snapshot
            if flip:
                await set_cutover(operator, queue, paused=True)
            sid = await outbox.submit(app, queue, {})
            await tx.commit()
            assert (await _row(operator, sid))["status"] == "PENDING"
            assert await _open_offers(operator, 1)
            await set_cutover(operator, queue, paused=False)
        # The same submit at READ COMMITTED fills it.
        sid = await outbox.submit(app, queue, {})
        assert (await _row(operator, sid))["status"] == "JUDGING"
    finally:
        for c in (app, operator):
            await c.close()


async def _waits_on_a_lock(observer: asyncpg.Connection, waiting: asyncpg.Connection) -> bool:
    pid = waiting.get_server_pid()
    kind = await observer.fetchval("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid)
    return bool(kind == "Lock")


async def test_sync_reopens_forgets_withdraws_and_reports_what_it_did_not_see(
    pg_pool: asyncpg.Pool, queue: str
) -> None:
    async with pg_pool.acquire() as conn:
        await _offer(conn, queue, [0, 1, 2])
        filled = [await outbox.submit(conn, queue, {"i": i}) for i in range(2)]  # slots 0 and 1
        # Not reported seen: both come back with their jobs (a lost notification is made up).
        synced = await offers.sync(
            conn, queue, WORKER, channel="c", lease_ttl=30, open_slots=[2], seen=[], withdraw=False
        )
        assert sorted(f.submission for f in synced.filled) == filled and all(f.has_payload for f in synced.filled)
        assert synced.present == {0, 1, 2}
        by_slot = {f.slot: f.attempt for f in synced.filled}
        # Slot 0 seen and wanted open again, slot 1 seen and not wanted: reopened, forgotten.
        seen = sorted(by_slot.items())
        await offers.sync(conn, queue, WORKER, channel="c", lease_ttl=30, open_slots=[0, 2], seen=seen, withdraw=False)
        rows = await conn.fetch("SELECT slot, submission FROM judgequeue.worker_offers ORDER BY slot")
        assert [(r["slot"], r["submission"]) for r in rows] == [(0, None), (2, None)]
        # The worker never read that answer (the connection dropped after the commit) and slot 0 is
        # filled again meanwhile: the same pairs sent again neither reopen nor forget the new fill,
        # which is reported like any unseen one.
        again = sorted([await outbox.submit(conn, queue, {"i": i}) for i in (2, 3)])  # slots 0 and 2
        resent = await offers.sync(
            conn, queue, WORKER, channel="c", lease_ttl=30, open_slots=[0, 2], seen=seen, withdraw=False
        )
        assert sorted(f.submission for f in resent.filled) == again and all(f.has_payload for f in resent.filled)
        [refill] = [f for f in resent.filled if f.slot == 0]
        assert refill.attempt != by_slot[0]
        handled = sorted((f.slot, f.attempt) for f in resent.filled)
        await offers.sync(conn, queue, WORKER, channel="c", lease_ttl=30, open_slots=[], seen=handled, withdraw=True)
        assert await conn.fetchval("SELECT count(*) FROM judgequeue.worker_offers") == 0


async def test_a_filled_offer_whose_lease_moved_on_is_reported_without_a_job(pg_pool: asyncpg.Pool, queue: str) -> None:
    async with pg_pool.acquire() as conn:
        await _offer(conn, queue, [0])
        sid = await outbox.submit(conn, queue, {})
        await outbox.rejudge(conn, sid)  # generation 2: the handed-over attempt is stale
        synced = await offers.sync(
            conn, queue, WORKER, channel="c", lease_ttl=30, open_slots=[], seen=[], withdraw=True
        )
    [stale] = synced.filled
    assert stale.submission == sid and not stale.has_payload


async def test_the_reaper_prunes_offers_their_worker_stopped_refreshing(pg_pool: asyncpg.Pool, queue: str) -> None:
    async with pg_pool.acquire() as conn:
        await _offer(conn, queue, [0, 1])
        await conn.execute("UPDATE judgequeue.worker_offers SET expires_at = now() - interval '10 minutes'")
        assert await wakeup.prune_offers(conn, older_than=300) == 2


# --- the worker's side ---------------------------------------------------------------------------






def _worker(pool: asyncpg.Pool, redis: aioredis.Redis, dsn: str, queue: str, judge: Any, **env: str) -> Worker:
    env.setdefault("schedule", "30s")  # offers and notifications, not polls, must do the work
    env.setdefault("grace_period", "1s")
    return Worker(pool, redis, make_settings(dsn, REDIS_URL, queue, intake="direct", **env), judge=judge)


def _keeper(pg_pool: asyncpg.Pool, queue: str) -> offer_keeper.OfferKeeper:
    """An offers loop of four offers for a worker of eight slots, none busy, starting nothing."""
    return offer_keeper.OfferKeeper(
        pg_pool, queue, WORKER, limit=4, concurrency=8, lease_ttl=30, busy=lambda: 0, start=lambda _: None
    )


@contextlib.asynccontextmanager
async def _four_offers(pg_pool: asyncpg.Pool, queue: str) -> AsyncIterator[offer_keeper.OfferKeeper]:
    """:func:`_keeper` running, its four offers open."""
    off = _keeper(pg_pool, queue)
    off.start()
    try:
        off.want(True)
        await eventually(lambda: _open_offers(pg_pool, 4), what="four offers open")
        yield off
    finally:
        await off.close(5)


async def _open_offers(pool: asyncpg.Pool | asyncpg.Connection, n: int) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM judgequeue.worker_offers WHERE submission IS NULL") == n)


async def _open_at_least(pool: asyncpg.Pool, n: int) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM judgequeue.worker_offers WHERE submission IS NULL") >= n)


async def _done(pool: asyncpg.Pool, ids: list[int]) -> bool:
    n = await pool.fetchval(
        "SELECT count(*) FROM judgequeue.submissions WHERE id = ANY($1) AND status = 'ACCEPTED'", ids
    )
    return bool(n == len(ids))


async def test_an_idle_worker_offers_and_submits_hand_it_their_jobs(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """Trickles of submits are judged through the offers alone: the worker's takes are the few it
    makes while idle, not one per job; its offers are topped up as they fill."""
    w = _worker(pg_pool, redis_client, pg_dsn, queue, SleepJudgeAccepting(), concurrency="8", offers="4")
    direct = w.intake
    assert isinstance(direct, DirectIntake)
    async with running(w):
        await eventually(lambda: _open_offers(pg_pool, 4), what="four offers open")
        takes_before = direct.takes_issued
        ids: list[int] = []
        async with pg_pool.acquire() as conn:
            for k in range(5):
                ids += [await outbox.submit(conn, queue, {"i": i}) for i in range(3)]
                await eventually(functools.partial(_done, pg_pool, list(ids)), what=f"trickle {k} judged")
                # Topped up once three quarters are gone (offers.to_add): open again before the next.
                await eventually(lambda: _open_at_least(pg_pool, 2), what="the offers topped up")
        assert direct.takes_issued - takes_before <= 2, "the jobs came through offers, not takes"
        claimed = await pg_pool.fetch(
            "SELECT DISTINCT claimed_by FROM judgequeue.outbox WHERE submission_id = ANY($1)", ids
        )
    assert {r["claimed_by"] for r in claimed} == {w.name}
    assert await _open_offers(pg_pool, 0), "a stopped worker takes its offers back"


class SleepJudgeAccepting:
    async def judge(self, payload: Any) -> Verdict:
        return Verdict("ACCEPTED", {"i": payload.get("i")})


async def test_offers_never_give_a_worker_more_jobs_than_slots(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """Two slots: at most two jobs at once, whether they came by offer or by take; the rest wait
    PENDING and are judged as slots free."""
    judge = GateJudge()
    w = _worker(pg_pool, redis_client, pg_dsn, queue, judge, concurrency="2", offers="8")
    async with running(w):
        await eventually(lambda: _open_offers(pg_pool, 2), what="an offer per free slot, no more")
        async with pg_pool.acquire() as conn:
            ids = [await outbox.submit(conn, queue, {"i": i}) for i in range(6)]
        await eventually(lambda: len(judge.started) == 2, what="two jobs running")
        assert await pg_pool.fetchval(
            "SELECT count(*) FROM judgequeue.submissions WHERE id = ANY($1) AND status = 'PENDING'", ids
        ) == 4
        judge.gate.set()
        await eventually(functools.partial(_done, pg_pool, ids), what="all judged as slots freed")
        # Rows that went the usual way (rejudges) while both slots are offered, and submits that
        # fill those offers at the same moment: still two at once.
        judge.gate.clear()
        await eventually(lambda: _open_offers(pg_pool, 2), what="both slots offered again")
        async with pg_pool.acquire() as conn:
            for sid in ids[:2]:
                await outbox.rejudge(conn, sid)
            more = [await outbox.submit(conn, queue, {"i": i}) for i in range(6, 8)]
        await eventually(lambda: len(judge.started) == 8, what="two more running")
        judge.gate.set()
        await eventually(functools.partial(_done, pg_pool, ids + more), what="all judged again")
    assert judge.most <= 2


async def test_offers_never_open_for_slots_a_take_is_filling(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker registers (its take found nothing), wants offers and looks again: that take is
    given both slots. Offers opened while it runs would be filled by submits too, and the take
    would then lease rows into the same slots (four jobs on two slots). The offers count the take's
    slots as busy until it ends: no offer opens meanwhile, and never more than two jobs run."""
    judge = GateJudge()
    w = _worker(pg_pool, redis_client, pg_dsn, queue, judge, concurrency="2", offers="8")
    real_take, real_sync = takes.take, offers.sync
    calls = 0
    in_take, release = asyncio.Event(), asyncio.Event()
    synced_during_take = asyncio.Event()

    async def gated_take(*args: Any, **kwargs: Any) -> takes.Take:
        nonlocal calls
        calls += 1
        if calls == 2:  # the look-again take right after the registration
            in_take.set()
            await release.wait()
        return await real_take(*args, **kwargs)

    async def watched_sync(*args: Any, **kwargs: Any) -> offers.Synced:
        result = await real_sync(*args, **kwargs)
        if in_take.is_set() and not release.is_set() and not kwargs["withdraw"]:
            synced_during_take.set()
        return result

    monkeypatch.setattr(takes, "take", gated_take)
    monkeypatch.setattr(offers, "sync", watched_sync)
    async with running(w):
        await asyncio.wait_for(in_take.wait(), 10)
        # The offers' loop, woken by the registration, has written them while the take waits.
        await asyncio.wait_for(synced_during_take.wait(), 10)
        assert await _open_offers(pg_pool, 0), "offers opened for slots the take is filling"
        async with pg_pool.acquire() as conn:
            ids = [await outbox.submit(conn, queue, {"i": i}) for i in range(4)]
        release.set()
        await eventually(lambda: len(judge.started) == 2, what="the take's two jobs running")
        judge.gate.set()
        await eventually(functools.partial(_done, pg_pool, ids), what="all judged as slots freed")
    assert judge.most <= 2


async def test_offers_lost_with_the_table_stay_reserved_when_written_again(
    pg_pool: asyncpg.Pool, queue: str
) -> None:
    """The offers table is unlogged: a crash of the database empties it. The next sync writes the
    worker's open slots again, and those slots stay reserved (the worker takes nothing into them):
    slots a submit may fill are never free for a take at the same time."""
    started: list[Any] = []
    off = offer_keeper.OfferKeeper(
        pg_pool, queue, WORKER, limit=4, concurrency=8, lease_ttl=30, busy=lambda: 0, start=started.extend
    )
    off.start()
    try:
        off.want(True)
        await eventually(lambda: _open_offers(pg_pool, 4), what="four offers open")
        await pg_pool.execute("TRUNCATE judgequeue.worker_offers")  # what a crash does to it
        off._refreshed_at = 0.0  # the loop's next sync is the once-a-second refresh
        await off._sync()
        assert await _open_offers(pg_pool, 4)
        assert off.reserved == 4
    finally:
        await off.close(5)
    assert started == []


async def test_offers_stay_alive_while_top_ups_keep_the_loop_busy(pg_pool: asyncpg.Pool, queue: str) -> None:
    """Top-ups between refreshes write only the slots they open; the once-a-second refresh still
    comes when the loop never waits out its timer (a fill every few milliseconds wakes it), so an
    offer nobody fills does not expire (tuning.OFFER_VALIDITY) while its worker lives."""
    async with _four_offers(pg_pool, queue) as off:
        deadline = asyncio.get_running_loop().time() + tuning.OFFER_VALIDITY + 1.5
        while asyncio.get_running_loop().time() < deadline:
            off.freed()  # what each fill does: wake the loop for a top-up
            off._bell.ring()
            await asyncio.sleep(0.02)  # pacing of the wake-ups, not synchronisation
        alive = await pg_pool.fetchval(
            "SELECT count(*) FROM judgequeue.worker_offers WHERE submission IS NULL AND expires_at > now()"
        )
        assert alive == 4


async def test_the_offers_loop_sleeps_while_it_offers_nothing(
    pg_pool: asyncpg.Pool, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not wanted (a busy worker), or cooling down after a burst: nothing to write or keep alive,
    so the loop wakes about once a REFRESH, not in a spin (which once cost a third of a busy
    worker's CPU and a quarter of its throughput)."""
    off = _keeper(pg_pool, queue)
    syncs = 0
    real = off._sync

    async def counted() -> None:
        nonlocal syncs
        syncs += 1
        await real()

    monkeypatch.setattr(off, "_sync", counted)
    off.start()
    try:
        off.want(True)
        await eventually(lambda: _open_offers(pg_pool, 4), what="four offers open")
        off.taken(tuning.OFFER_BURST_ROWS, 64)  # a burst: cool down (offers withdrawn, none for COOLDOWN)
        await eventually(lambda: _open_offers(pg_pool, 0), what="offers withdrawn")
        syncs = 0
        window = asyncio.Event()
        asyncio.get_running_loop().call_later(tuning.OFFER_COOLDOWN / 2, window.set)
        await window.wait()  # a span of the cooldown, measured by the loop's own clock
        assert syncs <= 2, f"{syncs} syncs in {tuning.OFFER_COOLDOWN / 2}s with nothing to offer"
    finally:
        await off.close(5)


async def test_a_take_during_the_cooldown_does_not_extend_it(pg_pool: asyncpg.Pool, queue: str) -> None:
    """While cooling down every row comes through takes, so a take that finds a group of rows
    says nothing about offers: the cooldown ends when it was due and the offers come back (a take
    found a burst each time here once, and the offers never came back at 1,000 submits a second)."""
    async with _four_offers(pg_pool, queue) as off:
        off.taken(tuning.OFFER_BURST_ROWS, 64)  # a burst while offering: cool down
        await eventually(lambda: _open_offers(pg_pool, 0), what="offers withdrawn")
        due = off._cooldown_until
        off.taken(tuning.OFFER_BURST_ROWS * 4, 64)  # a take during the cooldown
        assert off._cooldown_until == due
        await eventually(
            lambda: _open_offers(pg_pool, 4), what="offers back after the cooldown", within=tuning.OFFER_COOLDOWN + 5
        )


async def test_a_lost_notification_is_made_up_by_the_sync(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """The listener's connection dies while submits fill the offers (its notifications are lost):
    the worker still judges those jobs within a sync or two, long before their leases expire."""
    w = _worker(pg_pool, redis_client, pg_dsn, queue, SleepJudgeAccepting(), concurrency="8", offers="4",
                lease_ttl="60s")  # fmt: skip
    direct = w.intake
    assert isinstance(direct, DirectIntake)
    async with running(w):
        await eventually(lambda: _open_offers(pg_pool, 4), what="offers open")
        listen_pid = direct.wakeup._conn.get_server_pid() if direct.wakeup and direct.wakeup._conn else None
        assert listen_pid is not None
        async with pg_pool.acquire() as conn:
            await conn.execute("SELECT pg_terminate_backend($1)", listen_pid)
            await eventually(
                lambda: direct.wakeup is not None and not direct.wakeup.listening, what="the listener gone"
            )
            ids = [await outbox.submit(conn, queue, {"i": i}) for i in range(3)]
        assert await pg_pool.fetchval(
            "SELECT count(*) FROM judgequeue.submissions WHERE id = ANY($1) AND status = 'JUDGING'", ids
        ) == 3  # handed over to offers whose notifications nobody heard
        await eventually(functools.partial(_done, pg_pool, ids), within=10, what="judged from the sync's report")


async def test_a_rejudge_reaches_a_worker_whose_slots_are_all_offered(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """One slot, offered: a rejudge writes a PENDING row (bump_generation hands nothing over); its
    notification makes the worker take the offer back and the row in."""
    w = _worker(pg_pool, redis_client, pg_dsn, queue, SleepJudgeAccepting(), concurrency="1", offers="1")
    async with running(w):
        await eventually(lambda: _open_offers(pg_pool, 1), what="the one slot offered")
        async with pg_pool.acquire() as conn:
            [sid] = [await outbox.submit(conn, queue, {"i": 0})]
            await eventually(functools.partial(_done, pg_pool, [sid]), what="judged by offer")
            await eventually(lambda: _open_offers(pg_pool, 1), what="offered again")
            await outbox.rejudge(conn, sid)
        await eventually(
            lambda: _generation_done(pg_pool, sid, 2), within=10, what="the rejudge judged without the poll"
        )


async def _generation_done(pool: asyncpg.Pool, sid: int, generation: int) -> bool:
    row = await pool.fetchrow("SELECT status, generation FROM judgequeue.submissions WHERE id = $1", sid)
    return bool(row is not None and row["generation"] == generation and row["status"] == "ACCEPTED")


async def test_a_burst_makes_the_worker_take_its_offers_back(
    pg_pool: asyncpg.Pool, pg_dsn: str, redis_client: aioredis.Redis, queue: str
) -> None:
    """Submits that outrun the offers (a take finds a burst of rows) end the offers for a while: a
    NOTIFY per commit would cap the submits. The burst is judged through takes."""
    judge = GateJudge()
    w = _worker(pg_pool, redis_client, pg_dsn, queue, judge, concurrency="64", offers="2")
    async with running(w):
        await eventually(lambda: _open_offers(pg_pool, 2), what="offers open")
        async with pg_pool.acquire() as conn, conn.transaction():  # one commit: they arrive at once
            ids = [await outbox.submit(conn, queue, {"i": i}) for i in range(2 + tuning.OFFER_BURST_ROWS * 2)]
        await eventually(lambda: len(judge.started) == len(ids), what="the burst taken")
        await eventually(lambda: _open_offers(pg_pool, 0), what="offers taken back")
        judge.gate.set()
        await eventually(functools.partial(_done, pg_pool, ids), what="all judged")


def test_a_bad_offers_count_is_one_clear_error() -> None:
    from judgequeue.core.base.errors import ConfigError
    from judgequeue.core.config import load_settings

    env = {
        "JUDGEQUEUE_POSTGRES_DSN": "postgresql://u@h/db",
        "JUDGEQUEUE_REDIS_URL": "redis://h/0",
        "JUDGEQUEUE_QUEUE": "q",
    }
    assert load_settings(env).worker.offers == 32
    assert load_settings({**env, "JUDGEQUEUE_OFFERS": "0"}).worker.offers == 0
    for bad in ("-1", "many", "1.5"):
        with pytest.raises(ConfigError, match="JUDGEQUEUE_OFFERS"):
            load_settings({**env, "JUDGEQUEUE_OFFERS": bad})
