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
    """Replica counts of one child Deployment as reported in its status, and what its own
    conditions say went wrong: ``refused`` is the message of ``ReplicaFailure`` (the ReplicaSet
    could not create pods: admission such as PodSecurity, a quota), ``stuck`` the message of
    ``Progressing=False`` (``ProgressDeadlineExceeded``: no progress within progressDeadlineSeconds)."""

    role: str
    desired: int
    ready: int
    available: int
    updated: int
    exists: bool = True
    refused: str = ""
    stuck: str = ""


def availability(role: str, deployment: Mapping[str, Any] | None) -> RoleAvailability:
    """Read a Deployment's counts and conditions (a missing Deployment counts as nothing available).

    Conditions the Deployment controller has not written for the current generation yet say
    nothing about it, so a new rollout is never reported stuck because the previous one was."""
    if deployment is None:
        return RoleAvailability(role, 0, 0, 0, 0, exists=False)
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    desired = int(spec.get("replicas", 1))
    stale = status.get("observedGeneration") is not None and int(status["observedGeneration"]) < int(
        (deployment.get("metadata") or {}).get("generation", 0)
    )
    conds = status.get("conditions") or []
    failure = find(conds, "ReplicaFailure") or {}
    progressing = find(conds, "Progressing") or {}
    refused = str(failure.get("message") or failure.get("reason") or "") if failure.get("status") == "True" else ""
    stuck = ""
    if progressing.get("status") == "False" and progressing.get("reason") == "ProgressDeadlineExceeded":
        stuck = str(progressing.get("message") or "ProgressDeadlineExceeded")
    available = int(status.get("availableReplicas", 0) or 0)
    updated = 0 if stale else int(status.get("updatedReplicas", 0) or 0)
    # A rollout that has every pod it wants updated and available refuses none: a ReplicaFailure
    # still shown then is an old ReplicaSet's, cleared at its next sync (Ready must not meet Degraded).
    complete = updated >= desired and available >= desired
    return RoleAvailability(
        role=role,
        desired=desired,
        ready=int(status.get("readyReplicas", 0) or 0),
        available=available,
        updated=updated,
        refused="" if stale or complete else refused,
        stuck="" if stale else stuck,
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


@dataclass(frozen=True)
class Problem:
    """One thing a reconcile could not do, or found wrong: a CamelCase reason and the cause's own
    message (the API server's, the Deployment controller's, a role's last line)."""

    reason: str
    message: str


def degraded(problems: Sequence[Problem]) -> Condition:
    """``Degraded``: True with the first problem's reason and every problem's message, else False."""
    if not problems:
        return Condition("Degraded", "False", "Reconciled", "the spec is applied")
    message = "; ".join(dict.fromkeys(p.message for p in problems))  # each once, in order
    return Condition("Degraded", "True", problems[0].reason, message)


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


#: Container waiting reasons that name a cause (the kubelet's), as opposed to ContainerCreating.
WAITING_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                   "CreateContainerError", "RunContainerError")


@dataclass(frozen=True)
class PodWaiting:
    """Why one of a role's pods does not run yet, as the scheduler or the kubelet says it."""

    role: str
    pod: str
    reason: str
    message: str


def waiting(role: str, pods: Sequence[Mapping[str, Any]]) -> PodWaiting | None:
    """The first of ``role``'s pods that is unschedulable (``PodScheduled=False``) or whose container
    waits for a named cause (:data:`WAITING_REASONS`: an image that cannot be pulled, a missing
    Secret key), with that message; None if none is."""
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name", ""))
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        status = pod.get("status") or {}
        scheduled = find(status.get("conditions"), "PodScheduled") or {}
        if scheduled.get("status") == "False":
            return PodWaiting(role, name, str(scheduled.get("reason") or "Unschedulable"),
                              _clip(str(scheduled.get("message") or "")))
        for container in status.get("containerStatuses") or ():
            wait = (container.get("state") or {}).get("waiting") or {}
            if wait.get("reason") in WAITING_REASONS:
                return PodWaiting(role, name, str(wait["reason"]), _clip(str(wait.get("message") or "")))
    return None


def _clip(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


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


def rollout_problems(
    roles: Sequence[RoleAvailability], failures: Sequence[PodFailure] = (), waits: Sequence[PodWaiting] = ()
) -> tuple[Condition, Condition, list[Problem]]:
    """Ready and Progressing from the children's availability, and what makes the JudgeQueue
    Degraded: pods the API server refuses to create (``ReplicaFailure``: PodSecurity and other
    admission, quotas), a rollout past its progress deadline, and a role that exited refusing its
    configuration (exit 2: an uninstalled judge plugin, a bad variable), which restarts cannot fix.

    ``failures`` are the last termination messages of roles short of replicas (:func:`last_failure`)
    and ``waits`` why their pods do not run yet (:func:`waiting`): Ready quotes them, so ``kubectl get
    jq`` says why, not just "worker 0/1".
    """
    missing = [r.role for r in roles if not r.exists]
    short = [r for r in roles if r.exists and r.available < r.desired]
    rolling = [r for r in roles if r.exists and r.updated < r.desired]
    short_roles = {r.role for r in short}
    failing = [f for f in failures if f.role in short_roles]
    pending = [w for w in waits if w.role in short_roles]
    refused = [r for r in roles if r.exists and r.refused]
    stuck = [r for r in roles if r.exists and r.stuck]
    problems: list[Problem] = []
    for r in refused:
        problems.append(Problem("PodsRefused", f"{r.role} pods refused: {r.refused}"))
    for r in stuck:
        why = "".join(f"; pod {w.pod} {w.reason}: {w.message}" for w in pending if w.role == r.role)
        problems.append(Problem("RolloutStuck", f"{r.role} rollout stuck: {r.stuck}{why}"))
    if not missing:
        problems += [Problem("RoleMisconfigured", f"{f.role} refuses its configuration: {f.message}")
                     for f in failing if f.exit_code == CONFIG_EXIT_CODE]
    if missing:
        ready = Condition("Ready", "False", "ChildrenMissing", f"not created yet: {', '.join(missing)}")
    elif short:
        detail = ", ".join(f"{r.role} {r.available}/{r.desired}" for r in short)
        message = f"available replicas: {detail}"
        refused_short = [r for r in refused if r.role in short_roles]
        if refused_short:
            why = "; ".join(f"{r.role} pods refused: {r.refused}" for r in refused_short)
            ready = Condition("Ready", "False", "PodsRefused", f"{message}; {why}")
        elif failing:
            why = "; ".join(f"{f.role} pod {f.pod} exited {f.exit_code}: {f.message}" for f in failing)
            ready = Condition("Ready", "False", "ContainersFailing", f"{message}; {why}")
        elif pending:
            why = "; ".join(f"{w.role} pod {w.pod} {w.reason}: {w.message}" for w in pending)
            ready = Condition("Ready", "False", "PodsPending", f"{message}; {why}")
        else:
            ready = Condition("Ready", "False", "ReplicasUnavailable", message)
    else:
        detail = ", ".join(f"{r.role} {r.available}/{r.desired}" for r in roles)
        ready = Condition("Ready", "True", "AllReplicasAvailable", detail)
    if rolling or short or missing:
        progressing = Condition("Progressing", "True", "RollingOut", "children are being updated")
    else:
        progressing = Condition("Progressing", "False", "Reconciled", "children match the spec")
    return ready, progressing, problems


def rollout(
    roles: Sequence[RoleAvailability], failures: Sequence[PodFailure] = (), waits: Sequence[PodWaiting] = ()
) -> list[Condition]:
    """Ready / Progressing / Degraded from the children alone (:func:`rollout_problems`)."""
    ready, progressing, problems = rollout_problems(roles, failures, waits)
    return [ready, progressing, degraded(problems)]
