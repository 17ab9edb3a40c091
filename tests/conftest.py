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
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import streams
from tests.support import scheduling
from tests.support.databases import REDIS_URL, create_database, delete_queue_keys, drop_database


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier (``-m "not kube"`` leaves one out) and order the collection for
    the build beside the suite (tests/support/scheduling.py)."""
    for item in items:
        tier = scheduling.tier_of(Path(str(item.fspath)), TESTS)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
    parallel = _parallel(config)
    items.sort(key=lambda item: scheduling.order_key(item, TESTS, parallel))


def _parallel(config: pytest.Config) -> bool:
    """True on an xdist worker or controller (the heavy units then go out first)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) or bool(getattr(config.option, "numprocesses", None))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> scheduling.UnitScheduling:
    return scheduling.UnitScheduling(config, log)


TESTS = Path(__file__).parent
#: Set by scripts/test when the heavy tiers build beside the tests: the folder of that build's locks
#: (one per artefact), exit codes and log.
HEAVY_BUILD = os.environ.get("JUDGEQUEUE_PREPARE_HEAVY")
#: Per artefact, once a test has waited for it: "" (built) or why it was not.
_built: dict[str, str] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that needs an artefact scripts/test builds beside the suite waits for that artefact
    (not the whole build), and fails with the build's log when it failed."""
    if HEAVY_BUILD is None:
        return
    for artefact in scheduling.needs(item, TESTS):
        if artefact not in _built:
            _built[artefact] = scheduling.wait_for(Path(HEAVY_BUILD), artefact)
        if _built[artefact]:
            pytest.fail(_built[artefact], pytrace=False)


#: Seconds spent per folder of tests/ (setup, call and teardown), for the summary below.
_SECONDS_BY_FOLDER: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    parts = Path(report.location[0]).parts
    folder = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
    _SECONDS_BY_FOLDER[folder] = _SECONDS_BY_FOLDER.get(folder, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Where a run's time went, folder by folder (what a cold CI run's budget is planned from)."""
    if not _SECONDS_BY_FOLDER:
        return
    terminalreporter.section("time per folder")
    for folder, seconds in sorted(_SECONDS_BY_FOLDER.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"tests/{folder}: {seconds / 60:.1f} min")


@pytest.fixture(scope="session")
def template_db() -> Iterator[str]:
    """A migrated database every test database is cloned from (one per session and xdist worker)."""
    name = f"jq_template_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{os.getpid()}"
    asyncio.run(drop_database(name))
    asyncio.run(create_database(name=name))
    yield name
    asyncio.run(drop_database(name))


@pytest.fixture
async def fresh_db() -> AsyncIterator[str]:
    """An empty database (no migrations) for migration tests; yields its DSN."""
    dsn = await create_database("jq_t", migrated=False)
    yield dsn
    await drop_database(dsn)


@pytest.fixture
async def pg_dsn(template_db: str) -> AsyncIterator[str]:
    """A migrated database of this test's own; yields its DSN."""
    dsn = await create_database("jq_t", template=template_db)
    yield dsn
    await drop_database(dsn)


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
    await delete_queue_keys(client, queue_name)
    await client.aclose()


@pytest.fixture
async def queue(pg_pool: asyncpg.Pool, redis_client: aioredis.Redis, queue_name: str) -> str:
    """``queue_name`` created in Postgres, with its consumer group in Redis: a queue roles can serve."""
    async with pg_pool.acquire() as conn:
        await create_queue(conn, queue_name)
    await streams.ensure_group(redis_client, queue_name)
    return queue_name
