"""A hypothesis stateful test of the outbox and the generation/attempt fence on the real database.

Random interleavings of submit, dispatch (two claimers), lease, renew, verdict writes with current
and stale leases, rejudge, and lease expiry + rescue are run against Postgres and a small model; after
every step the database must agree with the model and the outbox must hold exactly one row per
(submission, generation).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from judgequeue.core.store import leases, outbox
from judgequeue.core.store.queues import create_queue
from tests.support.queries import submissions

QUEUE = "judge"
T = TypeVar("T")
MAX_RETRIES = 3
VERDICTS = ("ACCEPTED", "WRONG_ANSWER", "RUNTIME_ERROR")


@dataclass
class Sub:
    generation: int = 1
    status: str = "PENDING"
    attempt: uuid.UUID | None = None
    retries: int = 0


@dataclass
class Model:
    subs: dict[int, Sub] = field(default_factory=dict)
    held: list[leases.Lease] = field(default_factory=list)  # current and stale leases alike


class OutboxFenceMachine(RuleBasedStateMachine):
    dsn: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.conn: asyncpg.Connection = self.loop.run_until_complete(asyncpg.connect(self.dsn))
        self.run(self.conn.execute("TRUNCATE judgequeue.submissions, judgequeue.outbox, judgequeue.queues"))
        self.run(create_queue(self.conn, QUEUE))
        self.model = Model()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.conn.close())
        self.loop.close()

    def _sid(self, data: st.DataObject) -> int:
        return data.draw(st.sampled_from(sorted(self.model.subs)))

    @rule()
    def submit(self) -> None:
        sid = self.run(outbox.submit(self.conn, QUEUE, {"n": len(self.model.subs)}))
        self.model.subs[sid] = Sub()

    @rule(owner=st.sampled_from(["d1", "d2"]), result=st.sampled_from(["sent", "retry", "release"]))
    def dispatch(self, owner: str, result: outbox.Result) -> None:
        rows = self.run(outbox.claim(self.conn, QUEUE, limit=3, owner=owner, claim_ttl=30))
        marks = [outbox.Mark(r.outbox_id, result, None if result == "sent" else "boom") for r in rows]
        states = self.run(outbox.mark(self.conn, marks, owner=owner, retry=outbox.Retry(100, 0.001, 0.001)))
        assert set(states) == {r.outbox_id for r in rows}, "the claimer's own marks always land"
        other = "d2" if owner == "d1" else "d1"
        assert (
            self.run(outbox.mark(self.conn, marks, owner=other, retry=outbox.Retry(100, 1, 1))) == {}
        ), "another claimer's marks are fenced out"

    @precondition(lambda self: self.model.subs)
    @rule(data=st.data(), stale=st.booleans())
    def take_lease(self, data: st.DataObject, stale: bool) -> None:
        sid = self._sid(data)
        sub = self.model.subs[sid]
        generation = sub.generation - 1 if stale else sub.generation
        got = self.run(leases.acquire(self.conn, QUEUE, [(sid, generation)], ttl=30))
        if not stale and sub.status == "PENDING":
            assert len(got) == 1 and got[0].generation == sub.generation
            sub.status, sub.attempt = "JUDGING", got[0].attempt
            self.model.held.append(got[0])
        else:
            assert got == [], f"lease granted to a stale envelope: {sub} gen={generation}"

    @precondition(lambda self: self.model.held)
    @rule(data=st.data(), status=st.sampled_from(VERDICTS))
    def write_verdict(self, data: st.DataObject, status: str) -> None:
        lease = data.draw(st.sampled_from(self.model.held))
        sub = self.model.subs[lease.submission]
        written = self.run(leases.write_verdicts(self.conn, [leases.VerdictWrite(lease, status, {"by": "test"})]))
        current = sub.status == "JUDGING" and sub.generation == lease.generation and sub.attempt == lease.attempt
        assert (lease.attempt in written) == current, f"fence wrong for {sub} with lease gen {lease.generation}"
        if current:
            sub.status = status

    @precondition(lambda self: self.model.held)
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.model.held))
        sub = self.model.subs[lease.submission]
        kept = self.run(leases.renew(self.conn, [lease], ttl=30))
        current = sub.status == "JUDGING" and sub.generation == lease.generation and sub.attempt == lease.attempt
        assert (lease.attempt in kept) == current

    @precondition(lambda self: self.model.subs)
    @rule(data=st.data())
    def rejudge(self, data: st.DataObject) -> None:
        sid = self._sid(data)
        sub = self.model.subs[sid]
        assert self.run(outbox.rejudge(self.conn, sid)) == sub.generation + 1
        sub.generation, sub.status, sub.attempt, sub.retries = sub.generation + 1, "PENDING", None, 0

    @precondition(lambda self: any(s.status == "JUDGING" for s in self.model.subs.values()))
    @rule()
    def expire_leases_and_rescue(self) -> None:
        self.run(
            self.conn.execute(
                "UPDATE judgequeue.submissions SET lease_expires_at = now() - interval '1 second'"
                " WHERE status = 'JUDGING'"
            )
        )
        sweep = self.run(leases.rescue_expired_leases(self.conn, QUEUE, max_retries=MAX_RETRIES))
        requeued = failed = 0
        for sub in self.model.subs.values():
            if sub.status != "JUDGING":
                continue
            sub.retries += 1
            if sub.retries >= MAX_RETRIES:
                sub.status = "SYSTEM_ERROR"
                failed += 1
            else:
                sub.generation, sub.status, sub.attempt = sub.generation + 1, "PENDING", None
                requeued += 1
        assert (sweep.requeued, sweep.failed) == (requeued, failed)

    @invariant()
    def database_matches_model(self) -> None:
        rows = list(self.run(submissions(self.conn)).values())
        assert len(rows) == len(self.model.subs)
        for r in rows:
            sub = self.model.subs[r["id"]]
            assert (r["status"], r["generation"]) == (sub.status, sub.generation)
            if sub.status == "PENDING":
                assert r["attempt_id"] is None

    @invariant()
    def one_outbox_row_per_generation(self) -> None:
        rows = self.run(
            self.conn.fetch(
                "SELECT submission_id, count(*) AS n, max(generation) AS g FROM judgequeue.outbox"
                " GROUP BY submission_id"
            )
        )
        for r in rows:
            assert r["n"] == r["g"] == self.model.subs[r["submission_id"]].generation


@pytest.fixture
def machine_dsn(pg_dsn: str) -> str:
    return pg_dsn


def test_outbox_and_fence_state_machine(machine_dsn: str) -> None:
    OutboxFenceMachine.dsn = machine_dsn
    runner = OutboxFenceMachine.TestCase
    runner.settings = settings(
        max_examples=40,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    runner().runTest()
