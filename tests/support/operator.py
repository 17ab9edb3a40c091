"""The operator running against kmock (StrictEmulator) with real Postgres and Redis: the shared setup.

:func:`operator_env` puts the connection Secrets in place, starts the operator in its own thread and
stops it at the end (failing if it crashed); :class:`Env` reads what it wrote; :func:`spec` is a
JudgeQueue spec with test-sized autoscaling.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from judgequeue.controllers.state import OperatorConfig
from tests.support.databases import REDIS_URL
from tests.support.kmock_emulator import (
    DEPLOYMENTS,
    JQ,
    SECRETS,
    OperatorThread,
    StrictEmulator,
    secret,
    write_kubeconfig,
)
from tests.support.waiting import eventually

NS = "jq-test"


@dataclass
class Env:
    kmock: StrictEmulator
    operator: OperatorThread
    pg_dsn: str

    def cr(self, name: str = "judge") -> dict[str, Any]:
        obj = self.kmock.current(JQ, NS, name)
        assert obj is not None
        return obj

    def condition(self, type_: str, name: str = "judge") -> dict[str, Any]:
        for cond in (self.cr(name).get("status") or {}).get("conditions", []):
            if cond["type"] == type_:
                return dict(cond)
        return {}

    def replicas(self, name: str = "judge-worker") -> int | None:
        obj = self.kmock.current(DEPLOYMENTS, NS, name)
        return None if obj is None else obj["spec"].get("replicas")

    async def patch_cr(self, patch: dict[str, Any], name: str = "judge") -> int:
        """Patch the CR as kubectl would; returns the new generation."""
        async with self.kmock.patch(f"/apis/judgequeue.dev/v1alpha1/namespaces/{NS}/judgequeues/{name}",
                                    json=patch, headers={"Content-Type": "application/merge-patch+json"}) as resp:
            assert resp.status == 200, await resp.text()
            return int((await resp.json())["metadata"]["generation"])

    async def observed(self, generation: int, name: str = "judge") -> None:
        await eventually(lambda: (self.cr(name).get("status") or {}).get("observedGeneration") == generation,
                         what=f"observedGeneration {generation}")


def spec(queue_: str, /, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "image": "ghcr.io/example/judgequeue:1.0",
        "queue": queue_,
        "postgres": {"secretKeyRef": {"name": "jq-db", "key": "dsn"}},
        "redis": {"secretKeyRef": {"name": "jq-redis", "key": "url"}},
        "worker": {"minReplicas": 1, "maxReplicas": 4, "targetBacklogPerReplica": 5, "scaleDownStabilization": "1s"},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


@contextlib.asynccontextmanager
async def operator_env(
    kmock: StrictEmulator,
    tmp_path: Path,
    pg_dsn: str,
    *,
    dsn: str | None = None,
    redis_url: str = REDIS_URL,
    db_timeout: float = 2.0,
) -> AsyncIterator[Env]:
    """The operator watching :data:`NS`, its Secrets naming ``dsn`` (default ``pg_dsn``) and ``redis_url``."""
    kmock.declare()
    kmock.put_object(SECRETS, NS, secret("jq-db", dsn=dsn or pg_dsn))
    kmock.put_object(SECRETS, NS, secret("jq-redis", url=redis_url))
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url))
    operator = OperatorThread(kubeconfig, [NS], OperatorConfig(interval=0.25, db_timeout=db_timeout))
    operator.start()
    await operator.wait_ready()
    try:
        yield Env(kmock, operator, pg_dsn)
    finally:
        await operator.stop()
        kmock.close_watches()
    assert operator.error is None, operator.error
