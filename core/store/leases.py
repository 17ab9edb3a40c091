"""Judging leases and the generation/attempt fence (docs/design.md §1, §4).

A worker turns a stream envelope ``(submission, generation)`` into a lease by moving the submission
from PENDING to JUDGING with a fresh ``attempt_id`` and a DB-clock expiry. From then on every write
of that attempt (renew, verdict, release) is fenced on ``(id, generation, attempt_id,
status='JUDGING')``: zero rows means someone else owns the submission now (a rejudge bumped the
generation, the reaper rescued an expired lease), and the caller must drop its result.

Every statement takes arrays, so a worker acquires, renews and writes a whole batch in one round
trip. SQL is fixed text with parameters only.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from ..base import metrics
from ..judges import Job
from . import sql


@dataclass(frozen=True)
class Lease:
    """A submission this worker is judging: the fence tuple plus what the judge needs."""

    submission: int
    generation: int
    attempt: uuid.UUID
    payload: Any
    created_at: datetime
    #: The generation the submit or rejudge that this lease serves created: rescues, releases and
    #: deferrals bump :attr:`generation` but keep it. None where not tracked (shadow).
    request_generation: int | None = None
    #: Failed tries of this request so far (:func:`defer` with ``failed``).
    call_failures: int = 0


def job_of(queue: str, lease: Lease) -> Job:
    """The identity a judge sees of the job ``lease`` holds (pure)."""
    request = lease.request_generation if lease.request_generation is not None else lease.generation
    return Job(queue, lease.submission, lease.generation, request, lease.call_failures)


@dataclass(frozen=True)
class VerdictWrite:
    """A verdict to write under ``lease``'s fence."""

    lease: Lease
    status: str
    verdict: dict[str, Any]
    #: ``verdict`` as JSON text, when the caller serialised it already (it checks it stores).
    text: str | None = None

    def document(self) -> str:
        return self.text if self.text is not None else json.dumps(self.verdict, separators=(",", ":"))


@dataclass(frozen=True)
class LeaseSweep:
    """What one :func:`rescue_expired_leases` call did."""

    requeued: int
    failed: int


async def acquire(
    conn: asyncpg.Connection, queue: str, envelopes: Sequence[tuple[int, int]], *, ttl: float
) -> list[Lease]:
    """Take leases for ``(submission, generation)`` pairs still PENDING at that generation.

    The commit does not wait for the WAL flush: call :func:`make_durable` before acking the entries.

    Pairs absent from the result are stale (generation moved on, already judging or terminal, or
    unknown); :func:`stale_reasons` says which.
    """
    if not envelopes:
        return []
    attempts = [uuid.uuid4() for _ in envelopes]
    rows = await conn.fetch(
        sql.query("lease_acquire"),
        [s for s, _ in envelopes],
        [g for _, g in envelopes],
        attempts,
        queue,
        float(ttl),
    )
    return [
        Lease(
            submission=r["id"],
            generation=r["generation"],
            attempt=uuid.UUID(bytes=r["attempt_id"].bytes),
            payload=json.loads(r["payload"]),
            created_at=r["created_at"],
            request_generation=r["request_generation"],
            call_failures=r["call_failures"],
        )
        for r in rows
    ]


async def make_durable(conn: asyncpg.Connection) -> None:
    """Return once every lease taken so far (by anyone) is on disk, whatever the session's defaults.

    :func:`acquire` commits without waiting for the WAL flush, so the judge starts one fsync
    sooner. A lease lost in a database crash is harmless as long as its stream entry is still
    pending (the reaper re-delivers it and the fence drops the old attempt's verdict), so the worker
    acks entries only after this returns.
    """
    await conn.execute(sql.query("lease_make_durable"))


def classify_stale(envelope_generation: int, current_generation: int | None, status: str | None) -> str:
    """Why an envelope could not be leased (pure; the label of the stale counter)."""
    if current_generation is None:
        return "unknown_submission"
    if current_generation != envelope_generation:
        return "generation_moved"
    if status == "JUDGING":
        return "already_judging"
    if status == "PENDING":  # raced with another worker that has since released it
        return "not_pending"
    return "already_terminal"


async def stale_reasons(conn: asyncpg.Connection, envelopes: Sequence[tuple[int, int]]) -> list[str]:
    """The :func:`classify_stale` reason of each envelope (read-only, off the hot path)."""
    if not envelopes:
        return []
    rows = await conn.fetch(sql.query("lease_stale_reasons"), [s for s, _ in envelopes], [g for _, g in envelopes])
    return [classify_stale(r["generation"], r["current_generation"], r["status"]) for r in rows]


def fence_arrays(leases: Sequence[Lease]) -> tuple[list[int], list[int], list[uuid.UUID]]:
    """The fence of each lease as the SQL takes it, one array per column: submissions, generations,
    attempts (the live leases' queries and the shadow ones' alike)."""
    return [x.submission for x in leases], [x.generation for x in leases], [x.attempt for x in leases]


async def renew(conn: asyncpg.Connection, leases: Sequence[Lease], *, ttl: float) -> set[uuid.UUID]:
    """Extend the leases still held; returns the attempts that still hold theirs (the rest are lost)."""
    if not leases:
        return set()
    rows = await conn.fetch(sql.query("lease_renew"), *fence_arrays(leases), float(ttl))
    return {uuid.UUID(bytes=r["attempt_id"].bytes) for r in rows}


async def write_verdicts(conn: asyncpg.Connection, writes: Sequence[VerdictWrite]) -> dict[uuid.UUID, float]:
    """Write verdicts fenced on (generation, attempt); returns end-to-end seconds per written attempt.

    An attempt missing from the result was stale: its verdict was not written.
    """
    if not writes:
        return {}
    ids, generations, attempts = fence_arrays([w.lease for w in writes])
    rows = await conn.fetch(
        sql.query("lease_verdict"),
        ids,
        generations,
        attempts,
        [w.status for w in writes],
        [w.document() for w in writes],
    )
    return {r["attempt_id"]: float(r["end_to_end"]) for r in rows}  # asyncpg's UUID is a uuid.UUID


async def release(conn: asyncpg.Connection, leases: Sequence[Lease]) -> list[int]:
    """Give leases back (new generation + outbox row each); returns the submissions released."""
    if not leases:
        return []
    rows = await conn.fetch(sql.query("lease_release"), *fence_arrays(leases))
    return [r["id"] for r in rows]


async def defer(conn: asyncpg.Connection, lease: Lease, *, delay: float, failed: bool, reason: str) -> int | None:
    """Give ``lease`` back to be tried again no sooner than ``delay`` seconds from now (DB clock).

    Fenced like a verdict: returns the new generation, or None when the lease was not held any more
    (the try is stale; nothing changed). The job holds no worker slot while it waits: its outbox row
    is dispatched (or taken directly) once due. ``failed`` counts the try in ``call_failures``.
    """
    return await conn.fetchval(  # type: ignore[no-any-return]
        sql.query("lease_defer"), lease.submission, lease.generation, lease.attempt, float(delay), failed, reason
    )


async def rescue_expired_leases(
    conn: asyncpg.Connection, queue: str, *, max_retries: int, batch: int = 500
) -> LeaseSweep:
    """Rescue up to ``batch`` expired JUDGING leases of ``queue`` in one transaction.

    Each gets a new generation and outbox row (``retry_count + 1``), or ends ``SYSTEM_ERROR``
    ("gave up after N lease expiries") once its expiries reach ``max_retries``. Safe to call from
    several reapers at once (``FOR UPDATE SKIP LOCKED``); decisions use the database clock. Counts
    ``judgequeue_lease_expiries_total``.
    """
    row = await conn.fetchrow(sql.query("lease_rescue_expired"), queue, max_retries, batch)
    assert row is not None
    sweep = LeaseSweep(requeued=int(row["requeued"]), failed=int(row["failed"]))
    if sweep.requeued or sweep.failed:
        metrics.LEASE_EXPIRIES.labels(queue).inc(sweep.requeued + sweep.failed)
    return sweep


def unleased(asked: Sequence[tuple[int, int]], leased: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The envelopes of a batch that got no lease, duplicates included (pure)."""
    remaining = Counter(leased)
    out = []
    for pair in asked:
        if remaining[pair] > 0:
            remaining[pair] -= 1
        else:
            out.append(pair)
    return out
