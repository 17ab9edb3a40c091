"""Kopf handlers: reconcile children and cutover flags, refresh status, autoscale workers.

Reconcile is level-based: every change (create, update, resume after a restart) and every timer tick
renders the desired children and makes the live ones equal to them (:mod:`.children`: created when
missing, replaced when anything differs, including fields someone added), holds the queue row's
flags to the spec (:mod:`.cutover`: restored or reported when changed outside it), and reads the
children's state into status. The timer also scales workers on the backlog unless
``worker.autoscaling: external``. A daemon per JudgeQueue makes a pass as soon as its queue row
changes in Postgres (a LISTEN) or one of its Deployments changes (a watch), and every 2 s while a
rollout is in flight. Handlers of one object are serialised with a lock, and a pass never renders
from a generation the change handlers have not processed yet.

Status never lies: every step that fails (a child the API server refuses, pods admission refuses, a
rollout past its deadline or whose new pods fail, a bad connection string, a missing Secret, a role
refusing its configuration, the database out of reach, a queue another JudgeQueue owns) makes
``Degraded`` True with a reason and the cause's own message, written on the same pass, and the next
pass that finds it fixed clears it; each failure is a Warning Event and each condition change an
Event, and nothing secret is quoted (:mod:`.redact`). One queue, one fleet: a JudgeQueue that does
not own its queue runs nothing on it, and a queue changes hands only once the old fleet is off it.
The operator writes status and children, never the spec."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast
from urllib.parse import urlsplit

import asyncpg
import kopf
from redis.exceptions import RedisError

from judgequeue.core.base.errors import JudgeQueueError
from judgequeue.core.spec import ENDPOINT_URL_PATTERN, JudgeQueueSpec, fleet_intake, parse_spec
from judgequeue.core.store.backlog import Backlog, read_backlog
from judgequeue.core.store.events import webhook_health
from judgequeue.core.store.queues import listen_queues, owned_queues, release_queue
from judgequeue.core.transport.connect import connect_postgres, redis_client
from judgequeue.core.transport.redis_url import validate_redis_url

from . import autoscale, conditions, cutover, redact
from .actions import log_action, log_problem
from .children import Verified, sync_child
from .conditions import Problem
from .kube import KIND_REFS, PODS, KubeApi, KubeError, SecretNotFound
from .render import (
    GROUP,
    MANAGED_BY,
    PLURAL,
    SHADOW_WORKER,
    VERSION,
    Owner,
    name_errors,
    optional_children,
    render_children,
    selector_labels,
    worker_replicas,
)

Status = dict[str, Any]
Log = logging.Logger | logging.LoggerAdapter[Any]

#: Degraded reasons that stop the autoscaler: scaling a fleet that cannot run, or is not ours, helps nobody.
NO_AUTOSCALE = ("QueueOwned", "QueueHandedOver", "RoleMisconfigured", "ChildRefused", "PodsRefused", "ImagePullFailed")


@dataclass(frozen=True)
class OperatorConfig:
    """Operator-wide knobs (not per JudgeQueue)."""

    interval: float = 10.0  # timer: autoscale, status refresh, retries
    db_timeout: float = 5.0  # connecting to Postgres/Redis for cutover and backlog


@dataclass
class OperatorState:
    """Shared by every handler of one operator process."""

    config: OperatorConfig
    kube: KubeApi | None = None
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # (namespace/name, generation) -> how many times a change handler ran; tests assert "once".
    handled: collections.Counter[tuple[str, int]] = field(default_factory=collections.Counter)
    # (uid, reason) -> (message, monotonic time) of the last Warning Event posted, to rate-limit them.
    warned: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)
    # JudgeQueue uid -> child name -> what was last verified equal to the rendered child.
    verified: dict[str, dict[str, Verified]] = field(default_factory=dict)
    # JudgeQueue uid -> what its daemon (follow_queue_row) waits on to make a pass at once.
    pokes: dict[str, asyncio.Event] = field(default_factory=dict)

    def poke(self, uid: str) -> None:
        """Ask the daemon of JudgeQueue ``uid`` for a pass now (nothing if none runs)."""
        event = self.pokes.get(uid)
        if event is not None:
            event.set()

    def lock(self, uid: str) -> asyncio.Lock:
        return self.locks.setdefault(uid, asyncio.Lock())

    def forget(self, uid: str) -> None:
        self.locks.pop(uid, None)
        self.verified.pop(uid, None)
        for key in [k for k in self.warned if k[0] == uid]:
            del self.warned[key]

    @property
    def api(self) -> KubeApi:
        if self.kube is None:
            raise RuntimeError("the Kubernetes client is not set up (operator not started)")
        return self.kube


WARNING_EVENT_REPEAT = 60.0  # seconds before the same Warning Event is posted again for one object


def warn_event(state: OperatorState, body: Mapping[str, Any], reason: str, message: str) -> None:
    """Post a Warning Event on the JudgeQueue (``kubectl describe jq`` shows it) for a failed reconcile.

    Kopf posts no Events from log messages by default, so a reconcile retrying a refusal (RBAC,
    admission, a missing Secret) would be visible only in the operator's logs. The same reason and
    message are posted at most once a minute per object, so a retry loop does not flood the API.
    """
    message = redact.redact(message)
    key = (str(body["metadata"].get("uid", "")), reason)
    now = time.monotonic()
    last = state.warned.get(key)
    if last is not None and last[0] == message and now - last[1] < WARNING_EVENT_REPEAT:
        return
    state.warned[key] = (message, now)
    kopf.warn(cast(kopf.Body, body), reason=reason, message=message[:1000])


def normal_event(body: Mapping[str, Any], reason: str, message: str) -> None:
    """Post a Normal Event on the JudgeQueue (scrubbed like every Event)."""
    kopf.event(cast(kopf.Body, body), type="Normal", reason=reason, message=redact.redact(message)[:1000])


#: Conditions in their unwelcome state for these reasons are no failure: a rollout or a start in
#: progress, a flip waiting for open submits.
BENIGN_REASONS = ("RollingOut", "ReplicasUnavailable", "ChildrenMissing", "PodsPending", "WaitingForSubmits")


def failing_condition(cond: Mapping[str, Any]) -> bool:
    """True when ``cond`` reports a failure: Degraded True, Ready or CutoverApplied False, or
    Progressing False other than for a finished rollout, for a reason that is not benign."""
    kind, status, reason = cond.get("type"), cond.get("status"), cond.get("reason")
    unwelcome = (status == "True") if kind == "Degraded" else (
        status == "False" and (kind != "Progressing" or reason != "Reconciled"))
    return unwelcome and reason not in BENIGN_REASONS


def announce(state: OperatorState, body: Mapping[str, Any], previous: Any, current: Any) -> None:
    """One Event per condition change (its status or reason moved), with the condition's reason and
    message: a Warning when it now reports a failure (:func:`failing_condition`), else Normal, so
    ``kubectl describe jq`` tells the story of a JudgeQueue, failures and recoveries alike. Warnings
    go through :func:`warn_event` (the one a reconcile step posted for the same failure is not
    posted twice)."""
    before = {c.get("type"): c for c in previous or ()}
    for cond in current or ():
        old = before.get(cond.get("type")) or {}
        if (old.get("status"), old.get("reason")) == (cond.get("status"), cond.get("reason")):
            continue
        reason, message = str(cond.get("reason") or cond.get("type")), str(cond.get("message") or "")
        if failing_condition(cond):
            warn_event(state, body, reason, message)
        else:
            normal_event(body, reason, message)


@dataclass(frozen=True)
class Connections:
    """Where the operator's own connections go, read from the JudgeQueue's Secrets; they are opened
    through :mod:`judgequeue.core.transport.connect` exactly as the roles open theirs, so the operator works
    behind the same PgBouncer (``pooler``) and with the same ``redis+sentinel://`` URL."""

    postgres_dsn: str
    redis_url: str
    pooler: str = "none"


def _now() -> datetime:
    return datetime.now(UTC)


def _owner(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def queue_owner(owner: Owner) -> str:
    """How a JudgeQueue is recorded as its queue's owner in Postgres."""
    return f"JudgeQueue {owner.namespace}/{owner.name}"


def _jq(owner: Owner) -> str:
    return f"{owner.namespace}/{owner.name}"


async def _connections(api: KubeApi, namespace: str, spec: JudgeQueueSpec) -> Connections:
    return Connections(
        postgres_dsn=await api.secret_value(namespace, spec.postgres.name, spec.postgres.key),
        redis_url=await api.secret_value(namespace, spec.redis.name, spec.redis.key),
        pooler=spec.postgres_pooler,
    )


async def _pod_states(
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
            log_problem(_jq(owner), f"cannot read {role.role} pods for why they are unavailable: {exc}")
            continue
        current = conditions.current_pods(role, pods)
        failure = conditions.failing(role.role, current)
        if failure is not None:
            failures.append(failure)
        waits += conditions.waiting_pods(role.role, current)
    return failures, waits


async def _apply_children(
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
            log_problem(_jq(owner), f"the API server refused {message}", object=what)
            warn_event(state, body, "ChildRefused", message)
            continue
        result[child.name] = synced.live
        if synced.action == "create":
            log_action("create", what, "missing", judgequeue=_jq(owner), diff=child.body.get("spec"))
        elif synced.action == "replace":
            paths = ", ".join(d.path for d in synced.diffs[:12])
            why = "changed outside the spec" if synced.drift else "the spec changed"
            shown = [redact.difference(d) for d in synced.diffs]  # someone's env var may hold a password
            log_action("replace", what, f"{why}: {paths}", judgequeue=_jq(owner),
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
        if live is None or not _owned_by(live, owner):
            continue  # never ours (someone's own policy of that name): leave it
        await api.delete(KIND_REFS[kind], owner.namespace, name, uid=live["metadata"].get("uid"))
        verified.pop(name, None)
        log_action("delete", f"{kind} {name}", "the spec no longer renders it", judgequeue=_jq(owner))
    return result, problems


FLEET = ("dispatcher", "worker", "reaper", SHADOW_WORKER)


async def _stop_fleet(state: OperatorState, owner: Owner, why: str) -> None:
    """Scale every Deployment of this JudgeQueue to zero (a JudgeQueue that does not own its queue
    runs nothing on it); creates nothing."""
    verified = state.verified.get(owner.uid, {})
    for role in FLEET:
        name = f"{owner.name}-{role}"
        live = await state.api.get(KIND_REFS["Deployment"], owner.namespace, name)
        if live is None or not _owned_by(live, owner) or int((live.get("spec") or {}).get("replicas", 1)) == 0:
            continue
        current = int(live["spec"].get("replicas", 1))
        await state.api.patch(KIND_REFS["Deployment"], owner.namespace, name, {"spec": {"replicas": 0}})
        verified.pop(name, None)
        log_action("scale", f"Deployment {name}", f"{role}s {current} -> 0: {why}", judgequeue=_jq(owner),
                   fields={"replicas": 0, "from": current})


async def _queues_in_use(state: OperatorState, owner: Owner) -> set[str] | None:
    """The queues this JudgeQueue's pods run on (``JUDGEQUEUE_QUEUE`` of each, terminating ones
    included); None when its pods cannot be read."""
    selector = ",".join(f"{k}={v}" for k, v in selector_labels(owner.name).items())
    try:
        pods = await state.api.list_objects(PODS, owner.namespace, label_selector=selector)
    except KubeError as exc:
        log_problem(_jq(owner), f"cannot read the pods to see which queues they run on: {exc}")
        return None
    return {str(env.get("value")) for pod in pods for container in (pod.get("spec") or {}).get("containers") or ()
            for env in container.get("env") or () if env.get("name") == "JUDGEQUEUE_QUEUE"}


async def _release_abandoned(state: OperatorState, owner: Owner, conns: Connections, queues: list[str]) -> None:
    """Release the queues this JudgeQueue still holds but its spec no longer names (``spec.queue``
    renamed), each once none of its pods runs on it any more: until then the old pods still serve it,
    and a JudgeQueue waiting for it must not start a second fleet there. The handoff of a renamed
    queue is thus: claim the new one, roll the pods over (or, when the new one is taken, scale to
    zero), release the old one when its last pod is gone."""
    if not queues:
        return
    in_use = await _queues_in_use(state, owner)
    free = [q for q in queues if in_use is not None and q not in in_use]
    if not free:
        return
    try:
        conn = await connect_postgres(conns.postgres_dsn, pooler=conns.pooler, timeout=state.config.db_timeout)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError, JudgeQueueError) as exc:
        log_problem(_jq(owner), f"cannot release {', '.join(free)} yet: {exc!r}")
        return
    try:
        for queue in free:
            if await release_queue(conn, queue, queue_owner(owner)):
                log_action("release", f"queue {queue}", "spec.queue names another queue now and no pod of this"
                           " JudgeQueue runs on it any more", judgequeue=_jq(owner))
    finally:
        await conn.close()


async def _owner_gone(state: OperatorState, recorded: str, queue: str) -> bool:
    """Whether ``recorded`` (a queue row's owner, ``JudgeQueue NS/NAME``) names a JudgeQueue that no
    longer exists and none of whose pods still runs on ``queue``: one deleted, its finalizer released
    by hand, while no operator ran, so nothing released its queue. Its pods are garbage-collected
    after it; until the last one on the queue is gone (or has been terminating for
    :data:`RELEASE_WAIT`: a lost node) its queue stays held, so two fleets never run on one queue.
    False whenever that cannot be known (another kind of owner, the API refusing the look)."""
    kind, _, ref = recorded.partition(" ")
    namespace, _, name = ref.partition("/")
    if kind != "JudgeQueue" or not namespace or not name or "/" in name:
        return False
    selector = ",".join(f"{k}={v}" for k, v in selector_labels(name).items())
    try:
        if await state.api.get(KIND_REFS["JudgeQueue"], namespace, name) is not None:
            return False
        pods = await state.api.list_objects(PODS, namespace, label_selector=selector)
    except KubeError as exc:
        log_problem(recorded, f"cannot tell whether the owner of queue {queue} still exists: {exc}")
        return False
    for pod in pods:
        if _deleting_for(pod) >= RELEASE_WAIT:
            continue
        env = [e for c in (pod.get("spec") or {}).get("containers") or () for e in c.get("env") or ()]
        if any(e.get("name") == "JUDGEQUEUE_QUEUE" and e.get("value") == queue for e in env):
            return False
    return True


def _owned_by(obj: Mapping[str, Any], owner: Owner) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("uid") == owner.uid and r.get("controller") for r in refs)


def _workers_status(spec: JudgeQueueSpec, owner: Owner, live: Mapping[str, Any] | None) -> dict[str, Any]:
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


def _refused(status: Mapping[str, Any], generation: int, problem: Problem) -> Status:
    """Status for a reconcile that wrote nothing: Degraded with ``problem``, nothing progressing."""
    updates = conditions.failure(problem.reason, problem.message)
    return {"observedGeneration": generation,
            "conditions": conditions.merge_conditions(status.get("conditions"), updates, generation=generation,
                                                      now=_now())}


def _claimed_before(status: Mapping[str, Any], spec: JudgeQueueSpec, owner: Owner) -> bool:
    previous = status.get("cutover") or {}
    return bool(previous.get("owner") == queue_owner(owner) and previous.get("queue") == spec.queue)


async def reconcile(
    body: Mapping[str, Any], state: OperatorState, *, tick: bool = False,
) -> Status:
    """Bring children and queue flags to the spec; returns the status fields to patch. ``tick``: also
    read the backlog and, unless autoscaling is external, scale the workers on it."""
    meta = body["metadata"]
    generation = int(meta.get("generation", 0))
    status: Mapping[str, Any] = body.get("status") or {}
    owner = _owner(body)
    jq = _jq(owner)
    parsed = parse_spec(body.get("spec"), name=meta["name"])
    errors = (parsed if isinstance(parsed, list) else []) + name_errors(meta["name"])
    if errors or isinstance(parsed, list):
        log_problem(jq, f"invalid spec, nothing changed: {'; '.join(errors)}", level=logging.ERROR)
        warn_event(state, body, "InvalidSpec", "; ".join(errors))
        return {
            "observedGeneration": generation,
            "conditions": conditions.merge_conditions(
                status.get("conditions"), conditions.invalid_spec(errors), generation=generation, now=_now()
            ),
        }
    api = state.api
    try:
        conns = await _connections(api, owner.namespace, parsed)
    except SecretNotFound as exc:
        log_problem(jq, f"{exc}; nothing changed, will retry", level=logging.ERROR)
        warn_event(state, body, "SecretNotFound", str(exc))
        return _refused(status, generation, Problem("SecretNotFound", str(exc)))
    try:
        validate_redis_url(conns.redis_url)
    except ValueError as exc:  # the message never echoes a password
        message = f"Secret {parsed.redis.name} key {parsed.redis.key}: the Redis URL {exc}"
        log_problem(jq, f"{message}; nothing changed, will retry", level=logging.ERROR)
        warn_event(state, body, "InvalidConnection", message)
        return _refused(status, generation, Problem("InvalidConnection", message))

    applied = conditions.find(status.get("conditions"), "CutoverApplied") or {}
    sync = await cutover.sync_queue(
        conns.postgres_dsn, parsed, owner=queue_owner(owner), previous=status.get("cutover") or {},
        generation=generation, connect_timeout=state.config.db_timeout, pooler=conns.pooler,
        previous_message=str(applied.get("message", "")), previous_reason=str(applied.get("reason", "")),
        owner_gone=lambda recorded, queue: _owner_gone(state, recorded, queue))
    _log_sync(sync, parsed, owner, body, state)
    if applied.get("status") == "True" and (sync.wrote is not None or sync.condition.status != "True"):
        # The row changed under the claim: say what it holds now, not after the children's pass.
        await _withdraw(state, body, [sync.condition], generation, {"cutover": sync.status} if sync.status else {})
    if sync.owned_by is not None or (sync.problem is not None and sync.problem.reason == "DatabaseUnavailable"
                                     and not _claimed_before(status, parsed, owner)):
        # Another JudgeQueue owns the queue, or ownership cannot be checked yet: write nothing. A fleet
        # this one ran (on a queue taken from it, or before its spec.queue named the other's) stops.
        assert sync.problem is not None
        if sync.owned_by is not None:
            await _stop_fleet(state, owner, f"queue {parsed.queue} belongs to {sync.owned_by}" if sync.owned_by
                              else sync.problem.message)
            await _release_abandoned(state, owner, conns, sync.also_owned)
        refused = _refused(status, generation, sync.problem)
        refused["conditions"] = conditions.merge_conditions(
            refused["conditions"], [sync.condition, conditions.Condition(
                "Ready", "False", sync.problem.reason, f"nothing runs: {sync.problem.message}")],
            generation=generation, now=_now())
        return refused

    handoff = autoscale.handoff(
        mode=parsed.worker.autoscaling, previous_mode=(status.get("workers") or {}).get("autoscaling"),
        spec_replicas=parsed.worker.replicas, memory=autoscale.Handoff.of(status.get("autoscaling")),
        window=parsed.worker.scale_down_window, now=time.time())
    # Shadow workers run while the queue row is in shadow mode (a flip the gate holds back included).
    row_mode = (sync.status or status.get("cutover") or {}).get("mode") or parsed.cutover.mode
    children, problems = await _apply_children(state, body, parsed, owner, keep_live_workers=handoff.keep_live,
                                               shadow_mode=row_mode == "shadow")
    await _release_abandoned(state, owner, conns, sync.also_owned)
    components = ["dispatcher", "worker", "reaper"] + ([SHADOW_WORKER] if parsed.worker.shadow.enabled else [])
    roles = [conditions.availability(r, children.get(f"{owner.name}-{r}")) for r in components]
    was_ready = (conditions.find(status.get("conditions"), "Ready") or {}).get("status") == "True"
    if was_ready and not all(r.complete for r in roles):
        # A child replaced, recreated or scaled: Ready no longer holds. Withdrawn now; why the new
        # pods do not run (read from them next) follows with the pass's status.
        await _withdraw(state, body, list(conditions.rollout_problems(roles)[:2]), generation)
    failures, waits = await _pod_states(api, owner, roles)
    ready, progressing, rollout_problems = conditions.rollout_problems(roles, failures, waits)
    problems += rollout_problems
    if sync.problem is not None:
        problems.append(sync.problem)
    new_status: Status = {
        "observedGeneration": generation,
        "workers": _workers_status(parsed, owner, children.get(f"{owner.name}-worker")),
        "autoscaling": {**(status.get("autoscaling") or {}), **handoff.status()},
    }
    if sync.status:
        new_status["cutover"] = sync.status
    if sync.shadow:
        new_status["shadow"] = sync.shadow
    if tick and not any(p.reason in NO_AUTOSCALE for p in problems):
        try:
            scaled = await autoscale_workers(body, parsed, state, conns, children.get(f"{owner.name}-worker"),
                                             handoff_keeps=handoff.keep_live)
            _merge(new_status, scaled)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError, RedisError,
                JudgeQueueError, ValueError) as exc:
            message = f"cannot read the backlog of queue {parsed.queue!r}: {exc!r}"
            problems.append(Problem("BacklogUnavailable", message))
            log_problem(jq, message)
    for problem in problems:  # each failure a Warning Event of its own (at most once a minute while it lasts)
        warn_event(state, body, problem.reason, problem.message)
    updates = [ready, progressing, conditions.degraded(problems), sync.condition]
    hooks = await _webhooks_condition(state, owner.namespace, parsed, conns)
    if hooks is not None:
        updates.append(hooks)
        if hooks.status == "False":
            log_problem(jq, hooks.message, reason=hooks.reason)
            warn_event(state, body, hooks.reason, hooks.message)
    new_status["conditions"] = conditions.merge_conditions(
        status.get("conditions"), updates, generation=generation, now=_now())
    return new_status


async def _webhooks_condition(
    state: OperatorState, namespace: str, spec: JudgeQueueSpec, conns: Connections
) -> conditions.Condition | None:
    """``WebhooksDelivering`` (None without webhooks): each webhook's Secrets read and its URL
    checked, as its reapers will need them, and its deliveries' state read from Postgres."""
    if not spec.webhooks:
        return None
    problems: dict[str, str] = {}
    for hook in spec.webhooks:
        try:
            await state.api.secret_value(namespace, hook.secret.name, hook.secret.key)
            if hook.url_secret is not None:
                url = (await state.api.secret_value(namespace, hook.url_secret.name, hook.url_secret.key)).strip()
                if not re.match(ENDPOINT_URL_PATTERN, url) or not urlsplit(url).hostname:
                    problems[hook.name] = (f"Secret {namespace}/{hook.url_secret.name} key {hook.url_secret.key!r}"
                                           " does not hold an http or https URL with a host")  # fmt: skip
        except SecretNotFound as exc:
            problems[hook.name] = str(exc)
        except KubeError as exc:
            problems[hook.name] = f"its Secret cannot be read: {exc}"
    health = None
    with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
        conn = await connect_postgres(conns.postgres_dsn, pooler=conns.pooler, timeout=state.config.db_timeout)
        try:
            health = await webhook_health(conn, spec.queue)
        finally:
            await conn.close()
    return conditions.webhooks([hook.name for hook in spec.webhooks], problems, health)


async def _withdraw(state: OperatorState, body: Mapping[str, Any], updates: list[conditions.Condition],
                    generation: int, fields: Mapping[str, Any] | None = None) -> None:
    """Write ``updates`` (and status ``fields``) now, in the middle of a pass: a claim the pass has
    just made untrue (Ready when a child is replaced, CutoverApplied when the row is written) must not
    stand until the pass ends (the pods read, the other children compared). The pass's own status
    follows; ``observedGeneration`` is left to it. Best effort: a refused write is only logged."""
    meta = body["metadata"]
    previous = (body.get("status") or {}).get("conditions")
    patch = {**(fields or {}), "conditions": conditions.merge_conditions(previous, updates, generation=generation,
                                                                        now=_now())}
    try:
        await state.api.patch(KIND_REFS["JudgeQueue"], meta["namespace"], meta["name"],
                              {"status": redact.redact_tree(patch)}, subresource="status")
    except KubeError as exc:
        log_problem(f"{meta['namespace']}/{meta['name']}", f"status not written mid-pass: {exc}")


def _log_sync(sync: cutover.QueueSync, spec: JudgeQueueSpec, owner: Owner, body: Mapping[str, Any],
              state: OperatorState) -> None:
    jq = _jq(owner)
    obj = f"queue {spec.queue}"
    if sync.released_from is not None:
        message = (f"queue {spec.queue} was held by {sync.released_from}, which no longer exists (deleted while"
                   " no operator ran) and runs nothing on it: released, and claimed by this JudgeQueue")
        log_action("release", obj, f"its owner {sync.released_from} no longer exists", judgequeue=jq)
        normal_event(body, "QueueOwnerGone", message)
    if sync.claimed and sync.owned_by is None and sync.problem is None:
        log_action("claim", obj, f"recorded {queue_owner(owner)} as its owner", judgequeue=jq)
    if sync.took_back is not None:
        message = (f"took queue {spec.queue} back from {sync.took_back}: its owner was set outside the operator"
                   " (ownership changes hands only when its owner releases it)")
        log_action("claim", obj, message, judgequeue=jq)
        warn_event(state, body, "QueueOwnerRestored", message)
    if sync.wrote is not None and sync.before is not None:
        wanted = cutover.wanted(spec).canonical()
        if sync.wrote == "gated":
            written = cutover.held_back(cutover.wanted(spec), sync.before).canonical()
            reason = (f"wrote {written}, the flip to live held back by the gate"
                      f" (the row held {cutover.describe(sync.before)})")
        elif sync.wrote == "restore":
            reason = f"restored {wanted}: the row held {cutover.describe(sync.before)}, changed outside the spec"
            warn_event(state, body, "CutoverDrifted", f"{obj}: {reason}")
        else:
            reason = f"wrote {wanted} (the row held {cutover.describe(sync.before)})"
            if sync.gate is not None:
                reason += ("; gate met: " if sync.gate.met else "; forced past the gate: ") + sync.gate.message
        log_action("cutover", obj, reason, judgequeue=jq)
    if sync.condition.reason == "GateNotMet":
        log_problem(jq, f"{obj}: {sync.condition.message}", level=logging.INFO, reason="GateNotMet")
        warn_event(state, body, "GateNotMet", sync.condition.message)
    if sync.problem is not None:
        log_problem(jq, f"{obj}: {sync.problem.message}", reason=sync.problem.reason)
        if sync.problem.reason in ("QueueOwned", "QueueHandedOver", "Drifted", "WatermarkMovedBack"):
            warn_event(state, body, sync.problem.reason, sync.problem.message)


async def measure_backlog(conns: Connections, queue: str, *, io_timeout: float) -> Backlog:
    """The queue's backlog (outbox, stream lag, PEL), read through the connections the roles use:
    the spec's pooler for Postgres, a plain or ``redis+sentinel://`` URL for Redis. A malformed Redis
    URL raises ValueError (the caller reports it)."""
    redis = redis_client(conns.redis_url, socket_timeout=io_timeout, socket_connect_timeout=io_timeout)
    try:
        conn = await connect_postgres(conns.postgres_dsn, pooler=conns.pooler, timeout=io_timeout)
    except BaseException:
        await redis.aclose()
        raise
    try:
        return await read_backlog(conn, redis, queue)
    finally:
        await redis.aclose()
        await conn.close()


async def autoscale_workers(
    body: Mapping[str, Any], spec: JudgeQueueSpec, state: OperatorState, conns: Connections,
    live: Mapping[str, Any] | None, *, handoff_keeps: bool = False,
) -> Status:
    """One autoscaler tick: read the backlog, decide, scale the worker Deployment, emit an Event."""
    owner = _owner(body)
    status: Mapping[str, Any] = body.get("status") or {}
    backlog = await measure_backlog(conns, spec.queue, io_timeout=state.config.db_timeout)
    backlog_status = {"total": backlog.total, "outboxPending": backlog.outbox_pending,
                      "streamLag": backlog.stream_lag, "pel": backlog.pel,
                      "readAt": conditions.rfc3339(_now())}
    result: Status = {"backlog": backlog_status}
    if spec.worker.autoscaling == "external" or live is None:
        return result
    name = f"{owner.name}-worker"
    current = int(live.get("spec", {}).get("replicas", 0) or 0)
    remembered = status.get("autoscaling") or {}
    decision = autoscale.decide(
        backlog=backlog.total,
        current=current,
        min_replicas=spec.worker.min_replicas,
        max_replicas=spec.worker.max_replicas,
        target_per_replica=spec.worker.target_backlog_per_replica,
        window=spec.worker.scale_down_window,
        now=time.time(),
        state=autoscale.ScaleState(last_scale_up=remembered.get("lastScaleUp"), last_busy=remembered.get("lastBusy")),
    )
    result["autoscaling"] = {"lastScaleUp": decision.state.last_scale_up, "lastBusy": decision.state.last_busy,
                             "wanted": decision.wanted}
    if decision.changed and decision.replicas != current:
        scaled = await state.api.patch(KIND_REFS["Deployment"], owner.namespace, name,
                                       {"spec": {"replicas": decision.replicas}})
        verified = state.verified.get(owner.uid, {})
        verified.pop(name, None)  # the next pass compares it again (its generation moved)
        reason = "ScaledUp" if decision.replicas > current else "ScaledDown"
        message = f"workers {current} -> {decision.replicas}: {decision.reason}"
        log_action("scale", f"Deployment {name}", message, judgequeue=_jq(owner),
                   fields={"replicas": decision.replicas, "from": current})
        normal_event(body, reason, message)
        result["workers"] = _workers_status(spec, owner, scaled)
    return result


def _merge(status: Status, extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(status.get(key), dict):
            status[key].update(value)
        else:
            status[key] = value


async def safe_reconcile(body: Mapping[str, Any], state: OperatorState, *, tick: bool = False) -> Status:
    """:func:`reconcile`, with a failure it did not foresee turned into ``Degraded`` (reason
    ``ReconcileFailed``, the error's own message) instead of a status left as it was. The Kubernetes
    API being out of reach (no status can be written then) is raised for Kopf to retry."""
    meta = body["metadata"]
    previous = (body.get("status") or {}).get("conditions")
    try:
        new_status = await reconcile(body, state, tick=tick)
    except KubeError as exc:
        if not exc.refused:
            raise
        message = f"Kubernetes API: {exc.api_message}"
    except Exception as exc:  # a bug must show in status, not only in the logs
        logging.getLogger(__name__).exception("reconcile failed")
        message = f"{type(exc).__name__}: {exc}"
    else:
        new_status = redact.redact_tree(new_status)  # status quotes others' words: never a secret
        announce(state, body, previous, new_status.get("conditions"))
        return cast(Status, new_status)
    warn_event(state, body, "ReconcileFailed", message)
    log_problem(f"{meta['namespace']}/{meta['name']}", f"reconcile failed: {message}", level=logging.ERROR)
    new_status = redact.redact_tree(_refused(body.get("status") or {}, int(meta.get("generation", 0)),
                                             Problem("ReconcileFailed", message)))
    announce(state, body, previous, new_status.get("conditions"))
    return cast(Status, new_status)


#: How long a deleted JudgeQueue keeps its queue while its pods still run on it (then it lets go
#: anyway: a node that is gone leaves pods Terminating for as long as nobody deletes them by force).
RELEASE_WAIT = 120.0


def _deleting_for(body: Mapping[str, Any]) -> float:
    stamp = (body.get("metadata") or {}).get("deletionTimestamp")
    if not stamp:
        return 0.0
    return max(0.0, (_now() - datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))).total_seconds())


async def release(body: Mapping[str, Any], state: OperatorState, *, drain: bool = False) -> None:
    """On deletion: give up every queue the JudgeQueue holds (its ``spec.queue``, and one it was
    renamed away from). With ``drain`` (the delete handler), its fleet is scaled to zero first and
    the queues are released once none of its pods runs any more (at most :data:`RELEASE_WAIT` after
    the deletion), so a JudgeQueue waiting for the queue never starts a second
    fleet beside the last pods of the first. Best effort: an unreachable database must not keep the
    JudgeQueue from going (``docs/runbook.md`` says how to release it by hand). Runs again, finding
    nothing left, when the deletion is seen done, so a JudgeQueue whose finalizer was released by hand
    while the operator runs releases its queue too."""
    owner = _owner(body)
    queue = ((body.get("status") or {}).get("cutover") or {}).get("queue")
    parsed = parse_spec(body.get("spec"), name=owner.name)
    if not queue or isinstance(parsed, list):
        state.forget(owner.uid)
        return
    if drain:
        try:
            await _stop_fleet(state, owner, "the JudgeQueue is deleted")
            while _deleting_for(body) < RELEASE_WAIT:
                if not await _queues_in_use(state, owner):
                    break
                await asyncio.sleep(1.0)
        except KubeError as exc:
            log_problem(_jq(owner), f"cannot stop the fleet before releasing the queue: {exc}")
    state.forget(owner.uid)
    try:
        conns = await _connections(state.api, owner.namespace, parsed)
        conn = await connect_postgres(conns.postgres_dsn, pooler=conns.pooler, timeout=state.config.db_timeout)
        try:
            held = await owned_queues(conn, queue_owner(owner))
            released = [q for q in held if await release_queue(conn, q, queue_owner(owner))]
        finally:
            await conn.close()
    except (SecretNotFound, KubeError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError,
            JudgeQueueError) as exc:
        log_problem(_jq(owner), f"queue {queue}: ownership not released ({exc!r}); release it by hand"
                    " (docs/runbook.md, \"A queue owned by another JudgeQueue\")")
        return
    for name in released:
        log_action("release", f"queue {name}", "the JudgeQueue is deleted", judgequeue=_jq(owner))


async def refresh(state: OperatorState, meta: Mapping[str, Any], *, tick: bool) -> None:
    """One pass over the JudgeQueue as it is now, its status written: the timer's (``tick``: with the
    backlog and autoscaling), or one for its queue row changed in Postgres. Skipped while a change
    handler has not processed the current generation (it owns the next step)."""
    jq = f"{meta['namespace']}/{meta['name']}"
    what = "timer" if tick else "queue row changed"
    async with state.lock(meta["uid"]):
        try:
            fresh = await state.api.get(KIND_REFS["JudgeQueue"], meta["namespace"], meta["name"])
        except KubeError as exc:
            log_problem(jq, f"{what}: pass skipped: {exc}")
            return
        if fresh is None or fresh["metadata"].get("deletionTimestamp"):
            return
        status = fresh.get("status") or {}
        if int(fresh["metadata"].get("generation", 0)) != int(status.get("observedGeneration", -1)):
            return
        try:
            new_status = await safe_reconcile(fresh, state, tick=tick)
        except KubeError as exc:
            log_problem(jq, f"{what}: Kubernetes API: {exc}")
            return
        # Written here, under the lock, so this pass's status never lands after a newer change's.
        try:
            await state.api.patch(KIND_REFS["JudgeQueue"], meta["namespace"], meta["name"],
                                  {"status": new_status}, subresource="status")
        except KubeError as exc:
            log_problem(jq, f"{what}: status not written: {exc}")


async def _row_source(state: OperatorState, body: Mapping[str, Any]) -> tuple[str, str] | None:
    """Where to LISTEN for the JudgeQueue's queue row: (DSN, queue). The spec's direct listen DSN,
    else its DSN when that reaches Postgres itself; None behind a transaction pooler without a listen
    DSN (LISTEN cannot work there) or while the spec or its Secret is not usable."""
    meta = body["metadata"]
    parsed = parse_spec(body.get("spec"), name=meta["name"])
    if isinstance(parsed, list):
        return None
    ref = parsed.postgres_listen
    if ref is None and parsed.postgres_pooler == "transaction":
        return None
    ref = ref or parsed.postgres
    try:
        return await state.api.secret_value(meta["namespace"], ref.name, ref.key), parsed.queue
    except (SecretNotFound, KubeError):
        return None


#: Seconds between passes while a rollout is in flight (``Progressing=True``, not yet Degraded): its new
#: pods failing (an image that cannot be pulled, a crash, a refusal) is Degraded within seconds, not a
#: timer's interval, and a finished one Ready.
FOLLOW_ROLLOUT = 2.0


def _rolling(body: Mapping[str, Any]) -> bool:
    """A rollout in flight that has not failed yet (once Degraded, the timer's passes are enough)."""
    found = (body.get("status") or {}).get("conditions")
    progressing, degraded = conditions.find(found, "Progressing") or {}, conditions.find(found, "Degraded") or {}
    return progressing.get("status") == "True" and degraded.get("status") != "True"


async def follow_queue_row(state: OperatorState, body: Mapping[str, Any], stopped: Any) -> None:
    """Follow the JudgeQueue between the timer's passes (a Kopf daemon, for as long as it exists).

    It holds a LISTEN (:func:`judgequeue.core.store.queues.listen_queues`) for the queue row and makes a
    pass (:func:`refresh`) as soon as its flags or owner change, whoever changed them, or as soon as
    one of its Deployments changes (:meth:`OperatorState.poke`: recreated, scaled, its rollout
    moving), so status and the row or the children never disagree for a timer's interval; it
    listens again when the connection drops or the DSN or queue changes (behind a transaction
    pooler without ``spec.postgres.listen`` it cannot: the timer keeps the row). While a rollout is
    in flight it also makes a pass every :data:`FOLLOW_ROLLOUT` seconds, so new pods that fail are
    reported at once."""
    interval = state.config.interval
    meta = body["metadata"]
    while not stopped:
        source = await _row_source(state, body)
        conn: asyncpg.Connection | None = None
        heard = asyncio.Event()
        state.pokes[meta["uid"]] = heard
        try:
            if source is not None:
                try:
                    conn = await connect_postgres(source[0], timeout=state.config.db_timeout)
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError,
                        JudgeQueueError) as exc:
                    log_problem(_jq(_owner(body)), f"queue {source[1]}: cannot listen for its row"
                                f" ({redact.redact(repr(exc))}); the timer keeps it", level=logging.DEBUG)

                def on_change(name: str, queue: str = source[1], heard: asyncio.Event = heard) -> None:
                    if name == queue:
                        heard.set()

                if conn is not None:
                    await listen_queues(conn, on_change)
            loop = asyncio.get_running_loop()
            look_again = loop.time() + interval
            while not stopped and (conn is None or not conn.is_closed()):
                try:
                    await asyncio.wait_for(heard.wait(), timeout=FOLLOW_ROLLOUT)
                except TimeoutError:
                    if _rolling(body):  # the live body: Kopf keeps it current
                        await refresh(state, meta, tick=False)
                    if loop.time() >= look_again:
                        look_again = loop.time() + interval
                        if await _row_source(state, body) != source or (source is not None and conn is None):
                            break  # another DSN or queue, or a connection to try again: listen there
                    continue
                heard.clear()
                await refresh(state, meta, tick=False)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log_problem(_jq(_owner(body)), f"listening stopped ({redact.redact(repr(exc))})", level=logging.DEBUG)
        finally:
            if state.pokes.get(meta["uid"]) is heard:
                del state.pokes[meta["uid"]]
            if conn is not None:
                conn.terminate()


def build_registry(
    state: OperatorState,
    *,
    login: Callable[..., Awaitable[kopf.ConnectionInfo | None]] | None = None,
    kube_factory: Callable[[], KubeApi] | None = None,
) -> kopf.OperatorRegistry:
    """A Kopf registry with the JudgeQueue handlers bound to ``state``."""
    registry = kopf.OperatorRegistry()

    if login is not None:
        kopf.on.login(registry=registry)(login)

    @kopf.on.startup(registry=registry)
    async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=GROUP, key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING
        # A JudgeQueue deleted while its timer is mid-tick keeps Kopf's finalizer until the tick is
        # seen finished, and Kopf looks again only after this long (60 s by default): the delete
        # would hang for a minute. A tick is bounded by the API and database timeouts; look each second.
        settings.background.cancellation_polling = 1.0
        if kube_factory is not None and state.kube is None:
            state.kube = kube_factory()

    @kopf.on.cleanup(registry=registry)
    async def _cleanup(**_: Any) -> None:
        if state.kube is not None:
            await state.kube.close()
            state.kube = None

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, registry=registry)
    async def on_change(body: kopf.Body, **_: Any) -> None:
        meta = body["metadata"]
        state.handled[(f"{meta['namespace']}/{meta['name']}", int(meta.get("generation", 0)))] += 1
        async with state.lock(meta["uid"]):
            try:
                new_status = await safe_reconcile(body, state)
                # Written here, under the lock (not left to Kopf's patch after the handler): the pass
                # the daemon makes next (it hears the flags or claim this one wrote, or a child it
                # changed) must read this status, and must never be overwritten by it afterwards.
                await state.api.patch(KIND_REFS["JudgeQueue"], meta["namespace"], meta["name"],
                                      {"status": new_status}, subresource="status")
            except KubeError as exc:
                if exc.status == 404 and exc.reason == "NotFound":
                    return  # deleted meanwhile: nothing to write status on
                warn_event(state, body, "ReconcileFailed", f"Kubernetes API: {exc}")
                raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=5) from exc

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    async def on_delete(body: kopf.Body, **_: Any) -> None:
        async with state.lock(body["metadata"]["uid"]):
            await release(body, state, drain=True)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def on_gone(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        if event.get("type") == "DELETED":  # gone, with or without on_delete (a finalizer released by hand)
            await release(body, state)

    @kopf.timer(GROUP, VERSION, PLURAL, interval=state.config.interval, registry=registry)
    async def tick(body: kopf.Body, **_: Any) -> None:
        await refresh(state, body["metadata"], tick=True)

    @kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, cancellation_timeout=1.0)
    async def follow_row(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
        await follow_queue_row(state, body, stopped)

    @kopf.on.event("apps", "v1", "deployments", labels={"app.kubernetes.io/managed-by": MANAGED_BY},
                   registry=registry)
    async def child_changed(body: kopf.Body, **_: Any) -> None:
        # A Deployment of ours changed (recreated by hand, scaled, its rollout moving): its
        # JudgeQueue's status must follow now, not on the next tick. Its daemon makes the pass.
        for ref in body.get("metadata", {}).get("ownerReferences") or ():
            if ref.get("kind") == "JudgeQueue" and ref.get("controller") and ref.get("uid"):
                state.poke(str(ref["uid"]))

    return registry
