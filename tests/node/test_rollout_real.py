"""A rollout that cannot finish is never Ready, with a real kubelet and containerd.

The operator runs as the chart installs it (README's ``helm install``, its default ten-second
timer). A Ready JudgeQueue of one worker gets an image no registry serves (the kubelet's own
``ErrImagePull``: the node has no network, and ``.invalid`` no resolver), then a judge its image
does not have (the new worker exits 2). The Deployment keeps the old worker serving; the JudgeQueue
must be Degraded within 15 s with the kubelet's or the role's own words, not Ready, Progressing with
the old and new counts, and Ready again once the spec is fixed.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from tests.kube.tools import condition, jq_path, kubectl_wait, ready_pods, wait_for
from tests.node.conftest import NodeCluster
from tests.node.test_worker_privileges import _secrets

DEGRADED_WITHIN = 15.0


@pytest.mark.usefixtures("helm_installed")
@pytest.mark.parametrize(("change", "fix", "reason", "words"), [
    ({"image": "registry.invalid/judgequeue:missing"}, None, "ImagePullFailed", "registry.invalid"),
    ({"worker": {"judge": "gpu"}}, {"worker": {"judge": "sleep"}}, "RoleMisconfigured",
     "JUDGEQUEUE_JUDGE='gpu' is not an installed judge plugin"),
], ids=["an image that cannot be pulled", "new workers refusing their judge"])
def test_a_rollout_that_cannot_finish_is_degraded_not_ready(
    node_cluster: NodeCluster, change: dict[str, Any], fix: dict[str, Any] | None, reason: str, words: str,
) -> None:
    kube = node_cluster.kube
    namespace = f"rollout-{uuid.uuid4().hex[:6]}"
    kube.create_namespace(namespace)
    try:
        kube.apply(_secrets(node_cluster, namespace), namespace=namespace)
        kube.apply({"apiVersion": "judgequeue.dev/v1alpha1", "kind": "JudgeQueue", "metadata": {"name": "judge"},
                    "spec": {"image": node_cluster.image, "queue": f"rollout-{uuid.uuid4().hex[:6]}",
                             "postgres": {"secretKeyRef": {"name": "judgequeue-postgres", "key": "dsn"}},
                             "redis": {"secretKeyRef": {"name": "judgequeue-redis", "key": "url"}},
                             "dispatcher": {"replicas": 0}, "reaper": {"replicas": 0},
                             "worker": {"judge": "sleep", "minReplicas": 1, "maxReplicas": 1, "concurrency": 1}}},
                   namespace=namespace)
        met, _, out = kubectl_wait(kube, namespace, "judge", "Ready", timeout=180)
        assert met, (out, kube.request("GET", jq_path(namespace, "judge")).get("status"))
        (old_pod,) = ready_pods(kube, namespace, "worker")

        def patch(spec: dict[str, Any]) -> None:
            kube.request("PATCH", jq_path(namespace, "judge"), {"spec": spec},
                         content_type="application/merge-patch+json")

        patch(change)
        met, took, out = kubectl_wait(kube, namespace, "judge", "Degraded", timeout=DEGRADED_WITHIN)
        print(f"\n[node tier] {reason}: Degraded {took:.1f} s after the change")
        obj = kube.request("GET", jq_path(namespace, "judge"))
        assert met, (out, obj.get("status"))
        degraded, ready, progressing = (condition(obj, t) for t in ("Degraded", "Ready", "Progressing"))
        assert degraded["reason"] == reason and words in degraded["message"], degraded
        assert ready["status"] == "False", ready
        assert progressing["status"] == "True", progressing
        wait_for("Progressing with the old and new counts", lambda: "1 old still running" in condition(
            kube.request("GET", jq_path(namespace, "judge")), "Progressing").get("message", ""), timeout=30)
        assert [p["metadata"]["uid"] for p in ready_pods(kube, namespace, "worker")] == [old_pod["metadata"]["uid"]]
        time.sleep(12)  # another pass of the default timer: still so
        obj = kube.request("GET", jq_path(namespace, "judge"))
        assert (condition(obj, "Ready")["status"], condition(obj, "Degraded")["status"]) == ("False", "True")

        patch(fix or {"image": node_cluster.image})
        met, _, out = kubectl_wait(kube, namespace, "judge", "Ready", timeout=180)
        obj = kube.request("GET", jq_path(namespace, "judge"))
        assert met, (out, obj.get("status"))
        assert condition(obj, "Degraded")["status"] == "False", obj["status"]["conditions"]
    finally:  # its worker's requests must not be left on the node for the tests after it
        kube.kubectl("delete", "jq", "judge", "--wait=true", "--timeout=180s", namespace=namespace, check=False)
        kube.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s", check=False)
