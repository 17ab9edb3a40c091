"""The workers' egress NetworkPolicy on the real control plane, reconciled by the operator with exactly
the chart's RBAC: the API server accepts what the operator renders (its validation of ports and
ipBlock CIDRs, which kmock does not do), the policy follows the spec, the operator deletes it when
the spec turns it off, and the garbage collector removes it with the JudgeQueue (owner reference).
Whether a CNI enforces it is the cluster's part: there is no CNI here (docs/judges.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.kube.cluster import Cluster
from tests.kube.tools import connection_secrets, jq_path, judgequeue, operator_identity, start_operator, wait_for
from tests.support.databases import REDIS_URL

DNS = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}


def test_the_egress_policy_follows_the_spec_and_goes_with_the_judgequeue(
    crd_installed: Cluster, namespace: str, pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    kube = crd_installed
    connection_secrets(kube, namespace, dsn=pg_dsn, redis_url=REDIS_URL)
    kubeconfig = operator_identity(kube, namespace)
    created = kube.request("POST", jq_path(namespace), judgequeue(
        "judge", queue_name, dispatcher={"replicas": 0}, reaper={"replicas": 0},
        worker={"minReplicas": 0, "maxReplicas": 1}))
    path = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/judge-worker-egress"
    operator = start_operator(kubeconfig, namespace, tmp_path / "operator.log", interval=0.5)
    try:
        policy: dict[str, Any] = wait_for("the egress policy", lambda: kube.get(path), timeout=60,
                                          check=operator.check)
        owner = policy["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"], o["uid"], o["controller"]) for o in owner] == [
            ("JudgeQueue", "judge", created["metadata"]["uid"], True)]
        assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"
        assert policy["spec"]["policyTypes"] == ["Egress"]
        assert policy["spec"]["egress"] == [
            DNS,
            {"ports": [{"protocol": "TCP", "port": 5432}]},
            {"ports": [{"protocol": "TCP", "port": 6379}, {"protocol": "TCP", "port": 26379}]},
        ]
        kube.request("PATCH", jq_path(namespace, "judge"), {"spec": {"worker": {"networkPolicy": {
            "postgres": {"cidr": "10.96.0.0/12"}, "redis": {"port": 6380, "sentinelPort": 0}}}}},
            content_type="application/merge-patch+json")
        narrowed = [
            DNS,
            {"ports": [{"protocol": "TCP", "port": 5432}], "to": [{"ipBlock": {"cidr": "10.96.0.0/12"}}]},
            {"ports": [{"protocol": "TCP", "port": 6380}]},
        ]
        wait_for("the narrowed policy", lambda: (kube.get(path) or {}).get("spec", {}).get("egress") == narrowed,
                 timeout=60, check=operator.check)
        # Turned off: the operator deletes it (its RBAC has delete); turned on: created again.
        kube.request("PATCH", jq_path(namespace, "judge"), {"spec": {"worker": {"networkPolicy": {"enabled": False}}}},
                     content_type="application/merge-patch+json")
        wait_for("the policy deleted by the operator", lambda: kube.get(path) is None, timeout=60,
                 check=operator.check)
        kube.request("PATCH", jq_path(namespace, "judge"), {"spec": {"worker": {"networkPolicy": {"enabled": True}}}},
                     content_type="application/merge-patch+json")
        again = wait_for("the policy created again", lambda: kube.get(path), timeout=60, check=operator.check)
        assert again["metadata"]["uid"] != policy["metadata"]["uid"] and again["spec"]["egress"] == narrowed
        # Deleting the JudgeQueue: the real garbage collector removes the policy it owns.
        kube.request("DELETE", jq_path(namespace, "judge"))
        wait_for("the policy removed with the JudgeQueue", lambda: kube.get(path) is None, timeout=90,
                 check=operator.check)
    finally:
        operator.stop()
