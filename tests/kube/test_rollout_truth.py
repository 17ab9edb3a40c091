"""A rollout that cannot finish is never Ready, on the real control plane with the chart's RBAC.

A Ready JudgeQueue of one worker gets a change whose new pods cannot run: an image that cannot be
pulled (the node agent, like a kubelet, cannot resolve a registry under ``.invalid``), or a judge the
image does not have (the new workers exit 2 refusing it). The Deployment controller keeps the old
worker serving (maxSurge 1, maxUnavailable 0: replicas 2, updated 1, available 1), so availability
alone looks fine. The JudgeQueue must say what is true:

- ``Degraded`` within 15 s of the change (``kubectl wait``), with the new pods' own words, whatever
  ``progressDeadline`` says (here the default, ten minutes), with the operator's default timer;
- ``Ready=False`` and ``Progressing=True`` with the old and new counts meanwhile;
- Ready again once the spec is fixed, with nothing left over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from judgequeue.controllers.state import OperatorConfig
from tests.kube import tools
from tests.kube.cluster import Cluster
from tests.kube.node import NodeAgent

DEGRADED_WITHIN = 15.0  # seconds from the change to Degraded, with the operator's default timer


@dataclass(frozen=True)
class Case:
    name: str
    change: dict[str, Any]
    fix: dict[str, Any]
    reason: str  # Degraded's
    ready_reason: str
    words: str  # a fragment of the new pods' own message


CASES = [
    Case("an image that cannot be pulled", {"image": "registry.invalid/judgequeue:missing"},
         {"image": "judgequeue:test"}, "ImagePullFailed", "PodsPending", "lookup registry.invalid: no such host"),
    Case("new workers refusing their judge", {"worker": {"judge": "gpu"}}, {"worker": {"judge": "sleep"}},
         "RoleMisconfigured", "ContainersFailing", "JUDGEQUEUE_JUDGE='gpu' is not an installed judge plugin"),
]


def _patch(kube: Cluster, namespace: str, spec: dict[str, Any]) -> None:
    kube.request("PATCH", tools.jq_path(namespace, "judge"), {"spec": spec},
                 content_type="application/merge-patch+json")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_rollout_that_cannot_finish_is_degraded_not_ready(
    crd_installed: Cluster, node: NodeAgent, namespace: str, pg_dsn: str, queue_name: str, tmp_path: Path,
    case: Case,
) -> None:
    kube = crd_installed
    operator = tools.operator_with_secrets(kube, namespace, tmp_path / "operator.log", dsn=pg_dsn,
                                           interval=OperatorConfig().interval)
    check: Callable[[], None] = operator.check
    try:
        kube.request("POST", tools.jq_path(namespace), tools.judgequeue(
            "judge", queue_name, dispatcher={"replicas": 0}, reaper={"replicas": 0},
            worker={"judge": "sleep", "minReplicas": 1, "maxReplicas": 1, "concurrency": 1}))
        met, _, out = tools.kubectl_wait(kube, namespace, "judge", "Ready", timeout=120)
        assert met, (out, operator.text()[-3000:])
        (old_pod,) = tools.ready_pods(kube, namespace, "worker")

        _patch(kube, namespace, case.change)
        met, took, out = tools.kubectl_wait(kube, namespace, "judge", "Degraded", timeout=DEGRADED_WITHIN)
        tools.record_figure(f"rollout_degraded_seconds[{case.name}]", round(took, 2))
        obj = kube.request("GET", tools.jq_path(namespace, "judge"))
        assert met, (out, obj.get("status"), operator.text()[-3000:])
        degraded = tools.condition(obj, "Degraded")
        assert degraded["reason"] == case.reason and case.words in degraded["message"], degraded
        ready, progressing = tools.condition(obj, "Ready"), tools.condition(obj, "Progressing")
        assert (ready["status"], ready["reason"]) == ("False", case.ready_reason), ready
        assert case.words in ready["message"], ready
        assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut"), progressing
        # Once the Deployment controller has seen the change (the first pass may precede it): the counts.
        counts_shown = "worker: 1 of 1 updated, 1 old still running, 1 of 1 available"
        tools.wait_for("Progressing with the old and new counts", lambda: counts_shown in tools.condition(
            kube.request("GET", tools.jq_path(namespace, "judge")), "Progressing").get("message", ""),
            timeout=15, check=check)
        # The world it describes: the old worker still serves, alone; the new one does not run.
        deployment = kube.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/judge-worker")
        counts = {k: deployment["status"].get(k) for k in ("replicas", "updatedReplicas", "availableReplicas")}
        assert counts == {"replicas": 2, "updatedReplicas": 1, "availableReplicas": 1}, deployment["status"]
        serving = tools.ready_pods(kube, namespace, "worker")
        assert [p["metadata"]["uid"] for p in serving] == [old_pod["metadata"]["uid"]]

        # Another pass of the timer changes nothing: still not Ready, still Degraded. (The backlog is
        # not read meanwhile, so no status field marks the tick: wait for one.)
        time.sleep(OperatorConfig().interval + 2)
        check()
        obj = kube.request("GET", tools.jq_path(namespace, "judge"))
        assert tools.condition(obj, "Ready")["status"] == "False" and tools.condition(obj, "Degraded")[
            "status"] == "True", obj["status"]["conditions"]

        _patch(kube, namespace, case.fix)
        met, _, out = tools.kubectl_wait(kube, namespace, "judge", "Ready", timeout=120)
        obj = kube.request("GET", tools.jq_path(namespace, "judge"))
        assert met, (out, obj.get("status"), operator.text()[-3000:])
        assert tools.condition(obj, "Degraded")["status"] == "False", obj["status"]["conditions"]
        assert tools.condition(obj, "Progressing")["reason"] == "Reconciled", obj["status"]["conditions"]
        deployment = kube.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/judge-worker")
        assert deployment["status"].get("replicas") == deployment["status"].get("updatedReplicas") == 1
    finally:
        operator.stop()
