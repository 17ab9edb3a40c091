"""Fixtures of the process tier: a Postgres server a test may crash, and root for the sandbox tests.

The shared databases and Redis key spaces (every tier but unit) are in tests/conftest.py."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator

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


@pytest.fixture(scope="module")
def sandbox_dir() -> Iterator[str]:
    """The program judge's sandbox directory for a test module.

    Not under pytest's tmp_path: that is 0700, and each box's uid must be able to reach its box."""
    path = f"/tmp/jq-sandbox-test-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)
