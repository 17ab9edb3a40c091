"""Status conditions of a ``JudgeQueue`` (pure; no I/O).

Conditions follow the Kubernetes convention: ``type``, ``status`` ("True"/"False"/"Unknown"),
``reason`` (CamelCase), ``message``, ``observedGeneration`` and ``lastTransitionTime``, which only
moves when the status flips, so ``kubectl`` shows how long a state has lasted.
"""

from __future__ import annotations

import re
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
    ``Progressing=False`` (``ProgressDeadlineExceeded``: no progress within progressDeadlineSeconds).

    ``replicas`` counts every pod the Deployment runs, old template and new; ``updated`` those of the
    current template. ``observed`` is False while the Deployment controller has not seen the current
    generation (its counts are then of the previous one). ``new_hash`` is the ``pod-template-hash``
    of the current template's pods (empty when unknown): which pods are the new ones in a rollout."""

    role: str
    desired: int
    ready: int
    available: int
    updated: int
    exists: bool = True
    refused: str = ""
    stuck: str = ""
    replicas: int = 0
    observed: bool = True
    new_hash: str = ""
    generation: int = 0

    @property
    def old(self) -> int:
        """Pods of an earlier template still running (or starting, or failing)."""
        return max(0, self.replicas - self.updated)

    @property
    def short(self) -> bool:
        return self.exists and self.available < self.desired

    @property
    def complete(self) -> bool:
        """The rollout is done: the controller saw the current spec, and exactly the desired number
        of pods run, all of the current template, all available. Anything else is still rolling."""
        return (self.exists and self.observed and self.updated == self.desired and self.replicas == self.desired
                and self.available >= self.desired and not self.stuck)

    def progress(self) -> str:
        """Where this role's rollout stands, e.g. ``worker: 1 of 1 updated, 1 old still running, 1 of
        1 available``."""
        if not self.observed:
            return f"{self.role}: generation {self.generation} not yet seen by the Deployment controller"
        text = f"{self.role}: {self.updated} of {self.desired} updated"
        if self.old:
            text += f", {self.old} old still running"
        return text + f", {self.available} of {self.desired} available"


#: The Deployment controller names the ReplicaSet of the current template in its Progressing
#: condition ("Created new replica set ...", "ReplicaSet ... is progressing.", "... has successfully
#: progressed.", "... has timed out progressing."): the pods of that ReplicaSet are the new ones.
_NEW_REPLICA_SET = re.compile(r'(?:ReplicaSet|replica set) "([^"]+)"')


def _new_hash(deployment: Mapping[str, Any], progressing: Mapping[str, Any]) -> str:
    name = str((deployment.get("metadata") or {}).get("name") or "")
    match = _NEW_REPLICA_SET.search(str(progressing.get("message") or ""))
    if not name or match is None or not match.group(1).startswith(name + "-"):
        return ""
    return match.group(1)[len(name) + 1:]


def availability(role: str, deployment: Mapping[str, Any] | None) -> RoleAvailability:
    """Read a Deployment's counts and conditions (a missing Deployment counts as nothing available).

    Conditions the Deployment controller has not written for the current generation yet say
    nothing about it, so a new rollout is never reported stuck because the previous one was."""
    if deployment is None:
        return RoleAvailability(role, 0, 0, 0, 0, exists=False)
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    desired = int(spec.get("replicas", 1))
    generation = int((deployment.get("metadata") or {}).get("generation", 0) or 0)
    stale = int(status.get("observedGeneration", 0) or 0) < generation
    conds = status.get("conditions") or []
    failure = find(conds, "ReplicaFailure") or {}
    progressing = find(conds, "Progressing") or {}
    refused = str(failure.get("message") or failure.get("reason") or "") if failure.get("status") == "True" else ""
    stuck = ""
    if progressing.get("status") == "False" and progressing.get("reason") == "ProgressDeadlineExceeded":
        stuck = str(progressing.get("message") or "ProgressDeadlineExceeded")
    available = int(status.get("availableReplicas", 0) or 0)
    updated = 0 if stale else int(status.get("updatedReplicas", 0) or 0)
    # status.replicas is omitted when it is 0, and then so is updatedReplicas.
    replicas = int(status.get("replicas", 0) or 0) if "replicas" in status else updated
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
        replicas=replicas,
        observed=not stale,
        new_hash="" if stale else _new_hash(deployment, progressing),
        generation=generation,
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


#: Failed tries of one waiting delivery after which an endpoint counts as failing (not a blip).
WEBHOOK_FAILING_ATTEMPTS = 3


def webhooks(
    configured: Sequence[str], problems: Mapping[str, str], health: Sequence[Any] | None
) -> Condition | None:
    """``WebhooksDelivering`` for the spec's webhooks (None when there are none), pure.

    False naming the endpoint when its configuration cannot work (``problems``: a missing Secret or
    key, a URL that is not one), when its deliveries are dead-lettered, or when one keeps failing
    (the receiver down, unreachable, answering errors), with its latest error; Unknown while the
    deliveries cannot be read (``health`` None); else True."""
    if not configured:
        return None
    found = [f"webhook {name}: {problems[name]}" for name in configured if name in problems]
    if found:
        return Condition("WebhooksDelivering", "False", "WebhookMisconfigured", "; ".join(found))
    if health is None:
        return Condition("WebhooksDelivering", "Unknown", "DeliveriesUnreadable",
                         "the webhook deliveries cannot be read from Postgres")  # fmt: skip
    by_name = {h.name: h for h in health if h.name in configured}
    dead = [h for h in by_name.values() if h.dead]
    if dead:
        message = "; ".join(f"webhook {h.name}: {h.dead} deliveries dead-lettered (latest error: {h.last_error}); "
                            "judgequeue events dead|replay" for h in dead)  # fmt: skip
        return Condition("WebhooksDelivering", "False", "WebhookDeadLetters", _clip(message))
    failing = [h for h in by_name.values() if h.failing_attempts >= WEBHOOK_FAILING_ATTEMPTS]
    if failing:
        message = "; ".join(f"webhook {h.name}: {h.pending} deliveries waiting, the oldest {h.oldest_pending_age:.0f}s,"
                            f" after {h.failing_attempts} tries: {h.last_error}" for h in failing)  # fmt: skip
        return Condition("WebhooksDelivering", "False", "WebhookFailing", _clip(message))
    waiting = sum(h.pending for h in by_name.values())
    return Condition("WebhooksDelivering", "True", "Delivering",
                     f"{len(configured)} webhooks, {waiting} deliveries waiting")  # fmt: skip


#: The exit code of a role refusing its configuration (core/cli/common.py EXIT_USAGE): restarts cannot fix it.
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
IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
START_FAILURE_REASONS = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")
WAITING_REASONS = IMAGE_PULL_REASONS + START_FAILURE_REASONS


@dataclass(frozen=True)
class PodWaiting:
    """Why one of a role's pods does not run yet, as the scheduler or the kubelet says it."""

    role: str
    pod: str
    reason: str
    message: str


def _deleting(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def _ready(pod: Mapping[str, Any]) -> bool:
    return (find((pod.get("status") or {}).get("conditions"), "Ready") or {}).get("status") == "True"


def current_pods(role: RoleAvailability, pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods of ``role``'s current template (``pod-template-hash`` is its ``new_hash``), none that
    is being deleted; every pod not being deleted while the current template's hash is unknown. In a
    rollout these are the new pods: what they do is the rollout's fate, not what the old ones do."""
    live = [p for p in pods if not _deleting(p)]
    if not role.new_hash:
        return live
    return [p for p in live if ((p.get("metadata") or {}).get("labels") or {}).get("pod-template-hash")
            == role.new_hash]


def waiting_pods(role: str, pods: Sequence[Mapping[str, Any]]) -> list[PodWaiting]:
    """Each of ``role``'s pods that is unschedulable (``PodScheduled=False``) or whose container waits
    for a named cause (:data:`WAITING_REASONS`: an image that cannot be pulled, a missing Secret
    key), with that message."""
    found: list[PodWaiting] = []
    for pod in pods:
        if _deleting(pod):
            continue
        name = str((pod.get("metadata") or {}).get("name", ""))
        status = pod.get("status") or {}
        scheduled = find(status.get("conditions"), "PodScheduled") or {}
        if scheduled.get("status") == "False":
            found.append(PodWaiting(role, name, str(scheduled.get("reason") or "Unschedulable"),
                                    _clip(str(scheduled.get("message") or ""))))
            continue
        for container in status.get("containerStatuses") or ():
            wait = (container.get("state") or {}).get("waiting") or {}
            if wait.get("reason") in WAITING_REASONS:
                found.append(PodWaiting(role, name, str(wait["reason"]), _clip(str(wait.get("message") or ""))))
                break
    return found


def waiting(role: str, pods: Sequence[Mapping[str, Any]]) -> PodWaiting | None:
    """The first of :func:`waiting_pods`, or None."""
    found = waiting_pods(role, pods)
    return found[0] if found else None


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
                    found.append((str(terminated.get("finishedAt") or ""), PodFailure(role, name, code,
                                                                                     _clip(lines[-1]))))
                    break  # the current state is more recent than lastState
    return max(found, key=lambda item: item[0])[1] if found else None


def failing(role: str, pods: Sequence[Mapping[str, Any]]) -> PodFailure | None:
    """Why ``role``'s pods crash: the newest non-zero exit of a pod that is not ready now (waiting in
    CrashLoopBackOff, or restarted and not ready again), quoting its termination message
    (:func:`last_failure`), else the kubelet's reason (``OOMKilled``, ``Error``). A pod that crashed
    once and runs ready again is history, not a failure. None if no pod is failing."""
    down = [p for p in pods if not _deleting(p) and not _ready(p)]
    found = last_failure(role, down)
    if found is not None:
        return found
    for pod in down:
        for status in (pod.get("status") or {}).get("containerStatuses") or ():
            state = status.get("state") or {}
            terminated = state.get("terminated") or ((status.get("lastState") or {}).get("terminated") or {})
            code = int(terminated.get("exitCode", 0) or 0)
            if code != 0:
                name = str((pod.get("metadata") or {}).get("name", ""))
                return PodFailure(role, name, code, str(terminated.get("reason") or "no termination message"))
    return None


def rollout_problems(
    roles: Sequence[RoleAvailability], failures: Sequence[PodFailure] = (), waits: Sequence[PodWaiting] = ()
) -> tuple[Condition, Condition, list[Problem]]:
    """Ready and Progressing from the children's rollouts, and what makes the JudgeQueue Degraded.

    A role is done (:attr:`RoleAvailability.complete`) only when its Deployment controller saw the
    current spec and it runs exactly the desired pods, all of the current template and available:
    a rollout whose new pods fail while the old ones still serve is not Ready, and Progressing says
    how many are old and new. Degraded are pods the API server refuses to create (``ReplicaFailure``:
    PodSecurity and other admission, quotas), a rollout past its progress deadline, and, whatever the
    deadline, new pods that fail: a role that exited refusing its configuration (exit 2: an
    uninstalled judge plugin, a bad variable; restarts cannot fix it), containers that crash, an image
    that cannot be pulled, a container that cannot be created.

    ``failures`` (:func:`failing`) and ``waits`` (:func:`waiting_pods`) are read from the current template's
    pods of the roles not done (:func:`current_pods`); Ready quotes them, so ``kubectl get jq`` says
    why, not just "worker 0/1".
    """
    missing = [r.role for r in roles if not r.exists]
    incomplete = [r for r in roles if r.exists and not r.complete]
    short = [r for r in incomplete if r.short]
    open_roles = {r.role for r in incomplete}
    crashing = [f for f in failures if f.role in open_roles]
    pending = [w for w in waits if w.role in open_roles]
    refused = [r for r in roles if r.exists and r.refused]
    stuck = [r for r in roles if r.exists and r.stuck]
    problems: list[Problem] = []
    for r in refused:
        problems.append(Problem("PodsRefused", f"{r.role} pods refused: {r.refused}"))
    for r in stuck:
        why = "".join(f"; pod {w.pod} {w.reason}: {w.message}" for w in pending if w.role == r.role)
        problems.append(Problem("RolloutStuck", f"{r.role} rollout stuck: {r.stuck}{why}"))
    for f in crashing:
        if f.exit_code == CONFIG_EXIT_CODE:
            problems.append(Problem("RoleMisconfigured", f"{f.role} refuses its configuration: {f.message}"))
        else:
            problems.append(Problem("ContainersFailing", f"{f.role} pod {f.pod} exited {f.exit_code}: {f.message}"))
    for w in pending:
        if w.reason in IMAGE_PULL_REASONS:
            problems.append(Problem("ImagePullFailed", f"{w.role} pod {w.pod} {w.reason}: {w.message}"))
        elif w.reason in START_FAILURE_REASONS:
            problems.append(Problem("ContainersFailing", f"{w.role} pod {w.pod} {w.reason}: {w.message}"))
    if missing:
        ready = Condition("Ready", "False", "ChildrenMissing", f"not created yet: {', '.join(missing)}")
    elif incomplete:
        parts = []
        if short:
            parts.append("available replicas: " + ", ".join(f"{r.role} {r.available}/{r.desired}" for r in short))
        rolling = [r for r in incomplete if r.old or not r.observed or r.updated < r.desired]
        if rolling:
            parts.append("rollout not finished: " + "; ".join(r.progress() for r in rolling))
        message = "; ".join(parts)
        refused_open = [r for r in refused if r.role in open_roles]
        if refused_open:
            why = "; ".join(f"{r.role} pods refused: {r.refused}" for r in refused_open)
            ready = Condition("Ready", "False", "PodsRefused", f"{message}; {why}")
        elif crashing:
            why = "; ".join(f"{f.role} pod {f.pod} exited {f.exit_code}: {f.message}" for f in crashing)
            ready = Condition("Ready", "False", "ContainersFailing", f"{message}; {why}")
        elif pending:
            why = "; ".join(f"{w.role} pod {w.pod} {w.reason}: {w.message}" for w in pending)
            ready = Condition("Ready", "False", "PodsPending", f"{message}; {why}")
        elif short:
            ready = Condition("Ready", "False", "ReplicasUnavailable", message)
        else:
            ready = Condition("Ready", "False", "RollingOut", message)
    else:
        detail = ", ".join(f"{r.role} {r.available}/{r.desired}" for r in roles)
        ready = Condition("Ready", "True", "AllReplicasAvailable", detail)
    if stuck:
        progressing = Condition("Progressing", "False", "RolloutStuck",
                                "; ".join(f"{r.role}: {r.stuck}" for r in stuck))
    elif missing or incomplete:
        lines = [f"creating {', '.join(missing)}"] if missing else []
        progressing = Condition("Progressing", "True", "RollingOut",
                                "; ".join(lines + [r.progress() for r in incomplete]))
    else:
        progressing = Condition("Progressing", "False", "Reconciled", "children match the spec")
    return ready, progressing, problems


def rollout(
    roles: Sequence[RoleAvailability], failures: Sequence[PodFailure] = (), waits: Sequence[PodWaiting] = ()
) -> list[Condition]:
    """Ready / Progressing / Degraded from the children alone (:func:`rollout_problems`)."""
    ready, progressing, problems = rollout_problems(roles, failures, waits)
    return [ready, progressing, degraded(problems)]
