"""Throwaway databases on the shared Postgres, and where the shared servers are.

The one place that knows the admin DSN and the Redis URL of the servers ``scripts/install`` starts.
The test fixtures (``tests/conftest.py``) and the benchmarks (``bench/common.py``) both make their
databases here; nothing in this module imports pytest, so a benchmark can use it as a plain library.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import redis.asyncio as aioredis

from judgequeue.core.store.migrate import migrate

ADMIN_DSN = os.environ.get("JUDGEQUEUE_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("JUDGEQUEUE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def dsn_for(database: str) -> str:
    """The admin DSN pointed at another database."""
    return urlunsplit(urlsplit(ADMIN_DSN)._replace(path="/" + database))


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@contextlib.asynccontextmanager
async def connection(dsn: str, **options: Any) -> AsyncIterator[asyncpg.Connection]:
    """One connection to ``dsn`` (``options`` go to ``asyncpg.connect``), closed at the end of the block."""
    conn = await asyncpg.connect(dsn, **options)
    try:
        yield conn
    finally:
        await conn.close()


async def _admin(statement: str) -> None:
    async with connection(ADMIN_DSN) as admin:
        await admin.execute(statement)


async def create_database(
    prefix: str = "jq_bench", *, name: str | None = None, template: str | None = None, migrated: bool = True
) -> str:
    """A new database (a copy of ``template``, else migrated unless ``migrated=False``); returns its DSN.

    Drop it with :func:`drop_database`.
    """
    name = name or unique_name(prefix)
    await _admin(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    if migrated and template is None:
        async with connection(dsn_for(name)) as conn:
            await migrate(conn)
    return dsn_for(name)


async def drop_database(dsn_or_name: str) -> None:
    """Drop a database made by :func:`create_database` (by DSN or by name), whoever is connected."""
    name = urlsplit(dsn_or_name).path.lstrip("/") if "://" in dsn_or_name else dsn_or_name
    await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def delete_queue_keys(client: aioredis.Redis, queue: str) -> None:
    """Delete every Redis key of ``queue`` (they all share the ``jq:{<queue>}`` prefix)."""
    keys = [key async for key in client.scan_iter(match=f"jq:{{{queue}}}:*", count=1000)]
    for start in range(0, len(keys), 500):
        await client.delete(*keys[start : start + 500])
