"""One reconcile pass: children and queue flags brought to the spec, status composed from what the
pass found (see :mod:`.handlers` for when passes run)."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import asyncpg
from redis.exceptions import RedisError

from judgequeue.core.base.errors import JudgeQueueError
from judgequeue.core.spec import ENDPOINT_URL_PATTERN, JudgeQueueSpec, parse_spec
from judgequeue.core.store.events import webhook_health
from judgequeue.core.transport.connect import connect_postgres
from judgequeue.core.transport.redis_url import validate_redis_url

from . import autoscale, conditions, cutover, redact
from .actions import log_action, log_problem
from .conditions import Problem
from .fleet import apply_children, pod_states, stop_fleet, workers_status
from .kube import KIND_REFS, KubeError, SecretNotFound
from .kube_events import announce, normal_event, warn_event
from .ownership import owner_gone, release_abandoned
from .render import (
    SHADOW_WORKER,
    Owner,
    name_errors,
)
from .scaling import autoscale_workers, merge_status
from .state import Connections, OperatorState, Status, jq_name, owner_of, queue_owner, read_connections, utc_now

#: Degraded reasons that stop the autoscaler: scaling a fleet that cannot run, or is not ours, helps nobody.
NO_AUTOSCALE = ("QueueOwned", "QueueHandedOver", "RoleMisconfigured", "ChildRefused", "PodsRefused", "ImagePullFailed")


def refused_status(status: Mapping[str, Any], generation: int, problem: Problem) -> Status:
    """Status for a reconcile that wrote nothing: Degraded with ``problem``, nothing progressing."""
    updates = conditions.failure(problem.reason, problem.message)
    return {"observedGeneration": generation,
            "conditions": conditions.merge_conditions(status.get("conditions"), updates, generation=generation,
                                                      now=utc_now())}


def _claimed_before(status: Mapping[str, Any], spec: JudgeQueueSpec, owner: Owner) -> bool:
    previous = status.get("cutover") or {}
    return bool(previous.get("owner") == queue_owner(owner) and previous.get("queue") == spec.queue)


@dataclass(frozen=True)
class Pass:
    """What one pass works on: the JudgeQueue as read, its parsed spec and its connections."""

    body: Mapping[str, Any]
    state: OperatorState
    spec: JudgeQueueSpec
    conns: Connections

    @property
    def owner(self) -> Owner:
        return owner_of(self.body)

    @property
    def generation(self) -> int:
        return int(self.body["metadata"].get("generation", 0))

    @property
    def status(self) -> Mapping[str, Any]:
        return self.body.get("status") or {}


async def reconcile(
    body: Mapping[str, Any], state: OperatorState, *, tick: bool = False,
) -> Status:
    """Bring children and queue flags to the spec; returns the status fields to patch. ``tick``: also
    read the backlog and, unless autoscaling is external, scale the workers on it."""
    started = await _start(body, state)
    if not isinstance(started, Pass):
        return started
    sync = await _sync_row(started)
    if sync.owned_by is not None or (sync.problem is not None and sync.problem.reason == "DatabaseUnavailable"
                                     and not _claimed_before(started.status, started.spec, started.owner)):
        return await _stand_down(started, sync)
    return await _run_fleet(started, sync, tick=tick)


async def _start(body: Mapping[str, Any], state: OperatorState) -> Pass | Status:
    """The pass's spec and connections, or the status of a pass that cannot start (an invalid spec, a
    missing Secret, a malformed Redis URL): nothing is changed then."""
    meta = body["metadata"]
    generation = int(meta.get("generation", 0))
    status: Mapping[str, Any] = body.get("status") or {}
    jq = jq_name(owner_of(body))
    parsed = parse_spec(body.get("spec"), name=meta["name"])
    errors = (parsed if isinstance(parsed, list) else []) + name_errors(meta["name"])
    if errors or isinstance(parsed, list):
        log_problem(jq, f"invalid spec, nothing changed: {'; '.join(errors)}", level=logging.ERROR)
        warn_event(state, body, "InvalidSpec", "; ".join(errors))
        return {
            "observedGeneration": generation,
            "conditions": conditions.merge_conditions(
                status.get("conditions"), conditions.invalid_spec(errors), generation=generation, now=utc_now()
            ),
        }
    try:
        conns = await read_connections(state.api, meta["namespace"], parsed)
        problem = await _role_credentials_problem(state, meta["namespace"], parsed)
    except SecretNotFound as exc:
        problem = Problem("SecretNotFound", str(exc))
    if problem is None:
        try:
            validate_redis_url(conns.redis_url)
        except ValueError as exc:  # the message never echoes a password
            redis = parsed.connections("operator")[1]
            problem = Problem("InvalidConnection", f"Secret {redis.name} key {redis.key}: the Redis URL {exc}")
    if problem is not None:
        log_problem(jq, f"{problem.message}; nothing changed, will retry", level=logging.ERROR)
        warn_event(state, body, problem.reason, problem.message)
        return refused_status(status, generation, problem)
    return Pass(body, state, parsed, conns)


async def _role_credentials_problem(state: OperatorState, namespace: str, spec: JudgeQueueSpec) -> Problem | None:
    """The first Secret of ``spec.credentials`` (dispatcher, worker, reaper) that its pods could not
    use: missing, without a key the component reads, or with a malformed Redis URL. Refused before
    anything is rendered, so a bad Secret is a condition naming it, never pods stuck mounting it or a
    crash loop."""
    for component in ("dispatcher", "worker", "reaper"):
        own = spec.credentials.get(component)
        if own is None:
            continue
        refs = [own.postgres, own.redis] + ([own.listen] if own.listen and spec.postgres_listen else [])
        try:
            values = [await state.api.secret_value(namespace, ref.name, ref.key) for ref in refs]
        except SecretNotFound as exc:
            return Problem("SecretNotFound", f"spec.credentials.{component}: {exc}")
        try:
            validate_redis_url(values[1])
        except ValueError as exc:
            return Problem("InvalidConnection", f"spec.credentials.{component}: Secret {own.secret_name} key "
                                                f"{own.redis_key}: the Redis URL {exc}")
    return None


def credentials_condition(spec: JudgeQueueSpec) -> conditions.Condition:
    """``SharedCredentials``: True (a warning) while a component connects with the shared
    ``spec.postgres``/``spec.redis`` rather than credentials of its own (docs/security.md)."""
    shared = spec.shared_components()
    if not shared:
        return conditions.Condition("SharedCredentials", "False", "PerComponentCredentials",
                                    "the dispatcher, worker, reaper and operator each connect with their own Secret")
    return conditions.Condition(
        "SharedCredentials", "True", "SharedCredentials",
        f"{', '.join(shared)} connect{'s' if len(shared) == 1 else ''} with the shared spec.postgres and spec.redis "
        f"Secrets ({spec.postgres.name}, {spec.redis.name}), so each can do whatever any component that shares "
        "them may; give each its own with spec.credentials (docs/security.md)")


async def _sync_row(run: Pass) -> cutover.QueueSync:
    """Hold the queue row's flags and owner to the spec; a CutoverApplied the row no longer bears out
    is withdrawn at once."""
    state, owner, status = run.state, run.owner, run.status
    applied = conditions.find(status.get("conditions"), "CutoverApplied") or {}
    sync = await cutover.sync_queue(
        run.conns.postgres_dsn, run.spec, owner=queue_owner(owner), previous=status.get("cutover") or {},
        generation=run.generation, connect_timeout=state.config.db_timeout, pooler=run.conns.pooler,
        previous_message=str(applied.get("message", "")), previous_reason=str(applied.get("reason", "")),
        owner_gone=lambda recorded, queue: owner_gone(state, recorded, queue))
    _log_sync(sync, run.spec, owner, run.body, state)
    if applied.get("status") == "True" and (sync.wrote is not None or sync.condition.status != "True"):
        # The row changed under the claim: say what it holds now, not after the children's pass.
        await withdraw(state, run.body, [sync.condition], run.generation,
                       {"cutover": sync.status} if sync.status else {})
    return sync


async def _stand_down(run: Pass, sync: cutover.QueueSync) -> Status:
    """Another JudgeQueue owns the queue, or ownership cannot be checked yet: write nothing. A fleet
    this one ran (on a queue taken from it, or before its spec.queue named the other's) stops."""
    assert sync.problem is not None
    if sync.owned_by is not None:
        await stop_fleet(run.state, run.owner, f"queue {run.spec.queue} belongs to {sync.owned_by}"
                         if sync.owned_by else sync.problem.message)
        await release_abandoned(run.state, run.owner, run.conns, sync.also_owned)
    refused = refused_status(run.status, run.generation, sync.problem)
    refused["conditions"] = conditions.merge_conditions(
        refused["conditions"], [sync.condition, conditions.Condition(
            "Ready", "False", sync.problem.reason, f"nothing runs: {sync.problem.message}")],
        generation=run.generation, now=utc_now())
    return refused


async def _run_fleet(run: Pass, sync: cutover.QueueSync, *, tick: bool) -> Status:
    """The queue is this JudgeQueue's: children made equal to the spec, their state read back into
    status, and on a tick the workers scaled on the backlog."""
    state, body, parsed, owner, status = run.state, run.body, run.spec, run.owner, run.status
    generation = run.generation
    handoff = autoscale.handoff(
        mode=parsed.worker.autoscaling, previous_mode=(status.get("workers") or {}).get("autoscaling"),
        spec_replicas=parsed.worker.replicas, memory=autoscale.Handoff.of(status.get("autoscaling")),
        window=parsed.worker.scale_down_window, now=time.time())
    # Shadow workers run while the queue row is in shadow mode (a flip the gate holds back included).
    row_mode = (sync.status or status.get("cutover") or {}).get("mode") or parsed.cutover.mode
    children, problems = await apply_children(state, body, parsed, owner, keep_live_workers=handoff.keep_live,
                                              shadow_mode=row_mode == "shadow")
    await release_abandoned(state, owner, run.conns, sync.also_owned)
    components = ["dispatcher", "worker", "reaper"] + ([SHADOW_WORKER] if parsed.worker.shadow.enabled else [])
    roles = [conditions.availability(r, children.get(f"{owner.name}-{r}")) for r in components]
    was_ready = (conditions.find(status.get("conditions"), "Ready") or {}).get("status") == "True"
    if was_ready and not all(r.complete for r in roles):
        # A child replaced, recreated or scaled: Ready no longer holds. Withdrawn now; why the new
        # pods do not run (read from them next) follows with the pass's status.
        await withdraw(state, body, list(conditions.rollout_problems(roles)[:2]), generation)
    failures, waits = await pod_states(state.api, owner, roles)
    ready, progressing, rollout_problems = conditions.rollout_problems(roles, failures, waits)
    problems += rollout_problems
    if sync.problem is not None:
        problems.append(sync.problem)
    new_status: Status = {
        "observedGeneration": generation,
        "workers": workers_status(parsed, owner, children.get(f"{owner.name}-worker")),
        "autoscaling": {**(status.get("autoscaling") or {}), **handoff.status()},
    }
    if sync.status:
        new_status["cutover"] = sync.status
    if sync.shadow:
        new_status["shadow"] = sync.shadow
    if tick and not any(p.reason in NO_AUTOSCALE for p in problems):
        scaled = await _scale(run, children.get(f"{owner.name}-worker"), keep_live=handoff.keep_live)
        if isinstance(scaled, Problem):
            problems.append(scaled)
        else:
            merge_status(new_status, scaled)
    for problem in problems:  # each failure a Warning Event of its own (at most once a minute while it lasts)
        warn_event(state, body, problem.reason, problem.message)
    updates = [ready, progressing, conditions.degraded(problems), sync.condition, credentials_condition(parsed)]
    hooks = await webhooks_condition(state, owner.namespace, parsed, run.conns)
    if hooks is not None:
        updates.append(hooks)
        if hooks.status == "False":
            log_problem(jq_name(owner), hooks.message, reason=hooks.reason)
            warn_event(state, body, hooks.reason, hooks.message)
    new_status["conditions"] = conditions.merge_conditions(
        status.get("conditions"), updates, generation=generation, now=utc_now())
    return new_status


async def webhooks_condition(
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


async def _scale(run: Pass, live_worker: Mapping[str, Any] | None, *, keep_live: bool) -> Status | Problem:
    """The timer's autoscaler step: the status fields it sets, or why the backlog could not be read."""
    try:
        return await autoscale_workers(run.body, run.spec, run.state, run.conns, live_worker, handoff_keeps=keep_live)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError, RedisError,
            JudgeQueueError, ValueError) as exc:
        message = f"cannot read the backlog of queue {run.spec.queue!r}: {exc!r}"
        log_problem(jq_name(run.owner), message)
        return Problem("BacklogUnavailable", message)


async def withdraw(state: OperatorState, body: Mapping[str, Any], updates: list[conditions.Condition],
                    generation: int, fields: Mapping[str, Any] | None = None) -> None:
    """Write ``updates`` (and status ``fields``) now, in the middle of a pass: a claim the pass has
    just made untrue (Ready when a child is replaced, CutoverApplied when the row is written) must not
    stand until the pass ends (the pods read, the other children compared). The pass's own status
    follows; ``observedGeneration`` is left to it. Best effort: a refused write is only logged."""
    meta = body["metadata"]
    previous = (body.get("status") or {}).get("conditions")
    patch = {**(fields or {}), "conditions": conditions.merge_conditions(previous, updates, generation=generation,
                                                                        now=utc_now())}
    try:
        await state.api.patch(KIND_REFS["JudgeQueue"], meta["namespace"], meta["name"],
                              {"status": redact.redact_tree(patch)}, subresource="status")
    except KubeError as exc:
        log_problem(f"{meta['namespace']}/{meta['name']}", f"status not written mid-pass: {exc}")


def _log_sync(sync: cutover.QueueSync, spec: JudgeQueueSpec, owner: Owner, body: Mapping[str, Any],
              state: OperatorState) -> None:
    jq = jq_name(owner)
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
    new_status = redact.redact_tree(refused_status(body.get("status") or {}, int(meta.get("generation", 0)),
                                             Problem("ReconcileFailed", message)))
    announce(state, body, previous, new_status.get("conditions"))
    return cast(Status, new_status)
