"""Pure parts of the operator: spec parsing, rendering, diffing, conditions, autoscaling, RBAC."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from judgequeue.controllers import autoscale, conditions, diff, rbac, render
from judgequeue.core.config import JUDGE_REFUSED_VARIABLE, file_variable_names, load_settings, variable_names
from judgequeue.core.spec import JudgeQueueSpec, parse_spec

SPEC: dict[str, Any] = {
    "image": "img:1",
    "postgres": {"secretKeyRef": {"name": "db", "key": "dsn"}},
    "redis": {"secretKeyRef": {"name": "rd", "key": "url"}},
}
OWNER = render.Owner(name="judge", namespace="ns", uid="uid-1")


def parsed(**overrides: Any) -> JudgeQueueSpec:
    spec = copy.deepcopy(SPEC)
    spec.update(overrides)
    result = parse_spec(spec, name="judge")
    assert not isinstance(result, list), result
    return result


def test_parse_defaults() -> None:
    spec = parsed()
    assert spec.queue == "judge"
    assert spec.dispatcher.batch_size == 100 and spec.dispatcher.backoff.max == 300
    assert spec.worker.autoscaling == "internal" and spec.values[("reaper", "retention")] == 7 * 86400
    assert spec.cutover.mode == "live" and spec.cutover.watermark is None


INVALID: list[tuple[dict[str, Any], str]] = [
    ({"dispatcher": {"batchSize": -5}}, "spec.dispatcher.batchSize"),
    ({"worker": {"minReplicas": 4, "maxReplicas": 2}}, "spec.worker.minReplicas: worker.minReplicas must not exceed"),
    ({"reaper": {"interval": "often"}}, "spec.reaper.interval"),
    ({"worker": {"judge": "Quantum!"}}, "spec.worker.judge: 'Quantum!' is not a judge plugin name"),
    ({"image": ""}, "spec.image"),
    ({"queue": "Bad Name"}, "spec.queue"),
    ({"dispatcher": {"backoff": {"base": "10m", "max": "1m"}}}, "spec.dispatcher.backoff.base"),
    ({"cutover": {"mode": "sideways"}}, "spec.cutover.mode"),
    ({"cutover": {"watermark": "yesterday"}}, "spec.cutover.watermark"),
    ({"worker": {"concurrency": 0}}, "spec.worker.concurrency"),
    ({"worker": {"autoscaling": "keda"}}, "spec.worker.autoscaling"),
    ({"postgres": {"secretKeyRef": {}}}, "spec.postgres.secretKeyRef.name"),
    ({"worker": {"resources": {"limits": {"cpu": "lots"}}}}, "spec.worker.resources.limits.cpu"),
    ({"reaper": {"leaseTtl": "5m"}}, "spec.reaper.leaseTtl"),
    ({"paused": "yes"}, "spec.paused"),
]


@pytest.mark.parametrize(("change", "expected"), INVALID)
def test_parse_errors_name_the_field(change: dict[str, Any], expected: str) -> None:
    spec = copy.deepcopy(SPEC)
    spec.update(change)
    result = parse_spec(spec, name="judge")
    assert isinstance(result, list)
    assert any(expected in e for e in result), result


def test_parse_collects_every_error_and_accepts_plugin_judges() -> None:
    result = parse_spec({"dispatcher": {"batchSize": 0}}, name="judge")
    assert isinstance(result, list) and len(result) >= 4  # image, postgres, redis, batchSize
    ok = parse_spec({**SPEC, "worker": {"judge": "gpu"}}, name="judge")
    assert not isinstance(ok, list) and ok.worker.judge == "gpu"
    watermark = parsed(cutover={"watermark": "2025-01-31T12:00:00Z"}).cutover.watermark
    assert watermark == datetime(2025, 1, 31, 12, tzinfo=UTC)


def _env(child: render.Child) -> dict[str, Any]:
    container = child.body["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_render_children_env_security_probes_and_owner() -> None:
    spec = parsed(worker={"gracePeriod": "45s", "concurrency": 8, "judge": "noop"},
                  dispatcher={"batchSize": 50, "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}}})
    children = render.render_children(spec, OWNER, worker_replicas=3)
    assert [(c.kind, c.name) for c in children] == [
        ("Deployment", "judge-dispatcher"), ("Deployment", "judge-worker"), ("Deployment", "judge-reaper"),
        ("Service", "judge-metrics"),
    ]
    known = set(variable_names()) | set(file_variable_names()) | {JUDGE_REFUSED_VARIABLE}
    for child in children[:3]:
        body = child.body
        assert body["metadata"]["ownerReferences"] == [{
            "apiVersion": "judgequeue.dev/v1alpha1", "kind": "JudgeQueue", "name": "judge", "uid": "uid-1",
            "controller": True, "blockOwnerDeletion": True,
        }]
        labels = body["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "judge"
        assert labels["app.kubernetes.io/managed-by"] == "judgequeue-operator"
        pod = body["spec"]["template"]["spec"]
        container = pod["containers"][0]
        role = labels["app.kubernetes.io/component"]
        assert container["command"] == ["judgequeue"] and container["args"] == [role]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert container["ports"][0]["containerPort"] == 9090
        sc = container["securityContext"]
        assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
        assert sc["capabilities"] == {"drop": ["ALL"]}
        env = _env(child)
        assert set(env) <= known, set(env) - known
        # Connections are files of the Secrets (tests/test_credentials_files.py), never env values.
        assert env["JUDGEQUEUE_POSTGRES_DSN_FILE"] == "/var/run/secrets/judgequeue/postgres-dsn"
        assert env["JUDGEQUEUE_REDIS_URL_FILE"] == "/var/run/secrets/judgequeue/redis-url"
        assert not any(isinstance(v, dict) for v in env.values())
        # The role's config loads with core's own parser (the contract between operator and roles).
        plain = {k: v for k, v in env.items() if isinstance(v, str) and not k.endswith("_FILE")}
        settings = load_settings({**plain, "JUDGEQUEUE_POSTGRES_DSN": "postgresql://x/y",
                                  "JUDGEQUEUE_REDIS_URL": "redis://x"})
        assert settings.queue == "judge"
    dispatcher, worker, reaper, service = children
    assert _env(dispatcher)["JUDGEQUEUE_BATCH_SIZE"] == "50"
    assert dispatcher.body["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "500m"
    assert _env(worker)["JUDGEQUEUE_CONCURRENCY"] == "8" and _env(worker)["JUDGEQUEUE_JUDGE"] == "noop"
    assert _env(worker)["JUDGEQUEUE_GRACE_PERIOD"] == "45s"
    assert worker.body["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45 + 10
    assert worker.body["spec"]["replicas"] == 3
    assert _env(reaper)["JUDGEQUEUE_RETENTION"] == "7d"
    assert "JUDGEQUEUE_BATCH_SIZE" not in _env(worker)
    assert service.body["spec"]["ports"][0]["port"] == 9090
    assert render.render_deployment(spec, OWNER, "worker", replicas=None).body["spec"].get("replicas") is None


def test_worker_replicas_policy() -> None:
    internal = parsed(worker={"minReplicas": 2, "maxReplicas": 5})
    assert render.worker_replicas(internal, None) == 2
    assert render.worker_replicas(internal, 4) == 4
    assert render.worker_replicas(internal, 9) == 5
    external = parsed(worker={"autoscaling": "external", "minReplicas": 1})
    assert render.worker_replicas(external, 7) is None
    assert render.worker_replicas(external, None) == 1
    scaled = parsed(worker={"autoscaling": "external", "replicas": 6})
    assert render.worker_replicas(scaled, 2) == 6


def test_merge_patch_only_what_differs() -> None:
    desired = {"spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "a", "image": "x:2"}]}}}}
    live: dict[str, Any] = {
        "status": {"replicas": 1},
        "spec": {"replicas": 2, "strategy": {"type": "RollingUpdate"},
                 "template": {"spec": {"containers": [{"name": "a", "image": "x:1", "imagePullPolicy": "Always"}]}}},
    }
    assert diff.merge_patch(live, desired) == {"spec": {"template": {"spec": {"containers": [
        {"name": "a", "image": "x:2"}]}}}}
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "x:2"
    assert diff.merge_patch(live, desired) == {}
    assert diff.covers({"a": 1}, {"a": True}) is False
    assert diff.merge_patch({}, {"a": {"b": 1}}) == {"a": {"b": 1}}


def test_child_patch_ignores_status_and_foreign_metadata() -> None:
    spec = parsed()
    child = render.render_children(spec, OWNER, worker_replicas=1)[0]
    live = copy.deepcopy(child.body)
    live["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "3"}
    live["metadata"]["resourceVersion"] = "17"
    live["status"] = {"availableReplicas": 1}
    assert diff.child_patch(live, child.body) == {}
    live["spec"]["replicas"] = 4
    assert diff.child_patch(live, child.body) == {"spec": {"replicas": 1}}


def test_conditions_keep_transition_time_when_status_unchanged() -> None:
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    first = conditions.merge_conditions(None, [conditions.Condition("Ready", "False", "X", "m")], generation=1, now=t0)
    same = conditions.merge_conditions(
        first, [conditions.Condition("Ready", "False", "Y", "m2")], generation=2, now=t0 + timedelta(minutes=1))
    assert same[0]["lastTransitionTime"] == "2025-01-01T00:00:00Z"
    assert same[0]["reason"] == "Y" and same[0]["observedGeneration"] == 2
    flipped = conditions.merge_conditions(
        same, [conditions.Condition("Ready", "True", "Z", "ok"),
               conditions.Condition("Degraded", "False", "R", "ok")], generation=2, now=t0 + timedelta(minutes=2))
    assert [c["type"] for c in flipped] == ["Ready", "Degraded"]
    assert flipped[0]["lastTransitionTime"] == "2025-01-01T00:02:00Z"


def test_rollout_conditions() -> None:
    deployment = {"metadata": {"generation": 2}, "spec": {"replicas": 2},
                  "status": {"observedGeneration": 2, "availableReplicas": 2, "readyReplicas": 2,
                             "updatedReplicas": 2}}
    roles = [conditions.availability(r, deployment) for r in ("dispatcher", "worker", "reaper")]
    ready, progressing, degraded = conditions.rollout(roles)
    assert (ready.status, progressing.status, degraded.status) == ("True", "False", "False")
    roles[1] = conditions.availability("worker", {"spec": {"replicas": 3}, "status": {"availableReplicas": 1}})
    ready, progressing, _ = conditions.rollout(roles)
    assert ready.status == "False" and "worker 1/3" in ready.message and progressing.status == "True"
    roles[2] = conditions.availability("reaper", None)
    assert conditions.rollout(roles)[0].reason == "ChildrenMissing"
    degraded, _ = conditions.invalid_spec(["spec.image: required"])
    assert degraded.status == "True" and degraded.reason == "InvalidSpec" and "spec.image" in degraded.message


GPU_LINE = ("judgequeue: error: JUDGEQUEUE_JUDGE='gpu' is not an installed judge plugin "
            "(available: noop, program, sleep)")


def _pod(name: str, *, state: dict[str, Any] | None = None, last: dict[str, Any] | None = None) -> dict[str, Any]:
    waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
    status: dict[str, Any] = {"name": "worker", "restartCount": 3, "state": state or waiting}
    if last is not None:
        status["lastState"] = last
    return {"metadata": {"name": name}, "status": {"containerStatuses": [status]}}


def _terminated(code: int, message: str, at: str) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": "Error", "message": message, "finishedAt": at}}


def test_last_failure_takes_the_newest_nonzero_exit_and_its_last_line() -> None:
    logs = "starting\n" + GPU_LINE + "\n\n"  # FallbackToLogsOnError: the log tail, fatal line last
    pods = [
        _pod("judge-worker-a", last=_terminated(2, logs, "2026-01-01T00:00:05Z")),
        _pod("judge-worker-b", state=_terminated(1, "judgequeue: error: connection refused", "2026-01-01T00:00:01Z")),
        _pod("judge-worker-c", last=_terminated(0, "bye", "2026-01-01T00:00:09Z")),  # a clean exit says nothing
        _pod("judge-worker-d", last=_terminated(137, "", "2026-01-01T00:00:09Z")),  # no message to quote
    ]
    failure = conditions.last_failure("worker", pods)
    assert failure == conditions.PodFailure("worker", "judge-worker-a", 2, GPU_LINE)
    assert conditions.last_failure("worker", pods[2:]) is None
    assert conditions.last_failure("worker", []) is None
    long = conditions.last_failure("worker", [_pod("p", last=_terminated(1, "x" * 5000, "t"))])
    assert long is not None and len(long.message) == conditions.MESSAGE_LIMIT and long.message.endswith("...")


def test_rollout_names_why_a_role_is_unavailable() -> None:
    up = {"metadata": {"generation": 1}, "spec": {"replicas": 1},
          "status": {"observedGeneration": 1, "availableReplicas": 1, "readyReplicas": 1, "updatedReplicas": 1}}
    down = {"metadata": {"generation": 1}, "spec": {"replicas": 1},
            "status": {"observedGeneration": 1, "availableReplicas": 0, "updatedReplicas": 1}}
    roles = [conditions.availability("dispatcher", up), conditions.availability("worker", down),
             conditions.availability("reaper", up)]
    gpu = conditions.PodFailure("worker", "judge-worker-a", 2, GPU_LINE)
    ready, _, degraded = conditions.rollout(roles, [gpu])
    assert (ready.status, ready.reason) == ("False", "ContainersFailing")
    assert ready.message == f"available replicas: worker 0/1; worker pod judge-worker-a exited 2: {GPU_LINE}"
    assert (degraded.status, degraded.reason) == ("True", "RoleMisconfigured") and GPU_LINE in degraded.message
    # A runtime failure (exit 1: say, Postgres unreachable) is quoted; it is a crash, not a configuration error.
    ready, _, degraded = conditions.rollout(roles, [conditions.PodFailure("worker", "p", 1, "connection refused")])
    assert "connection refused" in ready.message
    assert (degraded.status, degraded.reason) == ("True", "ContainersFailing") and "exited 1" in degraded.message
    # A failure of a role that is available again is history, not the reason for anything.
    ready, _, degraded = conditions.rollout([*roles[:1], conditions.availability("worker", up), roles[2]], [gpu])
    assert (ready.status, degraded.status) == ("True", "False") and GPU_LINE not in ready.message
    ready, _, _ = conditions.rollout(roles)
    assert (ready.reason, ready.message) == ("ReplicasUnavailable", "available replicas: worker 0/1")


def test_role_containers_fall_back_to_logs_for_their_termination_message() -> None:
    parsed = parse_spec(SPEC, name="judge")
    assert isinstance(parsed, JudgeQueueSpec)
    for child in render.render_children(parsed, render.Owner("judge", "ns", "u"), worker_replicas=1)[:3]:
        container = child.body["spec"]["template"]["spec"]["containers"][0]
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert container["terminationMessagePath"] == "/dev/termination-log"


def _decide(backlog: int, current: int, now: float, state: autoscale.ScaleState) -> autoscale.ScaleDecision:
    return autoscale.decide(backlog=backlog, current=current, min_replicas=1, max_replicas=5,
                            target_per_replica=10, window=60, now=now, state=state)


def test_autoscaler_up_at_once_down_after_window() -> None:
    state = autoscale.ScaleState()
    d = _decide(35, 1, 0, state)
    assert d.replicas == 4 and d.changed and d.state.last_scale_up == 0
    d = _decide(1000, 4, 1, d.state)
    assert d.replicas == 5  # capped at max
    d = _decide(0, 5, 30, d.state)
    assert d.replicas == 5 and not d.changed  # inside the window
    d = _decide(0, 5, 61, d.state)
    assert d.replicas == 1 and d.changed
    # A count that still matches the backlog keeps the window from starting.
    d = _decide(50, 5, 100, autoscale.ScaleState(last_scale_up=0))
    assert not d.changed and d.state.last_busy == 100
    d = _decide(0, 5, 150, d.state)
    assert not d.changed
    # Nothing remembered (fresh status): the window starts now.
    d = _decide(0, 5, 500, autoscale.ScaleState())
    assert not d.changed and d.state.last_busy == 500
    # Out of bounds is corrected at once.
    assert _decide(0, 9, 0, autoscale.ScaleState()).replicas == 5
    assert _decide(0, 0, 0, autoscale.ScaleState()).replicas == 1


def test_rbac_rules() -> None:
    rules = rbac.render_rules(cluster=False)
    by_resource = {res: r for r in rules for res in r["resources"]}
    assert "patch" in by_resource["judgequeues/status"]["verbs"]
    assert set(by_resource["deployments"]["verbs"]) >= {"get", "create", "patch"}
    assert by_resource["secrets"]["verbs"] == ["get"]
    assert by_resource["pods"]["verbs"] == ["get", "list"]  # termination messages for status; nothing more
    assert "namespaces" not in by_resource
    cluster = rbac.render_role("jq-operator", kind="ClusterRole")
    assert any("namespaces" in r["resources"] for r in cluster["rules"])
    role = rbac.render_role("jq-operator", kind="Role", namespace="ops")
    assert role["metadata"]["namespace"] == "ops"
    with pytest.raises(ValueError):
        rbac.render_role("x", kind="Role")


def test_status_reports_the_intake_the_children_run_and_why() -> None:
    """status.workers.intake is the value rendered into the workers' and dispatchers' environment."""
    from judgequeue.controllers.fleet import workers_status as _workers_status
    from judgequeue.core.config import DIRECT_INTAKE_MAX_WORKERS as N

    for worker, intake, reason in [
        ({"maxReplicas": N}, "direct", f"auto: maxReplicas {N} <= {N}, direct"),
        ({"maxReplicas": N + 1}, "stream", f"auto: maxReplicas {N + 1} > {N}, stream"),
        ({"maxReplicas": N + 1, "intake": "direct"}, "direct", "direct: set in spec.worker.intake"),
    ]:
        spec = parsed(worker=worker)
        status = _workers_status(spec, OWNER, None)
        assert (status["intake"], status["intakeReason"]) == (intake, reason), worker
        for role in ("worker", "dispatcher"):
            env = {e["name"]: e["value"] for e in render.role_env(spec, role)}
            assert env["JUDGEQUEUE_INTAKE"] == intake, (worker, role)
