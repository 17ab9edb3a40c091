"""The JudgeQueue's Deployments: made equal to their rendering, stopped, and read back (why the
pods of a rollout do not run, the workers' counts for status)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from judgequeue.core.spec import JudgeQueueSpec, fleet_intake

from . import conditions, redact
from .actions import log_action, log_problem
from .children import sync_child
from .conditions import Problem
from .kube import KIND_REFS, PODS, KubeApi, KubeError
from .kube_events import warn_event
from .render import (
    SHADOW_WORKER,
    Owner,
    optional_children,
    render_children,
    selector_labels,
    worker_replicas,
)
from .state import OperatorState, jq_name, owned_by


async def pod_states(
    api: KubeApi, owner: Owner, roles: list[conditions.RoleAvailability],
) -> tuple[list[conditions.PodFailure], list[conditions.PodWaiting]]:
    """Why each role whose rollout is not done is not, read from the pods of its current template
    (:func:`conditions.current_pods`: in a rollout, the new ones): the last termination message of
    a crashing container (an uninstalled judge plugin), or why a pod does not run yet (unschedulable,
    an image that cannot be pulled). Best effort: an API error (say, RBAC without ``pods: list``)
    leaves status at the counts."""
    failures: list[conditions.PodFailure] = []
    waits: list[conditions.PodWaiting] = []
    for role in roles:
        if not role.exists or role.complete:
            continue
        labels = {**selector_labels(owner.name), "app.kubernetes.io/component": role.role}
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        try:
            pods = await api.list_objects(PODS, owner.namespace, label_selector=selector)
        except KubeError as exc:
            log_problem(jq_name(owner), f"cannot read {role.role} pods for why they are unavailable: {exc}")
            continue
        current = conditions.current_pods(role, pods)
        failure = conditions.failing(role.role, current)
        if failure is not None:
            failures.append(failure)
        waits += conditions.waiting_pods(role.role, current)
    return failures, waits


async def apply_children(
    state: OperatorState, body: Mapping[str, Any], spec: JudgeQueueSpec, owner: Owner, *, keep_live_workers: bool,
    shadow_mode: bool = False,
) -> tuple[dict[str, dict[str, Any]], list[Problem]]:
    """Make every child equal to its rendering (created, replaced, deleted when no longer rendered);
    returns the live objects afterwards and the API server's refusals, one problem each (the other
    children are still reconciled)."""
    api = state.api
    verified = state.verified.setdefault(owner.uid, {})
    live_worker = await api.get(KIND_REFS["Deployment"], owner.namespace, f"{owner.name}-worker")
    live_replicas = (live_worker or {}).get("spec", {}).get("replicas") if live_worker else None
    replicas = live_replicas if keep_live_workers and live_replicas is not None else worker_replicas(
        spec, live_replicas)
    desired = render_children(spec, owner, worker_replicas=replicas, shadow_mode=shadow_mode)
    result: dict[str, dict[str, Any]] = {}
    problems: list[Problem] = []
    for child in desired:
        what = f"{child.kind} {child.name}"
        try:
            live = live_worker if child.name == f"{owner.name}-worker" else await api.get(
                KIND_REFS[child.kind], owner.namespace, child.name)
            synced = await sync_child(api, owner.namespace, child, live, verified)
        except KubeError as exc:
            if not exc.refused:
                raise
            verified.pop(child.name, None)
            message = f"{what}: {exc.api_message}"
            problems.append(Problem("ChildRefused", message))
            log_problem(jq_name(owner), f"the API server refused {message}", object=what)
            warn_event(state, body, "ChildRefused", message)
            continue
        result[child.name] = synced.live
        if synced.action == "create":
            log_action("create", what, "missing", judgequeue=jq_name(owner), diff=child.body.get("spec"))
        elif synced.action == "replace":
            paths = ", ".join(d.path for d in synced.diffs[:12])
            why = "changed outside the spec" if synced.drift else "the spec changed"
            shown = [redact.difference(d) for d in synced.diffs]  # someone's env var may hold a password
            log_action("replace", what, f"{why}: {paths}", judgequeue=jq_name(owner),
                       diff=[d.describe(400) for d in shown])
            if synced.drift:
                warn_event(state, body, "DriftReverted",
                           f"{what}: reverted changes made outside the spec: "
                           + "; ".join(d.describe() for d in shown[:12]))
    rendered = {(c.kind, c.name) for c in desired}
    for kind, name in optional_children(owner):
        if (kind, name) in rendered:
            continue
        live = await api.get(KIND_REFS[kind], owner.namespace, name)
        if live is None or not owned_by(live, owner):
            continue  # never ours (someone's own policy of that name): leave it
        await api.delete(KIND_REFS[kind], owner.namespace, name, uid=live["metadata"].get("uid"))
        verified.pop(name, None)
        log_action("delete", f"{kind} {name}", "the spec no longer renders it", judgequeue=jq_name(owner))
    return result, problems


FLEET = ("dispatcher", "worker", "reaper", SHADOW_WORKER)


async def stop_fleet(state: OperatorState, owner: Owner, why: str) -> None:
    """Scale every Deployment of this JudgeQueue to zero (a JudgeQueue that does not own its queue
    runs nothing on it); creates nothing."""
    verified = state.verified.get(owner.uid, {})
    for role in FLEET:
        name = f"{owner.name}-{role}"
        live = await state.api.get(KIND_REFS["Deployment"], owner.namespace, name)
        if live is None or not owned_by(live, owner) or int((live.get("spec") or {}).get("replicas", 1)) == 0:
            continue
        current = int(live["spec"].get("replicas", 1))
        await state.api.patch(KIND_REFS["Deployment"], owner.namespace, name, {"spec": {"replicas": 0}})
        verified.pop(name, None)
        log_action("scale", f"Deployment {name}", f"{role}s {current} -> 0: {why}", judgequeue=jq_name(owner),
                   fields={"replicas": 0, "from": current})


def workers_status(spec: JudgeQueueSpec, owner: Owner, live: Mapping[str, Any] | None) -> dict[str, Any]:
    selector = ",".join(f"{k}={v}" for k, v in selector_labels(owner.name, "worker").items())
    live_spec = (live or {}).get("spec") or {}
    live_status = (live or {}).get("status") or {}
    intake = fleet_intake(spec)  # what render_children gave the workers' and dispatchers' environment
    return {
        "replicas": int(live_spec.get("replicas", 0) or 0),
        "ready": int(live_status.get("readyReplicas", 0) or 0),
        "selector": selector,
        "autoscaling": spec.worker.autoscaling,
        "intake": intake.intake,
        "intakeReason": intake.reason,
    }
