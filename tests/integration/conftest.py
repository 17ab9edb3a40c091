"""Fixtures of the integration tier (the shared databases and Redis key spaces are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
import redis.asyncio as aioredis

from tests.support.worker_harness import Harness


@pytest.fixture
def harness_class() -> type[Harness]:
    """The harness ``h`` builds; a module whose tests need more (test_shadow.py) overrides this."""
    return Harness


@pytest.fixture
async def h(
    harness_class: type[Harness], pg_pool: asyncpg.Pool, redis_client: aioredis.Redis, pg_dsn: str, queue_name: str
) -> AsyncIterator[Harness]:
    async with harness_class(pg_pool, redis_client, pg_dsn, queue_name) as harness:
        yield harness
