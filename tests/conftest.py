"""Shared fixtures: every test gets its own Postgres database and its own Redis key space.

A template database is migrated once per session (per xdist worker); each test clones it with
``CREATE DATABASE ... TEMPLATE``, which takes tens of milliseconds, so tests can run in any order
and in parallel. Redis isolation comes from a unique queue name per test: every key of a queue
shares the ``jq:{<queue>}`` prefix, and the fixture deletes them afterwards.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import streams
from tests.support.databases import REDIS_URL, create_database, delete_queue_keys, drop_database

#: The tiers that need more than Postgres and Redis, one folder each: every test below tests/<tier>/
#: carries the marker of that name (pyproject.toml declares them), so ``-m "not kube"`` leaves one out.
TIERS = ("kube", "node", "vm")


def _tier(item: pytest.Item) -> str | None:
    here = Path(__file__).parent
    folders = Path(str(item.fspath)).parents
    return next((tier for tier in TIERS if here / tier in folders), None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier, and run the tiers that need no build first (in their order
    otherwise), so that on a new machine they run while scripts/test builds the heavy ones."""
    for item in items:
        tier = _tier(item)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
    items.sort(key=_build_order)


def _build_order(item: pytest.Item) -> int:
    """-1 for a test that needs nothing built; else the index of its tier (a test marked ``builds``,
    outside the tiers, with the first of them)."""
    tier = _tier(item)
    if tier is not None:
        return TIERS.index(tier)
    return 0 if item.get_closest_marker("builds") is not None else -1


#: Set by scripts/test when the heavy tiers build beside the tests: the folder of that build's lock,
#: exit code and log.
HEAVY_BUILD = os.environ.get("JUDGEQUEUE_PREPARE_HEAVY")
#: None until the first heavy test has waited for that build; then "" (built) or why it failed.
_heavy_failure: list[str] = []


def _wait_for_heavy_build(folder: Path) -> str:
    """Wait until the build has ended (it holds the lock until then); "" or its failure with its log."""
    with open(folder / "lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
    code = (folder / "rc").read_text().strip() if (folder / "rc").exists() else "none"
    if code == "0":
        return ""
    log = (folder / "log").read_text(errors="replace") if (folder / "log").exists() else ""
    return f"preparing the kube, node and vm tiers failed (exit {code}):\n{log[-6000:]}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test of a heavy tier waits for the build scripts/test started beside the suite, and fails
    with the build's log when it failed."""
    if HEAVY_BUILD is None or _build_order(item) < 0:
        return
    if not _heavy_failure:
        _heavy_failure.append(_wait_for_heavy_build(Path(HEAVY_BUILD)))
    if _heavy_failure[0]:
        pytest.fail(_heavy_failure[0], pytrace=False)


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
