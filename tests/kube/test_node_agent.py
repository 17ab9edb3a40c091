"""The test node agent does what the kube tier relies on a kubelet for (tests of the test tool)."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

from tests.kube.cluster import Cluster
from tests.kube.node import NodeAgent
from tests.kube.tools import wait_for


def _pod(name: str, script: str, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox:test", "command": ["sh", "-c", script]}
    container.update(spec.pop("container", {}))
    body: dict[str, Any] = {"containers": [container], "automountServiceAccountToken": False}
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body}


def _ready(kube: Cluster, ns: str, name: str) -> bool:
    pod = kube.get(f"/api/v1/namespaces/{ns}/pods/{name}") or {}
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def test_env_from_secret_configmap_and_field_and_readiness(kube: Cluster, node: NodeAgent, namespace: str,
                                                           tmp_path: Path) -> None:
    ns, out = namespace, tmp_path / "env.txt"
    kube.request("POST", f"/api/v1/namespaces/{ns}/secrets", {"apiVersion": "v1", "kind": "Secret",
                 "metadata": {"name": "s"}, "data": {"k": base64.b64encode(b"from-secret").decode()}})
    kube.request("POST", f"/api/v1/namespaces/{ns}/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "c"}, "data": {"k": "from-configmap"}})
    ready_file = tmp_path / "ready"
    pod = _pod("env", f'echo "$A $B $C $D" > {out}; sleep 600', container={
        "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
                {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "D", "value": "plain"}],
        "readinessProbe": {"exec": {"command": ["test", "-f", str(ready_file)]}, "periodSeconds": 1,
                           "failureThreshold": 1}})
    kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    wait_for("the container wrote its environment", lambda: out.exists() and out.read_text().strip(), timeout=60)
    assert out.read_text().split() == ["from-secret", "from-configmap", "env", "plain"]
    # The container can write before the agent has posted the pod's status: wait for the phase.
    wait_for("the pod Running", lambda: kube.request("GET", f"/api/v1/namespaces/{ns}/pods/env")
             .get("status", {}).get("phase") == "Running", timeout=30)
    assert not _ready(kube, ns, "env")
    ready_file.touch()
    wait_for("Ready once the probe passes", lambda: _ready(kube, ns, "env"), timeout=30)


def test_deletion_sends_sigterm_then_sigkill_after_the_grace_period(kube: Cluster, node: NodeAgent,
                                                                    namespace: str, tmp_path: Path) -> None:
    ns = namespace
    polite, stubborn = tmp_path / "polite", tmp_path / "stubborn"
    kube.request("POST", f"/api/v1/namespaces/{ns}/pods", _pod(
        "polite", f"trap 'echo term > {polite}; exit 0' TERM; echo up > {polite}; while :; do sleep 0.1; done",
        terminationGracePeriodSeconds=30))
    kube.request("POST", f"/api/v1/namespaces/{ns}/pods", _pod(
        "stubborn", f"trap '' TERM; echo up > {stubborn}; while :; do sleep 0.1; done",
        terminationGracePeriodSeconds=2))
    for marker in (polite, stubborn):
        wait_for(f"{marker.name} running", lambda m=marker: m.exists(), timeout=60)  # type: ignore[misc]
    kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/polite")
    # Gone well within its 30 s grace period: it exited on SIGTERM.
    wait_for("polite pod gone", lambda: kube.get(f"/api/v1/namespaces/{ns}/pods/polite") is None, timeout=20)
    assert polite.read_text().strip() == "term"
    started = time.monotonic()
    kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/stubborn")
    wait_for("stubborn pod gone", lambda: kube.get(f"/api/v1/namespaces/{ns}/pods/stubborn") is None, timeout=30)
    assert time.monotonic() - started >= 2  # SIGTERM ignored: killed only once the grace period ran out
    assert not [r for r in node.running() if r.name in ("polite", "stubborn")]


def test_missing_secret_is_a_pod_state_not_an_agent_error(kube: Cluster, node: NodeAgent, namespace: str) -> None:
    """As a kubelet: a container whose Secret is missing waits in CreateContainerConfigError."""
    ns = namespace
    errors_before = len(node.errors)
    pod = _pod("nosecret", "sleep 600", container={
        "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}]})
    kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)

    def waiting_reason() -> str | None:
        found = kube.get(f"/api/v1/namespaces/{ns}/pods/nosecret") or {}
        statuses = found.get("status", {}).get("containerStatuses") or [{}]
        reason = (statuses[0].get("state") or {}).get("waiting", {}).get("reason")
        return None if reason is None else str(reason)

    assert wait_for("CreateContainerConfigError", waiting_reason, timeout=60) == "CreateContainerConfigError"
    # A few more rounds of the agent's loop (each reports status): still no error of its own.
    for _ in range(3):
        rounds = node.rounds
        wait_for("another agent round", lambda: node.rounds > rounds, timeout=10)  # noqa: B023
    assert node.errors[errors_before:] == []
