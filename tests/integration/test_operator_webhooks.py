"""The operator names a webhook that cannot deliver (Kopf against kmock, real Postgres): a missing
Secret or key, a Secret that holds no URL, and a receiver that keeps failing or dead-letters, each
as ``WebhooksDelivering=False`` naming the webhook, and True once it delivers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from judgequeue.core.store import events, leases, outbox
from judgequeue.core.store.queues import create_queue
from tests.support.kmock_emulator import JQ, SECRETS, StrictEmulator, secret
from tests.support.operator import NS, Env, operator_env, spec
from tests.support.waiting import eventually

pytestmark = pytest.mark.kmock(cls=StrictEmulator)

HOOKS = [{"name": "board", "urlSecretKeyRef": {"name": "hooks", "key": "url"},
          "secretKeyRef": {"name": "hooks", "key": "key"}}]  # fmt: skip


@pytest.fixture
async def env(kmock: StrictEmulator, pg_dsn: str, tmp_path: Path) -> AsyncIterator[Env]:
    async with operator_env(kmock, tmp_path, pg_dsn) as running:
        yield running


async def _condition(env: Env, status: str, reason: str, containing: str = "") -> dict[str, object]:
    async def found() -> dict[str, object] | None:
        cond = env.condition("WebhooksDelivering")
        wanted = (cond.get("status"), cond.get("reason")) == (status, reason)
        return cond if wanted and containing in str(cond.get("message")) else None

    result = await eventually(found, within=20, what=f"WebhooksDelivering {status} {reason}")
    assert result is not None
    return result


async def test_a_webhook_that_cannot_deliver_is_a_condition_naming_it(
    env: Env, queue_name: str, pg: asyncpg.Connection
) -> None:
    env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"},
                                  "spec": spec(queue_name, events={"webhooks": HOOKS})})  # fmt: skip
    missing = await _condition(env, "False", "WebhookMisconfigured")
    assert missing["message"] == f"webhook board: Secret {NS}/hooks not found"
    env.kmock.put_object(SECRETS, NS, secret("hooks", url="not a url", key="k3y"))
    wrong = await _condition(env, "False", "WebhookMisconfigured", "does not hold")
    assert "webhook board: Secret" in str(wrong["message"]) and "key 'url' does not hold an http" in str(
        wrong["message"]
    )
    env.kmock.put_object(SECRETS, NS, secret("hooks", url="http://127.0.0.1:9/hook", key="k3y"))
    await _condition(env, "True", "Delivering")
    # An unreachable receiver: the reapers' failed tries, as Postgres records them.
    await create_queue(pg, queue_name)
    sid = await outbox.submit(pg, queue_name, {})
    [lease] = await leases.acquire(pg, queue_name, [(sid, 1)], ttl=30)
    await leases.write_verdicts(pg, [leases.VerdictWrite(lease, "ACCEPTED", {"status": "ACCEPTED"})])
    name = f"{queue_name}/board"
    await events.ensure_endpoint(pg, name, queue_name)
    assert await events.ingest(pg, name) == 1
    for _ in range(3):
        [delivery] = await events.claim(pg, name, concurrency=1, owner="r", claim_ttl=5)
        error = "connection: cannot connect to 127.0.0.1:9: Connection refused"
        await events.failed(pg, name, delivery.event_id, "r", max_attempts=5, delay=0, error=error, permanent=False)
    failing = await _condition(env, "False", "WebhookFailing")
    assert "webhook board: 1 deliveries waiting" in str(failing["message"])
    assert "after 3 tries: connection: cannot connect to 127.0.0.1:9" in str(failing["message"])
    [delivery] = await events.claim(pg, name, concurrency=1, owner="r", claim_ttl=5)
    await events.failed(pg, name, delivery.event_id, "r", max_attempts=5, delay=0, error="answered 410 (refused)",
                        permanent=True)  # fmt: skip
    dead = await _condition(env, "False", "WebhookDeadLetters")
    assert "webhook board: 1 deliveries dead-lettered (latest error: answered 410 (refused))" in str(dead["message"])
    assert await events.replay(pg, name) == [delivery.event_id]
    [delivery] = await events.claim(pg, name, concurrency=1, owner="r", claim_ttl=5)
    assert await events.delivered(pg, name, [delivery.event_id], "r")
    await _condition(env, "True", "Delivering")
    assert env.condition("Degraded").get("status") == "False"  # the fleet itself is fine
    assert env.operator.error is None
