"""Webhooks survive what production does to them (docs/events.md): real dispatcher, worker and
reaper processes, the reaper delivering to a receiver of the test's own that is down, then
answers 503 and 429 with Retry-After, while the reaper is ``kill -9``ed in the middle of a POST
and Postgres terminates every connection. Every verdict change reaches the receiver, each key's
effect is applied once (repeats are counted and ignored), each submission's deliveries come in
generation order, and the scoreboard ends at each submission's last generation's verdict.

The receiver's outage lasts ``JUDGEQUEUE_TEST_WEBHOOK_DOWN`` seconds (default 3, short for the
suite; 60 runs the issue's long outage: the deliverer's backoff then waits up to a minute).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import asyncpg

from judgequeue.core.store import events, outbox
from judgequeue.core.store.queues import create_queue
from tests.support.roles import Roles, submit_retrying, wait_all_terminal
from tests.support.waiting import eventually
from tests.support.webhook_receiver import Receiver

DOWN = float(os.environ.get("JUDGEQUEUE_TEST_WEBHOOK_DOWN", "3"))
SECRET = "whsec-test-only"
STATUSES = ["ACCEPTED", "WRONG_ANSWER", "TIME_LIMIT", "RUNTIME_ERROR"]


async def _rejudge(dsn: str, ids: list[int]) -> None:
    """Rejudge like an application during an outage: retry each until its commit succeeds."""
    for sid in ids:
        for _ in range(100):
            try:
                conn = await asyncpg.connect(dsn, timeout=2)
                try:
                    async with conn.transaction():
                        await outbox.rejudge(conn, sid)
                    break
                finally:
                    await conn.close()
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
                await asyncio.sleep(0.1)


async def _db_state(dsn: str, queue: str) -> tuple[dict[int, tuple[int, str]], set[str]]:
    """Each submission's (generation, status) and every event key Postgres holds."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT id, generation, status FROM judgequeue.submissions WHERE queue = $1", queue)
        found = await events.read(conn, events.START, queue=queue, limit=100_000)
    finally:
        await conn.close()
    return {r["id"]: (r["generation"], r["status"]) for r in rows}, {e.key for e in found}


async def test_every_verdict_change_is_delivered_and_applied_once_through_outages_and_kills(
    pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    receiver = Receiver(SECRET.encode())
    await receiver.start()
    port = receiver.port
    await receiver.stop()  # down from the start
    conn = await asyncpg.connect(pg_dsn)
    await create_queue(conn, queue_name)
    await conn.close()
    hooks = {"board": {"url": f"http://127.0.0.1:{port}/hook", "secret": SECRET, "deadline": 1, "concurrency": 4,
                       "maxAttempts": 1000}}  # fmt: skip
    roles = Roles.on(pg_dsn, queue_name, tmp_path, JUDGEQUEUE_WEBHOOKS=json.dumps(hooks))
    roles.start_all()
    try:
        ids = [await submit_retrying(pg_dsn, queue_name, {"status": STATUSES[i % 4]}) for i in range(30)]
        await wait_all_terminal(pg_dsn, ids, within=60, roles=roles)
        await _rejudge(pg_dsn, ids[:10])
        await wait_all_terminal(pg_dsn, ids, within=60, roles=roles)
        await asyncio.sleep(DOWN)  # the outage itself: the deliverer meets a closed port meanwhile

        # Up again, answering 503 then 429, each with Retry-After: 1, before it takes anything.
        receiver.script = [(503, 1) for _ in range(5)]
        receiver.script += [(429, 1) for _ in range(5)]
        receiver.hold = True  # the first delivery it takes is held unanswered...
        await receiver.start()
        await eventually(lambda: receiver.held >= 1, within=60, what="a delivery held mid-POST")
        [reaper] = [p for p in roles.procs if p.role == "reaper"]
        os.kill(reaper.pid, signal.SIGKILL)  # ...and the deliverer is killed in the middle of it
        await asyncio.to_thread(reaper.wait)
        receiver.hold = False
        receiver.release.set()
        roles.start("reaper")

        # Postgres drops every connection while verdicts keep changing.
        await _rejudge(pg_dsn, ids[10:20])
        killer = await asyncpg.connect(pg_dsn)
        try:
            for _ in range(3):
                await killer.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                await asyncio.sleep(0.5)
        finally:
            await killer.close()
        await wait_all_terminal(pg_dsn, ids, within=60, roles=roles)

        async def settled() -> bool:
            state, keys = await _db_state(pg_dsn, queue_name)
            return receiver.board == state and set(receiver.deliveries) == keys

        await eventually(settled, within=120, every=0.2, what="every verdict change delivered")
        state, keys = await _db_state(pg_dsn, queue_name)
        assert len(keys) == 30 + 10 + 10  # one event per stored verdict
        assert receiver.board == state  # each submission at its last generation's verdict
        assert set(receiver.applied.values()) == {1}  # each key's effect once...
        assert max(receiver.deliveries.values()) >= 2  # ...though the killed POST was delivered again
        assert receiver.answered[503] == 5 and receiver.answered[429] == 5
        assert receiver.bad_signatures == 0
        assert receiver.max_inflight <= 4
        for sid in ids:  # each submission's deliveries in generation order, repeats included
            generations = [g for s, g in receiver.arrivals if s == sid]
            assert generations == sorted(generations), (sid, generations)
        assert roles.alive() == len(roles.procs) - 1  # only the killed reaper is gone
    finally:
        receiver.release.set()
        await asyncio.to_thread(roles.stop)
        await receiver.stop()
