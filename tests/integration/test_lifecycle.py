"""The roles' connections: session settings survive pool releases, open transactions do not."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from judgequeue.core.runtime import lifecycle
from judgequeue.core.runtime.lifecycle import DB_ERRORS, HeldSession, open_connections
from judgequeue.core.store import outbox
from judgequeue.core.store.queues import create_queue
from tests.support.databases import REDIS_URL, connection
from tests.support.settings import make_settings
from tests.support.waiting import eventually


async def test_pool_keeps_session_settings_and_rolls_back_open_transactions(pg_dsn: str, queue_name: str) -> None:
    conns = await open_connections(make_settings(pg_dsn, REDIS_URL, queue_name), asyncio.Event(), pool_size=1)
    assert conns is not None
    try:
        async with conns.pool.acquire() as conn:
            await conn.execute("SET application_name = 'kept'")
            await conn.execute("CREATE TABLE scratch (x int)")
            # A transaction left open by a cancelled caller must not leak into the next user.
            await conn.execute("BEGIN")
            await conn.execute("INSERT INTO scratch VALUES (1)")
        async with conns.pool.acquire() as conn:  # pool_size=1: the same session again
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SELECT count(*) FROM scratch") == 0
            assert await conn.fetchval("SHOW application_name") == "kept"
    finally:
        await conns.close()


async def test_durable_commits_by_default_and_lazy_claims_per_transaction(pg_dsn: str, queue_name: str) -> None:
    """No session setting at connect time (a pooler would refuse it); claims and marks set theirs."""
    conns = await open_connections(make_settings(pg_dsn, REDIS_URL, queue_name), asyncio.Event(), pool_size=1)
    assert conns is not None
    try:
        async with conns.pool.acquire() as conn:
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
            await create_queue(conn, queue_name)
            await outbox.submit(conn, queue_name, {})
            async with conn.transaction():
                [row] = await outbox.claim(conn, queue_name, limit=10, owner="me", claim_ttl=30)
                assert await conn.fetchval("SHOW synchronous_commit") == "off"
            async with conn.transaction():
                await outbox.mark(conn, [outbox.Mark(row.outbox_id, "sent")], owner="me", retry=outbox.Retry(3, 1, 2))
                assert await conn.fetchval("SHOW synchronous_commit") == "off"
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
    finally:
        await conns.close()


async def test_held_session_is_reused_and_replaced_after_a_failure(pg_pool: asyncpg.Pool, pg_dsn: str) -> None:
    session = HeldSession(pg_pool)
    try:
        first = await session.get()
        pid = await first.fetchval("SELECT pg_backend_pid()")
        assert await (await session.get()).fetchval("SELECT pg_backend_pid()") == pid  # no acquire per statement
        async with connection(pg_dsn) as admin:
            await admin.execute("SELECT pg_terminate_backend($1)", pid)

            async def gone() -> bool:
                return not await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)

            await eventually(gone, what="backend terminated")
        with pytest.raises(DB_ERRORS):
            await first.fetchval("SELECT 1")
        await session.drop()  # what the roles do after an error
        replacement = await session.get()
        assert await replacement.fetchval("SELECT pg_backend_pid()") != pid
    finally:
        await session.drop()  # a connection still checked out would hang the pool's close
    assert pg_pool.get_idle_size() == pg_pool.get_size()  # everything given back


async def test_held_session_notices_a_connection_the_server_ended(pg_pool: asyncpg.Pool, pg_dsn: str) -> None:
    """asyncpg takes a connection the server ended back into the pool: get() must not trip on it."""
    session = HeldSession(pg_pool)
    try:
        pid = await (await session.get()).fetchval("SELECT pg_backend_pid()")
        async with connection(pg_dsn) as admin:
            await admin.execute("SELECT pg_terminate_backend($1)", pid)

            async def detached() -> bool:
                # The handle is detached once the client has seen the close.
                try:
                    await session._conn.fetchval("SELECT 1")  # type: ignore[union-attr]
                except DB_ERRORS:
                    return True
                return False

            await eventually(detached, what="the client sees the session ended")
        again = await session.get()  # no drop() in between: get() itself must see it
        assert await again.fetchval("SELECT pg_backend_pid()") != pid
    finally:
        await session.release()
    assert pg_pool.get_idle_size() == pg_pool.get_size()


async def test_held_session_drop_closes_rather_than_reuses(pg_pool: asyncpg.Pool) -> None:
    """After an error the held connection may be in a state no reset repairs: it is never handed on."""
    session = HeldSession(pg_pool)
    pid = await (await session.get()).fetchval("SELECT pg_backend_pid()")
    await session.drop()
    async with pg_pool.acquire() as conn:
        assert await conn.fetchval("SELECT pg_backend_pid()") != pid


async def test_best_effort_gives_up_without_waiting_for_a_slow_cancel() -> None:
    """A shutdown step stuck on a stalled server is cancelled and left to unwind on its own."""
    release = asyncio.Event()
    unwound = False

    async def stuck() -> None:
        nonlocal unwound
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # asyncpg waits for the server to acknowledge a cancel like this
            unwound = True
            raise

    await lifecycle.best_effort(stuck(), 0.01)
    assert not unwound  # returned before the step finished unwinding
    release.set()

    async def failing() -> None:
        raise ConnectionResetError("server went away")

    await lifecycle.best_effort(failing(), 1.0)  # a failure is dropped, not raised
