"""Status never lies: a property over a catalogue of injected failures, on the real control plane.

For every failure in :data:`CATALOGUE` (a child the API server refuses, pods admission refuses (a
PodSecurity level, a LimitRange, a PriorityClass nobody created), a rollout past its deadline, a bad
connection string, a missing Secret, a role refusing its configuration, the database out of reach),
with the operator running as the chart's ServiceAccount:

- ``kubectl wait --for=condition=Degraded`` returns within 15 s of the failure, and the condition's
  reason is the case's and its message quotes the cause's own words (the API server's, the
  Deployment controller's, the role's);
- the failure is a Warning Event on the JudgeQueue with the same reason (``kubectl describe jq``);
- once the failure is fixed, ``kubectl wait --for=condition=Ready`` returns, and Degraded is False
  (and what the fix brought holds: the worker pods' priority from the class named), and the recovery
  is a Normal Event of each condition that moved back (Ready, Degraded).

The pods run on the node agent (tests/kube/node.py), so Ready means the roles really run.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.kube import tools
from tests.kube.cluster import ApiError, Cluster
from tests.kube.node import NodeAgent
from tests.support.databases import REDIS_URL

DEGRADED_WITHIN = 15.0  # seconds, the property's bound (the operator's timer runs every second here)


@dataclass
class Ctx:
    kube: Cluster
    namespace: str
    dsn: str
    queue: str
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def patch_jq(self, spec: dict[str, Any]) -> None:
        self.kube.request("PATCH", tools.jq_path(self.namespace, "judge"), {"spec": spec},
                          content_type="application/merge-patch+json")

    def put_secret(self, name: str, key: str, value: str) -> None:
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                "data": {key: base64.b64encode(value.encode()).decode()}}
        path = f"/api/v1/namespaces/{self.namespace}/secrets"
        try:
            self.kube.request("POST", path, body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            self.kube.request("PUT", f"{path}/{name}", body)

    def create(self, path: str, body: dict[str, Any]) -> None:
        self.kube.request("POST", path, body)

    def delete(self, path: str) -> None:
        try:
            self.kube.request("DELETE", path)
        except ApiError as exc:
            if exc.status != 404:
                raise


@dataclass(frozen=True)
class Case:
    name: str
    reason: str
    message: str  # a fragment of the cause's own message
    fix: Callable[[Ctx], None]
    prepare: Callable[[Ctx], None] = lambda ctx: None
    spec: dict[str, Any] = field(default_factory=dict)
    ready_reason: str | None = None  # what Ready says meanwhile, when the case pins it
    check: Callable[[Ctx], None] = lambda ctx: None  # once Ready: what the fix must have brought


def _quota(ctx: Ctx) -> None:
    ctx.create(f"/api/v1/namespaces/{ctx.namespace}/resourcequotas", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "two-deployments"},
        "spec": {"hard": {"count/deployments.apps": "2"}}})


def _policy_name(ctx: Ctx) -> str:
    return f"{ctx.namespace}-no-dispatchers"


def _policy(ctx: Ctx) -> None:
    """A ValidatingAdmissionPolicy that refuses dispatcher Deployments in this namespace (what a
    cluster's own guard rails do), active once a server-side dry run is refused."""
    name = _policy_name(ctx)
    ctx.create("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                                                         "operations": ["CREATE", "UPDATE"],
                                                         "resources": ["deployments"]}]},
                 "validations": [{"expression": "!object.metadata.name.endsWith('-dispatcher')",
                                  "message": "dispatchers are not allowed in this namespace"}]}})
    ctx.create("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": ctx.namespace}}}}})
    ctx.cleanup.append(lambda: ctx.delete(f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}"))
    probe = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "probe-dispatcher"},
             "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                 "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}

    def refused() -> bool:
        try:
            ctx.kube.request("POST", f"/apis/apps/v1/namespaces/{ctx.namespace}/deployments?dryRun=All", probe)
        except ApiError as exc:
            return "dispatchers are not allowed" in exc.message
        return False

    tools.wait_for("the admission policy in force", refused, timeout=30)


def _unbind(ctx: Ctx) -> None:
    ctx.delete(f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{_policy_name(ctx)}")


def _restricted(ctx: Ctx) -> None:
    ctx.kube.request("PATCH", f"/api/v1/namespaces/{ctx.namespace}",
                     {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
                     content_type="application/merge-patch+json")


def _limit_range(ctx: Ctx) -> None:
    ctx.create(f"/api/v1/namespaces/{ctx.namespace}/limitranges", {
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "small"},
        "spec": {"limits": [{"type": "Container", "default": {"memory": "256Mi"}}]}})


def _priority_class(ctx: Ctx) -> str:
    return f"{ctx.namespace}-judges"


def _create_priority_class(ctx: Ctx) -> None:
    """A PriorityClass (cluster-wide) for this case's worker pods; the case names another at first."""
    name = _priority_class(ctx)
    ctx.create("/apis/scheduling.k8s.io/v1/priorityclasses", {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
        "value": 100000, "description": "judgequeue test: contest judges first"})
    ctx.cleanup.append(lambda: ctx.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}"))


def _workers_have_the_priority(ctx: Ctx) -> None:
    """The API server's Priority admission gave the worker pods the class's value, not just its name."""
    pods = tools.ready_pods(ctx.kube, ctx.namespace, "worker")
    assert pods, "a Ready JudgeQueue has a ready worker pod"
    assert {(p["spec"].get("priorityClassName"), p["spec"].get("priority")) for p in pods} == {
        (_priority_class(ctx), 100000)}, [p["spec"].get("priority") for p in pods]


CATALOGUE: list[Case] = [
    Case("a child refused by a quota", "ChildRefused", "exceeded quota", prepare=_quota,
         fix=lambda ctx: ctx.delete(f"/api/v1/namespaces/{ctx.namespace}/resourcequotas/two-deployments")),
    Case("a child refused by an admission policy", "ChildRefused", "dispatchers are not allowed in this namespace",
         prepare=_policy, fix=_unbind),
    Case("worker pods refused by PodSecurity", "PodsRefused", "violates PodSecurity", prepare=_restricted,
         spec={"worker": {"judge": "program", "sandbox": "isolated"}}, ready_reason="PodsRefused",
         fix=lambda ctx: ctx.patch_jq({"worker": {"sandbox": "trusted"}})),
    Case("a memory limit below the request (a namespace's default limit)", "PodsRefused",
         "must be less than or equal to memory limit of 256Mi", prepare=_limit_range,
         spec={"worker": {"resources": {"requests": {"memory": "512Mi"}}}}, ready_reason="PodsRefused",
         fix=lambda ctx: ctx.patch_jq({"worker": {"resources": {"limits": {"memory": "1Gi"}}}})),
    Case("worker pods naming a PriorityClass that does not exist", "PodsRefused",
         "no PriorityClass with name contest-judges was found", prepare=_create_priority_class,
         spec={"worker": {"priorityClassName": "contest-judges"}}, ready_reason="PodsRefused",
         fix=lambda ctx: ctx.patch_jq({"worker": {"priorityClassName": _priority_class(ctx)}}),
         check=_workers_have_the_priority),
    Case("a rollout past its progress deadline", "RolloutStuck", "has timed out progressing",
         spec={"progressDeadline": "3s", "worker": {"resources": {"requests": {"memory": "300Gi"}}}},
         fix=lambda ctx: ctx.patch_jq({"progressDeadline": "2m",
                                       "worker": {"resources": {"requests": {"memory": "256Mi"}}}})),
    Case("a Redis URL with a bad port", "InvalidConnection", "bad port 'notaport'",
         prepare=lambda ctx: ctx.put_secret("judgequeue-redis", "url", "redis://127.0.0.1:notaport/0"),
         fix=lambda ctx: ctx.put_secret("judgequeue-redis", "url", REDIS_URL)),
    Case("a missing Secret", "SecretNotFound", "judgequeue-redis-later not found",
         spec={"redis": {"secretKeyRef": {"name": "judgequeue-redis-later", "key": "url"}}},
         fix=lambda ctx: ctx.put_secret("judgequeue-redis-later", "url", REDIS_URL)),
    Case("an unknown judge", "RoleMisconfigured", "JUDGEQUEUE_JUDGE='gpu' is not an installed judge plugin",
         spec={"worker": {"judge": "gpu"}}, ready_reason="ContainersFailing",
         fix=lambda ctx: ctx.patch_jq({"worker": {"judge": "sleep"}})),
    Case("the database out of reach", "DatabaseUnavailable", "Connect call failed",
         prepare=lambda ctx: ctx.put_secret("judgequeue-postgres", "dsn", "postgresql://postgres@127.0.0.1:1/none"),
         fix=lambda ctx: ctx.put_secret("judgequeue-postgres", "dsn", ctx.dsn)),
]


@pytest.mark.parametrize("case", CATALOGUE, ids=[c.name for c in CATALOGUE])
def test_every_failure_is_degraded_with_its_cause_then_ready_once_fixed(
    crd_installed: Cluster, node: NodeAgent, namespace: str, pg_dsn: str, queue_name: str, tmp_path: Path,
    case: Case,
) -> None:
    kube = crd_installed
    ctx = Ctx(kube, namespace, pg_dsn, queue_name)
    operator = tools.operator_with_secrets(kube, namespace, tmp_path / "operator.log", dsn=pg_dsn, interval=1.0)
    try:
        case.prepare(ctx)
        spec: dict[str, Any] = {"dispatcher": {"replicas": 0}, "reaper": {"replicas": 0},
                                "worker": {"judge": "sleep", "minReplicas": 1, "maxReplicas": 1, "concurrency": 1}}
        for key, value in case.spec.items():
            spec[key] = {**spec[key], **value} if isinstance(value, dict) and key in spec else value
        kube.request("POST", tools.jq_path(namespace), tools.judgequeue("judge", queue_name, **spec))
        met, took, out = tools.kubectl_wait(kube, namespace, "judge", "Degraded", timeout=DEGRADED_WITHIN)
        tools.record_figure(f"degraded_seconds[{case.name}]", round(took, 2))
        obj = kube.request("GET", tools.jq_path(namespace, "judge"))
        degraded = tools.condition(obj, "Degraded")
        assert met, (case.name, out, obj.get("status"), operator.text()[-3000:])
        assert degraded["reason"] == case.reason, (case.name, degraded)
        assert case.message in degraded["message"], (case.name, degraded)
        if case.ready_reason is not None:
            ready = tools.condition(obj, "Ready")
            assert (ready["status"], ready["reason"]) == ("False", case.ready_reason), ready
            assert case.message in ready["message"], ready
        warnings = tools.wait_for(f"a Warning Event {case.reason}", lambda: tools.warning_events(
            kube, namespace, "judge", case.reason), timeout=10, check=operator.check)
        assert any(case.message in e["message"] for e in warnings), (case.name, warnings)

        def normal(reason: str) -> int:
            return sum(1 for e in tools.events(kube, namespace, "judge") if (e["type"], e["reason"]) == (
                "Normal", reason))

        before = {reason: normal(reason) for reason in ("AllReplicasAvailable", "Reconciled")}
        case.fix(ctx)
        met, took, out = tools.kubectl_wait(kube, namespace, "judge", "Ready", timeout=120)
        obj = kube.request("GET", tools.jq_path(namespace, "judge"))
        assert met, (case.name, out, obj.get("status"), operator.text()[-3000:])
        assert tools.condition(obj, "Degraded")["status"] == "False", obj["status"]
        case.check(ctx)
        for recovered, reason in (("Ready", "AllReplicasAvailable"), ("Degraded", "Reconciled")):
            assert tools.condition(obj, recovered)["reason"] == reason
            tools.wait_for(f"a new Normal Event {reason} ({recovered})",
                           lambda r=reason: normal(r) > before[r],  # type: ignore[misc]
                           timeout=10, check=operator.check)
        tools.record_figure(f"ready_after_fix_seconds[{case.name}]", round(took, 2))
    finally:
        operator.stop()
        for undo in ctx.cleanup:
            undo()

