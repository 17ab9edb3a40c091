"""What a pod does besides its job, on its own component's credentials (real Postgres and Redis).

A role pod is probed (``/readyz``: Postgres, Redis and, for workers and reapers, that the consumer
group exists) and the reaper keeps the shadow stream trimmed by Redis's clock. With a component's own
login user and ACL user each must work: a probe that an ACL refuses leaves the pod unready forever (the
real-node tier found a worker's ``XINFO GROUPS`` refused), and a refused upkeep lets a stream grow.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core.roles.reaper.loop import Context
from judgequeue.core.roles.reaper.stream_upkeep import IdleConsumers, ShadowTrim
from judgequeue.core.runtime.process import ReadinessProbe
from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport import streams
from tests.support.credentials import ComponentUser, drop_component_users, make_component_users, with_user
from tests.support.databases import REDIS_URL, delete_queue_keys
from tests.support.settings import make_settings

PASSWORD = "jq-readiness"


@pytest.fixture
async def users(pg_dsn: str, queue_name: str) -> AsyncIterator[dict[str, ComponentUser]]:
    made = await make_component_users(pg_dsn, REDIS_URL, queue_name, ("dispatcher", "worker", "reaper"),
                                      prefix=f"jqr_{uuid.uuid4().hex[:8]}", password=PASSWORD)
    yield made
    await drop_component_users(pg_dsn, REDIS_URL, made.values())
    admin = aioredis.Redis.from_url(REDIS_URL)
    await delete_queue_keys(admin, queue_name)
    await admin.aclose()


@pytest.mark.parametrize(("role", "need_group"), [("dispatcher", False), ("worker", True), ("reaper", True)])
async def test_each_roles_readiness_probe_passes_on_its_own_credentials(
    pg_dsn: str, pg: asyncpg.Connection, queue_name: str, users: dict[str, ComponentUser], role: str,
    need_group: bool,
) -> None:
    await create_queue(pg, queue_name)
    own = users[role]
    settings = make_settings(with_user(pg_dsn, own.user, PASSWORD), with_user(REDIS_URL, own.user, PASSWORD),
                             queue_name)
    probe = ReadinessProbe(settings, need_group=need_group)
    try:
        before = await probe()
        if need_group:  # no group yet: unready, saying so (not refused by the ACL)
            assert before.checks["group"].startswith("group 'workers' missing"), before.checks
            client = aioredis.Redis.from_url(settings.redis_url)
            try:
                await streams.ensure_group(client, queue_name)  # as the role does at start, with its own user
            finally:
                await client.aclose()
        ready = await probe()
    finally:
        await probe.close()
    assert ready.ready, ready.checks
    assert set(ready.checks.values()) == {"ok"}, ready.checks


async def test_the_reapers_stream_upkeep_runs_on_its_own_credentials(
    pg_dsn: str, queue_name: str, users: dict[str, ComponentUser]
) -> None:
    own = users["reaper"]
    settings = make_settings(with_user(pg_dsn, own.user, PASSWORD), with_user(REDIS_URL, own.user, PASSWORD),
                             queue_name, RETENTION="1ms")
    admin = aioredis.Redis.from_url(REDIS_URL)
    client = aioredis.Redis.from_url(settings.redis_url)
    pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=1, max_size=1)
    try:
        for shadow in (False, True):
            await streams.ensure_group(admin, queue_name, shadow=shadow)
        await admin.xadd(streams.shadow_key(queue_name), {"submission": "1"}, id="1-0")  # appended long ago
        ctx = Context(pool, client, settings, "reaper-test")
        assert await ShadowTrim(ctx).run() == 1
        assert await admin.xlen(streams.shadow_key(queue_name)) == 0
        assert await IdleConsumers(ctx, idle_after=0.0).run() == 0
    finally:
        await pool.close()
        await client.aclose()
        await admin.aclose()
