"""One queue, one fleet, on the real control plane with the chart's RBAC and pods run by the node agent.

Two JudgeQueues (two namespaces, one operator, one database) and the queue row's ``owner``:

- a running JudgeQueue whose ``spec.queue`` is changed to a queue the other owns is refused and scales
  its fleet to zero (not "runs and writes nothing" while its pods go on), then releases the queue it
  left once its last pod is gone;
- a rename to a free queue is a handoff: the new queue is claimed, the pods roll over, and the old
  queue is released only when no pod runs on it any more, so a JudgeQueue waiting for the old queue
  starts its fleet there only then: never two fleets on one queue;
- an ``UPDATE`` of the owner column by hand does not hand the queue over: the JudgeQueue that held it
  takes it back (a ``QueueOwnerRestored`` Warning), the one named stays at zero;
- a deleted owner stops its fleet, then releases its queue, and the waiting one takes it over; one
  whose finalizer was released by hand (its delete handler never ran) releases its queue too.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kube import tools
from tests.kube.cluster import Cluster
from tests.kube.node import NodeAgent
from tests.support.databases import REDIS_URL


@pytest.fixture
def second_namespace(crd_installed: Cluster) -> Iterator[str]:
    with crd_installed.fresh_namespace() as name:
        yield name


def _spec() -> dict[str, Any]:
    return {"dispatcher": {"replicas": 0}, "reaper": {"replicas": 0},
            "worker": {"judge": "sleep", "minReplicas": 1, "maxReplicas": 1, "concurrency": 1}}


def _owner(dsn: str, queue: str) -> str | None:
    rows = tools.run_sql(dsn, "SELECT owner FROM judgequeue.queues WHERE name = $1", queue)
    return rows[0]["owner"] if rows else None


def _queue_of(pod: dict[str, Any]) -> str:
    env = pod["spec"]["containers"][0].get("env") or []
    return next((str(e.get("value")) for e in env if e["name"] == "JUDGEQUEUE_QUEUE"), "")


def _running_on(node: NodeAgent, namespace: str, queue: str) -> list[str]:
    """Pods of ``namespace`` whose process runs (terminating ones included) on ``queue``."""
    return [r.name for r in node.running() if r.namespace == namespace and _queue_of(r.pod) == queue]


class FleetWatch(threading.Thread):
    """Samples the node's running pods every 100 ms and records any moment when pods of both
    namespaces ran on ``queue`` at once."""

    def __init__(self, node: NodeAgent, namespaces: tuple[str, str], queue: str) -> None:
        super().__init__(daemon=True)
        self.node, self.namespaces, self.queue = node, namespaces, queue
        self.overlaps: list[tuple[list[str], list[str]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            a, b = (_running_on(self.node, ns, self.queue) for ns in self.namespaces)
            if a and b:
                self.overlaps.append((a, b))


def _patch(kube: Cluster, namespace: str, spec: dict[str, Any]) -> None:
    kube.request("PATCH", tools.jq_path(namespace, "judge"), {"spec": spec},
                 content_type="application/merge-patch+json")


def _first_runs_second_refused(kube: Cluster, first: str, second: str, queue: str) -> None:
    """``first``'s JudgeQueue on ``queue`` Ready, then ``second``'s on the same queue Degraded (one
    fleet per queue)."""
    kube.request("POST", tools.jq_path(first), tools.judgequeue("judge", queue, **_spec()))
    met, _, out = tools.kubectl_wait(kube, first, "judge", "Ready", timeout=120)
    assert met, out
    kube.request("POST", tools.jq_path(second), tools.judgequeue("judge", queue, **_spec()))
    met, _, out = tools.kubectl_wait(kube, second, "judge", "Degraded", timeout=15)
    assert met, out


def _replicas(kube: Cluster, namespace: str) -> int | None:
    deployment = kube.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/judge-worker")
    return None if deployment is None else int(deployment["spec"].get("replicas", 1))


@pytest.fixture
def two(crd_installed: Cluster, node: NodeAgent, namespace: str, second_namespace: str, pg_dsn: str,
        tmp_path: Path) -> Iterator[tuple[Cluster, str, str, tools.OperatorProcess]]:
    kube = crd_installed
    for ns in (namespace, second_namespace):
        tools.connection_secrets(kube, ns, dsn=pg_dsn, redis_url=REDIS_URL)
    operator = tools.start_operator(tools.operator_identity(kube, namespace), [namespace, second_namespace],
                                    tmp_path / "operator.log")
    try:
        yield kube, namespace, second_namespace, operator
    finally:
        operator.stop()


def test_a_queue_renamed_to_one_another_owns_stops_the_fleet_and_releases_the_old_queue(
    two: tuple[Cluster, str, str, tools.OperatorProcess], node: NodeAgent, pg_dsn: str, queue_name: str,
) -> None:
    kube, first, second, operator = two
    q1, q2 = f"{queue_name}-a", f"{queue_name}-b"
    kube.request("POST", tools.jq_path(first), tools.judgequeue("judge", q1, **_spec()))
    kube.request("POST", tools.jq_path(second), tools.judgequeue("judge", q2, **_spec()))
    for ns in (first, second):
        met, _, out = tools.kubectl_wait(kube, ns, "judge", "Ready", timeout=120)
        assert met, (out, operator.text()[-3000:])
    assert _running_on(node, first, q1)

    _patch(kube, first, {"queue": q2})
    met, _, out = tools.kubectl_wait(kube, first, "judge", "Degraded", timeout=15)
    assert met, out
    obj = kube.request("GET", tools.jq_path(first, "judge"))
    degraded, ready = tools.condition(obj, "Degraded"), tools.condition(obj, "Ready")
    assert degraded["reason"] == "QueueOwned" and f"belongs to JudgeQueue {second}/judge" in degraded["message"]
    assert ready["status"] == "False" and "scaled to zero" in ready["message"], ready
    assert _replicas(kube, first) == 0
    tools.wait_for("the first fleet gone", lambda: not _running_on(node, first, q1), timeout=60,
                   check=operator.check)
    tools.wait_for("the queue it left released", lambda: _owner(pg_dsn, q1) is None, timeout=15,
                   check=operator.check)
    assert _owner(pg_dsn, q2) == f"JudgeQueue {second}/judge" and _running_on(node, second, q2)
    assert tools.condition(kube.request("GET", tools.jq_path(second, "judge")), "Ready")["status"] == "True"
    scaled = [e for e in tools.actions(operator.lines(), "scale") if e["object"] == "Deployment judge-worker"
              and e["judgequeue"] == f"{first}/judge"]
    assert scaled and scaled[-1]["replicas"] == 0 and "belongs to" in scaled[-1]["reason"], scaled

    # A free queue: it runs again there.
    q3 = f"{queue_name}-c"
    _patch(kube, first, {"queue": q3})
    met, _, out = tools.kubectl_wait(kube, first, "judge", "Ready", timeout=120)
    assert met, out
    assert _owner(pg_dsn, q3) == f"JudgeQueue {first}/judge" and _running_on(node, first, q3)


def test_a_rename_hands_the_old_queue_over_only_once_no_pod_runs_on_it(
    two: tuple[Cluster, str, str, tools.OperatorProcess], node: NodeAgent, pg_dsn: str, queue_name: str,
) -> None:
    kube, first, second, operator = two
    q1, q2 = f"{queue_name}-a", f"{queue_name}-b"
    # A second JudgeQueue wants q1 too: refused, nothing of it runs.
    _first_runs_second_refused(kube, first, second, q1)
    assert _replicas(kube, second) is None  # refused before it ever ran: no children at all

    watch = FleetWatch(node, (first, second), q1)
    watch.start()
    try:
        _patch(kube, first, {"queue": q2})
        # The handoff: the new queue claimed, the old one still held while its pod runs ...
        tools.wait_for("the new queue claimed", lambda: _owner(pg_dsn, q2) == f"JudgeQueue {first}/judge",
                       timeout=15, check=operator.check)
        owners: list[tuple[str | None, list[str]]] = []

        def released() -> bool:
            owners.append((_owner(pg_dsn, q1), _running_on(node, first, q1)))
            return owners[-1][0] != f"JudgeQueue {first}/judge"

        tools.wait_for("the old queue released", released, timeout=90, check=operator.check)
        assert owners[-1][1] == [], owners[-1]  # released only with no pod of the first left on it
        # ... and the JudgeQueue waiting for it takes it over and runs there.
        tools.wait_for("the old queue taken over", lambda: _owner(pg_dsn, q1) == f"JudgeQueue {second}/judge",
                       timeout=15, check=operator.check)
        for ns in (first, second):
            met, _, out = tools.kubectl_wait(kube, ns, "judge", "Ready", timeout=120)
            assert met, (ns, out)
        assert _running_on(node, second, q1) and _running_on(node, first, q2)
    finally:
        watch.stop.set()
        watch.join()
    assert watch.overlaps == [], watch.overlaps[:3]
    releases = [e["object"] for e in tools.actions(operator.lines(), "release")]
    assert releases == [f"queue {q1}"], releases


def test_the_owner_column_changed_by_hand_is_taken_back_and_a_deleted_owner_releases(
    two: tuple[Cluster, str, str, tools.OperatorProcess], node: NodeAgent, pg_dsn: str, queue_name: str,
) -> None:
    kube, first, second, operator = two
    _first_runs_second_refused(kube, first, second, queue_name)

    watch = FleetWatch(node, (first, second), queue_name)
    watch.start()
    try:
        tools.run_sql(pg_dsn, "UPDATE judgequeue.queues SET owner = $2 WHERE name = $1", queue_name,
                      f"JudgeQueue {second}/judge")
        tools.wait_for("the owner taken back", lambda: tools.warning_events(kube, first, "judge",
                                                                            "QueueOwnerRestored"),
                       timeout=15, check=operator.check)
        assert _owner(pg_dsn, queue_name) == f"JudgeQueue {first}/judge"
        time.sleep(3)  # a few more passes: the second stays refused, with nothing running
        assert _owner(pg_dsn, queue_name) == f"JudgeQueue {first}/judge"
        assert _replicas(kube, second) in (None, 0)
        assert tools.condition(kube.request("GET", tools.jq_path(second, "judge")), "Degraded")["status"] == "True"
        assert _running_on(node, first, queue_name)

        # The owner deleted: its fleet stops, then it releases the queue and the second takes it over.
        kube.request("DELETE", tools.jq_path(first, "judge"))
        tools.wait_for("the queue taken over", lambda: _owner(pg_dsn, queue_name) == f"JudgeQueue {second}/judge",
                       timeout=60, check=operator.check)
        met, _, out = tools.kubectl_wait(kube, second, "judge", "Ready", timeout=120)
        assert met, out
    finally:
        watch.stop.set()
        watch.join()
    assert watch.overlaps == [], watch.overlaps[:3]  # the deleted owner's last pods went first


def test_a_judgequeue_whose_finalizer_is_released_by_hand_releases_its_queue(
    two: tuple[Cluster, str, str, tools.OperatorProcess], pg_dsn: str, queue_name: str,
) -> None:
    """Deleted and its finalizer dropped by hand while the operator was frozen: the operator sees only
    the object gone (its delete handler never runs), and releases the queue all the same."""
    kube, first, _, operator = two
    kube.request("POST", tools.jq_path(first), tools.judgequeue("judge", queue_name, **_spec()))
    tools.wait_for("the queue claimed", lambda: _owner(pg_dsn, queue_name) == f"JudgeQueue {first}/judge",
                   timeout=30, check=operator.check)
    tools.wait_for("status recording the claim", lambda: (kube.request("GET", tools.jq_path(first, "judge"))
                                                          .get("status", {}).get("cutover") or {}).get("queue"),
                   timeout=30, check=operator.check)
    operator.send_signal(signal.SIGSTOP)
    try:
        kube.kubectl("delete", "jq", "judge", "--wait=false", namespace=first)
        kube.kubectl("patch", "jq", "judge", "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                     namespace=first)
        tools.wait_for("the JudgeQueue gone", lambda: kube.get(tools.jq_path(first, "judge")) is None, timeout=30)
    finally:
        operator.send_signal(signal.SIGCONT)
    tools.wait_for("the queue released", lambda: _owner(pg_dsn, queue_name) is None, timeout=30,
                   check=operator.check)
