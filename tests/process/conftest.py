"""Fixtures of the process tier: a Postgres server a test may crash, root for the sandbox tests, and a
program judge for the problem archive tests.

The shared databases and Redis key spaces (every tier but unit) are in tests/conftest.py."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.sandbox.isolation import JudgeSettings
from judgequeue.core.store.migrate import migrate
from judgequeue.core.store.problems import attach_package_cache
from judgequeue.core.store.queues import create_queue
from tests.support.databases import connection
from tests.support.pg_servers import PostgresServer, postgres_server
from tests.support.sandbox_host import assert_host_clean


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


@pytest.fixture
async def package_judge(sandbox_dir: str, pg_pool: asyncpg.Pool) -> AsyncIterator[ProgramJudge]:
    """A program judge (4 slots) with a package cache attached the way the worker attaches it; nothing
    of its boxes may be left on the host afterwards."""
    j = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir), slots=4)
    attach_package_cache(j, pg_pool)
    yield j
    await assert_host_clean(j)
    j.close()
