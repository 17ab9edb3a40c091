"""The workers' egress NetworkPolicy through the operator: Kopf against kmock (StrictEmulator), real
Postgres and Redis. Created with the JudgeQueue for program-judge workers, patched when the spec's
ports or CIDRs change, deleted when the spec turns it off or the judge is not the program judge, and
never touched when it is not the JudgeQueue's own. (tests/kube/test_network_policy.py: the same on a
real API server, and its removal with the JudgeQueue by the garbage collector.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import pytest

from judgequeue.controllers.state import OperatorConfig
from tests.support.databases import REDIS_URL
from tests.support.kmock_emulator import (
    JQ,
    SECRETS,
    OperatorThread,
    StrictEmulator,
    eventually,
    secret,
    write_kubeconfig,
)

pytestmark = pytest.mark.kmock(cls=StrictEmulator)

NS = "jq-netpol"
POLICIES = kmock.resource("networking.k8s.io/v1/networkpolicies")
POLICY = "judge-worker-egress"
DNS = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}


def spec(queue: str, **worker: Any) -> dict[str, Any]:
    return {
        "image": "ghcr.io/example/judgequeue:1.0",
        "queue": queue,
        "postgres": {"secretKeyRef": {"name": "jq-db", "key": "dsn"}},
        "redis": {"secretKeyRef": {"name": "jq-redis", "key": "url"}},
        "worker": {"minReplicas": 1, "maxReplicas": 2, **worker},
    }


class Env:
    def __init__(self, emulator: StrictEmulator) -> None:
        self.kmock = emulator

    def policy(self) -> dict[str, Any] | None:
        return self.kmock.current(POLICIES, NS, POLICY)

    def status(self) -> dict[str, Any]:
        obj = self.kmock.current(JQ, NS, "judge")
        assert obj is not None
        return dict(obj.get("status") or {})

    async def patch_cr(self, patch: dict[str, Any]) -> int:
        async with self.kmock.patch(f"/apis/judgequeue.dev/v1alpha1/namespaces/{NS}/judgequeues/judge",
                                    json=patch, headers={"Content-Type": "application/merge-patch+json"}) as resp:
            assert resp.status == 200, await resp.text()
            return int((await resp.json())["metadata"]["generation"])

    async def observed(self, generation: int) -> None:
        await eventually(lambda: self.status().get("observedGeneration") == generation,
                         what=f"observedGeneration {generation}")


@pytest.fixture
async def env(kmock: StrictEmulator, pg_dsn: str, tmp_path: Path) -> AsyncIterator[Env]:
    kmock.declare()
    kmock.put_object(SECRETS, NS, secret("jq-db", dsn=pg_dsn))
    kmock.put_object(SECRETS, NS, secret("jq-redis", url=REDIS_URL))
    operator = OperatorThread(write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url)), [NS],
                              OperatorConfig(interval=0.25, db_timeout=2.0))
    operator.start()
    await operator.wait_ready()
    try:
        yield Env(kmock)
    finally:
        await operator.stop()
        kmock.close_watches()
    assert operator.error is None, operator.error


async def test_created_patched_deleted_and_recreated_with_the_spec(env: Env, queue_name: str) -> None:
    cr = env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"}, "spec": spec(queue_name)})
    await env.observed(1)
    policy = env.policy()
    assert policy is not None
    assert policy["metadata"]["ownerReferences"][0]["uid"] == cr["metadata"]["uid"]
    assert policy["metadata"]["ownerReferences"][0]["controller"] is True
    assert policy["spec"]["podSelector"] == {"matchLabels": {
        "app.kubernetes.io/name": "judgequeue", "app.kubernetes.io/instance": "judge",
        "app.kubernetes.io/component": "worker"}}
    assert policy["spec"]["policyTypes"] == ["Egress"]
    assert policy["spec"]["egress"] == [
        DNS,
        {"ports": [{"protocol": "TCP", "port": 5432}]},
        {"ports": [{"protocol": "TCP", "port": 6379}, {"protocol": "TCP", "port": 26379}]},
    ]
    # Narrowed to the database's and Redis' networks, PgBouncer's port, no Sentinel.
    generation = await env.patch_cr({"spec": {"worker": {"networkPolicy": {
        "postgres": {"port": 6432, "cidr": "10.20.0.0/16"},
        "redis": {"cidr": "10.30.0.7/32", "sentinelPort": 0}}}}})
    await env.observed(generation)
    policy = env.policy()
    assert policy is not None and policy["spec"]["egress"] == [
        DNS,
        {"ports": [{"protocol": "TCP", "port": 6432}], "to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}]},
        {"ports": [{"protocol": "TCP", "port": 6379}], "to": [{"ipBlock": {"cidr": "10.30.0.7/32"}}]},
    ]
    generation = await env.patch_cr({"spec": {"worker": {"networkPolicy": {"enabled": False}}}})
    await env.observed(generation)
    assert env.policy() is None
    generation = await env.patch_cr({"spec": {"worker": {"networkPolicy": {"enabled": True}}}})
    await env.observed(generation)
    policy = env.policy()
    assert policy is not None and policy["spec"]["egress"][1]["ports"] == [{"protocol": "TCP", "port": 6432}]
    # Another judge runs no untrusted code: no policy.
    generation = await env.patch_cr({"spec": {"worker": {"judge": "noop"}}})
    await env.observed(generation)
    assert env.policy() is None


async def test_a_policy_it_does_not_own_is_left_alone(env: Env, queue_name: str) -> None:
    theirs = env.kmock.put_object(POLICIES, NS, {"metadata": {"name": POLICY},
                                                 "spec": {"podSelector": {}, "policyTypes": ["Egress"]}})
    env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"},
                                  "spec": spec(queue_name, networkPolicy={"enabled": False})})
    await env.observed(1)
    left = env.policy()
    assert left is not None and left["metadata"]["uid"] == theirs["metadata"]["uid"]


async def test_a_bad_cidr_degrades_and_changes_nothing(env: Env, queue_name: str) -> None:
    env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"}, "spec": spec(queue_name)})
    await env.observed(1)
    before = env.policy()
    assert before is not None
    generation = await env.patch_cr({"spec": {"worker": {"networkPolicy": {"postgres": {"cidr": "10.0.0.1/8"}}}}})
    await env.observed(generation)
    degraded = next(c for c in env.status()["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True"
    assert "spec.worker.networkPolicy.postgres.cidr: '10.0.0.1/8' is not a CIDR" in degraded["message"]
    after = env.policy()
    assert after is not None and after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
