"""Rejudgings: a rejudge as a proposal, judged on the side, then applied or cancelled whole.

:func:`preview` opens a rejudging (``judgequeue.rejudging_preview()``): each selected submission
with a verdict gets a *probe*, a submission of its own in the same queue with the same payload and
fairness key, in the rejudging's class (``submissions.rejudging`` names the rejudging). Probes are
ordinary jobs, so the workers judge them with every guarantee a job has (lease, fence, rescue,
retries) while the submission's own status, verdict and generation stay as they are. A probe's
verdict is the *proposed verdict*; it is never an event, nor in a history.

:func:`apply` makes every proposed verdict visible in the caller's transaction, each at a new
generation of its submission (fencing out any job of an older one), with history cause ``applied``
and a verdict event each; a submission whose generation moved since the preview (rejudged,
cancelled, applied from another rejudging) keeps what it has and is reported *stale*.
:func:`cancel` discards a rejudging: its waiting probes are cancelled, nothing visible changes.
:func:`show` gives the old -> new matrix and the changed submissions with both verdicts.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from ..base.errors import UnknownRejudging, typed_pg_errors
from ..base.names import validate_queue_name
from . import sql
from .outbox import selected_ids

#: A proposal not judged yet, in the matrix's "new" column.
NOT_JUDGED = "PENDING"


async def _call(conn: asyncpg.Connection, statement: str, *args: Any) -> list[asyncpg.Record]:
    """Run ``statement`` (a named query's call), its refusals as judgequeue's typed errors."""
    with typed_pg_errors():
        return list(await conn.fetch(statement, *args))


def _check_id(rejudging: int) -> None:
    if isinstance(rejudging, bool) or not isinstance(rejudging, int) or rejudging <= 0:
        raise UnknownRejudging(f"unknown rejudging {rejudging!r}: a rejudging id is a positive integer")


@dataclass(frozen=True)
class Preview:
    """A rejudging just opened: its id, the submissions it previews, and those the selection named
    that were left out (still waiting for their verdict, or cancelled)."""

    rejudging: int
    previewed: int
    left_out: int


async def preview(
    conn: asyncpg.Connection,
    queue: str,
    *,
    job_class: str | None = None,
    ids: Sequence[int] | None = None,
    problem: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Preview:
    """Open a *rejudging* of ``queue``'s submissions in the caller's transaction: a proposal, judged on
    the side, that changes no visible verdict until :func:`apply` (``judgequeue.core.api.rejudging_preview``).

    Selects as :func:`~judgequeue.core.store.outbox.rejudge_many` does (``ids``, the payload's
    ``problem``, created in ``[since, until)``; at least one). Each selected submission with a verdict
    is judged again by the queue's workers in ``job_class`` (None: the queue's lowest), with every
    guarantee a job has (fenced leases, rescue of a killed worker's jobs, at most one proposed verdict
    each); one still waiting for its verdict, or cancelled, is left out (counted in
    :attr:`Preview.left_out`). Its status, verdict and generation (``api.result``) stay as they are.
    Refused, with nothing written: an unknown queue (:class:`UnknownQueue`), a class the queue lacks
    or no filter (:class:`InvalidClass`), a queue not in live mode (:class:`RejudgingRefused`)."""
    listed = selected_ids(queue, ids, problem, since, until, "a rejudging")
    rows = await _call(conn, sql.query("rejudging_preview"), queue, job_class, listed, problem, since, until)
    row = rows[0]
    return Preview(int(row["rejudging"]), int(row["previewed"]), int(row["left_out"]))


@dataclass(frozen=True)
class Application:
    """What :func:`apply` did: proposals made visible, skipped as stale (the submission moved on since
    the preview: ``stale_ids``), and missing (not judged; only with ``partial``). ``applied_now`` is
    False when the rejudging had been applied already (the figures are that apply's)."""

    rejudging: int
    applied: int
    stale: int
    missing: int
    applied_now: bool
    stale_ids: tuple[int, ...] = ()


async def apply(conn: asyncpg.Connection, queue: str, rejudging: int, *, partial: bool = False) -> Application:
    """Apply ``rejudging`` of ``queue`` in the caller's transaction (``judgequeue.rejudging_apply()``)."""
    validate_queue_name(queue)
    _check_id(rejudging)
    row = (await _call(conn, sql.query("rejudging_apply"), queue, rejudging, bool(partial)))[0]
    items = await _call(conn, sql.query("rejudging_items"), queue, rejudging)
    stale_ids = tuple(r["submission_id"] for r in items if r["outcome"] == "stale")
    return Application(
        rejudging, int(row["applied"] or 0), int(row["stale"] or 0), int(row["missing"] or 0),
        bool(row["applied_now"]), stale_ids,
    )  # fmt: skip


@dataclass(frozen=True)
class Cancelled:
    """What :func:`cancel` did: whether this call cancelled the rejudging (False: it was already),
    and how many of its probes it stopped (waiting or being judged)."""

    rejudging: int
    cancelled_now: bool
    stopped: int


async def cancel(conn: asyncpg.Connection, queue: str, rejudging: int) -> Cancelled:
    """Discard ``rejudging`` of ``queue`` in the caller's transaction (``judgequeue.rejudging_cancel()``)."""
    validate_queue_name(queue)
    _check_id(rejudging)
    row = (await _call(conn, sql.query("rejudging_cancel"), queue, rejudging))[0]
    return Cancelled(rejudging, bool(row["cancelled_now"]), int(row["stopped"]))


@dataclass(frozen=True)
class Summary:
    """One rejudging as ``rejudging list`` shows it."""

    rejudging: int
    queue: str
    job_class: str
    state: str  # OPEN, APPLIED, CANCELLED
    selection: dict[str, Any]
    items: int
    judged: int
    left_out: int
    created_at: datetime
    finished_at: datetime | None
    applied: int | None
    stale: int | None
    missing: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.rejudging, "queue": self.queue, "class": self.job_class, "state": self.state,
            "selection": self.selection, "items": self.items, "judged": self.judged, "left_out": self.left_out,
            "created_at": self.created_at.isoformat(),
            "finished_at": None if self.finished_at is None else self.finished_at.isoformat(),
            "applied": self.applied, "stale": self.stale, "missing": self.missing,
        }  # fmt: skip


def _summary(r: asyncpg.Record) -> Summary:
    return Summary(
        r["id"], r["queue"], r["job_class"], r["state"], json.loads(r["selection"]), int(r["items"]),
        int(r["judged"]), int(r["left_out"]), r["created_at"], r["finished_at"], r["applied"], r["stale"],
        r["missing"],
    )  # fmt: skip


async def list_all(conn: asyncpg.Connection, queue: str) -> list[Summary]:
    """``queue``'s rejudgings still within the retention, newest first."""
    validate_queue_name(queue)
    return [_summary(r) for r in await _call(conn, sql.query("rejudging_list"), queue, None)]


@dataclass(frozen=True)
class Change:
    """A previewed submission whose proposed status differs from its status at the preview, with both
    verdict documents (their ``details`` hold the per-test tables); ``moved_on`` when its generation
    changed since (it would be skipped as stale), ``outcome`` once applied."""

    submission_id: int
    old_status: str
    new_status: str
    old_verdict: dict[str, Any] | None
    new_verdict: dict[str, Any] | None
    moved_on: bool
    outcome: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.submission_id, "old_status": self.old_status, "new_status": self.new_status,
            "old_verdict": self.old_verdict, "new_verdict": self.new_verdict, "moved_on": self.moved_on,
            "outcome": self.outcome,
        }  # fmt: skip


@dataclass(frozen=True)
class Report:
    """``rejudging show``: the rejudging, its old -> new matrix (counts per (old status, new status);
    :data:`NOT_JUDGED` while a proposal is missing), and its changed submissions."""

    summary: Summary
    matrix: dict[tuple[str, str], int]
    changed: list[Change] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.summary.to_json(),
            "matrix": [{"old": o, "new": n, "count": c} for (o, n), c in sorted(self.matrix.items())],
            "changed": [c.to_json() for c in self.changed],
        }


def _doc(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    decoded = json.loads(value)
    return decoded if isinstance(decoded, dict) else {"value": decoded}


async def show(conn: asyncpg.Connection, queue: str, rejudging: int) -> Report:
    """The matrix and the changed submissions of ``rejudging`` of ``queue`` (read only)."""
    validate_queue_name(queue)
    _check_id(rejudging)
    head = await _call(conn, sql.query("rejudging_list"), queue, rejudging)  # its one row, or none
    if not head:
        raise UnknownRejudging(f"unknown rejudging {rejudging} in queue {queue!r}")
    matrix: Counter[tuple[str, str]] = Counter()
    changed = []
    for r in await _call(conn, sql.query("rejudging_items"), queue, rejudging):
        new = r["new_status"] or NOT_JUDGED
        matrix[(r["old_status"], new)] += 1
        if r["new_status"] is not None and r["new_status"] != r["old_status"]:
            changed.append(Change(
                r["submission_id"], r["old_status"], r["new_status"], _doc(r["old_verdict"]), _doc(r["new_verdict"]),
                r["current_generation"] != r["base_generation"], r["outcome"],
            ))  # fmt: skip
    return Report(_summary(head[0]), dict(matrix), changed)


async def prune(
    conn: asyncpg.Connection, queue: str, *, retention: float, batch: int = 1000, max_batches: int = 100
) -> int:
    """Delete ``queue``'s rejudgings (with their items) opened more than ``retention`` seconds ago;
    returns the rejudgings deleted. Their probes are submissions, pruned as any."""
    return await sql.prune_in_batches(conn, sql.query("rejudgings_prune"), retention, batch, queue,
                                      max_batches=max_batches)
