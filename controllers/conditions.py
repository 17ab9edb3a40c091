"""Status conditions of a ``JudgeQueue`` (pure; no I/O).

Conditions follow the Kubernetes convention: ``type``, ``status`` ("True"/"False"/"Unknown"),
``reason`` (CamelCase), ``message``, ``observedGeneration`` and ``lastTransitionTime``, which only
moves when the status flips, so ``kubectl`` shows how long a state has lasted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

Status = Literal["True", "False", "Unknown"]
CONDITION_TYPES = ("Ready", "Progressing", "Degraded", "CutoverApplied")


@dataclass(frozen=True)
class Condition:
    type: str
    status: Status
    reason: str
    message: str


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(
    previous: Sequence[Mapping[str, Any]] | None,
    updates: Iterable[Condition],
    *,
    generation: int,
    now: datetime,
) -> list[dict[str, Any]]:
    """Apply ``updates`` to the ``previous`` conditions list, keeping other types as they were.

    ``lastTransitionTime`` is kept when a condition's status did not change.
    """
    by_type: dict[str, dict[str, Any]] = {str(c.get("type")): dict(c) for c in previous or () if c.get("type")}
    for cond in updates:
        old = by_type.get(cond.type)
        moved = old is None or old.get("status") != cond.status or not old.get("lastTransitionTime")
        by_type[cond.type] = {
            "type": cond.type,
            "status": cond.status,
            "reason": cond.reason,
            "message": cond.message,
            "observedGeneration": generation,
            "lastTransitionTime": rfc3339(now) if moved or old is None else old["lastTransitionTime"],
        }
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(by_type.values(), key=lambda c: (order.get(c["type"], len(order)), c["type"]))


def find(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    for cond in conditions or ():
        if cond.get("type") == type_:
            return cond
    return None


@dataclass(frozen=True)
class RoleAvailability:
    """Replica counts of one child Deployment as reported in its status."""

    role: str
    desired: int
    ready: int
    available: int
    updated: int
    exists: bool = True


def availability(role: str, deployment: Mapping[str, Any] | None) -> RoleAvailability:
    """Read a Deployment's counts (a missing Deployment counts as nothing available)."""
    if deployment is None:
        return RoleAvailability(role, 0, 0, 0, 0, exists=False)
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    desired = int(spec.get("replicas", 1))
    stale = status.get("observedGeneration") is not None and int(status["observedGeneration"]) < int(
        (deployment.get("metadata") or {}).get("generation", 0)
    )
    return RoleAvailability(
        role=role,
        desired=desired,
        ready=int(status.get("readyReplicas", 0) or 0),
        available=int(status.get("availableReplicas", 0) or 0),
        updated=0 if stale else int(status.get("updatedReplicas", 0) or 0),
    )


def invalid_spec(errors: Sequence[str]) -> list[Condition]:
    """Conditions for a spec the operator refuses to apply (children left as they are)."""
    message = "; ".join(errors)
    return [
        Condition("Degraded", "True", "InvalidSpec", message),
        Condition("Progressing", "False", "InvalidSpec", "the spec is invalid; nothing was changed"),
    ]


def failure(reason: str, message: str) -> list[Condition]:
    return [
        Condition("Degraded", "True", reason, message),
        Condition("Progressing", "False", reason, message),
    ]


#: The exit code of a role refusing its configuration (core/cli.py EXIT_USAGE): restarts cannot fix it.
CONFIG_EXIT_CODE = 2
#: How much of a termination message a condition quotes (the kubelet keeps up to 4096 bytes).
MESSAGE_LIMIT = 400


@dataclass(frozen=True)
class PodFailure:
    """Why one of a role's containers last stopped, as its pod status tells it."""

    role: str
    pod: str
    exit_code: int
    message: str


def last_failure(role: str, pods: Sequence[Mapping[str, Any]]) -> PodFailure | None:
    """The most recent non-zero container exit among ``role``'s pods that left a termination message
    (``state.terminated``, else ``lastState.terminated`` of a restarted container), or None.

    The message is the last non-empty line of the termination message: a role's fatal error is one
    line, and with ``FallbackToLogsOnError`` the kubelet takes the log tail, whose last line it is.
    """
    found: list[tuple[str, PodFailure]] = []
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name", ""))
        for status in (pod.get("status") or {}).get("containerStatuses") or ():
            for where in ("state", "lastState"):
                terminated = (status.get(where) or {}).get("terminated") or {}
                code = int(terminated.get("exitCode", 0) or 0)
                lines = [line.strip() for line in str(terminated.get("message") or "").splitlines() if line.strip()]
                if code != 0 and lines:
                    text = lines[-1]
                    if len(text) > MESSAGE_LIMIT:
                        text = text[: MESSAGE_LIMIT - 3] + "..."
                    found.append((str(terminated.get("finishedAt") or ""), PodFailure(role, name, code, text)))
                    break  # the current state is more recent than lastState
    return max(found, key=lambda item: item[0])[1] if found else None


def rollout(roles: Sequence[RoleAvailability], failures: Sequence[PodFailure] = ()) -> list[Condition]:
    """Ready / Progressing / Degraded from the children's availability after a successful reconcile.

    ``failures`` are the last termination messages of roles short of replicas (:func:`last_failure`):
    Ready quotes them, so ``kubectl get jq`` says why, not just "worker 0/1"; a role that exited
    refusing its configuration (exit 2: an uninstalled judge plugin, a bad variable) also makes the
    JudgeQueue Degraded, since restarting it cannot help.
    """
    missing = [r.role for r in roles if not r.exists]
    short = [r for r in roles if r.exists and r.available < r.desired]
    rolling = [r for r in roles if r.exists and r.updated < r.desired]
    short_roles = {r.role for r in short}
    failing = [f for f in failures if f.role in short_roles]
    if missing:
        ready = Condition("Ready", "False", "ChildrenMissing", f"not created yet: {', '.join(missing)}")
    elif short:
        detail = ", ".join(f"{r.role} {r.available}/{r.desired}" for r in short)
        message = f"available replicas: {detail}"
        if failing:
            why = "; ".join(f"{f.role} pod {f.pod} exited {f.exit_code}: {f.message}" for f in failing)
            ready = Condition("Ready", "False", "ContainersFailing", f"{message}; {why}")
        else:
            ready = Condition("Ready", "False", "ReplicasUnavailable", message)
    else:
        detail = ", ".join(f"{r.role} {r.available}/{r.desired}" for r in roles)
        ready = Condition("Ready", "True", "AllReplicasAvailable", detail)
    if rolling or short or missing:
        progressing = Condition("Progressing", "True", "RollingOut", "children are being updated")
    else:
        progressing = Condition("Progressing", "False", "Reconciled", "children match the spec")
    misconfigured = [f for f in failing if f.exit_code == CONFIG_EXIT_CODE]
    if misconfigured and not missing:
        why = "; ".join(f"{f.role} refuses its configuration: {f.message}" for f in misconfigured)
        return [ready, progressing, Condition("Degraded", "True", "RoleMisconfigured", why)]
    return [ready, progressing, Condition("Degraded", "False", "Reconciled", "the spec is applied")]
