"""Postgres failover: a primary with a synchronous streaming standby, the primary stopped like a
crash and the standby promoted while jobs flow. Roles (and the submitting applications) hold a
multi-host DSN with ``target_session_attrs=read-write`` and must follow the promoted standby on
their own; with synchronous replication no committed submission may be lost.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from judgequeue.core.store.migrate import migrate
from judgequeue.core.store.queues import create_queue
from tests.support.chaos import AUDIT_SQL
from tests.support.databases import REDIS_URL, connection
from tests.support.flow import Flow, check_flow, terminal_count
from tests.support.pg_servers import PostgresServer, postgres_server
from tests.support.queries import submissions
from tests.support.roles import Roles
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import eventually


@pytest.fixture
async def primary_and_standby(queue_name: str) -> AsyncIterator[tuple[PostgresServer, PostgresServer]]:
    """A migrated primary (every commit waits for the standby's flush) and its streaming standby."""
    with postgres_server(settings={"synchronous_standby_names": "'*'"}) as primary:
        async with connection(primary.dsn) as conn:
            # Until the standby connects, a synchronous commit would wait: set up first, locally.
            await conn.execute("SET synchronous_commit = local")
            await migrate(conn)
            await create_queue(conn, queue_name)
            await conn.execute(AUDIT_SQL)
        with postgres_server(standby_of=primary) as standby:
            async with connection(primary.dsn) as conn:

                async def synchronous() -> bool:
                    state = await conn.fetchval("SELECT sync_state FROM pg_stat_replication")
                    return bool(state == "sync")

                await eventually(synchronous, within=30, what="the standby streaming synchronously")
            yield primary, standby


def multi_host_dsn(*servers: PostgresServer) -> str:
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers)
    return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"


async def test_roles_follow_a_promoted_standby_and_lose_nothing(
    primary_and_standby: tuple[PostgresServer, PostgresServer],
    queue_name: str,
    redis_client: aioredis.Redis,
    tmp_path: Path,
) -> None:
    primary, standby = primary_and_standby
    dsn = multi_host_dsn(primary, standby)
    roles = Roles.on(dsn, queue_name, tmp_path, JUDGEQUEUE_CONCURRENCY="8")
    roles.start_all(dispatchers=2, workers=2)
    async with roles.all_stay_up():
        flow = Flow(dsn, queue_name, submitters=3, job_seconds=(0.1, 0.5))

        await flow.wait_verdicts(100, what="verdicts before the failover")

        await flow.wait_judging(5)  # they take 0.1-0.5 s each
        in_flight = len(flow.expected) - await terminal_count(dsn, list(flow.expected))
        stopped = time.monotonic()
        await asyncio.to_thread(primary.crash)  # jobs in flight: claimed, leased, judging
        await asyncio.to_thread(standby.promote)
        promoted = time.monotonic()
        judged_at_promotion = await terminal_count(dsn, list(flow.expected))

        async def resumed() -> bool:
            return await terminal_count(dsn, list(flow.expected)) > judged_at_promotion

        await eventually(resumed, within=60, what="a verdict written on the promoted standby")
        first_verdict = time.monotonic() - promoted

        async def followed() -> bool:
            after = flow.committed_after(promoted)
            return bool(after) and await terminal_count(dsn, after) > 0

        await eventually(followed, within=60, what="a submission committed after the promotion judged")
        follow = time.monotonic() - promoted
        before = len(flow.expected)
        await flow.wait_verdicts(before + 100, what="verdicts (100 more after the failover)")
        expected = await flow.stop()
        report = await check_flow(dsn, REDIS_URL, queue_name, expected, roles, within=90)
        print(
            f"postgres failover: primary down to promoted {promoted - stopped:.2f}s, promoted to first verdict "
            f"{first_verdict:.2f}s, to first verdict of a submission committed after it {follow:.2f}s; "
            f"{len(expected)} submissions ({in_flight} unfinished at the "
            f"crash), lost {report.lost_submissions}, "
            f"re-executions {report.duplicate_executions}"
        )
        assert report.violations == [], report.violations
        assert report.lost_submissions == 0


@pytest.fixture
async def primary_and_async_standby(queue_name: str) -> AsyncIterator[tuple[PostgresServer, PostgresServer, TcpProxy]]:
    """A migrated primary and a standby replicating asynchronously through a proxy the test controls."""
    with postgres_server() as primary:
        async with connection(primary.dsn) as conn:
            await migrate(conn)
            await create_queue(conn, queue_name)
            await conn.execute(AUDIT_SQL)
        link = TcpProxy(primary.port)
        await link.start()
        workdir = Path(tempfile.mkdtemp(prefix="jq-pg-standby-"))
        standby: PostgresServer | None = None
        try:
            # In a thread: pg_basebackup and the standby's start stream through the proxy on this loop.
            standby = await asyncio.to_thread(PostgresServer, workdir, standby_of=primary, via_port=link.port)
            yield primary, standby, link
        finally:
            if standby is not None:
                await asyncio.to_thread(standby.stop)
            await link.close()
            shutil.rmtree(workdir, ignore_errors=True)


async def test_asynchronous_standby_loses_only_the_lag_window(
    primary_and_async_standby: tuple[PostgresServer, PostgresServer, TcpProxy],
    queue_name: str,
    redis_client: aioredis.Redis,
    tmp_path: Path,
) -> None:
    """With asynchronous replication the commits the standby never received are lost, and only those:
    every other submission still ends with exactly one verdict, whatever lease, verdict, claim or
    mark the failover lost with them (docs/reliability.md has the table)."""
    primary, standby, link = primary_and_async_standby
    dsn = multi_host_dsn(primary, standby)
    roles = Roles.on(dsn, queue_name, tmp_path, JUDGEQUEUE_CONCURRENCY="8", JUDGEQUEUE_REDISPATCH_AFTER="3s")
    roles.start_all(dispatchers=2, workers=2)
    async with roles.all_stay_up():
        flow = Flow(dsn, queue_name, submitters=3, job_seconds=(0.1, 0.5))

        await flow.wait_verdicts(100, what="verdicts before the failover")
        link.stall(True)  # the lag window: from here on the standby receives nothing
        window_opened = time.monotonic()
        judged = await terminal_count(dsn, list(flow.expected))

        async def window_full() -> bool:
            return len(flow.committed_after(window_opened)) >= 30 and await flow.verdicts() >= judged + 30

        await eventually(window_full, within=60, what="30 submissions and 30 verdicts the standby never got")
        await asyncio.to_thread(primary.crash)
        link.cut()
        await asyncio.to_thread(standby.promote)
        promoted = time.monotonic()

        async def followed() -> bool:
            after = flow.committed_after(promoted)
            return len(after) >= 20 and await terminal_count(dsn, after) >= 20

        await eventually(followed, within=90, what="20 submissions committed after the promotion judged")
        expected = await flow.stop()
        async with connection(dsn) as conn:
            present = set(await submissions(conn))
        lost = [sid for sid in expected if sid not in present]
        assert lost, "the stalled link must have cost some commits"
        assert all(flow.committed_at[sid] >= window_opened for sid in lost), "lost outside the window"
        survivors = {sid: status for sid, status in expected.items() if sid in present}
        report = await check_flow(dsn, REDIS_URL, queue_name, survivors, roles, within=90)
        async with connection(dsn) as conn:
            resent = await conn.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE last_error LIKE 're-sent%'")
        print(
            f"asynchronous failover: {len(expected)} submissions, {len(lost)} lost (all committed in the lag "
            f"window), {len(survivors)} judged once each; re-executions {report.duplicate_executions}, "
            f"re-sent from the outbox {resent}"
        )
        assert report.violations == [], report.violations
