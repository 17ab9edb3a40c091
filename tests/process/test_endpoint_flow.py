"""An endpoint's fleet-wide bound with real role processes: two workers, the http-call judge, a slow
endpoint counting its concurrent calls (tests/support/counting_server.py), one worker SIGKILLed in
the middle of the run and replaced.

The hard invariants only (bench/endpoints.py measures how busy the endpoint is kept): the endpoint
never has more calls in progress than its bound, whatever the workers' slot count; every job ends
with exactly one verdict, ACCEPTED; only the calls of jobs the killed worker held are repeated
(once, with the same idempotency key: those in progress and those answered but not yet written);
and no slot is left held once the killed worker's leases expire.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from bench.endpoints import fleet_round
from judgequeue.core.transport.endpoint_slots import EndpointSlots
from tests.support.counting_server import counting_server
from tests.support.roles import Roles
from tests.support.waiting import eventually

BOUND = 4


@pytest.mark.parametrize("slots", [4, 8])
async def test_the_endpoint_never_sees_more_than_its_bound_and_every_job_is_judged_once(
    pg_dsn: str, pg_pool: asyncpg.Pool, redis_client: aioredis.Redis, queue: str, tmp_path: Path, slots: int
) -> None:
    jobs = 48
    killed_at: list[float] = []
    async with counting_server(0.3) as server:

        async def kill_one_worker(roles: Roles) -> None:
            await eventually(lambda: sum(server.calls.values()) >= 12, within=60, what="the run under way")
            victim = next(p for p in roles.procs if p.role == "worker")
            killed_at.append(time.monotonic())
            victim.send_signal(signal.SIGKILL)  # mid-run: it holds calls, slots and waiting jobs
            victim.wait()
            roles.start("worker")

        got = await fleet_round(pg_pool, pg_dsn, queue, tmp_path, server, jobs=jobs, slots=slots, workers=2,
                                bound=BOUND, within=180, during=kill_one_worker)  # fmt: skip
        assert server.peak <= BOUND, f"{server.peak} calls at once, over the bound of {BOUND}"
        assert server.peak == BOUND  # the bound was reached: the check above could have failed
        assert got.statuses == {"ACCEPTED": jobs}
        rows = await pg_pool.fetch(
            "SELECT id, generation, verdict->>'generation' AS written, verdict->'details'->>'idempotency_key' AS key"
            " FROM judgequeue.submissions WHERE queue = $1", queue,
        )  # fmt: skip
        assert len(rows) == jobs
        assert all(int(r["written"]) == r["generation"] for r in rows)  # the verdict of the last generation
        keys = {r["key"] for r in rows}
        assert set(server.calls) == keys  # every job's call was made, with its own key
        # Only the killed worker's calls are repeated: those in progress and those answered whose
        # verdict it had not yet written. Each began before the kill, is made once more, and the
        # worker held at most its slots' worth of jobs.
        again = {key: at for key, at in server.started.items() if len(at) > 1}
        assert len(again) <= slots, again
        assert all(len(at) == 2 and at[0] < killed_at[0] < at[1] for at in again.values()), (killed_at, again)
        # The killed worker's slots free when their leases expire: nothing is left held.
        async def none_held() -> bool:
            return await EndpointSlots(redis_client).holders(queue, "slow") == 0

        await eventually(none_held, within=30, what="no slot left held")
