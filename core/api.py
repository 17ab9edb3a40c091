"""The public API for applications: what an online judge's web app needs from judgequeue.

Everything here is stable; everything else in ``judgequeue.core`` is internal. An application
writes submissions in its own transaction (:func:`submit`), starts a new generation of one
(:func:`rejudge`), and reads where one stands (:func:`result`). Judge plugins implement
:class:`Judge` and return a :class:`Verdict`. Errors are subclasses of :class:`JudgeQueueError`;
each says what was wrong with the input, and a refused call writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from . import submissions
from .errors import (
    InvalidPayload,
    InvalidQueueName,
    JudgeQueueError,
    PayloadTooLarge,
    UnknownQueue,
    UnknownSubmission,
)
from .judges import Judge, Verdict
from .outbox import rejudge, submit
from .states import VERDICTS


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


__all__ = [
    "VERDICTS",
    "InvalidPayload",
    "InvalidQueueName",
    "Judge",
    "JudgeQueueError",
    "PayloadTooLarge",
    "Result",
    "UnknownQueue",
    "UnknownSubmission",
    "Verdict",
    "rejudge",
    "result",
    "submit",
]
