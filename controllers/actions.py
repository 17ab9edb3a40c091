"""What the operator did, one JSON line each: every create, replace, delete, cutover write, scale
and queue claim, with the object, the JudgeQueue it serves and the reason (pure apart from logging).

These lines go through the ``judgequeue.operator`` logger at INFO, so ``kubectl logs`` of the operator
shows every action at the default level (Kopf's own per-object logger is kept at WARNING: it
reports each handler run). At DEBUG each line also carries ``diff``: the values that differed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

ACTIONS = logging.getLogger("judgequeue.operator")

#: The actions a line may name (``action`` field).
KINDS = ("create", "replace", "delete", "cutover", "scale", "claim", "release")


def log_action(
    action: str, obj: str, reason: str, *, judgequeue: str, diff: Any = None, level: int = logging.INFO,
    fields: Mapping[str, Any] | None = None,
) -> None:
    """One line: ``<action> <obj>: <reason>`` with ``action``, ``object``, ``judgequeue`` (namespace/name)
    and ``reason`` fields (and ``diff`` when DEBUG is on and there is one)."""
    if action not in KINDS:
        raise ValueError(f"unknown action {action!r} (one of {', '.join(KINDS)})")
    extra: dict[str, Any] = {"action": action, "object": obj, "judgequeue": judgequeue, "reason": reason,
                             **(fields or {})}
    if diff is not None and ACTIONS.isEnabledFor(logging.DEBUG):
        extra["diff"] = diff
    ACTIONS.log(level, f"{action} {obj}: {reason}", extra=extra)


def log_problem(judgequeue: str, message: str, *, level: int = logging.WARNING, **fields: Any) -> None:
    """A failure of a reconcile step, on the same logger (what status reports, with the JudgeQueue)."""
    ACTIONS.log(level, message, extra={"judgequeue": judgequeue, **fields})
