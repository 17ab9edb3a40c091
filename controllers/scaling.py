"""The autoscaler's I/O: the backlog read through the roles' own connections, and the worker
Deployment scaled on :func:`.autoscale.decide` (the decision itself is pure)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from judgequeue.core.spec import JudgeQueueSpec
from judgequeue.core.store.backlog import Backlog, read_backlog
from judgequeue.core.transport.connect import connect_postgres, redis_client

from . import autoscale, conditions
from .actions import log_action
from .fleet import workers_status
from .kube import KIND_REFS
from .kube_events import normal_event
from .state import Connections, OperatorState, Status, jq_name, owner_of, utc_now


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
    owner = owner_of(body)
    status: Mapping[str, Any] = body.get("status") or {}
    backlog = await measure_backlog(conns, spec.queue, io_timeout=state.config.db_timeout)
    backlog_status = {"total": backlog.total, "outboxPending": backlog.outbox_pending,
                      "streamLag": backlog.stream_lag, "pel": backlog.pel,
                      "readAt": conditions.rfc3339(utc_now())}
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
        log_action("scale", f"Deployment {name}", message, judgequeue=jq_name(owner),
                   fields={"replicas": decision.replicas, "from": current})
        normal_event(body, reason, message)
        result["workers"] = workers_status(spec, owner, scaled)
    return result


def merge_status(status: Status, extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(status.get(key), dict):
            status[key].update(value)
        else:
            status[key] = value
