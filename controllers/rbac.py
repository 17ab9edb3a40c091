"""The Kubernetes permissions the operator needs, listed once (the Helm chart renders them from here).

``RULES`` is the single source; :func:`render_rules` gives the ``rules`` of a Role or ClusterRole and
:func:`render_role` a whole object. Cluster-wide operators also need to list namespaces (Kopf's
namespace scanning) and to manage CRDs' discovery, which :data:`CLUSTER_RULES` adds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Rule:
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str


RULES: tuple[Rule, ...] = (
    Rule(("judgequeue.dev",), ("judgequeues",), ("get", "list", "watch", "patch"),
         "watch JudgeQueues; Kopf's finalizer/progress annotations"),
    Rule(("judgequeue.dev",), ("judgequeues/status",), ("get", "patch", "update"), "report status and conditions"),
    Rule(("judgequeue.dev",), ("judgequeues/finalizers",), ("update",),
         "children's owner references set blockOwnerDeletion, which admission (OwnerReferencesPermissionEnforcement, "
         "on in OpenShift) allows only to who may update the owner's finalizers"),
    Rule(("apps",), ("deployments",), ("get", "list", "watch", "create", "patch", "update", "delete"),
         "dispatcher, worker and reaper Deployments"),
    Rule(("",), ("services",), ("get", "list", "watch", "create", "patch", "update", "delete"), "metrics Service"),
    Rule(("networking.k8s.io",), ("networkpolicies",), ("get", "list", "watch", "create", "patch", "update", "delete"),
         "program-judge workers' egress NetworkPolicy (deleted when the spec turns it off)"),
    Rule(("",), ("pods",), ("get", "list"),
         "read a failing role's pods' last termination message (an uninstalled judge plugin) into status"),
    Rule(("",), ("secrets",), ("get",), "read the Postgres/Redis connections: cutover flags and backlog"),
    Rule(("", "events.k8s.io"), ("events",), ("create", "patch"), "Kubernetes Events (scaling, cutover)"),
    Rule(("kopf.dev",), ("kopfpeerings",), ("get", "list", "watch", "patch"),
         "Kopf peering between operator replicas (namespaced)"),
)

CLUSTER_RULES: tuple[Rule, ...] = (
    Rule(("",), ("namespaces",), ("get", "list", "watch"), "Kopf: find namespaces to serve"),
    Rule(("apiextensions.k8s.io",), ("customresourcedefinitions",), ("get", "list", "watch"),
         "Kopf: resource discovery"),
    Rule(("kopf.dev",), ("clusterkopfpeerings",), ("get", "list", "watch", "patch"),
         "Kopf peering for a cluster-wide operator"),
)


def render_rules(*, cluster: bool) -> list[dict[str, Any]]:
    """The ``rules`` list of a (Cluster)Role: namespaced rules, plus cluster-only ones if ``cluster``."""
    rules = RULES + (CLUSTER_RULES if cluster else ())
    return [
        {"apiGroups": list(r.api_groups), "resources": list(r.resources), "verbs": list(r.verbs)} for r in rules
    ]


def render_role(name: str, *, kind: Literal["Role", "ClusterRole"], namespace: str | None = None) -> dict[str, Any]:
    """A whole Role (namespaced operator) or ClusterRole (cluster-wide operator) object."""
    metadata: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/name": "judgequeue-operator"}}
    if kind == "Role":
        if namespace is None:
            raise ValueError("a Role needs a namespace")
        metadata["namespace"] = namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": metadata,
        "rules": render_rules(cluster=kind == "ClusterRole"),
    }
