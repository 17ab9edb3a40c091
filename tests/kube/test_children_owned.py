"""The operator owns its children whole, on the real control plane with the chart's RBAC.

Fields someone adds to a child that weaken the workers' isolation (capabilities, ``hostNetwork``,
a ``nodeSelector``, an egress NetworkPolicy whose selector matches no pod, which turns the policy
off) are removed on the operator's next pass, with a Warning Event naming each; and every action
is one JSON line at INFO (with the diff at DEBUG, the level this operator runs at).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.kube import tools
from tests.kube.cluster import ApiError, Cluster


def _edit(kube: Cluster, path: str, change: Callable[[dict[str, Any]], None]) -> None:
    """What ``kubectl edit`` does: read, change, write the whole object back (as the admin)."""
    obj = kube.request("GET", path)
    change(obj)
    kube.request("PUT", path, obj)


def test_fields_added_to_children_are_removed_and_named(
    crd_installed: Cluster, namespace: str, pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    kube = crd_installed
    operator = tools.operator_with_secrets(kube, namespace, tmp_path / "operator.log", dsn=pg_dsn,
                                           extra_env={"JUDGEQUEUE_LOG_LEVEL": "DEBUG"})
    deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    policy = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/judge-worker-egress"
    try:
        kube.request("POST", tools.jq_path(namespace), tools.judgequeue(
            "judge", queue_name, worker={"judge": "program", "minReplicas": 1, "maxReplicas": 1}))
        tools.wait_for("every child", lambda: all(kube.get(p) for p in (
            f"{deployments}/judge-dispatcher", f"{deployments}/judge-worker", f"{deployments}/judge-reaper", policy)),
            timeout=60, check=operator.check)
        tools.wait_ticks(kube, namespace, "judge", 1, check=operator.check)
        rendered = {name: copy.deepcopy(kube.request("GET", f"{deployments}/judge-{name}")["spec"]["template"])
                    for name in ("dispatcher", "worker", "reaper")}
        rendered_policy = kube.request("GET", policy)["spec"]

        def add_capabilities(obj: dict[str, Any]) -> None:
            caps = obj["spec"]["template"]["spec"]["containers"][0]["securityContext"].setdefault("capabilities", {})
            caps["add"] = [*caps.get("add", []), "NET_ADMIN", "SYS_ADMIN"]

        _edit(kube, f"{deployments}/judge-worker", add_capabilities)
        _edit(kube, f"{deployments}/judge-dispatcher",
              lambda obj: obj["spec"]["template"]["spec"].update(hostNetwork=True))
        _edit(kube, f"{deployments}/judge-reaper",
              lambda obj: obj["spec"]["template"]["spec"].update(nodeSelector={"disk": "ssd"}))
        _edit(kube, policy, lambda obj: obj["spec"].update(podSelector={"matchLabels": {"matches": "nothing"}}))

        def template(name: str) -> dict[str, Any]:
            return dict(kube.request("GET", f"{deployments}/judge-{name}")["spec"]["template"])

        for name in ("worker", "dispatcher", "reaper"):
            tools.wait_for(f"the {name} Deployment as rendered", lambda n=name: template(n) == rendered[n],  # type: ignore[misc]
                           timeout=15, check=operator.check)
        tools.wait_for("the egress policy as rendered", lambda: kube.request("GET", policy)["spec"] == rendered_policy,
                       timeout=15, check=operator.check)
        worker_caps = template("worker")["spec"]["containers"][0]["securityContext"].get("capabilities", {})
        assert not {"NET_ADMIN", "SYS_ADMIN"} & set(worker_caps.get("add", []))

        def named() -> str:
            return " | ".join(e["message"] for e in tools.warning_events(kube, namespace, "judge", "DriftReverted"))

        fragments = ("Deployment judge-worker", "capabilities.add", "NET_ADMIN",
                     "Deployment judge-dispatcher", "spec.template.spec.hostNetwork=true (not in the spec)",
                     "Deployment judge-reaper", "spec.template.spec.nodeSelector", "NetworkPolicy judge-worker-egress",
                     "spec.podSelector.matchLabels")
        tools.wait_for("Warning Events naming every reverted field", lambda: all(f in named() for f in fragments),
                       timeout=30, check=operator.check)
        # The log: one INFO line per action, with the object and why; DEBUG (this operator) adds the diff.
        lines = operator.lines()
        created = {e["object"] for e in tools.actions(lines, "create")}
        assert created == {"Deployment judge-dispatcher", "Deployment judge-worker", "Deployment judge-reaper",
                           "Service judge-metrics", "NetworkPolicy judge-worker-egress"}, created
        replaced = {e["object"]: e for e in tools.actions(lines, "replace")
                    if e["reason"].startswith("changed outside the spec")}
        assert set(replaced) == {"Deployment judge-dispatcher", "Deployment judge-worker", "Deployment judge-reaper",
                                 "NetworkPolicy judge-worker-egress"}, replaced
        hostnet = replaced["Deployment judge-dispatcher"]
        assert hostnet["level"] == "INFO" and hostnet["judgequeue"] == f"{namespace}/judge"
        assert "spec.template.spec.hostNetwork" in hostnet["reason"]
        assert any("hostNetwork=true" in d for d in hostnet["diff"])
        # The queue was created by the claim with the spec's flags: nothing else was written to it.
        assert [e["object"] for e in tools.actions(lines, "claim")] == [f"queue {queue_name}"]
        assert tools.actions(lines, "cutover") == []
    finally:
        operator.stop()


def _replace_force(kube: Cluster, namespace: str, kind: str, name: str,
                   change: Callable[[dict[str, Any]], None]) -> str:
    """``kubectl get -o json``, changed, then ``kubectl replace --force``: the object is deleted and
    created again under its name (a new uid, generation 1 again); returns the new uid.

    The operator watches its Deployments and may recreate a deleted one (as rendered) before
    kubectl's create (which then fails: AlreadyExists). Then the changed object is created the way
    kubectl does it, a delete and a create, back to back through the API, until it lands."""
    obj = json.loads(kube.kubectl("get", "-n", namespace, kind, name, "-o", "json").stdout)
    old_uid = obj["metadata"]["uid"]
    change(obj)
    result = kube.kubectl("replace", "--force", "-f", "-", input=json.dumps(obj), check=False)
    if result.returncode != 0:
        assert "AlreadyExists" in result.stderr, result.stderr
        path = {"deployment": f"/apis/apps/v1/namespaces/{namespace}/deployments",
                "networkpolicy": f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"}[kind]
        body = {k: v for k, v in obj.items() if k != "status"}
        body["metadata"] = {k: v for k, v in obj["metadata"].items()
                            if k not in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")}

        def recreated() -> bool:
            kube.request("DELETE", f"{path}/{name}")
            try:
                kube.request("POST", path, body)
            except ApiError as exc:
                if exc.status == 409:
                    return False  # the operator was first again
                raise
            return True

        tools.wait_for(f"{kind} {name} recreated with the change", recreated, timeout=30)
    new = json.loads(kube.kubectl("get", "-n", namespace, kind, name, "-o", "json").stdout)
    assert new["metadata"]["uid"] != old_uid, "kubectl replace --force makes a new object"
    return str(new["metadata"]["uid"])


def test_a_child_recreated_by_hand_is_compared_whole_at_once(
    crd_installed: Cluster, namespace: str, pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    """A child deleted and created again with ``kubectl replace --force`` (same name, labels and owner
    reference, a new uid) starts at generation 1 again, as the original did: it is still compared in
    full on the next pass, and what it added is removed."""
    kube = crd_installed
    operator = tools.operator_with_secrets(kube, namespace, tmp_path / "operator.log", dsn=pg_dsn)
    deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    policy = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/judge-worker-egress"
    try:
        kube.request("POST", tools.jq_path(namespace), tools.judgequeue(
            "judge", queue_name, reaper={"replicas": 0},
            worker={"judge": "program", "minReplicas": 1, "maxReplicas": 1}))
        tools.wait_for("every child", lambda: all(kube.get(p) for p in (f"{deployments}/judge-dispatcher", policy)),
                       timeout=60, check=operator.check)
        tools.wait_ticks(kube, namespace, "judge", 2, check=operator.check)  # verified, and found equal again
        rendered_policy = kube.request("GET", policy)["spec"]
        assert kube.request("GET", f"{deployments}/judge-dispatcher")["metadata"]["generation"] == 1

        _replace_force(kube, namespace, "deployment", "judge-dispatcher",
                       lambda obj: obj["spec"]["template"]["spec"].update(hostNetwork=True))
        _replace_force(kube, namespace, "networkpolicy", "judge-worker-egress",
                       lambda obj: obj["spec"].update(egress=[{}]))

        def host_network() -> Any:
            return kube.request("GET", f"{deployments}/judge-dispatcher")["spec"]["template"]["spec"].get(
                "hostNetwork")

        tools.wait_for("hostNetwork removed", lambda: not host_network(), timeout=15, check=operator.check)
        tools.wait_for("the egress policy as rendered", lambda: kube.request("GET", policy)["spec"] == rendered_policy,
                       timeout=15, check=operator.check)

        def named() -> str:
            return " | ".join(e["message"] for e in tools.warning_events(kube, namespace, "judge", "DriftReverted"))

        tools.wait_for("Warning Events naming both", lambda: all(f in named() for f in (
            "spec.template.spec.hostNetwork=true (not in the spec)", "NetworkPolicy judge-worker-egress")),
            timeout=15, check=operator.check)
    finally:
        operator.stop()
