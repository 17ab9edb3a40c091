"""Events on the JudgeQueue (``kubectl describe jq``): a Warning for each failure, rate-limited,
and one Event per condition change, scrubbed of secrets like everything the operator writes."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, cast

import kopf

from . import redact
from .state import OperatorState

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
