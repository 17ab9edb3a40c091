"""``spec.worker.intake: auto`` on the real control plane: the operator picks the intake from the
worker fleet's upper bound (maxReplicas), renders it into the workers' and dispatchers' environment,
and says which and why in status (and ``kubectl get jq``'s Intake column), as the API server stores it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from judgequeue.core.config import DIRECT_INTAKE_MAX_WORKERS as N
from tests.kube import tools
from tests.kube.cluster import Cluster
from tests.support.databases import REDIS_URL


def test_auto_gives_a_large_fleet_stream_in_its_deployments_and_status(
    crd_installed: Cluster, namespace: str, pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    kube = crd_installed
    tools.connection_secrets(kube, namespace, dsn=pg_dsn, redis_url=REDIS_URL)
    operator = tools.start_operator(tools.operator_identity(kube, namespace), namespace, tmp_path / "operator.log")
    deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    path = tools.jq_path(namespace, "judge")

    def intakes() -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for role in ("dispatcher", "worker", "reaper"):
            found = kube.get(f"{deployments}/judge-{role}")
            env = found["spec"]["template"]["spec"]["containers"][0]["env"] if found else []
            out[role] = next((e["value"] for e in env if e["name"] == "JUDGEQUEUE_INTAKE"), None)
        return out

    def workers_status() -> dict[str, Any]:
        return dict((kube.request("GET", path).get("status") or {}).get("workers") or {})

    try:
        # No intake written: the CRD defaults it to auto; maxReplicas above the bound gives stream.
        kube.request("POST", tools.jq_path(namespace), tools.judgequeue(
            "judge", queue_name, worker={"judge": "sleep", "minReplicas": 1, "maxReplicas": N + 1}))
        assert kube.request("GET", path)["spec"]["worker"]["intake"] == "auto"
        tools.wait_for("stream in the dispatcher's and workers' environment",
                       lambda: intakes() == {"dispatcher": "stream", "worker": "stream", "reaper": None},
                       timeout=60, check=operator.check)
        tools.wait_for("stream in status", lambda: workers_status().get("intake") == "stream",
                       timeout=30, check=operator.check)
        assert workers_status()["intakeReason"] == f"auto: maxReplicas {N + 1} > {N}, stream"
        table = kube.kubectl("get", "jq", "judge", namespace=namespace).stdout.splitlines()
        start = table[0].index("INTAKE")  # columns are aligned; an empty one (AGREEMENT) leaves blanks
        assert table[1][start:].split()[0] == "stream", table

        # An explicit intake is kept whatever the fleet: both roles roll to it, status follows.
        kube.request("PATCH", path, {"spec": {"worker": {"intake": "direct"}}},
                     content_type="application/merge-patch+json")
        tools.wait_for("direct in the dispatcher's and workers' environment",
                       lambda: intakes() == {"dispatcher": "direct", "worker": "direct", "reaper": None},
                       timeout=30, check=operator.check)
        tools.wait_for("direct in status", lambda: workers_status().get("intakeReason")
                       == "direct: set in spec.worker.intake", timeout=30, check=operator.check)
        assert workers_status()["intake"] == "direct"
    finally:
        operator.stop()
