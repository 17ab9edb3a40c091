"""The roles' connections: session settings survive pool releases, open transactions do not."""

from __future__ import annotations

import asyncio

from judgequeue.core.lifecycle import open_connections
from tests.conftest import REDIS_URL
from tests.helpers import make_settings


async def test_pool_keeps_session_settings_and_rolls_back_open_transactions(pg_dsn: str, queue_name: str) -> None:
    conns = await open_connections(
        make_settings(pg_dsn, REDIS_URL, queue_name), asyncio.Event(), pool_size=1, durable_commits=False
    )
    assert conns is not None
    try:
        async with conns.pool.acquire() as conn:
            assert await conn.fetchval("SHOW synchronous_commit") == "off"
            await conn.execute("CREATE TABLE scratch (x int)")
            # A transaction left open by a cancelled caller must not leak into the next user.
            await conn.execute("BEGIN")
            await conn.execute("INSERT INTO scratch VALUES (1)")
        async with conns.pool.acquire() as conn:  # pool_size=1: the same session again
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SELECT count(*) FROM scratch") == 0
            assert await conn.fetchval("SHOW synchronous_commit") == "off"
    finally:
        await conns.close()


async def test_durable_commits_by_default(pg_dsn: str, queue_name: str) -> None:
    conns = await open_connections(make_settings(pg_dsn, REDIS_URL, queue_name), asyncio.Event(), pool_size=1)
    assert conns is not None
    try:
        assert await conns.pool.fetchval("SHOW synchronous_commit") == "on"
    finally:
        await conns.close()
