"""A property-based fuzzer against running roles: arbitrary stream entries, good jobs in between.

Hypothesis generates sequences of steps: a good submission (through the outbox, as applications
submit), a foreign stream entry (any field names and bytes, numbers at and past bigint's edges,
well-formed envelopes naming random ids), or a frozen worker (SIGSTOP while entries arrive, so
some entries sit in its PEL until the reaper claims them and must parse them itself). Dispatcher,
workers and reaper run as real processes for the whole test, against real Postgres and Redis.

After every example: each worker and the reaper are still running, every good submission has
exactly one terminal verdict, and every entry has left the stream and the PEL (acked, or
dead-lettered with a reason). At the end every role exits 0 on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from judgequeue.core.store import outbox
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import streams
from judgequeue.core.transport.envelope import Envelope
from tests.support.databases import REDIS_URL
from tests.support.queries import count_submissions, submissions
from tests.support.roles import Roles

NAMES = ("submission", "generation", "attempt", "outbox", "enqueued_at", "deliveries")

numbers = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64).map(str),
    st.sampled_from(["0", "1", "9223372036854775807", "9223372036854775808", "1e3", "nan", " 7", "\u0661"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
values = st.one_of(numbers.map(str.encode), st.binary(max_size=40))
names = st.one_of(st.sampled_from([n.encode() for n in NAMES]), st.binary(min_size=1, max_size=20))
foreign_entry = st.one_of(
    st.dictionaries(names, values, min_size=1, max_size=8),
    # Complete envelopes with arbitrary values in each field, so parsing gets past the first one.
    st.fixed_dictionaries({n.encode(): values for n in NAMES}),
    # Well-formed envelopes naming ids that may or may not exist.
    st.builds(
        lambda s, g, d: Envelope(s, g, 1, 1, time.time(), d).fields(),
        st.integers(min_value=1, max_value=2**63 - 1),
        st.integers(min_value=0, max_value=2**63 - 1),
        st.integers(min_value=1, max_value=1000),
    ),
)
step = st.one_of(
    st.just(("good", None)),
    st.tuples(st.just("foreign"), foreign_entry),
    st.just(("freeze", None)),
)

OK = {"seconds": 0.001, "status": "ACCEPTED"}
TERMINAL_OK = "ACCEPTED"


class Fuzz:
    def __init__(self, pg_dsn: str, queue: str, roles: Roles) -> None:
        self.pg_dsn, self.queue, self.roles = pg_dsn, queue, roles
        self.workers = [p for p in roles.procs if "worker" in p.args]  # type: ignore[operator]
        self.examples = 0
        self.foreign = 0
        self.freezes = 0

    async def run(self, steps: list[tuple[str, Any]]) -> None:
        self.examples += 1
        conn = await asyncpg.connect(self.pg_dsn)
        redis = aioredis.Redis.from_url(REDIS_URL)
        frozen: list[Any] = []
        good: list[int] = []
        try:
            for kind, fields in steps:
                if kind == "good":
                    async with conn.transaction():
                        good.append(await outbox.submit(conn, self.queue, OK))
                elif kind == "foreign":
                    await redis.xadd(streams.stream_key(self.queue), fields)
                    self.foreign += 1
                elif kind == "freeze" and not frozen:
                    # One worker at most, so the other keeps judging meanwhile.
                    frozen.append(self.workers[self.examples % len(self.workers)])
                    frozen[0].send_signal(signal.SIGSTOP)
                    self.freezes += 1
            if frozen:
                await self._until(lambda: self._frozen_pel_reclaimed(redis), "the reaper to take the frozen PEL")
                frozen[0].send_signal(signal.SIGCONT)
            await self._until(lambda: self._all_good_done(conn, good), "every good submission judged")
            await self._until(lambda: self._stream_empty(redis), "stream and PEL empty")
            rows = await submissions(conn, good)
            assert set(rows) == set(good)
            assert all(r["status"] == TERMINAL_OK and r["verdict"] is not None for r in rows.values()), rows
            dead: Any = await redis.xrange(streams.dlq_key(self.queue))
            assert all(fields.get(b"reason") for _, fields in dead), "every dead letter says why"
            assert self.roles.alive() == len(self.roles.procs), self.roles.logs()
        finally:
            for proc in frozen:
                proc.send_signal(signal.SIGCONT)
            await redis.aclose()
            await conn.close()

    async def _until(self, check: Any, what: str, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while not await check():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {within}s\n{self.roles.logs()}")
            assert self.roles.alive() == len(self.roles.procs), self.roles.logs()
            await asyncio.sleep(0.02)

    async def _frozen_pel_reclaimed(self, redis: aioredis.Redis) -> bool:
        consumers: Any = await redis.xinfo_consumers(streams.stream_key(self.queue), streams.GROUP)
        workers = [c for c in consumers if bytes(c["name"]).startswith(b"worker")]
        return all(int(c["pending"]) == 0 for c in workers)

    async def _all_good_done(self, conn: asyncpg.Connection, ids: list[int]) -> bool:
        return await count_submissions(conn, ids=ids, status=TERMINAL_OK) == len(ids)

    async def _stream_empty(self, redis: aioredis.Redis) -> bool:
        key = streams.stream_key(self.queue)
        pending: Any = await redis.xpending(key, streams.GROUP)
        return int(pending["pending"]) == 0 and await redis.xlen(key) == 0


def test_running_roles_survive_arbitrary_entries(pg_dsn: str, queue_name: str, tmp_path: Path) -> None:
    async def setup() -> None:
        conn = await asyncpg.connect(pg_dsn)
        await create_queue(conn, queue_name)
        await conn.close()

    asyncio.run(setup())
    roles = Roles.on(
        pg_dsn,
        queue_name,
        tmp_path,
        JUDGEQUEUE_VISIBILITY_TIMEOUT="500ms",
        JUDGEQUEUE_REAPER_INTERVAL="100ms",
        JUDGEQUEUE_LOG_LEVEL="ERROR",
    )
    roles.start_all(workers=2)
    fuzz = Fuzz(pg_dsn, queue_name, roles)
    try:

        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(st.lists(step, min_size=1, max_size=12))
        def example(steps: list[tuple[str, Any]]) -> None:
            asyncio.run(fuzz.run(steps))

        example()
        assert fuzz.foreign > 0 and fuzz.freezes > 0, "the run must exercise both paths"
    finally:
        codes = roles.stop()
    assert codes == [0] * 4, roles.logs()
