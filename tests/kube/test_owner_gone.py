"""A queue whose owner was deleted while no operator ran is released, on the real control plane with
the chart's RBAC and pods run by the node agent.

The README says a JudgeQueue stuck on its finalizer with no operator may be released by hand. Then
nothing runs its delete handler and no operator sees it go: the queue row still names it as owner.
When the operator starts again, a JudgeQueue waiting for that queue finds the recorded owner gone
(no JudgeQueue of that namespace and name, none of its pods left on the queue), releases it and
takes it over, saying so (a ``QueueOwnerGone`` Event, the ``CutoverApplied`` message, a release
action line); the two fleets never run on the queue at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube import tools
from tests.kube.cluster import Cluster
from tests.kube.node import NodeAgent
from tests.kube.test_one_fleet import FleetWatch, _owner, _running_on, _spec
from tests.support.databases import REDIS_URL


@pytest.fixture
def second_namespace(crd_installed: Cluster) -> Iterator[str]:
    with crd_installed.fresh_namespace() as name:
        yield name


def test_a_queue_whose_owner_was_force_deleted_while_no_operator_ran_is_taken_over(
    crd_installed: Cluster, node: NodeAgent, namespace: str, second_namespace: str, pg_dsn: str,
    queue_name: str, tmp_path: Path,
) -> None:
    kube, first, second = crd_installed, namespace, second_namespace
    for ns in (first, second):
        tools.connection_secrets(kube, ns, dsn=pg_dsn, redis_url=REDIS_URL)
    kubeconfig = tools.operator_identity(kube, first)
    log = tmp_path / "operator.log"
    operator = tools.start_operator(kubeconfig, [first, second], log)
    watch = FleetWatch(node, (first, second), queue_name)
    try:
        kube.request("POST", tools.jq_path(first), tools.judgequeue("judge", queue_name, **_spec()))
        met, _, out = tools.kubectl_wait(kube, first, "judge", "Ready", timeout=120)
        assert met, (out, operator.text()[-3000:])
        kube.request("POST", tools.jq_path(second), tools.judgequeue("judge", queue_name, **_spec()))
        met, _, out = tools.kubectl_wait(kube, second, "judge", "Degraded", timeout=15)
        assert met, out
        assert tools.condition(kube.request("GET", tools.jq_path(second, "judge")), "Degraded")["reason"] == (
            "QueueOwned")
        watch.start()

        operator.stop()  # no operator runs from here
        kube.kubectl("delete", "jq", "judge", "--wait=false", namespace=first)
        kube.kubectl("patch", "jq", "judge", "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                     namespace=first)
        tools.wait_for("the JudgeQueue gone", lambda: kube.get(tools.jq_path(first, "judge")) is None, timeout=30)
        assert _owner(pg_dsn, queue_name) == f"JudgeQueue {first}/judge"  # nothing released it

        operator = tools.start_operator(kubeconfig, [first, second], log)
        tools.wait_for("the queue taken over", lambda: _owner(pg_dsn, queue_name) == f"JudgeQueue {second}/judge",
                       timeout=90, check=operator.check)
        met, _, out = tools.kubectl_wait(kube, second, "judge", "Ready", timeout=120)
        assert met, (out, operator.text()[-3000:])
        assert _running_on(node, second, queue_name) and not _running_on(node, first, queue_name)
        obj = kube.request("GET", tools.jq_path(second, "judge"))
        applied = tools.condition(obj, "CutoverApplied")
        assert applied["status"] == "True", applied
        assert f"taken over from JudgeQueue {first}/judge, which no longer exists" in applied["message"], applied
        gone = [e for e in tools.events(kube, second, "judge") if e.get("reason") == "QueueOwnerGone"]
        assert gone and gone[0]["type"] == "Normal", gone
        assert f"held by JudgeQueue {first}/judge, which no longer exists" in gone[0]["message"], gone
        released = [e for e in tools.actions(operator.lines(), "release") if e["object"] == f"queue {queue_name}"]
        assert [e["judgequeue"] for e in released] == [f"{second}/judge"], released
        assert f"JudgeQueue {first}/judge no longer exists" in released[0]["reason"], released
    finally:
        watch.stop.set()
        if watch.is_alive():
            watch.join()
        operator.stop()
    assert watch.overlaps == [], watch.overlaps[:3]  # the first fleet was gone before the second started
