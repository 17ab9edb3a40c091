"""A child changed behind the operator's back is seen at once, on the real control plane with the
chart's RBAC and pods run by the node agent.

A Ready JudgeQueue whose worker Deployment is recreated by hand (``kubectl replace --force``, with a
``nodeSelector`` no node has: its new pods cannot be scheduled) has children that no longer match
the claim. Sampled every 0.25 s, ``Ready=True`` never disagrees with the children for more than
2 s, with the operator's default timer (10 s): only a pass made when the child changes can keep
that, and the drift is then reverted and the JudgeQueue Ready again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from judgequeue.controllers.state import OperatorConfig
from tests.kube import tools
from tests.kube.cluster import Cluster
from tests.kube.node import NodeAgent
from tests.kube.test_status_schedule import BOUND, NAME, Sampler

WATCHED_FOR = 15.0  # seconds the claims are sampled after the change (the timer's interval and more)


def test_a_worker_deployment_recreated_by_hand_is_not_claimed_ready_for_more_than_2s(
    crd_installed: Cluster, node: NodeAgent, namespace: str, pg_dsn: str, queue_name: str, tmp_path: Path,
) -> None:
    kube = crd_installed
    operator = tools.operator_with_secrets(kube, namespace, tmp_path / "operator.log", dsn=pg_dsn,
                                           interval=OperatorConfig().interval)
    sampler: Sampler | None = None
    try:
        kube.request("POST", tools.jq_path(namespace), tools.judgequeue(
            NAME, queue_name, dispatcher={"replicas": 0}, reaper={"replicas": 0},
            worker={"judge": "sleep", "minReplicas": 1, "maxReplicas": 1, "concurrency": 1}))
        met, _, out = tools.kubectl_wait(kube, namespace, NAME, "Ready", timeout=120)
        assert met, (out, operator.text()[-3000:])
        tools.wait_ticks(kube, namespace, NAME, 1, check=operator.check)  # settled: the timer has run

        sampler = Sampler(kube, namespace, pg_dsn, queue_name, time.monotonic())
        sampler.start()
        obj = json.loads(kube.kubectl("get", "-n", namespace, "deployment", f"{NAME}-worker", "-o", "json").stdout)
        obj["spec"]["template"]["spec"]["nodeSelector"] = {"disk": "ssd"}
        # Deleted, then created again: the operator may recreate it first (then kubectl's create fails).
        replaced = kube.kubectl("replace", "--force", "-f", "-", input=json.dumps(obj), check=False)
        window_ends = sampler.started + WATCHED_FOR  # an observation window, not a wait for anything
        tools.wait_for("the end of the sampling window", lambda: time.monotonic() > window_ends,
                       timeout=WATCHED_FOR + 5, check=operator.check)
        sampler.halt.set()
        sampler.join(timeout=30)
        episodes = [f"{e.claim} {e.first:.2f}-{e.last:.2f}s: {e.why}" for e in sampler.episodes]
        assert not [e for e in sampler.episodes if e.seen_for > BOUND], (replaced.stderr, episodes)
        met, _, out = tools.kubectl_wait(kube, namespace, NAME, "Ready", timeout=120)
        assert met, (out, operator.text()[-3000:])
        template = kube.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/{NAME}-worker")["spec"][
            "template"]
        assert "nodeSelector" not in template["spec"], template
    finally:
        if sampler is not None:
            sampler.halt.set()
            sampler.join(timeout=30)
        operator.stop()
