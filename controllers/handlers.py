"""Kopf handlers: reconcile children and cutover flags, refresh status, autoscale workers.

Reconcile is level-based: every change (create, update, resume after a restart) and every timer tick
renders the desired children, creates what is missing and patches only what differs. The timer also
retries a cutover that could not be applied, refreshes readiness and, unless
``worker.autoscaling: external``, scales workers on the backlog. Handlers of one object are
serialised with a lock, and a tick never renders from a generation the change handlers have not
processed yet. The operator writes status and children, never the spec.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import asyncpg
import kopf
from redis.exceptions import RedisError

from judgequeue.core.backlog import Backlog, read_backlog
from judgequeue.core.connect import connect_postgres, redis_client
from judgequeue.core.errors import CutoverBlocked, JudgeQueueError, WatermarkMovedBack
from judgequeue.core.queues import create_queue, set_cutover
from judgequeue.core.redis_url import validate_redis_url
from judgequeue.core.spec import JudgeQueueSpec, parse_spec

from . import autoscale, conditions
from .diff import child_patch
from .kube import KIND_REFS, PODS, KubeApi, KubeError, SecretNotFound
from .render import (
    GROUP,
    PLURAL,
    VERSION,
    Owner,
    optional_children,
    render_children,
    selector_labels,
    worker_replicas,
)

Status = dict[str, Any]


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

    def lock(self, uid: str) -> asyncio.Lock:
        return self.locks.setdefault(uid, asyncio.Lock())

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
    key = (str(body["metadata"].get("uid", "")), reason)
    now = time.monotonic()
    last = state.warned.get(key)
    if last is not None and last[0] == message and now - last[1] < WARNING_EVENT_REPEAT:
        return
    state.warned[key] = (message, now)
    kopf.warn(cast(kopf.Body, body), reason=reason, message=message[:1000])


@dataclass(frozen=True)
class Connections:
    """Where the operator's own connections go, read from the JudgeQueue's Secrets; they are opened
    through :mod:`judgequeue.core.connect` exactly as the roles open theirs, so the operator works
    behind the same PgBouncer (``pooler``) and with the same ``redis+sentinel://`` URL."""

    postgres_dsn: str
    redis_url: str
    pooler: str = "none"


def _now() -> datetime:
    return datetime.now(UTC)


def _owner(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


async def _connections(api: KubeApi, namespace: str, spec: JudgeQueueSpec) -> Connections:
    return Connections(
        postgres_dsn=await api.secret_value(namespace, spec.postgres.name, spec.postgres.key),
        redis_url=await api.secret_value(namespace, spec.redis.name, spec.redis.key),
        pooler=spec.postgres_pooler,
    )


async def _failures(
    api: KubeApi, owner: Owner, roles: list[conditions.RoleAvailability],
    logger: logging.Logger | logging.LoggerAdapter[Any],
) -> list[conditions.PodFailure]:
    """The last termination message of each role short of replicas, read from its pods, so status
    says why a role is unavailable (e.g. an uninstalled judge plugin). Best effort: an API error
    (say, RBAC without ``pods: list``) leaves status at the replica counts."""
    failures: list[conditions.PodFailure] = []
    for role in roles:
        if not role.exists or role.available >= role.desired:
            continue
        labels = {**selector_labels(owner.name), "app.kubernetes.io/component": role.role}
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        try:
            pods = await api.list_objects(PODS, owner.namespace, label_selector=selector)
        except KubeError as exc:
            logger.warning(f"cannot read {role.role} pods for their termination messages: {exc}")
            continue
        failure = conditions.last_failure(role.role, pods)
        if failure is not None:
            failures.append(failure)
    return failures


async def _apply_children(
    api: KubeApi, spec: JudgeQueueSpec, owner: Owner, logger: logging.Logger | logging.LoggerAdapter[Any]
) -> dict[str, dict[str, Any]]:
    """Create missing children and patch the differing ones; returns the live objects afterwards."""
    live_worker = await api.get(KIND_REFS["Deployment"], owner.namespace, f"{owner.name}-worker")
    live_replicas = (live_worker or {}).get("spec", {}).get("replicas") if live_worker else None
    desired = render_children(spec, owner, worker_replicas=worker_replicas(spec, live_replicas))
    result: dict[str, dict[str, Any]] = {}
    for child in desired:
        ref = KIND_REFS[child.kind]
        live = live_worker if child.name == f"{owner.name}-worker" else await api.get(ref, owner.namespace, child.name)
        if live is None:
            logger.info(f"creating {child.kind} {child.name}")
            result[child.name] = await api.create(ref, owner.namespace, child.body)
            continue
        patch = child_patch(live, child.body)
        if patch:
            logger.info(f"patching {child.kind} {child.name}: {sorted(patch.get('spec', {}))}")
            result[child.name] = await api.patch(ref, owner.namespace, child.name, patch)
        else:
            result[child.name] = live
    rendered = {(c.kind, c.name) for c in desired}
    for kind, name in optional_children(owner):
        if (kind, name) in rendered:
            continue
        live = await api.get(KIND_REFS[kind], owner.namespace, name)
        if live is None or not _owned_by(live, owner):
            continue  # never ours (someone's own policy of that name): leave it
        logger.info(f"deleting {kind} {name}: the spec no longer renders it")
        await api.delete(KIND_REFS[kind], owner.namespace, name, uid=live["metadata"].get("uid"))
    return result


def _owned_by(obj: Mapping[str, Any], owner: Owner) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("uid") == owner.uid and r.get("controller") for r in refs)


def _cutover_wanted(spec: JudgeQueueSpec) -> dict[str, Any]:
    wanted: dict[str, Any] = {"queue": spec.queue, "mode": spec.cutover.mode, "paused": spec.paused}
    if spec.cutover.watermark is not None:
        wanted["watermark"] = conditions.rfc3339(spec.cutover.watermark)
    return wanted


def _cutover_applied(status: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    applied = status.get("cutover") or {}
    cond = conditions.find(status.get("conditions"), "CutoverApplied")
    same = all(applied.get(k) == v for k, v in wanted.items()) and ("watermark" in wanted) == ("watermark" in applied)
    return bool(same and cond is not None and cond.get("status") == "True")


async def apply_cutover(
    dsn: str, spec: JudgeQueueSpec, *, connect_timeout: float, pooler: str = "none"
) -> dict[str, Any]:
    """Write the queue's flags in one transaction (created if missing); returns what the row now says.

    ``pooler`` is the spec's ``postgres.pooler``: behind a transaction pooler the connection names no
    prepared statements, since named ones stay on the pooler's server session after this connection
    closes and collide with the same names from a later (restarted) operator process."""
    conn = await connect_postgres(dsn, pooler=pooler, timeout=connect_timeout)
    try:
        async with conn.transaction():
            await create_queue(conn, spec.queue, mode=spec.cutover.mode)
            if spec.cutover.watermark is not None:
                flags = await set_cutover(
                    conn, spec.queue, mode=spec.cutover.mode, watermark=spec.cutover.watermark, paused=spec.paused
                )
            else:
                flags = await set_cutover(conn, spec.queue, mode=spec.cutover.mode, paused=spec.paused)
    finally:
        await conn.close()
    applied: dict[str, Any] = {"queue": flags.name, "mode": flags.mode, "paused": flags.paused,
                               "configVersion": flags.config_version}
    if flags.watermark is not None:
        applied["watermark"] = conditions.rfc3339(flags.watermark)
    return applied


async def _cutover(
    status: Mapping[str, Any], spec: JudgeQueueSpec, conns: Connections, config: OperatorConfig, generation: int,
    logger: logging.Logger | logging.LoggerAdapter[Any],
) -> tuple[dict[str, Any] | None, conditions.Condition | None]:
    """Apply the cutover flags if they are not applied yet: (new status.cutover or None, condition or None)."""
    wanted = _cutover_wanted(spec)
    if _cutover_applied(status, wanted):
        return None, None
    try:
        applied = await apply_cutover(conns.postgres_dsn, spec, connect_timeout=config.db_timeout,
                                      pooler=conns.pooler)
    except WatermarkMovedBack as exc:
        return None, conditions.Condition("CutoverApplied", "False", "WatermarkMovedBack", str(exc))
    except CutoverBlocked as exc:
        logger.warning(f"cutover not applied, will retry: {exc}")
        return None, conditions.Condition("CutoverApplied", "False", "WaitingForSubmits", str(exc))
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError, JudgeQueueError) as exc:
        logger.warning(f"cutover not applied, will retry: {exc!r}")
        return None, conditions.Condition(
            "CutoverApplied", "False", "DatabaseUnavailable", f"cannot apply flags to queue {spec.queue!r}: {exc}"
        )
    applied["generation"] = generation
    message = f"queue {spec.queue!r}: mode={applied['mode']} paused={applied['paused']}"
    if "watermark" in applied:
        message += f" watermark={applied['watermark']}"
    logger.info(f"cutover applied: {message}")
    return applied, conditions.Condition("CutoverApplied", "True", "Applied", message)


def _workers_status(spec: JudgeQueueSpec, owner: Owner, live: Mapping[str, Any] | None) -> dict[str, Any]:
    selector = ",".join(f"{k}={v}" for k, v in selector_labels(owner.name, "worker").items())
    live_spec = (live or {}).get("spec") or {}
    live_status = (live or {}).get("status") or {}
    return {
        "replicas": int(live_spec.get("replicas", 0) or 0),
        "ready": int(live_status.get("readyReplicas", 0) or 0),
        "selector": selector,
        "autoscaling": spec.worker.autoscaling,
    }


async def reconcile(
    body: Mapping[str, Any], state: OperatorState, logger: logging.Logger | logging.LoggerAdapter[Any]
) -> Status:
    """Bring children and queue flags to the spec; returns the status fields to patch."""
    meta = body["metadata"]
    generation = int(meta.get("generation", 0))
    status: Mapping[str, Any] = body.get("status") or {}
    previous = status.get("conditions")
    parsed = parse_spec(body.get("spec"), name=meta["name"])
    if isinstance(parsed, list):
        logger.error(f"invalid spec, nothing changed: {'; '.join(parsed)}")
        warn_event(state, body, "InvalidSpec", "; ".join(parsed))
        return {
            "observedGeneration": generation,
            "conditions": conditions.merge_conditions(
                previous, conditions.invalid_spec(parsed), generation=generation, now=_now()
            ),
        }
    owner = _owner(body)
    api = state.api
    try:
        conns = await _connections(api, owner.namespace, parsed)
    except SecretNotFound as exc:
        logger.error(f"{exc}; nothing changed, will retry")
        warn_event(state, body, "SecretNotFound", str(exc))
        return {
            "observedGeneration": generation,
            "conditions": conditions.merge_conditions(
                previous, conditions.failure("SecretNotFound", str(exc)), generation=generation, now=_now()
            ),
        }
    try:
        validate_redis_url(conns.redis_url)
    except ValueError as exc:  # the message never echoes a password
        message = f"Secret {parsed.redis.name} key {parsed.redis.key}: the Redis URL {exc}"
        logger.error(f"{message}; nothing changed, will retry")
        warn_event(state, body, "InvalidConnection", message)
        return {
            "observedGeneration": generation,
            "conditions": conditions.merge_conditions(
                previous, conditions.failure("InvalidConnection", message), generation=generation, now=_now()
            ),
        }
    children = await _apply_children(api, parsed, owner, logger)
    roles = [conditions.availability(r, children.get(f"{owner.name}-{r}")) for r in ("dispatcher", "worker", "reaper")]
    failures = await _failures(api, owner, roles, logger)
    updates = conditions.rollout(roles, failures)
    new_status: Status = {
        "observedGeneration": generation,
        "workers": _workers_status(parsed, owner, children.get(f"{owner.name}-worker")),
    }
    applied, cutover_condition = await _cutover(status, parsed, conns, state.config, generation, logger)
    if applied is not None:
        new_status["cutover"] = applied
    if cutover_condition is not None:
        updates.append(cutover_condition)
    new_status["conditions"] = conditions.merge_conditions(previous, updates, generation=generation, now=_now())
    return new_status


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
    body: Mapping[str, Any], spec: JudgeQueueSpec, state: OperatorState,
    logger: logging.Logger | logging.LoggerAdapter[Any],
) -> Status:
    """One autoscaler tick: read the backlog, decide, patch the worker Deployment, emit an Event."""
    owner = _owner(body)
    api = state.api
    status: Mapping[str, Any] = body.get("status") or {}
    conns = await _connections(api, owner.namespace, spec)
    backlog = await measure_backlog(conns, spec.queue, io_timeout=state.config.db_timeout)
    backlog_status = {"total": backlog.total, "outboxPending": backlog.outbox_pending,
                      "streamLag": backlog.stream_lag, "pel": backlog.pel,
                      "readAt": conditions.rfc3339(_now())}
    result: Status = {"backlog": backlog_status}
    if spec.worker.autoscaling == "external":
        return result
    name = f"{owner.name}-worker"
    live = await api.get(KIND_REFS["Deployment"], owner.namespace, name)
    if live is None:
        return result
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
        scale = {"spec": {"replicas": decision.replicas}}
        live = await api.patch(KIND_REFS["Deployment"], owner.namespace, name, scale)
        reason = "ScaledUp" if decision.replicas > current else "ScaledDown"
        message = f"workers {current} -> {decision.replicas}: {decision.reason}"
        logger.info(message)
        kopf.event(cast(kopf.Body, body), type="Normal", reason=reason, message=message)
    result["workers"] = _workers_status(spec, owner, live)
    return result


def _merge(status: Status, extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(status.get(key), dict):
            status[key].update(value)
        else:
            status[key] = value


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
    async def on_change(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **_: Any) -> None:
        meta = body["metadata"]
        state.handled[(f"{meta['namespace']}/{meta['name']}", int(meta.get("generation", 0)))] += 1
        async with state.lock(meta["uid"]):
            try:
                new_status = await reconcile(body, state, logger)
            except KubeError as exc:
                warn_event(state, body, "ReconcileFailed", f"Kubernetes API: {exc}")
                raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=5) from exc
        patch.status.update(new_status)

    @kopf.timer(GROUP, VERSION, PLURAL, interval=state.config.interval, registry=registry)
    async def tick(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
        meta = body["metadata"]
        async with state.lock(meta["uid"]):
            try:
                fresh = await state.api.get(KIND_REFS["JudgeQueue"], meta["namespace"], meta["name"])
            except KubeError as exc:
                logger.warning(f"timer skipped: {exc}")
                return
            if fresh is None or fresh["metadata"].get("deletionTimestamp"):
                return
            status = fresh.get("status") or {}
            if int(fresh["metadata"].get("generation", 0)) != int(status.get("observedGeneration", -1)):
                return  # a change handler has not processed this generation yet: it owns the next step
            parsed = parse_spec(fresh.get("spec"), name=meta["name"])
            if isinstance(parsed, list):
                return
            try:
                new_status = await reconcile(fresh, state, logger)
            except KubeError as exc:
                logger.warning(f"timer: Kubernetes API: {exc}")
                warn_event(state, fresh, "ReconcileFailed", f"Kubernetes API: {exc}")
                return
            degraded = conditions.find(new_status.get("conditions"), "Degraded")
            if degraded is None or degraded.get("status") != "True":
                merged_body = {**fresh, "status": {**status, **new_status}}
                try:
                    _merge(new_status, await autoscale_workers(merged_body, parsed, state, logger))
                except KubeError as exc:
                    logger.warning(f"timer: Kubernetes API: {exc}")
                    warn_event(state, fresh, "AutoscaleFailed", f"Kubernetes API: {exc}")
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError, RedisError,
                        SecretNotFound, ValueError) as exc:
                    logger.warning(f"timer: backlog not read: {exc!r}")
            # Written here, under the lock, so a tick's status never lands after a newer change's.
            try:
                await state.api.patch(KIND_REFS["JudgeQueue"], meta["namespace"], meta["name"],
                                      {"status": new_status}, subresource="status")
            except KubeError as exc:
                logger.warning(f"timer: status not written: {exc}")

    return registry
