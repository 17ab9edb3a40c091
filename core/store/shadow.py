"""Shadow verdicts and legacy verdicts: the two tables of shadow judging.

In shadow mode the legacy judge is authoritative and a submission's own status stays PENDING. A
shadow worker (``JUDGEQUEUE_SHADOW=judge``) judges the shadow stream's entries with the same judge
and sandbox, and its verdict goes to ``judgequeue.shadow_verdicts``, never to the submission. Every
write is fenced like a live verdict (docs/design.md §5), on the shadow row instead of the submission:

- :func:`acquire` takes a lease per ``(submission, generation)``: a fresh attempt and an expiry on the
  database clock, on a new row, a row of an older generation, or one whose lease expired (taken over)
  or that waits for a delivery; :func:`renew`, :func:`write_verdicts` and :func:`release` act only
  while the row still holds that ``(generation, attempt)`` and is ``JUDGING``: zero rows means stale.
- :func:`rescue_expired` (the reaper) sends an expired lease's entry again, up to ``maxRetries``
  expiries, then ends the row ``SYSTEM_ERROR`` with the reason; :func:`give_up` does the same for an
  entry nobody acks (``maxDeliveries``) or that the database refuses.

The application reports the legacy judge's verdict with :func:`report_legacy_verdict`, in its own
transaction. :func:`agreement` counts the two sides per queue and verdict class
(:mod:`judgequeue.core.base.agreement` says what "agree" means); :func:`mismatches` lists the
submissions they disagree on, both verdicts and their details. :func:`prune` deletes both sides
after the reaper's retention.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from ..base.agreement import Agreement, summarize
from ..base.errors import InvalidVerdict, typed_pg_errors
from ..base.states import VERDICTS
from . import sql
from .leases import Lease, VerdictWrite, fence_arrays
from .outbox import json_text

#: Largest legacy verdict details, as JSON text (the SQL function enforces the same limit).
MAX_DETAILS_BYTES = 1_048_576


async def acquire(
    conn: asyncpg.Connection, queue: str, envelopes: Sequence[tuple[int, int]], *, ttl: float, worker: str
) -> list[Lease]:
    """Shadow leases for ``(submission, generation)`` pairs of ``queue`` (the submission must be at that
    generation); pairs absent from the result are stale (:func:`stale_reasons` says why).

    Like :func:`judgequeue.core.store.leases.acquire` it commits without waiting for the WAL flush: call
    :func:`judgequeue.core.store.leases.make_durable` before acking the entries."""
    if not envelopes:
        return []
    attempts = [uuid.uuid4() for _ in envelopes]
    rows = await conn.fetch(
        sql.query("shadow_acquire"), [s for s, _ in envelopes], [g for _, g in envelopes], attempts, queue,
        float(ttl), worker,
    )  # fmt: skip
    return [Lease(r["id"], r["generation"], r["attempt_id"], json.loads(r["payload"]), r["created_at"]) for r in rows]


async def renew(conn: asyncpg.Connection, leases: Sequence[Lease], *, ttl: float) -> set[uuid.UUID]:
    """Extend the shadow leases still held; returns their attempts (the others are lost)."""
    if not leases:
        return set()
    rows = await conn.fetch(sql.query("shadow_renew"), *fence_arrays(leases), float(ttl))
    return {r["attempt_id"] for r in rows}


async def write_verdicts(conn: asyncpg.Connection, writes: Sequence[VerdictWrite]) -> dict[uuid.UUID, float]:
    """Write shadow verdicts fenced on (generation, attempt); returns the seconds each written attempt
    judged for (from its lease). An attempt missing from the result was stale: nothing was written."""
    if not writes:
        return {}
    ids, generations, attempts = fence_arrays([w.lease for w in writes])
    rows = await conn.fetch(
        sql.query("shadow_verdict"), ids, generations, attempts, [w.status for w in writes],
        [w.document() for w in writes],
    )  # fmt: skip
    return {r["attempt_id"]: float(r["seconds"]) for r in rows}


async def release(conn: asyncpg.Connection, leases: Sequence[Lease]) -> list[int]:
    """Give shadow leases back (a stopping worker): expired now, so the reaper's next sweep sends their
    entries again. Returns the submissions released."""
    if not leases:
        return []
    return [r["id"] for r in await conn.fetch(sql.query("shadow_release"), *fence_arrays(leases))]


def classify_stale(
    envelope_generation: int, current_generation: int | None, shadow_generation: int | None, shadow_status: str | None
) -> str:
    """Why a shadow envelope got no lease (pure; the label of the stale counter, prefixed ``shadow_``)."""
    if current_generation is None:
        return "unknown_submission"
    if current_generation != envelope_generation or (shadow_generation or 0) > envelope_generation:
        return "generation_moved"
    if shadow_status == "JUDGING":
        return "already_judging"
    if shadow_status is not None:
        return "already_judged"
    return "not_pending"  # raced with a lease that has since been released


async def stale_reasons(conn: asyncpg.Connection, envelopes: Sequence[tuple[int, int]]) -> list[str]:
    """The :func:`classify_stale` reason of each envelope (read-only, off the hot path)."""
    if not envelopes:
        return []
    rows = await conn.fetch(
        sql.query("shadow_stale_reasons"), [s for s, _ in envelopes], [g for _, g in envelopes]
    )
    return [
        classify_stale(r["generation"], r["current_generation"], r["shadow_generation"], r["shadow_status"])
        for r in rows
    ]


@dataclass(frozen=True)
class Resend:
    """A shadow entry to send again: an expired lease's (submission, generation), with its outbox
    row's id and attempts for the envelope (0 when that row was pruned)."""

    submission: int
    generation: int
    outbox: int
    attempts: int


@dataclass(frozen=True)
class ShadowRescue:
    """What one :func:`rescue_expired` did: entries to send again, and rows ended SYSTEM_ERROR."""

    resend: list[Resend]
    failed: int


async def rescue_expired(
    conn: asyncpg.Connection, queue: str, *, max_retries: int, resend_after: float, batch: int = 500
) -> ShadowRescue:
    """Rescue up to ``batch`` expired shadow leases of ``queue`` in one statement.

    Each is marked waiting for a delivery (attempt NULL, so the old attempt is fenced out at once) and
    returned for the caller to send again; if that send is lost, the row is rescued again
    ``resend_after`` seconds later. At ``max_retries`` expiries it ends ``SYSTEM_ERROR`` with the
    reason. Safe from several reapers at once (``FOR UPDATE SKIP LOCKED``)."""
    rows = await conn.fetch(
        sql.query("shadow_rescue_expired"), queue, max(1, max_retries), batch, float(resend_after)
    )
    resend = [Resend(r["submission_id"], r["generation"], r["outbox_id"], r["attempts"])
              for r in rows if r["outcome"] == "resend"]
    return ShadowRescue(resend, sum(1 for r in rows if r["outcome"] == "failed"))


async def give_up(conn: asyncpg.Connection, pairs: Sequence[tuple[int, int]], reasons: Sequence[str]) -> list[str]:
    """End shadow judging of ``(submission, generation)`` pairs with a SYSTEM_ERROR shadow verdict
    giving the reason (idempotent); one outcome per pair: ``recorded``, ``unknown``, ``superseded``,
    or the row's status in lower case where a held lease or a final verdict has it."""
    if not pairs:
        return []
    rows = await conn.fetch(
        sql.query("shadow_give_up"), [s for s, _ in pairs], [g for _, g in pairs], [r[:1000] for r in reasons]
    )
    return [r["outcome"] for r in rows]


def validate_legacy_verdict(verdict: object, details: object) -> str | None:
    """``details`` as JSON text (None for none), or the error :func:`report_legacy_verdict` raises
    (pure; the SQL function checks the same)."""
    if not isinstance(verdict, str) or verdict not in VERDICTS:
        raise InvalidVerdict(f"legacy verdict {verdict!r} is not a verdict (one of {', '.join(VERDICTS)})")
    if details is None:
        return None
    if not isinstance(details, dict):
        raise InvalidVerdict(f"legacy verdict details must be a JSON object or None, got {type(details).__name__}")
    return json_text(details, subject="legacy verdict details are", limit=MAX_DETAILS_BYTES)


async def report_legacy_verdict(
    conn: asyncpg.Connection, submission_id: int, verdict: str, details: dict[str, Any] | None = None
) -> None:
    """Record the legacy judge's verdict of ``submission_id`` (the last report wins); see
    :func:`judgequeue.core.api.report_legacy_verdict`."""
    text = validate_legacy_verdict(verdict, details)
    if isinstance(submission_id, bool) or not isinstance(submission_id, int):
        raise TypeError(f"submission_id must be an int, got {type(submission_id).__name__}")
    with typed_pg_errors():
        await conn.execute(sql.query("report_legacy_verdict"), submission_id, verdict, text)


async def agreement(conn: asyncpg.Connection, queue: str) -> Agreement:
    """The queue's figures: legacy and final shadow verdicts paired by submission, over what the
    retention keeps. One statement; the database counts, :func:`~judgequeue.core.base.agreement.summarize`
    classifies."""
    rows = await conn.fetch(sql.query("shadow_agreement"), queue, list(VERDICTS))
    return summarize(queue, ((r["legacy"], r["shadow"], int(r["n"])) for r in rows))


@dataclass(frozen=True)
class Mismatch:
    """A submission the two judges disagree on, with both verdicts and their details."""

    submission: int
    queue: str
    generation: int
    legacy: str
    legacy_details: dict[str, Any] | None
    reported_at: datetime
    shadow: str
    shadow_details: dict[str, Any] | None
    judged_at: datetime


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


async def mismatches(conn: asyncpg.Connection, queue: str | None, *, limit: int = 20) -> list[Mismatch]:
    """The latest ``limit`` mismatches of ``queue`` (None: every queue), newest first."""
    rows = await conn.fetch(sql.query("shadow_mismatches"), queue, list(VERDICTS), limit)
    return [
        Mismatch(r["submission_id"], r["queue"], r["generation"], r["legacy_status"], _json(r["legacy_details"]),
                 r["reported_at"], r["shadow_status"], _json(r["shadow_details"]), r["judged_at"])
        for r in rows
    ]


async def prune(
    conn: asyncpg.Connection, queue: str, *, retention: float, batch: int = 1000, max_batches: int = 100
) -> tuple[int, int]:
    """Delete ``queue``'s final shadow verdicts judged, and legacy verdicts reported, more than
    ``retention`` seconds ago, oldest first, ``batch`` rows per statement; returns (shadow, legacy)."""
    judged = await sql.prune_in_batches(conn, sql.query("shadow_verdicts_prune"), retention, batch, queue,
                                        list(VERDICTS), max_batches=max_batches)
    reported = await sql.prune_in_batches(conn, sql.query("legacy_verdicts_prune"), retention, batch, queue,
                                          max_batches=max_batches)
    return judged, reported
