"""Shared fixtures: every test gets its own Postgres database and its own Redis key space.

A template database is migrated once per session (per xdist worker); each test clones it with
``CREATE DATABASE ... TEMPLATE``, which takes tens of milliseconds, so tests can run in any order
and in parallel. Redis isolation comes from a unique queue name per test: every key of a queue
shares the ``jq:{<queue>}`` prefix, and the fixture deletes them afterwards.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core.migrate import migrate
from judgequeue.core.queues import create_queue
from tests.pg_servers import PostgresServer, postgres_server

ADMIN_DSN = os.environ.get("JUDGEQUEUE_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("JUDGEQUEUE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def dsn_for(database: str) -> str:
    """The admin DSN pointed at another database."""
    parts = urlsplit(ADMIN_DSN)
    return urlunsplit(parts._replace(path="/" + database))


def _worker_suffix() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main") + f"_{os.getpid()}"


async def _create_template(name: str) -> None:
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    conn = await asyncpg.connect(dsn_for(name))
    try:
        await migrate(conn)
    finally:
        await conn.close()


async def _drop(name: str) -> None:
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture(scope="session")
def template_db() -> Iterator[str]:
    name = f"jq_template_{_worker_suffix()}"
    asyncio.run(_create_template(name))
    yield name
    asyncio.run(_drop(name))


@pytest.fixture
async def fresh_db() -> AsyncIterator[str]:
    """An empty database (no migrations) for migration tests; yields its DSN."""
    name = f"jq_t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield dsn_for(name)
    await _drop(name)


@pytest.fixture
async def pg_dsn(template_db: str) -> AsyncIterator[str]:
    """A migrated database of this test's own; yields its DSN."""
    name = f"jq_t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    finally:
        await admin.close()
    yield dsn_for(name)
    await _drop(name)


@pytest.fixture
async def pg(pg_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(pg_dsn)
    yield conn
    await conn.close()


@pytest.fixture
async def pg_pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=10)
    assert pool is not None
    yield pool
    await pool.close()


@pytest.fixture
def queue_name() -> str:
    """A queue name no other test uses, so its Redis keys are this test's alone."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def redis_client(queue_name: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL)
    yield client
    keys = [key async for key in client.scan_iter(match=f"jq:{{{queue_name}}}:*", count=1000)]
    for start in range(0, len(keys), 500):
        await client.delete(*keys[start : start + 500])
    await client.aclose()


@pytest.fixture
async def own_pg(queue_name: str) -> AsyncIterator[PostgresServer]:
    """A throwaway Postgres server of this test's own (it may crash it), migrated, with the queue."""
    with postgres_server() as server:
        conn = await asyncpg.connect(server.dsn)
        await migrate(conn)
        await create_queue(conn, queue_name)
        await conn.close()
        yield server
