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


def rollout(roles: Sequence[RoleAvailability]) -> list[Condition]:
    """Ready / Progressing / Degraded from the children's availability after a successful reconcile."""
    missing = [r.role for r in roles if not r.exists]
    short = [r for r in roles if r.exists and r.available < r.desired]
    rolling = [r for r in roles if r.exists and r.updated < r.desired]
    if missing:
        ready = Condition("Ready", "False", "ChildrenMissing", f"not created yet: {', '.join(missing)}")
    elif short:
        detail = ", ".join(f"{r.role} {r.available}/{r.desired}" for r in short)
        ready = Condition("Ready", "False", "ReplicasUnavailable", f"available replicas: {detail}")
    else:
        detail = ", ".join(f"{r.role} {r.available}/{r.desired}" for r in roles)
        ready = Condition("Ready", "True", "AllReplicasAvailable", detail)
    if rolling or short or missing:
        progressing = Condition("Progressing", "True", "RollingOut", "children are being updated")
    else:
        progressing = Condition("Progressing", "False", "Reconciled", "children match the spec")
    return [ready, progressing, Condition("Degraded", "False", "Reconciled", "the spec is applied")]
