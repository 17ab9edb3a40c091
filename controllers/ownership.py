"""One queue, one fleet: which queues a JudgeQueue's pods run on, releasing a queue the spec no
longer names or whose JudgeQueue is deleted, and telling when a recorded owner is gone."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import asyncpg

from judgequeue.core.base.errors import JudgeQueueError
from judgequeue.core.spec import parse_spec
from judgequeue.core.store.queues import owned_queues, release_queue
from judgequeue.core.transport.connect import connect_postgres

from .actions import log_action, log_problem
from .fleet import stop_fleet
from .kube import KIND_REFS, PODS, KubeError, SecretNotFound
from .render import (
    Owner,
    selector_labels,
)
from .state import Connections, OperatorState, jq_name, owner_of, queue_owner, read_connections, utc_now


async def queues_in_use(state: OperatorState, owner: Owner) -> set[str] | None:
    """The queues this JudgeQueue's pods run on (``JUDGEQUEUE_QUEUE`` of each, terminating ones
    included); None when its pods cannot be read."""
    selector = ",".join(f"{k}={v}" for k, v in selector_labels(owner.name).items())
    try:
        pods = await state.api.list_objects(PODS, owner.namespace, label_selector=selector)
    except KubeError as exc:
        log_problem(jq_name(owner), f"cannot read the pods to see which queues they run on: {exc}")
        return None
    return {str(env.get("value")) for pod in pods for container in (pod.get("spec") or {}).get("containers") or ()
            for env in container.get("env") or () if env.get("name") == "JUDGEQUEUE_QUEUE"}


async def release_abandoned(state: OperatorState, owner: Owner, conns: Connections, queues: list[str]) -> None:
    """Release the queues this JudgeQueue still holds but its spec no longer names (``spec.queue``
    renamed), each once none of its pods runs on it any more: until then the old pods still serve it,
    and a JudgeQueue waiting for it must not start a second fleet there. The handoff of a renamed
    queue is thus: claim the new one, roll the pods over (or, when the new one is taken, scale to
    zero), release the old one when its last pod is gone."""
    if not queues:
        return
    in_use = await queues_in_use(state, owner)
    free = [q for q in queues if in_use is not None and q not in in_use]
    if not free:
        return
    try:
        conn = await connect_postgres(conns.postgres_dsn, pooler=conns.pooler, timeout=state.config.db_timeout)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError, JudgeQueueError) as exc:
        log_problem(jq_name(owner), f"cannot release {', '.join(free)} yet: {exc!r}")
        return
    try:
        for queue in free:
            if await release_queue(conn, queue, queue_owner(owner)):
                log_action("release", f"queue {queue}", "spec.queue names another queue now and no pod of this"
                           " JudgeQueue runs on it any more", judgequeue=jq_name(owner))
    finally:
        await conn.close()


async def owner_gone(state: OperatorState, recorded: str, queue: str) -> bool:
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
        if deleting_for(pod) >= RELEASE_WAIT:
            continue
        env = [e for c in (pod.get("spec") or {}).get("containers") or () for e in c.get("env") or ()]
        if any(e.get("name") == "JUDGEQUEUE_QUEUE" and e.get("value") == queue for e in env):
            return False
    return True


#: How long a deleted JudgeQueue keeps its queue while its pods still run on it (then it lets go
#: anyway: a node that is gone leaves pods Terminating for as long as nobody deletes them by force).
RELEASE_WAIT = 120.0


def deleting_for(body: Mapping[str, Any]) -> float:
    stamp = (body.get("metadata") or {}).get("deletionTimestamp")
    if not stamp:
        return 0.0
    return max(0.0, (utc_now() - datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))).total_seconds())


async def release(body: Mapping[str, Any], state: OperatorState, *, drain: bool = False) -> None:
    """On deletion: give up every queue the JudgeQueue holds (its ``spec.queue``, and one it was
    renamed away from). With ``drain`` (the delete handler), its fleet is scaled to zero first and
    the queues are released once none of its pods runs any more (at most :data:`RELEASE_WAIT` after
    the deletion), so a JudgeQueue waiting for the queue never starts a second
    fleet beside the last pods of the first. Best effort: an unreachable database must not keep the
    JudgeQueue from going (``docs/runbook.md`` says how to release it by hand). Runs again, finding
    nothing left, when the deletion is seen done, so a JudgeQueue whose finalizer was released by hand
    while the operator runs releases its queue too."""
    owner = owner_of(body)
    queue = ((body.get("status") or {}).get("cutover") or {}).get("queue")
    parsed = parse_spec(body.get("spec"), name=owner.name)
    if not queue or isinstance(parsed, list):
        state.forget(owner.uid)
        return
    if drain:
        try:
            await stop_fleet(state, owner, "the JudgeQueue is deleted")
            while deleting_for(body) < RELEASE_WAIT:
                if not await queues_in_use(state, owner):
                    break
                await asyncio.sleep(1.0)
        except KubeError as exc:
            log_problem(jq_name(owner), f"cannot stop the fleet before releasing the queue: {exc}")
    state.forget(owner.uid)
    try:
        conns = await read_connections(state.api, owner.namespace, parsed)
        conn = await connect_postgres(conns.postgres_dsn, pooler=conns.pooler, timeout=state.config.db_timeout)
        try:
            held = await owned_queues(conn, queue_owner(owner))
            released = [q for q in held if await release_queue(conn, q, queue_owner(owner))]
        finally:
            await conn.close()
    except (SecretNotFound, KubeError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError,
            JudgeQueueError) as exc:
        log_problem(jq_name(owner), f"queue {queue}: ownership not released ({exc!r}); release it by hand"
                    " (docs/runbook.md, \"A queue owned by another JudgeQueue\")")
        return
    for name in released:
        log_action("release", f"queue {name}", "the JudgeQueue is deleted", judgequeue=jq_name(owner))
