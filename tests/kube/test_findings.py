"""Five things the operator once got wrong on a real API server, each checked against one (each failed before its fix).

1. The CRD is accepted: CEL rules are checked against every ``default:`` as written, so an object
   default must already hold the keys its rules read.
2. Every status field the operator writes is declared (not pruned; strict field validation accepts
   it), so the operator sees its cutover as applied and does not re-apply it on every tick.
3. Under OwnerReferencesPermissionEnforcement the chart's RBAC may create children whose owner
   reference sets ``blockOwnerDeletion`` (needs ``update`` on ``judgequeues/finalizers``).
4. The scale subresource answers while nobody has set the worker count yet.
5. The chart's kubeVersion claim holds on the oldest release it claims (tests/kube/test_chart_real.py
   covers the peering CRDs; this file the operator's JSON logs and its Events for failed reconciles).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from judgequeue.controllers.rbac import render_rules
from judgequeue.controllers.render import Owner, render_deployment
from judgequeue.core.spec import parse_spec
from tests.kube.cluster import ApiError, Cluster
from tests.kube.conftest import CHART, CRD_FILE, EXAMPLE
from tests.kube.tools import (
    condition,
    connection_secrets,
    jq_path,
    judgequeue,
    operator_identity,
    start_operator,
    wait_for,
)
from tests.support.databases import REDIS_URL


def test_crd_is_accepted_by_a_current_api_server(kube: Cluster) -> None:
    result = kube.kubectl("apply", "-f", str(CRD_FILE), check=False)
    assert result.returncode == 0, result.stderr
    kube.wait_established("judgequeues.judgequeue.dev")


def test_minimal_object_gets_every_default(crd_installed: Cluster, namespace: str) -> None:
    created = crd_installed.request("POST", jq_path(namespace), judgequeue("minimal", "minimal"))
    spec = created["spec"]
    # The CRD writes each default as its shortest duration (controllers/crd.py): 60 s is "1m".
    assert spec["reaper"]["interval"] == "5s" and spec["reaper"]["visibilityTimeout"] == "1m"
    assert spec["dispatcher"]["backoff"] == {"base": "1s", "max": "5m"}
    assert spec["worker"]["minReplicas"] == 1 and spec["worker"]["maxReplicas"] == 8
    assert spec["worker"]["replicas"] == 1
    assert spec["cutover"] == {"mode": "live", "driftPolicy": "restore"}
    assert spec["progressDeadline"] == "10m"


# The status fields the operator writes (reconcile.reconcile / scaling.autoscale_workers), every one of them.
OPERATOR_STATUS: dict[str, Any] = {
    "observedGeneration": 1,
    "conditions": [{"type": "Ready", "status": "True", "reason": "Available", "message": "ok",
                    "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    "workers": {"replicas": 1, "ready": 1, "selector": "a=b", "autoscaling": "internal"},
    "backlog": {"total": 0, "outboxPending": 0, "streamLag": 0, "pel": 0, "readAt": "2026-01-01T00:00:00Z"},
    "cutover": {"queue": "q", "mode": "live", "paused": False, "configVersion": 2, "generation": 1,
                "watermark": "2026-01-01T00:00:00Z", "owner": "JudgeQueue ns/judge",
                "applied": "mode=live paused=false watermark=2026-01-01T00:00:00Z"},
    "autoscaling": {"lastScaleUp": 1767225600.5, "lastBusy": None, "wanted": 1, "externalSince": 1767225600.5,
                    "handoffReplicas": 1},
}


def test_operator_status_is_declared_under_strict_field_validation(crd_installed: Cluster, namespace: str) -> None:
    crd_installed.request("POST", jq_path(namespace), judgequeue("strict", "strict"))
    patched = crd_installed.request(
        "PATCH", jq_path(namespace, "strict", "status") + "?fieldValidation=Strict", {"status": OPERATOR_STATUS},
        content_type="application/merge-patch+json")
    status = patched["status"]
    assert status["cutover"]["queue"] == "q"
    assert status["workers"]["autoscaling"] == "internal"
    assert status["autoscaling"] == {"lastScaleUp": 1767225600.5, "wanted": 1,  # null removes in a merge patch
                                     "externalSince": 1767225600.5, "handoffReplicas": 1}
    assert status["cutover"]["applied"] == OPERATOR_STATUS["cutover"]["applied"]


async def _config_version(dsn: str, queue: str) -> int | None:
    conn = await asyncpg.connect(dsn)
    try:
        value = await conn.fetchval("SELECT config_version FROM judgequeue.queues WHERE name = $1", queue)
        return None if value is None else int(value)
    finally:
        await conn.close()


async def test_operator_applies_cutover_once_not_on_every_tick(
    crd_installed: Cluster, namespace: str, pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    kube = crd_installed
    connection_secrets(kube, namespace, dsn=pg_dsn, redis_url=REDIS_URL)
    kubeconfig = operator_identity(kube, namespace)
    kube.request("POST", jq_path(namespace), judgequeue("judge", queue_name))
    operator = start_operator(kubeconfig, namespace, tmp_path / "operator.log", interval=0.5)
    try:
        def cr() -> dict[str, Any]:
            return dict(kube.request("GET", jq_path(namespace, "judge")))

        wait_for("cutover applied", lambda: condition(cr(), "CutoverApplied").get("status") == "True",
                 check=operator.check)
        applied = await _config_version(pg_dsn, queue_name)
        assert cr()["status"]["cutover"]["queue"] == queue_name
        # Three more timer ticks (each rewrites status.backlog.readAt): the flags stay as applied.
        def read_at() -> Any:
            return (cr()["status"].get("backlog") or {}).get("readAt")

        def changed_from(seen: Any) -> Callable[[], bool]:
            return lambda: read_at() not in (None, seen)

        for _ in range(3):
            wait_for("another timer tick", changed_from(read_at()), check=operator.check)
        assert await _config_version(pg_dsn, queue_name) == applied
        assert cr()["status"]["workers"]["autoscaling"] == "internal"
        assert "inconsistencies" not in operator.text()
    finally:
        operator.stop()


def test_chart_rbac_may_set_block_owner_deletion(crd_installed: Cluster, namespace: str) -> None:
    kube = crd_installed
    owner_obj = kube.request("POST", jq_path(namespace), judgequeue("owner", "owner"))
    kubeconfig = operator_identity(kube, namespace)
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    spec = parse_spec(owner_obj["spec"], name="owner")
    assert not isinstance(spec, list), spec
    owner = Owner(name="owner", namespace=namespace, uid=owner_obj["metadata"]["uid"])
    child = render_deployment(spec, owner, "worker", replicas=1)
    assert child.body["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
    created = kube.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", child.body, token=token)
    assert created["metadata"]["ownerReferences"][0]["uid"] == owner.uid


def test_scale_subresource_answers_before_anyone_scaled(crd_installed: Cluster, namespace: str) -> None:
    crd_installed.request("POST", jq_path(namespace), judgequeue("scaled", "scaled"))
    scale = crd_installed.request("GET", jq_path(namespace, "scaled", "scale"))
    assert scale["kind"] == "Scale" and isinstance(scale["spec"]["replicas"], int)
    # And an external scaler's write lands in spec.worker.replicas.
    crd_installed.request("PATCH", jq_path(namespace, "scaled", "scale"), {"spec": {"replicas": 3}},
                          content_type="application/merge-patch+json")
    assert crd_installed.request("GET", jq_path(namespace, "scaled"))["spec"]["worker"]["replicas"] == 3


def _claimed_minor() -> int:
    claim = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    match = re.fullmatch(r">=\s*1\.(\d+)\.0-0", claim)
    assert match, f"kubeVersion {claim!r} is not a plain lower bound"
    return int(match.group(1))


@pytest.mark.builds("control-plane", "oldest")
def test_oldest_claimed_release_accepts_crd_and_example(kube_oldest: Cluster) -> None:
    served = kube_oldest.request("GET", "/version")
    assert int(served["minor"]) == _claimed_minor(), (served, "the chart claims a release this tier does not check")
    result = kube_oldest.kubectl("apply", "-f", str(CRD_FILE), check=False)
    assert result.returncode == 0, result.stderr
    kube_oldest.wait_established("judgequeues.judgequeue.dev")
    result = kube_oldest.kubectl("apply", "-n", "default", "-f", str(EXAMPLE), check=False)
    assert result.returncode == 0, result.stderr
    # And the oldest server enforces the CEL rules too.
    bad = judgequeue("bad", "bad", worker={"minReplicas": 5, "maxReplicas": 2})
    with pytest.raises(ApiError, match=r"worker\.minReplicas must not exceed worker\.maxReplicas"):
        kube_oldest.request("POST", jq_path("default"), bad)


def test_operator_logs_json_and_posts_events_when_reconcile_fails(
    crd_installed: Cluster, namespace: str, pg_dsn: str, tmp_path: Path
) -> None:
    """An operator whose RBAC lacks Deployments says so in JSON logs and in an Event on the object."""
    kube = crd_installed
    connection_secrets(kube, namespace, dsn=pg_dsn, redis_url=REDIS_URL)
    name = "crippled"
    kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                 {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    rules = [r for r in render_rules(cluster=True) if "deployments" not in r["resources"]]
    kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name}, "rules": rules})
    kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    kubeconfig = kube.kubeconfig_for(kube.sa_token(namespace, name), f"{namespace}-{name}", namespace)
    kube.request("POST", jq_path(namespace), judgequeue("judge", "crippled"))
    operator = start_operator(kubeconfig, namespace, tmp_path / "operator.log", interval=0.5)
    try:
        def warning_events() -> list[dict[str, Any]]:
            events = kube.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
            return [e for e in events if e["involvedObject"].get("name") == "judge" and e.get("type") == "Warning"
                    and "forbidden" in e.get("message", "").lower()]

        events = wait_for("a Warning Event naming the refusal", warning_events, timeout=60, check=operator.check)
        assert events[0]["involvedObject"]["kind"] == "JudgeQueue"
        logged = wait_for("a JSON log line naming the refusal",
                          lambda: [e for e in operator.lines() if "forbidden" in str(e.get("msg", "")).lower()],
                          timeout=30, check=operator.check)
        assert logged[0]["level"] in ("WARNING", "ERROR") and "ts" in logged[0]
    finally:
        operator.stop()
