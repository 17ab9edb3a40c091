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

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from .follow import follow_queue_row, refresh
from .kube import KIND_REFS, KubeApi, KubeError
from .kube_events import warn_event
from .ownership import release
from .reconcile import safe_reconcile
from .render import (
    GROUP,
    MANAGED_BY,
    PLURAL,
    VERSION,
)
from .state import OperatorState


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
