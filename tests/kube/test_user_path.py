"""The user's path, as README.md's "Install on Kubernetes" tells it, on the real control plane.

``helm install`` of the chart (operator, RBAC, CRDs) with RBAC authorization and
OwnerReferencesPermissionEnforcement on; the operator runs in a pod as the chart's ServiceAccount
(in-cluster credentials, through the node agent); the database is migrated with ``judgequeue
migrate``; the connection Secrets are applied; ``kubectl apply -f examples/judgequeue.yaml`` is the
example unchanged. Then pods run, ``judgequeue submit --wait`` and SQL ``submit()`` get verdicts,
``kubectl get jq`` fills its columns and the status is kstatus-compatible. The GitOps flip and its
rollback follow on the same installation (tests/kube/test_gitops_churn.py has the churn).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
import redis
import yaml

from tests.conftest import ADMIN_DSN, REDIS_URL
from tests.kube.cluster import Cluster
from tests.kube.conftest import CHART, EXAMPLE
from tests.kube.node import NodeAgent
from tests.kube.tools import JUDGEQUEUE_BIN, condition, jq_path, wait_for

RELEASE_NS = "judgequeue-system"
# A Redis database of its own: the example's queue is named "demo", as other suites' may be.
KUBE_REDIS_URL = REDIS_URL.rsplit("/", 1)[0] + "/13"
PAYLOAD = {"language": "python", "source": "print(sum(map(int, input().split())))",
           "tests": [{"input": "1 2", "output": "3"}], "limits": {"time": 2, "memory_mb": 256}}


@dataclass
class Installed:
    kube: Cluster
    node: NodeAgent
    namespace: str
    dsn: str

    def jq(self) -> dict[str, Any]:
        return dict(self.kube.request("GET", jq_path(self.namespace, "demo")))


def clear_queue_keys(url: str, queue: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"jq:{{{queue}}}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def helm_install(kube: Cluster) -> subprocess.CompletedProcess[str]:
    """README's command, with the image the node agent maps to the installed judgequeue command."""
    return kube.helm_cmd("install", "judgequeue", str(CHART), "-n", RELEASE_NS, "--create-namespace",
                         "--set", "image.repository=registry.example.com/judgequeue", "--wait", "--timeout", "3m")


def secrets_manifest(namespace: str, dsn: str, url: str) -> str:
    """The README's two Secrets (stringData), pointing at the test's servers."""
    return yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "judgequeue-postgres", "namespace": namespace},
         "type": "Opaque", "stringData": {"dsn": dsn}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "judgequeue-redis", "namespace": namespace},
         "type": "Opaque", "stringData": {"url": url}},
    ])


def ready_pods(kube: Cluster, namespace: str, component: str) -> list[dict[str, Any]]:
    pods = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector="
                               f"app.kubernetes.io/component%3D{component}")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))]


@pytest.fixture(scope="module")
def installed(kube: Cluster, node: NodeAgent, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """helm install, migrate, Secrets, the example applied: the README's steps in order."""
    admin = ADMIN_DSN
    database = f"jq_kube_{uuid.uuid4().hex[:8]}"
    dsn = admin.rsplit("/", 1)[0] + f"/{database}"
    run_sql(admin, f'CREATE DATABASE "{database}"')
    clear_queue_keys(KUBE_REDIS_URL, "demo")
    result = helm_install(kube)
    assert "STATUS: deployed" in result.stdout, result.stdout + result.stderr
    subprocess.run([str(JUDGEQUEUE_BIN), "migrate", "--postgres-dsn", dsn], check=True, capture_output=True)
    namespace = f"judge-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", namespace)
    kube.apply(secrets_manifest(namespace, dsn, KUBE_REDIS_URL))
    applied = kube.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    assert "judgequeue.judgequeue.dev/demo created" in applied.stdout
    try:
        yield Installed(kube, node, namespace, dsn)
    finally:
        # The documented order: JudgeQueues first (the operator removes its finalizer), then the chart.
        kube.kubectl("delete", "-n", namespace, "-f", str(EXAMPLE), "--wait=true", "--timeout=60s", check=False)
        kube.helm_cmd("uninstall", "judgequeue", "-n", RELEASE_NS, "--wait", check=False)
        wait_for("the example's pods gone", lambda: not kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")
                 ["items"], timeout=90)
        clear_queue_keys(KUBE_REDIS_URL, "demo")
        run_sql(admin, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def run_sql(dsn: str, sql: str, *args: Any) -> Any:
    """One statement on a connection of its own (these tests are synchronous: they drive processes)."""

    async def go() -> Any:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(go())


def test_pods_run_and_the_queue_becomes_ready(installed: Installed) -> None:
    kube, ns = installed.kube, installed.namespace
    operator_pods = kube.request("GET", f"/api/v1/namespaces/{RELEASE_NS}/pods")["items"]
    assert len(operator_pods) == 1, "the chart's operator pod is not running"
    assert operator_pods[0]["spec"]["serviceAccountName"] == "judgequeue"
    assert installed.node.running("judgequeue-"), "the node agent is not running the operator pod"
    def ready(component: str, count: int) -> Callable[[], bool]:
        return lambda: len(ready_pods(kube, ns, component)) == count

    for component, count in (("dispatcher", 1), ("worker", 2), ("reaper", 1)):
        wait_for(f"{count} ready {component} pod(s)", ready(component, count), timeout=120)
    wait_for("JudgeQueue Ready", lambda: condition(installed.jq(), "Ready").get("status") == "True", timeout=120)
    assert installed.node.errors == []


def test_submit_wait_and_sql_submit_get_verdicts(installed: Installed) -> None:
    wait_for("JudgeQueue Ready", lambda: condition(installed.jq(), "Ready").get("status") == "True", timeout=120)
    env = {**os.environ, "JUDGEQUEUE_POSTGRES_DSN": installed.dsn, "JUDGEQUEUE_QUEUE": "demo"}
    result = subprocess.run([str(JUDGEQUEUE_BIN), "submit", "--wait", "--timeout", "60s", "--payload",
                             json.dumps(PAYLOAD)], capture_output=True, text=True, env=env, timeout=90)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "ACCEPTED", result.stdout
    (row,) = run_sql(installed.dsn, "SELECT judgequeue.submit('demo', $1::jsonb) AS id", json.dumps(PAYLOAD))

    def verdict() -> str | None:
        (found,) = run_sql(installed.dsn, "SELECT status FROM judgequeue.submissions WHERE id = $1", row["id"])
        return None if found["status"] in ("PENDING", "JUDGING") else str(found["status"])

    assert wait_for("the SQL submission's verdict", verdict, timeout=60) == "ACCEPTED"


def test_kubectl_get_jq_fills_the_printer_columns(installed: Installed) -> None:
    kube, ns = installed.kube, installed.namespace

    def columns() -> dict[str, str] | None:
        out = kube.kubectl("get", "jq", "demo", "-n", ns).stdout.splitlines()
        header, row = out[0].split(), out[1].split()
        values = dict(zip(header, row, strict=False))
        if values.get("BACKLOG", "<none>") == "<none>" or values.get("READY") != "True":
            return None
        return values

    values = wait_for("kubectl get jq with every column filled", columns, timeout=60)
    assert values["MODE"] == "live" and values["WORKERS"] == "2", values
    assert int(values["BACKLOG"]) >= 0


def test_status_is_kstatus_compatible(installed: Installed) -> None:
    wait_for("JudgeQueue Ready", lambda: condition(installed.jq(), "Ready").get("status") == "True", timeout=120)
    obj = installed.jq()
    generation = obj["metadata"]["generation"]
    status = obj["status"]
    assert status["observedGeneration"] == generation
    types = {c["type"]: c for c in status["conditions"]}
    assert {"Ready", "Progressing", "Degraded", "CutoverApplied"} <= set(types)
    for cond in status["conditions"]:
        assert cond["status"] in ("True", "False", "Unknown")
        assert cond["observedGeneration"] == generation and cond["reason"] and "lastTransitionTime" in cond
    # kstatus reads Reconciling/Stalled as abnormal-true; Ready True with Degraded False is "Current".
    assert types["Degraded"]["status"] == "False" and types["Progressing"]["status"] == "False"
    waited = installed.kube.kubectl("wait", "-n", installed.namespace, "jq/demo", "--for=condition=Ready",
                                    "--timeout=30s")
    assert "condition met" in waited.stdout
