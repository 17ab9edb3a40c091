"""Reads of ``judgequeue.submissions`` and the one write tools make to it (docs/design.md §2, §3).

The table's writes are owned by narrow doors: the SQL functions behind :func:`outbox.submit` and
:func:`outbox.rejudge`, the lease fence in :mod:`leases` (acquire, renew, verdict, release,
rescue), the dispatcher's mark (a DEAD delivery ends its submission, in the same statement) and
the dead-letter record. This module holds what the tools need besides: reading rows and counts,
and the generation bump of a DLQ replay; a submission's verdict history
(``judgequeue.verdict_history``, written by a trigger with every verdict) and its cancellation
(``judgequeue.cancel()``). Terminal means a status in :data:`states.ENDED_STATUSES`: a verdict, or
``CANCELLED``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from ..base.errors import InvalidReason, UnknownSubmission, typed_pg_errors
from ..base.names import validate_queue_name
from ..base.states import ENDED_STATUSES
from . import sql

#: Longest cancellation reason (the SQL function enforces the same).
MAX_REASON_CHARS = 1000


async def read(conn: asyncpg.Connection, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The rows (id, status, generation, verdict, created_at, finished_at) of ``ids`` that exist,
    the verdict decoded from its JSON (None until there is one)."""
    rows = await conn.fetch(sql.query("submissions_read"), list(ids))
    return {r["id"]: {**r, "verdict": None if r["verdict"] is None else json.loads(r["verdict"])} for r in rows}


def is_terminal(status: str) -> bool:
    """True for a verdict or a cancellation: the submission will not change again without a
    generation bump (a rejudge)."""
    return status in ENDED_STATUSES


async def count_by_status(conn: asyncpg.Connection, queue: str) -> dict[str, int]:
    """How many of ``queue``'s submissions are in each status (statuses with none are absent)."""
    return {r["status"]: r["n"] for r in await conn.fetch(sql.query("submissions_count_by_status"), queue)}


async def finished_since(conn: asyncpg.Connection, queue: str, seconds: float) -> int:
    """How many of ``queue``'s submissions got their verdict in the last ``seconds`` (database clock)."""
    return int(await conn.fetchval(sql.query("submissions_finished_since"), queue, seconds))


async def exists(conn: asyncpg.Connection, submission: int) -> bool:
    return bool(await conn.fetchval(sql.query("submission_exists"), submission))


async def bump_generation(conn: asyncpg.Connection, submission: int, generation: int) -> int | None:
    """Queue ``submission`` again under a new generation if it is still at ``generation`` (a DLQ replay).

    Returns the new generation, or None when the submission moved on or does not exist.
    """
    value: Any = await conn.fetchval(sql.query("submission_bump_generation"), submission, generation)
    return None if value is None else int(value)


@dataclass(frozen=True)
class Cancellation:
    """What :func:`cancel` did: the generation the submission is cancelled at, and whether this
    call cancelled it (False: it was cancelled already and nothing changed)."""

    submission_id: int
    generation: int
    cancelled_now: bool


async def cancel(conn: asyncpg.Connection, queue: str, submission: int, reason: str) -> Cancellation:
    """Cancel ``submission`` of ``queue`` in the caller's transaction (``judgequeue.cancel()``).

    Raises :class:`InvalidReason` for a reason that is not 1 to 1,000 characters (or only blanks)
    and :class:`UnknownSubmission` for an id that is not one of ``queue``'s; nothing is written then.
    """
    validate_queue_name(queue)
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON_CHARS:
        got = f"{len(reason)} characters" if isinstance(reason, str) else type(reason).__name__
        raise InvalidReason(f"reason must be 1 to {MAX_REASON_CHARS} characters (not only blanks), got {got}")
    with typed_pg_errors():
        row = await conn.fetchrow(sql.query("submission_cancel"), queue, submission, reason)
    assert row is not None
    return Cancellation(submission, int(row["generation"]), bool(row["cancelled_now"]))


@dataclass(frozen=True)
class HistoryEntry:
    """One verdict a submission was given: its generation, status and cause (one of
    :data:`~judgequeue.core.base.states.HISTORY_CAUSES`), the stored document (per-test results,
    score, reason) and when it was stored (database clock)."""

    generation: int
    status: str
    cause: str
    verdict: dict[str, Any] | None
    stored_at: datetime

    @property
    def reason(self) -> str | None:
        value = self.verdict.get("reason") if isinstance(self.verdict, dict) else None
        return value if isinstance(value, str) else None

    @property
    def score(self) -> Any:
        details = self.verdict.get("details") if isinstance(self.verdict, dict) else None
        return details.get("score") if isinstance(details, dict) else None


async def history(conn: asyncpg.Connection, queue: str, submission: int) -> list[HistoryEntry]:
    """Every verdict ``submission`` of ``queue`` was given still within the retention, oldest first.

    Empty for a submission without a verdict yet; :class:`UnknownSubmission` when it is not one of
    ``queue``'s (and has no history left there).
    """
    validate_queue_name(queue)
    rows = await conn.fetch(sql.query("submission_history"), queue, submission)
    if not rows and not await conn.fetchval(sql.query("submission_in_queue"), queue, submission):
        raise UnknownSubmission(f"unknown submission {submission} in queue {queue!r}")
    return [
        HistoryEntry(
            generation=r["generation"], status=r["status"], cause=r["cause"],
            verdict=None if r["verdict"] is None else json.loads(r["verdict"]), stored_at=r["created_at"],
        )
        for r in rows
    ]


async def prune_history(
    conn: asyncpg.Connection, queue: str, *, retention: float, batch: int = 1000, max_batches: int = 100
) -> int:
    """Delete ``queue``'s history rows stored more than ``retention`` seconds ago (the verdicts'
    retention), ``batch`` rows per statement; returns the rows deleted."""
    return await sql.prune_in_batches(conn, sql.query("history_prune"), retention, batch, queue,
                                      max_batches=max_batches)
