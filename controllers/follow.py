"""Passes between the timer's: the daemon that follows a JudgeQueue's queue row (LISTEN), its
Deployments (pokes) and a rollout in flight, and the locked pass it makes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import asyncpg

from judgequeue.core.base.errors import JudgeQueueError
from judgequeue.core.spec import parse_spec
from judgequeue.core.store.queues import listen_queues
from judgequeue.core.transport.connect import connect_postgres

from . import conditions, redact
from .actions import log_problem
from .kube import KIND_REFS, KubeError, SecretNotFound
from .reconcile import safe_reconcile
from .state import OperatorState, jq_name, owner_of


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
    postgres, _, listen = parsed.connections("operator")  # its own credentials, if the spec names them
    if listen is None and parsed.postgres_pooler == "transaction":
        return None
    ref = listen or postgres
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
                    log_problem(jq_name(owner_of(body)), f"queue {source[1]}: cannot listen for its row"
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
            log_problem(jq_name(owner_of(body)), f"listening stopped ({redact.redact(repr(exc))})", level=logging.DEBUG)
        finally:
            if state.pokes.get(meta["uid"]) is heard:
                del state.pokes[meta["uid"]]
            if conn is not None:
                conn.terminate()
