"""The public API for applications: what an online judge's web app needs from judgequeue.

Everything here is stable; everything else in ``judgequeue.core`` is internal. An application
writes submissions in its own transaction (:func:`submit`, in one of the queue's priority classes
and with a fairness key when it has them), starts a new generation of one (:func:`rejudge`) or of
many in one statement (:func:`rejudge_many`: by ids, problem, time range), and reads where one
stands (:func:`result`). While a queue is in shadow mode it
reports what the judge being replaced decided (:func:`report_legacy_verdict`), which judgequeue
compares with its own shadow verdicts; a shadow verdict is never a submission's verdict, so
:func:`result` never shows one. Judge plugins implement
:class:`Judge` and return a :class:`Verdict`. Errors are subclasses of :class:`JudgeQueueError`;
each says what was wrong with the input, and a refused call writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from .base.errors import (
    InvalidClass,
    InvalidPayload,
    InvalidQueueName,
    InvalidVerdict,
    JudgeQueueError,
    NotShadowed,
    PayloadTooLarge,
    UnknownQueue,
    UnknownSubmission,
)
from .base.states import VERDICTS
from .judges import Judge, Verdict
from .store import shadow, submissions
from .store.outbox import rejudge, rejudge_many, submit


@dataclass(frozen=True)
class Result:
    """Where a submission stands: its status (PENDING, JUDGING or a verdict in :data:`VERDICTS`),
    its generation, and the verdict's details once it has one (per-test results, score, message)."""

    submission_id: int
    status: str
    generation: int
    details: dict[str, Any] | None
    created_at: datetime
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        """True once the current generation has its verdict."""
        return self.status in VERDICTS


async def result(conn: asyncpg.Connection, submission_id: int) -> Result:
    """The current state of ``submission_id``; raises :class:`UnknownSubmission` if there is none."""
    row = (await submissions.read(conn, [submission_id])).get(submission_id)
    if row is None:
        raise UnknownSubmission(f"unknown submission {submission_id}")
    return Result(
        submission_id=submission_id, status=row["status"], generation=row["generation"], details=row["verdict"],
        created_at=row["created_at"], finished_at=row["finished_at"],
    )  # fmt: skip


async def report_legacy_verdict(
    conn: asyncpg.Connection, submission_id: int, verdict: str, details: dict[str, Any] | None = None
) -> None:
    """Record the legacy judge's verdict of ``submission_id``, in the caller's transaction.

    ``verdict`` is one of :data:`VERDICTS`; ``details`` (optional) a JSON object, shown beside the
    shadow verdict's by ``judgequeue shadow diff``: give it the program judge's shape (``tests``: a list
    of ``{"test", "verdict", "cpu_ms", "wall_ms", "memory_kb", "message"}``, ``score``, ``reason``) and
    both sides line up. Reporting again replaces the previous report (the legacy judge judged again).

    Accepted for a submission of a queue in shadow mode, and for one that was sent to shadow judging
    (a legacy verdict may arrive after the flip). Refused, with nothing written: a verdict that is not
    one of :data:`VERDICTS` or details that are not an object (:class:`InvalidVerdict`), details
    that are not JSON (:class:`InvalidPayload`) or over 1 MiB (:class:`PayloadTooLarge`), an unknown
    id (:class:`UnknownSubmission`), and a submission of a queue not in shadow mode that was never
    shadowed (:class:`NotShadowed`). SQL callers use ``judgequeue.report_legacy_verdict(id, verdict,
    details)``, which refuses the same with the SQLSTATEs of :mod:`judgequeue.core.base.errors`.
    """
    await shadow.report_legacy_verdict(conn, submission_id, verdict, details)


__all__ = [
    "VERDICTS",
    "InvalidClass",
    "InvalidPayload",
    "InvalidQueueName",
    "InvalidVerdict",
    "Judge",
    "JudgeQueueError",
    "NotShadowed",
    "PayloadTooLarge",
    "Result",
    "UnknownQueue",
    "UnknownSubmission",
    "Verdict",
    "rejudge",
    "rejudge_many",
    "report_legacy_verdict",
    "result",
    "submit",
]
