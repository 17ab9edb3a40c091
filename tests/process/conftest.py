"""Fixtures of the process tier: a Postgres server a test may crash, and root for the sandbox tests.

The shared databases and Redis key spaces (every tier but unit) are in tests/conftest.py."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from judgequeue.core.migrate import migrate
from judgequeue.core.queues import create_queue
from tests.support.databases import connection
from tests.support.pg_servers import PostgresServer, postgres_server


@pytest.fixture
def as_root() -> None:
    """The sandbox tests run untrusted programs under their own uids: they need root, as CI has.

    Not a skip: a run without root would pass without ever testing the sandbox.
    """
    if os.geteuid() != 0:
        pytest.fail("the sandbox tests need root (CI and scripts/install run as root); run the suite as root")


@pytest.fixture
async def own_pg(queue_name: str) -> AsyncIterator[PostgresServer]:
    """A throwaway Postgres server of this test's own (it may crash it), migrated, with the queue."""
    with postgres_server() as server:
        async with connection(server.dsn) as conn:
            await migrate(conn)
            await create_queue(conn, queue_name)
        yield server
