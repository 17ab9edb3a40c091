"""Pure parts of the operator's truthfulness: the cutover decision, the full comparison of children,
the handoff to an external scaler, the Deployment conditions read into status, the action log."""

from __future__ import annotations

import copy
import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from judgequeue.controllers import actions, autoscale, children, conditions, cutover, diff, render
from judgequeue.core.spec import parse_quantity, parse_spec
from judgequeue.core.store.queues import QueueFlags

MARK = datetime(2026, 1, 1, tzinfo=UTC)
LATER = datetime(2026, 2, 1, tzinfo=UTC)


def _row(mode: str = "shadow", paused: bool = False, watermark: datetime | None = None, version: int = 3) -> QueueFlags:
    return QueueFlags("q", mode, watermark, paused, version, MARK, "JudgeQueue ns/judge")  # type: ignore[arg-type]


def _want(mode: str = "shadow", paused: bool = False, watermark: datetime | None = None,
          policy: str = "restore") -> cutover.Wanted:
    return cutover.Wanted("q", mode, paused, watermark, policy)


@pytest.mark.parametrize(("want", "row", "last", "decision"), [
    (_want(), _row(), None, "applied"),  # the row holds the spec's flags
    (_want(), _row("live"), None, "write"),  # never written by this spec
    (_want("live"), _row(), _want().canonical(), "write"),  # the spec changed since the last write
    (_want(), _row("live"), _want().canonical(), "restore"),  # drift, restored by default
    (_want(policy="report"), _row("live"), _want().canonical(), "report"),
    (_want(policy="report"), _row("live"), "something older", "write"),  # a spec change is applied anyway
    (_want(watermark=MARK), _row(watermark=LATER), _want(watermark=MARK).canonical(), "restore"),
    (_want(), _row(watermark=MARK), _want().canonical(), "report"),  # a watermark cannot be removed
    (_want("live"), _row(watermark=MARK), _want().canonical(), "write"),  # mode first; the watermark is reported
])
def test_cutover_decision(want: cutover.Wanted, row: QueueFlags, last: str | None, decision: str) -> None:
    assert cutover.decide(want, row, last_applied=last) == decision


def test_a_flag_gate_has_one_place_to_go() -> None:
    """The decision is the one function a flip gate extends: every outcome is named (``gated``:
    tests/unit/test_shadow_pure.py)."""
    assert set(cutover.Decision.__args__) == {"applied", "write", "restore", "report", "gated"}  # type: ignore[attr-defined]


def test_how_the_flags_came_to_be_stays_until_the_next_write() -> None:
    """A forced flip's account outlives the next passes (which write nothing), never a later write."""
    now = "queue 'q': mode=live paused=false watermark=none (config version 4)"
    forced = now + "; forced past the gate (cutover.force): agreement 95.00% over 40 compared"
    assert cutover.applied_message(now, forced, wrote=False) == forced
    assert cutover.applied_message(now, "", wrote=False) == now
    later = now.replace("version 4", "version 5")
    assert cutover.applied_message(later, forced, wrote=False) == later  # other flags: not this account
    assert cutover.applied_message(now + "; the gate was met: ...", forced, wrote=True).endswith("met: ...")
    assert cutover.applied_message(now, now + "4; x", wrote=False) == now  # "version 44" is not "version 4"


def test_cutover_messages_name_the_rows_values() -> None:
    row = _row("live", paused=True, version=7)
    assert cutover.describe(row) == "mode=live paused=true watermark=none (config version 7)"
    sync = cutover._outcome(cutover.QueueSync(conditions.Condition("CutoverApplied", "Unknown", "", "")),
                            _want(policy="report"), row, "report", {"generation": 2, "applied": "x"}, 3)
    assert (sync.condition.status, sync.condition.reason) == ("False", "Drifted")
    assert "holds mode=live paused=true watermark=none (config version 7)" in sync.condition.message
    assert sync.status["mode"] == "live" and sync.status["generation"] == 2 and sync.status["applied"] == "x"
    assert sync.problem is not None and sync.problem.reason == "Drifted"


def test_differences_name_added_and_changed_fields() -> None:
    live = {"spec": {"template": {"spec": {"hostNetwork": True, "nodeSelector": {"disk": "ssd"}, "containers": [
        {"name": "worker", "image": "a:2", "securityContext": {"capabilities": {"drop": ["ALL"],
                                                                               "add": ["NET_ADMIN"]}},
         "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "9"}]}]}}}}
    want = {"spec": {"template": {"spec": {"containers": [
        {"name": "worker", "image": "a:1", "securityContext": {"capabilities": {"drop": ["ALL"]}},
         "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}]}}}}
    found = {d.path: d for d in diff.differences(live, want)}
    assert set(found) == {
        "spec.template.spec.hostNetwork", "spec.template.spec.nodeSelector",
        "spec.template.spec.containers[worker].image",
        "spec.template.spec.containers[worker].securityContext.capabilities.add",
        "spec.template.spec.containers[worker].env[B].value",
    }
    assert found["spec.template.spec.hostNetwork"].describe() == "spec.template.spec.hostNetwork=true (not in the spec)"
    assert found["spec.template.spec.containers[worker].image"].describe() == (
        'spec.template.spec.containers[worker].image="a:2" (spec: "a:1")')
    assert diff.differences(want, copy.deepcopy(want)) == []
    # A container added beside the rendered one is named, not hidden in a list comparison.
    sidecar = copy.deepcopy(want)
    sidecar["spec"]["template"]["spec"]["containers"].append({"name": "sidecar", "image": "evil"})
    assert [d.path for d in diff.differences(sidecar, want)] == ["spec.template.spec.containers[sidecar]"]
    assert diff.differences({"a": 1}, {"a": True}) != []  # 1 is not True


def test_replacement_keeps_what_others_own_and_nothing_else() -> None:
    desired = {"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "j-worker", "labels": {"app": "x"}, "ownerReferences": [{"uid": "u"}]},
               "spec": {"template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": []}}}}
    live = {"metadata": {"name": "j-worker", "resourceVersion": "9", "uid": "d", "generation": 4,
                         "labels": {"app": "y", "team": "a"}, "annotations": {"deployment.kubernetes.io/revision": "3"},
                         "managedFields": [{}], "ownerReferences": [{"uid": "other"}]},
            "spec": {"replicas": 5, "template": {"metadata": {"annotations": {
                "kubectl.kubernetes.io/restartedAt": "now", "evil": "1"}}, "spec": {"hostNetwork": True}}}}
    body = children.replacement(desired, live)
    assert body["metadata"]["labels"] == {"app": "x", "team": "a"}
    assert body["metadata"]["annotations"] == {"deployment.kubernetes.io/revision": "3"}
    assert body["metadata"]["ownerReferences"] == [{"uid": "u"}]
    assert not {"managedFields", "resourceVersion", "uid", "generation"} & set(body["metadata"])
    assert body["spec"]["replicas"] == 5  # rendered without replicas: someone else scales it
    assert body["spec"]["template"]["metadata"]["annotations"] == {"kubectl.kubernetes.io/restartedAt": "now"}
    assert "hostNetwork" not in body["spec"]["template"]["spec"]


@pytest.mark.parametrize(("previous", "spec_replicas", "memory", "at", "keep"), [
    ("internal", 1, autoscale.Handoff(), 100.0, True),  # the switch: the live count stays
    ("external", 1, autoscale.Handoff(100.0, 1), 150.0, True),  # within the window, nobody wrote
    ("external", 4, autoscale.Handoff(100.0, 1), 150.0, False),  # the external scaler wrote 4
    ("external", 1, autoscale.Handoff(100.0, 1), 400.0, False),  # one window passed
    ("external", 1, autoscale.Handoff(), 150.0, False),  # no switch seen: follow the spec
])
def test_handoff_to_an_external_scaler(previous: str, spec_replicas: int, memory: autoscale.Handoff, at: float,
                                       keep: bool) -> None:
    result = autoscale.handoff(mode="external", previous_mode=previous, spec_replicas=spec_replicas, memory=memory,
                               window=300.0, now=at)
    assert result.keep_live is keep
    assert autoscale.handoff(mode="internal", previous_mode="internal", spec_replicas=1, memory=memory, window=300,
                             now=at) == autoscale.Handoff()


def test_deployment_conditions_make_status() -> None:
    refused: dict[str, Any] = {"metadata": {"generation": 2}, "spec": {"replicas": 1},
               "status": {"observedGeneration": 2, "conditions": [
                   {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                    "message": 'pods "j-worker-x" is forbidden: violates PodSecurity "restricted:latest": ...'},
                   {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                    "message": 'ReplicaSet "j-worker-x" has timed out progressing.'}]}}
    worker = conditions.availability("worker", refused)
    assert worker.refused.startswith('pods "j-worker-x" is forbidden') and "timed out" in worker.stuck
    up = conditions.availability("dispatcher", {"spec": {"replicas": 0}, "status": {}})
    pending = conditions.PodWaiting("worker", "j-worker-x", "Unschedulable",
                                    "0/1 nodes are available: 1 Insufficient memory.")
    ready, _, problems = conditions.rollout_problems([up, worker], [], [pending])
    assert (ready.reason, "violates PodSecurity" in ready.message) == ("PodsRefused", True)
    assert [p.reason for p in problems] == ["PodsRefused", "RolloutStuck"]
    assert "Insufficient memory" in problems[1].message
    degraded = conditions.degraded(problems)
    assert (degraded.status, degraded.reason) == ("True", "PodsRefused") and "timed out" in degraded.message
    # Conditions of a generation the controller has not seen yet say nothing about the new rollout.
    stale = copy.deepcopy(refused)
    stale["metadata"]["generation"] = 3
    assert conditions.availability("worker", stale).refused == ""
    # A finished rollout refuses nothing, whatever an old ReplicaSet's ReplicaFailure still says.
    done = copy.deepcopy(refused)
    done["status"].update(updatedReplicas=1, availableReplicas=1, readyReplicas=1)
    assert conditions.availability("worker", done).refused == ""
    assert conditions.degraded([]).status == "False"


def _rolling(**status: Any) -> dict[str, Any]:
    """A worker Deployment of one replica whose rollout to template ``new`` left template ``old``'s pod
    running: what the Deployment controller reports with maxSurge 1 and maxUnavailable 0."""
    body: dict[str, Any] = {"metadata": {"name": "judge-worker", "generation": 3}, "spec": {"replicas": 1},
                            "status": {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 1,
                                       "readyReplicas": 1, "availableReplicas": 1, "conditions": [
                                           {"type": "Available", "status": "True"},
                                           {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
                                            "message": 'ReplicaSet "judge-worker-new" is progressing.'}]}}
    body["status"].update(status)
    return body


def _worker_pod(name: str, template: str, *, ready: bool, container: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"pod-template-hash": template}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"name": "worker", **container}]}}


def test_a_rollout_whose_new_pods_fail_is_not_ready_and_is_degraded() -> None:
    worker = conditions.availability("worker", _rolling())
    assert (worker.desired, worker.replicas, worker.updated, worker.old, worker.new_hash) == (1, 2, 1, 1, "new")
    assert not worker.complete and not worker.short
    old = _worker_pod("judge-worker-old-a", "old", ready=True, container={"state": {"running": {}}})
    refusing = _worker_pod("judge-worker-new-b", "new", ready=False, container={
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 2, "message": "judgequeue: error: JUDGEQUEUE_JUDGE='gpu' is not"
                                                             " an installed judge plugin", "finishedAt": "t"}}})
    current = conditions.current_pods(worker, [old, refusing])
    assert current == [refusing]  # the old pod serving says nothing about the new template
    ready, progressing, problems = conditions.rollout_problems(
        [worker], [f for f in [conditions.failing("worker", current)] if f], conditions.waiting_pods("worker", current))
    assert (ready.status, ready.reason) == ("False", "ContainersFailing"), ready
    assert "1 old still running" in ready.message and "exited 2" in ready.message
    assert (progressing.status, progressing.reason) == ("True", "RollingOut")
    assert progressing.message == "worker: 1 of 1 updated, 1 old still running, 1 of 1 available"
    assert [p.reason for p in problems] == ["RoleMisconfigured"] and "'gpu'" in problems[0].message
    # An image that cannot be pulled: Degraded at once, whatever the progress deadline.
    pulling = _worker_pod("judge-worker-new-c", "new", ready=False, container={
        "state": {"waiting": {"reason": "ErrImagePull", "message": 'failed to pull "registry.invalid/jq:x"'}}})
    current = conditions.current_pods(worker, [old, pulling])
    ready, _, problems = conditions.rollout_problems([worker], [], conditions.waiting_pods("worker", current))
    assert (ready.status, ready.reason) == ("False", "PodsPending")
    assert [p.reason for p in problems] == ["ImagePullFailed"] and "registry.invalid" in problems[0].message
    # Rolling with nothing wrong (yet): not Ready, not Degraded, Progressing with the counts.
    ready, progressing, problems = conditions.rollout_problems([worker])
    assert (ready.status, ready.reason, problems) == ("False", "RollingOut", [])
    assert ready.message == "rollout not finished: worker: 1 of 1 updated, 1 old still running, 1 of 1 available"
    # A crash of the old template's pod is not the rollout's failure.
    crashed_old = _worker_pod("judge-worker-old-d", "old", ready=False, container={
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "message": "boom", "finishedAt": "t"}}})
    assert conditions.failing("worker", conditions.current_pods(worker, [crashed_old])) is None
    # The controller has not seen the new generation: its counts are the previous one's, not Ready.
    unseen = conditions.availability("worker", _rolling(observedGeneration=2, replicas=1, updatedReplicas=1))
    ready, progressing, _ = conditions.rollout_problems([unseen])
    assert ready.status == "False" and "generation 3 not yet seen" in progressing.message
    assert unseen.new_hash == ""  # nor its Progressing condition's ReplicaSet
    # Done: the old pod gone, every pod new and available.
    done = conditions.availability("worker", _rolling(replicas=1, conditions=[
        {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
         "message": 'ReplicaSet "judge-worker-new" has successfully progressed.'}]))
    ready, progressing, problems = conditions.rollout_problems([done])
    assert (ready.status, progressing.status, problems) == ("True", "False", [])


def test_a_crash_without_a_termination_message_is_still_a_failure() -> None:
    oom = _worker_pod("p", "h", ready=False, container={
        "state": {"running": {}}, "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}})
    assert conditions.failing("worker", [oom]) == conditions.PodFailure("worker", "p", 137, "OOMKilled")
    recovered = _worker_pod("p", "h", ready=True, container={
        "state": {"running": {}}, "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}})
    assert conditions.failing("worker", [recovered]) is None


def test_pods_waiting_for_a_named_cause() -> None:
    pods = [{"metadata": {"name": "a"}, "status": {"conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}]}},
            {"metadata": {"name": "b"}, "status": {"containerStatuses": [
                {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "pull access denied"}}}]}}]
    assert conditions.waiting("worker", pods) == conditions.PodWaiting("worker", "a", "Unschedulable", "0/1 nodes")
    assert conditions.waiting("worker", pods[1:]) == conditions.PodWaiting("worker", "b", "ImagePullBackOff",
                                                                           "pull access denied")
    creating = [{"metadata": {"name": "c"}, "status": {"containerStatuses": [
        {"state": {"waiting": {"reason": "ContainerCreating"}}}]}}]
    assert conditions.waiting("worker", creating) is None


def test_children_names_must_fit() -> None:
    assert render.name_errors("a" * 49) == []
    (error,) = render.name_errors("a" * 50)
    assert error.startswith("metadata.name:") and "-worker-egress" in error and "at most 49" in error


def test_quantities_and_limits() -> None:
    assert parse_quantity("1Gi") == 1024 ** 3 and parse_quantity("500m") == parse_quantity("0.5")
    assert parse_quantity("512MB") is None and parse_quantity("half") is None and parse_quantity(True) is None
    spec = {"image": "i", "postgres": {"secretKeyRef": {"name": "p"}}, "redis": {"secretKeyRef": {"name": "r"}},
            "worker": {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}}
    errors = parse_spec(spec, name="judge")
    assert errors == ["spec.worker.resources.limits.memory: limits.memory must not be below requests.memory"
                      " (1Gi < 2Gi)"]


def test_default_worker_memory_is_schedulable_at_the_largest_concurrency() -> None:
    spec = parse_spec({"image": "i", "postgres": {"secretKeyRef": {"name": "p"}},
                       "redis": {"secretKeyRef": {"name": "r"}}, "worker": {"concurrency": 64}}, name="judge")
    assert not isinstance(spec, list), spec
    resources = render.default_worker_resources(spec)
    assert resources["requests"]["memory"] == "16640Mi" and resources["limits"]["memory"] == "65792Mi"
    too_many = parse_spec({"image": "i", "postgres": {"secretKeyRef": {"name": "p"}},
                           "redis": {"secretKeyRef": {"name": "r"}}, "worker": {"concurrency": 256}}, name="judge")
    assert too_many == ["spec.worker.concurrency: must be between 1 and 64, got 256"]


def test_action_lines(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="judgequeue.operator"):
        actions.log_action("replace", "Deployment j-worker", "changed outside the spec: spec.x",
                           judgequeue="ns/j", diff=["spec.x=1 (spec: 2)"])
    (record,) = caplog.records
    assert record.levelname == "INFO"
    assert record.getMessage() == "replace Deployment j-worker: changed outside the spec: spec.x"
    assert (record.action, record.object, record.judgequeue) == ("replace", "Deployment j-worker", "ns/j")  # type: ignore[attr-defined]
    assert not hasattr(record, "diff")  # the values only at DEBUG
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="judgequeue.operator"):
        actions.log_action("scale", "Deployment j-worker", "workers 1 -> 2", judgequeue="ns/j", diff={"replicas": 2})
    assert caplog.records[0].diff == {"replicas": 2}  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        actions.log_action("explode", "x", "y", judgequeue="ns/j")
    assert json.dumps(actions.KINDS)


def test_kopf_objects_reach_the_log_at_debug() -> None:
    from judgequeue.core.base.logs import setup_logging

    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    try:
        setup_logging("DEBUG")
        assert logging.getLogger("kopf.objects").level == logging.DEBUG
        setup_logging("INFO")
        assert logging.getLogger("kopf.objects").level == logging.WARNING
        assert logging.getLogger("judgequeue.operator").getEffectiveLevel() == logging.INFO
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
