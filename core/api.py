"""The public API for applications: what an online judge's web app needs from judgequeue.

Everything here is stable; everything else in ``judgequeue.core`` is internal. An application
writes submissions in its own transaction (:func:`submit`, in one of the queue's priority classes
and with a fairness key when it has them), starts a new generation of one (:func:`rejudge`) or of
many in one statement (:func:`rejudge_many`: by ids, problem, time range), cancels one
(:func:`cancel`: a queued job never starts, a running one is stopped, nothing of it is stored), and
reads where one stands (:func:`result`) and every verdict it was given (:func:`history`). A
rejudge can also be a proposal (:func:`rejudging_preview`): judged on the side, shown as an
old -> new matrix (:func:`rejudging_show`), then applied (:func:`rejudging_apply`) or discarded
(:func:`rejudging_cancel`) as a whole. While a
queue is in shadow mode it reports what the judge being replaced decided
(:func:`report_legacy_verdict`), which judgequeue compares with its own shadow verdicts; a shadow
verdict is never a submission's verdict, so :func:`result` never shows one. Judge plugins
implement :class:`Judge` and return a :class:`Verdict`. Errors are subclasses of :class:`JudgeQueueError`;
each says what was wrong with the input, and a refused call writes nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from .base.errors import (
    InvalidClass,
    InvalidPayload,
    InvalidQueueName,
    InvalidReason,
    InvalidVerdict,
    JudgeQueueError,
    NotShadowed,
    PayloadTooLarge,
    RejudgingRefused,
    UnknownQueue,
    UnknownRejudging,
    UnknownSubmission,
)
from .base.states import ENDED_STATUSES, HISTORY_CAUSES, VERDICTS
from .judges import Judge, Verdict
from .runtime import event_feed
from .store import events, rejudgings, shadow, submissions
from .store.events import InvalidKinds, InvalidPosition, Position, VerdictEvent
from .store.outbox import rejudge, rejudge_many, submit
from .store.rejudgings import Application, Cancelled, Preview, Report, Summary
from .store.rejudgings import preview as rejudging_preview
from .store.submissions import Cancellation, HistoryEntry


@dataclass(frozen=True)
class Result:
    """Where a submission stands: its status (PENDING, JUDGING, a verdict in :data:`VERDICTS`, or
    CANCELLED), its generation, and the verdict's details once it has one (per-test results, score,
    message; for a cancellation its reason)."""

    submission_id: int
    status: str
    generation: int
    details: dict[str, Any] | None
    created_at: datetime
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        """True once the current generation has its verdict (or the submission was cancelled)."""
        return self.status in ENDED_STATUSES


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


async def cancel(conn: asyncpg.Connection, queue: str, submission_id: int, reason: str) -> Cancellation:
    """Cancel ``submission_id`` of ``queue`` in the caller's transaction; it ends ``CANCELLED``.

    From the commit on: a queued job is never started (its deliveries are cancelled, and a stream
    entry already sent is acked as stale without running); a running one is stopped by its worker
    (sandbox killed, remote call aborted) within about a second; nothing of any earlier attempt is
    ever stored (the cancellation starts a new generation, which fences every earlier one out). A
    submission that has a verdict is cancelled too (the verdict stays in :func:`history`).
    Idempotent: cancelling a cancelled submission changes nothing (``cancelled_now`` is False).
    :func:`rejudge` reopens it. The cancellation is in :func:`history` and, as every verdict, in
    :func:`verdict_events`. Refused, with nothing written: a reason that is not 1 to 1,000
    characters (:class:`InvalidReason`), an id that is not one of ``queue``'s
    (:class:`UnknownSubmission`). SQL callers use ``judgequeue.cancel(queue, id, reason)``, which
    returns ``(generation, cancelled_now)``.
    """
    return await submissions.cancel(conn, queue, submission_id, reason)


async def history(conn: asyncpg.Connection, queue: str, submission_id: int) -> list[HistoryEntry]:
    """Every verdict ``submission_id`` of ``queue`` was given, oldest first: per generation its
    status, its cause (one of :data:`HISTORY_CAUSES`: ``judged``, ``rejudged``, ``rescued``,
    ``cancelled``, ``applied``: from a rejudging), the stored verdict and when it was stored. Each
    is written in its verdict's own transaction, and pruned with the verdicts' retention. Empty
    before the first verdict; raises :class:`UnknownSubmission` for an id that is not one of
    ``queue``'s."""
    return await submissions.history(conn, queue, submission_id)


async def rejudging_show(conn: asyncpg.Connection, queue: str, rejudging: int) -> Report:
    """Rejudging ``rejudging`` of ``queue``: its state and progress, the old -> new matrix (counts per
    (status at the preview, proposed status); ``PENDING`` while not judged yet) and each submission
    whose proposed status differs, with both verdict documents (per-test tables in their
    ``details``). :class:`UnknownRejudging` for an id that is not one of ``queue``'s."""
    return await rejudgings.show(conn, queue, rejudging)


async def rejudging_list(conn: asyncpg.Connection, queue: str) -> list[Summary]:
    """``queue``'s rejudgings still within the retention, newest first."""
    return await rejudgings.list_all(conn, queue)


async def rejudging_apply(
    conn: asyncpg.Connection, queue: str, rejudging: int, *, partial: bool = False
) -> Application:
    """Make every proposed verdict of ``rejudging`` visible, in the caller's transaction: all of them
    or (on error or rollback) none.

    Each becomes its submission's verdict at a new generation (a job still running for an older
    one is fenced out), recorded in :func:`history` with cause ``applied`` and emitted as a verdict
    event like any verdict. A submission whose generation moved since the preview (rejudged,
    cancelled, or applied from another rejudging) keeps what it has: its proposal is *stale*,
    skipped and listed in :attr:`Application.stale_ids`. Refused (:class:`RejudgingRefused`) while
    proposed verdicts are missing, naming how many, unless ``partial`` (then only the judged ones
    apply and the rest are cancelled), and for a cancelled rejudging. Applying an applied rejudging
    changes nothing (``applied_now`` False). :class:`UnknownRejudging` for an unknown id."""
    return await rejudgings.apply(conn, queue, rejudging, partial=partial)


async def rejudging_cancel(conn: asyncpg.Connection, queue: str, rejudging: int) -> Cancelled:
    """Discard ``rejudging`` in the caller's transaction: every visible verdict stays as it is; its
    jobs still waiting never run and running ones are stopped (their results are fenced out).
    Idempotent (``cancelled_now`` False the second time); refused for an applied rejudging
    (:class:`RejudgingRefused`); :class:`UnknownRejudging` for an unknown id."""
    return await rejudgings.cancel(conn, queue, rejudging)


def verdict_events(
    dsn: str,
    *,
    after: Position | str | None = None,
    queue: str | None = None,
    kinds: Sequence[str] = ("verdict",),
) -> AsyncIterator[VerdictEvent]:
    """Every verdict stored after ``after``, as an async iterator that never ends and never misses one.

    ``after`` is a :class:`Position` (or its text, ``<txid>-<id>``) an earlier event carried; None
    starts before every event still retained (the verdicts' retention). ``queue`` keeps one queue's
    events. Events come in commit order, which is generation order per submission; after a lost
    connection the iterator reconnects and reads on from the last event it gave, so keep each
    event's ``position`` with the effect you applied and pass it back after a restart. An event may
    come again after such a restart of yours: :attr:`VerdictEvent.key`
    (``queue:submission:generation``) names its effect. ``dsn`` must reach Postgres directly (not
    through a transaction pooler): the iterator holds a ``LISTEN`` session.

    ``kinds``: verdicts only by default; ``("verdict", "progress")`` adds the live progress of
    submissions being judged on queues whose workers report it (``VerdictEvent.kind`` tells them
    apart; a progress event's ``status`` is ``JUDGING`` and its ``progress`` says how far it got).
    A submission's progress events come before its generation's verdict; drop one whose generation
    already has a verdict you applied. An unknown kind raises ``InvalidKinds``.
    """
    start = events.START if after is None else Position.parse(after) if isinstance(after, str) else after
    return event_feed.follow(dsn, after=start, queue=queue, kinds=events.check_kinds(kinds))


async def events_head(conn: asyncpg.Connection) -> Position:
    """The position after every event committed so far: ``verdict_events(after=...)`` from here
    gives only verdicts stored from now on."""
    return await events.head(conn)


__all__ = [
    "ENDED_STATUSES",
    "HISTORY_CAUSES",
    "VERDICTS",
    "Application",
    "Cancellation",
    "Cancelled",
    "HistoryEntry",
    "InvalidClass",
    "InvalidKinds",
    "InvalidPayload",
    "InvalidPosition",
    "InvalidQueueName",
    "InvalidReason",
    "InvalidVerdict",
    "Judge",
    "JudgeQueueError",
    "NotShadowed",
    "PayloadTooLarge",
    "Position",
    "Preview",
    "RejudgingRefused",
    "Report",
    "Result",
    "Summary",
    "UnknownQueue",
    "UnknownRejudging",
    "UnknownSubmission",
    "Verdict",
    "VerdictEvent",
    "cancel",
    "events_head",
    "history",
    "rejudge",
    "rejudge_many",
    "rejudging_apply",
    "rejudging_cancel",
    "rejudging_list",
    "rejudging_preview",
    "rejudging_show",
    "report_legacy_verdict",
    "result",
    "submit",
    "verdict_events",
]
