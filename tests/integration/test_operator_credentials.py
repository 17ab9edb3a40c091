"""The operator with per-component credentials (``spec.credentials``): Kopf against kmock, real Postgres and Redis.

Each component's Secret holds a login user of its own (docs/security.md). The shared
``spec.postgres``/``spec.redis`` Secrets point nowhere, so a pass that still works proves the operator
connected with its own credentials; each Deployment it renders mounts its own Secret only; a
component's Secret that is missing is a Degraded condition naming it, with nothing rendered, until it
appears.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.core.spec import CREDENTIAL_COMPONENTS
from judgequeue.core.store.queues import get_queue
from judgequeue.core.transport.streams import stream_key
from tests.support.credentials import ComponentUser, drop_component_users, make_component_users, with_user
from tests.support.databases import REDIS_URL
from tests.support.kmock_emulator import DEPLOYMENTS, JQ, SECRETS, SERVICES, StrictEmulator, no_writes, secret
from tests.support.operator import NS, Env, operator_env, spec
from tests.support.waiting import eventually

pytestmark = pytest.mark.kmock(cls=StrictEmulator)

CHILDREN = [(DEPLOYMENTS, "judge-dispatcher"), (DEPLOYMENTS, "judge-worker"), (DEPLOYMENTS, "judge-reaper"),
            (SERVICES, "judge-metrics")]
PASSWORD = "jq-operator-credentials"
NOWHERE_DSN = "postgresql://postgres@127.0.0.1:1/nowhere"
NOWHERE_REDIS = "redis://127.0.0.1:1/0"


@pytest.fixture
async def users(pg_dsn: str, queue_name: str) -> AsyncIterator[dict[str, ComponentUser]]:
    made = await make_component_users(pg_dsn, REDIS_URL, queue_name, CREDENTIAL_COMPONENTS,
                                      prefix=f"jqo_{uuid.uuid4().hex[:8]}", password=PASSWORD)
    yield made
    await drop_component_users(pg_dsn, REDIS_URL, made.values())


@pytest.fixture
async def env(kmock: StrictEmulator, pg_dsn: str, tmp_path: Path) -> AsyncIterator[Env]:
    # The shared Secrets reach nothing: whatever works below, works with the components' own.
    async with operator_env(kmock, tmp_path, pg_dsn, dsn=NOWHERE_DSN, redis_url=NOWHERE_REDIS) as running:
        yield running


def component_secret(name: str, made: ComponentUser, pg_dsn: str) -> dict[str, Any]:
    return secret(name, **{"postgres-dsn": with_user(pg_dsn, made.user, PASSWORD),
                           "redis-url": with_user(REDIS_URL, made.user, PASSWORD)})


def mounted_secrets(deployment: dict[str, Any]) -> set[str]:
    pod = deployment["spec"]["template"]["spec"]
    return {source["secret"]["name"] for volume in pod["volumes"]
            for source in (volume.get("projected") or {}).get("sources", [])}


async def test_each_component_connects_with_its_own_secret(
    env: Env, queue_name: str, pg: asyncpg.Connection, pg_dsn: str, users: dict[str, ComponentUser]
) -> None:
    for component, made in users.items():
        env.kmock.put_object(SECRETS, NS, component_secret(f"jq-{component}", made, pg_dsn))
    credentials = {c: {"secretName": f"jq-{c}"} for c in CREDENTIAL_COMPONENTS}
    env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"},
                                  "spec": spec(queue_name, credentials=credentials, paused=True)})
    await env.observed(1)
    # The queue row was made and flagged through the operator's own login (the shared DSN reaches nothing).
    await eventually(lambda: env.condition("CutoverApplied").get("status") == "True", what="cutover applied")
    flags = await get_queue(pg, queue_name)
    assert flags.paused is True
    # The backlog was read through the operator's ACL user: a tick wrote its figures, nothing Degraded.
    redis = aioredis.Redis.from_url(REDIS_URL)
    try:
        await redis.xgroup_create(stream_key(queue_name), "workers", id="0-0", mkstream=True)
    finally:
        await redis.aclose()
    await eventually(lambda: "backlog" in (env.cr().get("status") or {}), what="backlog figures in status")
    assert env.condition("Degraded")["status"] == "False", env.condition("Degraded")
    shared = env.condition("SharedCredentials")
    assert (shared["status"], shared["reason"]) == ("False", "PerComponentCredentials"), shared
    for role in ("dispatcher", "worker", "reaper"):
        deployment = env.kmock.current(DEPLOYMENTS, NS, f"judge-{role}")
        assert deployment is not None
        assert mounted_secrets(deployment) == {f"jq-{role}"}, (role, mounted_secrets(deployment))

    # A component's Secret that does not exist: Degraded naming it, nothing rendered, until it appears.
    with no_writes(env.kmock, NS, CHILDREN):
        generation = await env.patch_cr({"spec": {"credentials": {"worker": {"secretName": "jq-worker-rotated"}}}})
        await env.observed(generation)
        degraded = env.condition("Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "SecretNotFound"), degraded
        assert "spec.credentials.worker" in degraded["message"] and "jq-worker-rotated" in degraded["message"]
    assert env.operator.error is None  # a condition, never a crash
    env.kmock.put_object(SECRETS, NS, component_secret("jq-worker-rotated", users["worker"], pg_dsn))
    await eventually(lambda: env.condition("Degraded").get("status") == "False", what="recovered: Secret made")
    worker = env.kmock.current(DEPLOYMENTS, NS, "judge-worker")
    assert worker is not None and mounted_secrets(worker) == {"jq-worker-rotated"}

    # A Secret without the key its component reads: named too.
    env.kmock.put_object(SECRETS, NS, secret("jq-reaper-partial", **{"postgres-dsn": "postgresql://x@h/db"}))
    generation = await env.patch_cr({"spec": {"credentials": {"reaper": {"secretName": "jq-reaper-partial"}}}})
    await env.observed(generation)
    degraded = env.condition("Degraded")
    assert degraded["status"] == "True" and "spec.credentials.reaper" in degraded["message"], degraded
    assert "has no key 'redis-url'" in degraded["message"], degraded


async def test_the_shared_url_still_works_and_status_warns(
    kmock: StrictEmulator, pg_dsn: str, tmp_path: Path, queue_name: str, pg: asyncpg.Connection
) -> None:
    async with operator_env(kmock, tmp_path, pg_dsn) as env:
        env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"}, "spec": spec(queue_name)})
        await env.observed(1)
        await eventually(lambda: env.condition("CutoverApplied").get("status") == "True", what="cutover applied")
        shared = env.condition("SharedCredentials")
        assert (shared["status"], shared["reason"]) == ("True", "SharedCredentials"), shared
        assert "dispatcher, worker, reaper, operator" in shared["message"], shared
        assert env.condition("Degraded")["status"] == "False"  # a warning, not a failure
        for role in ("dispatcher", "worker", "reaper"):
            deployment = env.kmock.current(DEPLOYMENTS, NS, f"judge-{role}")
            assert deployment is not None and mounted_secrets(deployment) == {"jq-db", "jq-redis"}
