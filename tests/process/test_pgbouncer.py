"""Every role, ``migrate`` and ``judgequeue.submit()`` through a real PgBouncer in transaction mode.

The PgBouncer (tests/pgbouncer.py) multiplexes all clients onto three server sessions with its
defaults (no ``ignore_startup_parameters``, no prepared-statement support in 1.18), so the first
tests show what breaks through it, and the others run the roles as processes through it while
applications submit, then check exactly one verdict per submission.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core.runtime.process import ReadinessProbe
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport.connect import connect_postgres
from tests.support.databases import ADMIN_DSN, REDIS_URL, connection
from tests.support.flow import Flow, check_flow, install_audit, terminal_count
from tests.support.pgbouncer import PgBouncer, pgbouncer
from tests.support.roles import RoleProcess, Roles, run_cli, submit_retrying, wait_all_terminal
from tests.support.settings import make_settings
from tests.support.waiting import eventually

NO_CACHE = {"statement_cache_size": 0}


@pytest.fixture(scope="module")
def bouncer() -> Iterator[PgBouncer]:
    with pgbouncer(ADMIN_DSN, pool_size=3) as server:
        yield server


async def test_the_pooler_really_switches_server_sessions(bouncer: PgBouncer, pg_dsn: str) -> None:
    """Why the roles need JUDGEQUEUE_POSTGRES_POOLER=transaction and per-transaction settings."""
    dsn = bouncer.dsn_for(pg_dsn)
    with pytest.raises(asyncpg.PostgresError, match="unsupported startup parameter"):
        await asyncpg.connect(dsn, server_settings={"synchronous_commit": "off"})
    for pooler, breaks in (("none", True), ("transaction", False)):
        client = await connect_postgres(dsn, pooler=pooler)
        other = await asyncpg.connect(dsn, **NO_CACHE)
        try:
            busy = other.transaction()
            await busy.start()
            await other.execute("SELECT 1")  # holds one server session...
            first = await client.fetchval("SELECT pg_backend_pid()")  # ...so this runs on another
            await busy.commit()  # the session released last is the one handed out next
            if breaks:
                with pytest.raises(asyncpg.InvalidSQLStatementNameError):
                    await client.fetchval("SELECT pg_backend_pid()")
            else:
                assert await client.fetchval("SELECT pg_backend_pid()") != first
        finally:
            await client.close()
            await other.close()


async def test_readiness_probe_through_the_pooler(bouncer: PgBouncer, pg_dsn: str, queue_name: str) -> None:
    """The probe keeps one connection across checks: it must not cache statements behind the pooler."""
    settings = make_settings(bouncer.dsn_for(pg_dsn), REDIS_URL, queue_name, postgres_pooler="transaction")
    probe = ReadinessProbe(settings, need_group=False, timeout=5)
    async with connection(bouncer.dsn_for(pg_dsn), **NO_CACHE) as other:
        for _ in range(3):  # each check after the first runs on the session another client just released
            busy = other.transaction()
            await busy.start()
            await other.execute("SELECT 1")
            assert (await probe()).checks["postgres"] == "ok"
            await busy.commit()
            assert (await probe()).checks["postgres"] == "ok"
        await probe.close()


def test_migrate_and_tools_through_the_pooler(bouncer: PgBouncer, fresh_db: str, tmp_path: Path) -> None:
    dsn = bouncer.dsn_for(fresh_db)
    env = {"JUDGEQUEUE_POSTGRES_DSN": dsn, "PATH": "/usr/bin:/bin"}
    runs = [RoleProcess("migrate", env, tmp_path / f"migrate-{i}.log", "--json") for i in range(3)]
    codes = [run.wait(60) for run in runs]
    outputs = [run.log() for run in runs]
    assert codes == [0, 0, 0], outputs
    assert sum('"applied": []' in out for out in outputs) == 2, outputs  # one run applied everything
    again = run_cli("migrate", env=env)
    assert again.returncode == 0 and "up to date" in again.stdout, again.stdout + again.stderr
    for command in (["queue", "create", "via-pooler"], ["queue", "list"], ["queue", "show", "via-pooler"]):
        tool = run_cli(*command, env=env)
        assert tool.returncode == 0 and "via-pooler" in tool.stdout, tool.stdout + tool.stderr


async def _setup(pg_dsn: str, queue: str) -> None:
    await install_audit(pg_dsn)
    async with connection(pg_dsn) as conn:
        await create_queue(conn, queue)


@pytest.mark.parametrize("intake", ["stream", "direct"])
async def test_roles_and_submit_through_pgbouncer_polling(
    bouncer: PgBouncer, pg_dsn: str, queue_name: str, redis_client: aioredis.Redis, tmp_path: Path, intake: str
) -> None:
    """No direct DSN: the dispatcher (and, with direct intake, the workers, whose takes go through the
    pooler too) polls on ``schedule`` and never registers, so no submit notifies."""
    await _setup(pg_dsn, queue_name)
    pooled = bouncer.dsn_for(pg_dsn)
    roles = Roles.on(pooled, queue_name, tmp_path, JUDGEQUEUE_POSTGRES_POOLER="transaction", JUDGEQUEUE_CONCURRENCY="8",
                     JUDGEQUEUE_INTAKE=intake)
    roles.start_all(dispatchers=2, workers=2)
    try:
        flow = Flow(pooled, queue_name, submitters=4, connect_options=NO_CACHE)

        async def some_done() -> bool:
            return await terminal_count(pg_dsn, list(flow.expected)) >= 100

        await eventually(some_done, within=60, what="100 verdicts through the pooler")
        expected = await flow.stop()
        report = await check_flow(pg_dsn, REDIS_URL, queue_name, expected, roles, within=60)
        print(report.as_dict())
        assert report.violations == [], report.violations
        async with connection(pg_dsn) as conn:
            assert await conn.fetchval("SELECT count(*) FROM judgequeue.dispatch_waiters") == 0
        assert roles.alive() == 5, roles.logs()
        if intake == "direct":
            # Who wins a row under load is a race (a busy worker leaves it to the dispatchers after a
            # schedule), so the proof that the takes go through the pooler comes with the
            # dispatchers stopped: only a worker's take can judge these.
            assert [p.stop() for p in roles.procs if p.role == "dispatcher"] == [0, 0], roles.logs()
            late = [await submit_retrying(pooled, queue_name, {"late": i}, connect_options=NO_CACHE) for i in range(3)]
            await wait_all_terminal(pg_dsn, late, within=60, roles=roles)
        async with connection(pg_dsn) as conn:
            direct = await conn.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE claimed_by LIKE 'worker-%'")
        assert (direct > 0) == (intake == "direct"), direct  # the takes really went through the pooler
    finally:
        codes = roles.stop()
    assert codes == [0] * 5, roles.logs() + bouncer.log()


async def test_listen_dsn_wakes_the_dispatcher_behind_the_pooler(
    bouncer: PgBouncer, pg_dsn: str, queue_name: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    """With a direct LISTEN DSN, a submit through the pooler wakes an idle dispatcher at once.

    The poll fallback is an hour, so every verdict below arrived through a notification.
    """
    await _setup(pg_dsn, queue_name)
    pooled = bouncer.dsn_for(pg_dsn)
    roles = Roles.on(
        pooled,
        queue_name,
        tmp_path,
        JUDGEQUEUE_POSTGRES_POOLER="transaction",
        JUDGEQUEUE_POSTGRES_LISTEN_DSN=pg_dsn,
        JUDGEQUEUE_SCHEDULE="1h",
    )
    roles.start("dispatcher")
    roles.start("worker")
    try:
        async with connection(pg_dsn) as conn:

            async def registered() -> bool:
                return bool(await conn.fetchval("SELECT count(*) FROM judgequeue.dispatch_waiters"))

            await eventually(registered, within=30, what="the idle dispatcher registered as a waiter")
        expected: dict[int, str] = {}
        for _ in range(5):  # one at a time: each finds the dispatcher idle and listening
            payload = {"seconds": 0, "status": "ACCEPTED"}
            sid = await submit_retrying(pooled, queue_name, payload, connect_options=NO_CACHE)
            expected[sid] = "ACCEPTED"

            async def judged(sid: int = sid) -> bool:
                return await terminal_count(pg_dsn, [sid]) == 1

            await eventually(judged, within=20, what=f"submission {sid} judged without polling")
        report = await check_flow(pg_dsn, REDIS_URL, queue_name, expected, roles, within=30)
        assert report.violations == [], report.violations
    finally:
        codes = await asyncio.to_thread(roles.stop)
    assert codes == [0, 0], roles.logs()
