"""An uninstalled judge plugin, named in the JudgeQueue's status on the real control plane.

The worker pod (run by the node agent, which keeps the kubelet's FallbackToLogsOnError rule) exits 2
with one line; the operator, with exactly the chart's RBAC, reads the pod's last termination message
and quotes it in ``Ready`` and ``Degraded``, instead of only "worker 0/1". Installing the right judge
(here: switching back to an installed one) clears it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.kube import tools
from tests.kube.cluster import Cluster
from tests.kube.node import NodeAgent
from tests.support.databases import REDIS_URL

NOT_INSTALLED = "JUDGEQUEUE_JUDGE='gpu' is not an installed judge plugin"


def test_an_uninstalled_judge_plugin_is_named_in_status(
    crd_installed: Cluster, node: NodeAgent, namespace: str, pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    kube = crd_installed
    tools.connection_secrets(kube, namespace, dsn=pg_dsn, redis_url=REDIS_URL)
    kubeconfig = tools.operator_identity(kube, namespace)
    kube.request("POST", tools.jq_path(namespace), tools.judgequeue(
        "judge", queue_name, dispatcher={"replicas": 0}, reaper={"replicas": 0},
        worker={"judge": "gpu", "minReplicas": 1, "maxReplicas": 1}))
    operator = tools.start_operator(kubeconfig, namespace, tmp_path / "operator.log", interval=0.5)
    try:
        def cr() -> dict[str, Any]:
            return dict(kube.request("GET", tools.jq_path(namespace, "judge")))

        def worker_pods() -> list[dict[str, Any]]:
            return list(kube.request("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector="
                                     "app.kubernetes.io/component%3Dworker")["items"])

        def pod_message() -> str:
            for pod in worker_pods():
                for status in pod.get("status", {}).get("containerStatuses") or []:
                    message = ((status.get("lastState") or {}).get("terminated") or {}).get("message", "")
                    if NOT_INSTALLED in message:
                        return str(message)
            return ""

        # What a kubelet reports (the agent's part): the exit and the log line, on the pod.
        assert "judgequeue: error:" in tools.wait_for("the worker pod's termination message", pod_message,
                                                timeout=90, check=operator.check)
        # What the operator makes of it, with the chart's RBAC.
        ready = tools.wait_for("Ready naming the plugin",
                         lambda: (c := tools.condition(cr(), "Ready")) and NOT_INSTALLED in c.get("message", "") and c,
                         timeout=60, check=operator.check)
        assert ready["status"] == "False" and ready["reason"] == "ContainersFailing"
        assert ready["message"].startswith("available replicas: worker 0/1; worker pod judge-worker-")
        degraded = tools.condition(cr(), "Degraded")
        assert degraded["status"] == "True" and degraded["reason"] == "RoleMisconfigured", degraded
        assert NOT_INSTALLED in degraded["message"]
        # Fixed spec: the new workers run, and the message goes with the failing pods.
        kube.request("PATCH", tools.jq_path(namespace, "judge"), {"spec": {"worker": {"judge": "sleep"}}},
                     content_type="application/merge-patch+json")
        tools.wait_for("Degraded cleared", lambda: tools.condition(cr(), "Degraded").get("status") == "False",
                 timeout=90, check=operator.check)
        assert NOT_INSTALLED not in tools.condition(cr(), "Ready").get("message", "")
    finally:
        operator.stop()
