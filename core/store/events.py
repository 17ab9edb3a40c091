"""Verdict events and webhook deliveries: ``judgequeue.verdict_events``, ``webhook_endpoints``,
``webhook_deliveries`` (docs/events.md).

Every verdict stored writes one event row in the same transaction (a trigger on ``submissions``,
schema.sql), so the record that a verdict must be announced commits with the verdict or not at all.
Events are read in *position* order, ``(txid, id)``: the writing transaction's id, then the row's.
A read stops before the oldest transaction still running (``pg_snapshot_xmin``), so an event whose
transaction commits after a later-numbered one is never jumped over: every future event sorts after
every position a reader has been given. The cost is that one long-running writing transaction
anywhere on the server holds every reader back until it ends (:func:`held` tells a reader so).

Webhook endpoints keep their own read position in Postgres; :func:`ingest` turns the events past it
into the endpoint's delivery rows and moves it in one statement, and a deliverer claims, sends and
forgets those rows (fenced on its own name), so a deliverer killed at any point resumes with nothing
lost: at worst one delivery is sent again, which its ``Idempotency-Key`` makes harmless.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from ..base.errors import JudgeQueueError
from . import sql

#: The channel every verdict event is announced on at its commit (payload: the queue's name).
CHANNEL = "judgequeue_events"


class InvalidPosition(JudgeQueueError):
    """An event position that is not ``<txid>-<id>`` (two non-negative integers)."""


@dataclass(frozen=True, order=True)
class Position:
    """Where a reader stands in the event log: after the event ``(txid, id)``. Its text form,
    ``<txid>-<id>``, is what the CLI prints and takes back (``--after``)."""

    txid: int = 0
    id: int = 0

    def __str__(self) -> str:
        return f"{self.txid}-{self.id}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """The position ``text`` names; :class:`InvalidPosition` otherwise (pure)."""
        txid, sep, ident = text.strip().partition("-")
        if not sep or not txid.isdigit() or not ident.isdigit():
            raise InvalidPosition(f"event position {text!r}: expected <txid>-<id>, e.g. 812-4031")
        return cls(int(txid), int(ident))


#: Before every event still retained.
START = Position()


@dataclass(frozen=True)
class VerdictEvent:
    """One verdict stored: ``(queue, submission, generation)`` names it (a generation has one
    verdict); a receiver keeps, per submission, the highest generation it applied and drops an
    event at or below it. ``score`` is the verdict's score when the judge gave one; ``reason`` is
    why for a ``SYSTEM_ERROR`` (a dead-letter, a lease given up on, a failed dispatch)."""

    position: Position
    queue: str
    submission_id: int
    generation: int
    status: str
    score: Any
    reason: str | None
    committed_at: datetime
    #: ``verdict``, or ``progress``: a judging attempt's live progress (``status`` is ``JUDGING``,
    #: :attr:`progress` says how far it got), written only for queues whose workers report it.
    kind: str = "verdict"
    #: A progress event's state: ``phase`` (``compiling``, ``compiled``, ``testing``), ``tests_done``,
    #: ``tests_total``, ``test`` (the latest test started or finished), ``last_verdict`` and
    #: ``last_time`` (seconds) of the latest test finished, ``compile_error`` when the build failed.
    progress: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        """``queue:submission:generation``: the idempotency key of this event's effect."""
        return f"{self.queue}:{self.submission_id}:{self.generation}"

    def to_json(self) -> dict[str, Any]:
        return {
            "position": str(self.position), "queue": self.queue, "submission": self.submission_id,
            "generation": self.generation, "status": self.status, "score": self.score, "reason": self.reason,
            "committed_at": self.committed_at.isoformat(), "kind": self.kind,
            **({"progress": self.progress} if self.progress is not None else {}),
        }  # fmt: skip


def _event(row: asyncpg.Record) -> VerdictEvent:
    return VerdictEvent(
        position=Position(int(row["txid"]), row["id"]), queue=row["queue"], submission_id=row["submission_id"],
        generation=row["generation"], status=row["status"],
        score=None if row["score"] is None else json.loads(row["score"]), reason=row["reason"],
        committed_at=row["created_at"], kind=row["kind"],
        progress=None if row["progress"] is None else json.loads(row["progress"]),
    )  # fmt: skip


#: The kinds of event: a verdict stored, a judging attempt's progress.
KINDS: tuple[str, ...] = ("verdict", "progress")


class InvalidKinds(JudgeQueueError):
    """Event kinds asked for that are not :data:`KINDS`."""


def check_kinds(kinds: Sequence[str] | None) -> list[str] | None:
    """``kinds`` as the read takes them (None: every kind); :class:`InvalidKinds` naming a bad one (pure)."""
    if kinds is None:
        return None
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise InvalidKinds(f"event kinds {list(kinds)!r}: each one of {', '.join(KINDS)}, at least one")
    return list(dict.fromkeys(kinds))


async def read(
    conn: asyncpg.Connection,
    after: Position,
    *,
    queue: str | None = None,
    limit: int = 500,
    kinds: Sequence[str] | None = ("verdict",),
) -> list[VerdictEvent]:
    """Up to ``limit`` events after ``after`` (of ``queue``, or every queue; of ``kinds``, verdicts
    only unless asked, None: every kind), in position order, stopping before the oldest transaction
    still running."""
    rows = await conn.fetch(sql.query("events_read"), str(after.txid), after.id, queue, limit, check_kinds(kinds))
    return [_event(r) for r in rows]


@dataclass(frozen=True)
class ProgressWrite:
    """One judging attempt's latest progress, fenced on ``(submission, generation, attempt)``."""

    submission: int
    generation: int
    attempt: uuid.UUID
    progress: str  # the JSON text of the state


async def record_progress(conn: asyncpg.Connection, writes: Sequence[ProgressWrite]) -> set[uuid.UUID]:
    """Write one progress event per attempt still judging under its lease (one statement); returns
    the attempts written. A missing one is stale: its lease is gone or its verdict is stored."""
    if not writes:
        return set()
    rows = await conn.fetch(
        sql.query("progress_record"), [w.submission for w in writes], [w.generation for w in writes],
        [w.attempt for w in writes], [w.progress for w in writes],
    )  # fmt: skip
    return {r["attempt_id"] for r in rows}


async def held(conn: asyncpg.Connection, *, queue: str | None = None) -> bool:
    """True when committed events wait behind an older transaction still running (read again soon)."""
    return bool(await conn.fetchval(sql.query("events_held"), queue))


async def head(conn: asyncpg.Connection) -> Position:
    """The position after every event committed so far: a reader starting here sees only later ones."""
    row = await conn.fetchrow(sql.query("events_head"))
    assert row is not None
    return Position(int(row["txid"]), row["id"])


async def prune(
    conn: asyncpg.Connection, queue: str, *, retention: float, batch: int = 1000, max_batches: int = 100
) -> int:
    """Delete ``queue``'s events and dead webhook deliveries older than ``retention`` seconds (the
    verdicts' retention), ``batch`` rows per statement; returns the rows deleted."""
    total = 0
    for statement in (sql.query("events_prune"), sql.query("webhook_prune_dead")):
        total += await sql.prune_in_batches(conn, statement, retention, batch, queue, max_batches=max_batches)
    return total


# === webhook endpoints ===========================================================================


@dataclass(frozen=True)
class Delivery:
    """One event claimed for sending to an endpoint; ``body`` is the JSON text sent."""

    event_id: int
    submission_id: int
    generation: int
    body: str
    attempts: int


class EndpointConflict(JudgeQueueError):
    """An endpoint name already used by another queue."""


async def ensure_endpoint(conn: asyncpg.Connection, name: str, queue: str) -> None:
    """Create endpoint ``name`` of ``queue`` if it is new (its position starts before every event
    still retained, so nothing committed before its first deliverer started is missed)."""
    existing = await conn.fetchval(sql.query("webhook_endpoint_ensure"), name, queue)
    if existing != queue:
        raise EndpointConflict(f"webhook endpoint {name!r} belongs to queue {existing!r}, not {queue!r}")


async def ingest(conn: asyncpg.Connection, endpoint: str, *, limit: int = 500) -> int:
    """Turn up to ``limit`` events past ``endpoint``'s position into its deliveries and move the
    position past them, in one statement; returns how many events were read."""
    row = await conn.fetchrow(sql.query("webhook_ingest"), endpoint, limit)
    assert row is not None
    return int(row["read"])


async def claim(
    conn: asyncpg.Connection, endpoint: str, *, concurrency: int, owner: str, claim_ttl: float
) -> list[Delivery]:
    """Claim due deliveries of ``endpoint`` for ``owner`` for ``claim_ttl`` seconds, so that at most
    ``concurrency`` are claimed at once across deliverers and none of a submission is claimed while
    an earlier one of the same submission still waits (generation order per submission)."""
    rows = await conn.fetch(sql.query("webhook_claim"), endpoint, concurrency, owner, float(claim_ttl))
    deliveries = [Delivery(r["event_id"], r["submission_id"], r["generation"], r["body"], r["attempts"]) for r in rows]
    return sorted(deliveries, key=lambda d: d.event_id)


async def delivered(conn: asyncpg.Connection, endpoint: str, event_ids: Sequence[int], owner: str) -> list[float]:
    """Forget deliveries the endpoint accepted (only those ``owner`` still holds); returns, for each
    one forgotten, the seconds from its verdict's commit to now (database clock)."""
    rows = await conn.fetch(sql.query("webhook_delivered"), endpoint, list(event_ids), owner)
    return [float(r["lag"]) for r in rows]


async def failed(
    conn: asyncpg.Connection,
    endpoint: str,
    event_id: int,
    owner: str,
    *,
    max_attempts: int,
    delay: float,
    error: str,
    permanent: bool,
) -> str | None:
    """Record a failed send: due again after ``delay`` seconds, or ``DEAD`` when ``permanent`` or at
    ``max_attempts``; returns the new state (None if ``owner`` no longer held the claim)."""
    state: str | None = await conn.fetchval(
        sql.query("webhook_failed"), endpoint, event_id, owner, max_attempts, float(delay), error, permanent
    )
    return state


async def release(conn: asyncpg.Connection, endpoint: str, owner: str) -> int:
    """Give back every claim ``owner`` holds on ``endpoint`` (a deliverer stopping)."""
    return int(await conn.fetchval(sql.query("webhook_release"), endpoint, owner))  # the rows it released


async def dead(conn: asyncpg.Connection, endpoint: str, *, limit: int = 1000) -> list[dict[str, Any]]:
    """``endpoint``'s dead deliveries (the dead-letter list), oldest first."""
    return [{**r, "body": json.loads(r["body"])} for r in await conn.fetch(sql.query("webhook_dead"), endpoint, limit)]


async def replay(conn: asyncpg.Connection, endpoint: str, event_ids: Sequence[int] = ()) -> list[int]:
    """Make dead deliveries of ``endpoint`` (these, or all) due again with fresh attempts."""
    return [r["event_id"] for r in await conn.fetch(sql.query("webhook_replay"), endpoint, list(event_ids))]


async def stats(conn: asyncpg.Connection, endpoint: str) -> tuple[int, int, float]:
    """(pending, dead, oldest pending age in seconds) of ``endpoint``'s deliveries."""
    row = await conn.fetchrow(sql.query("webhook_stats"), endpoint)
    assert row is not None
    return int(row["pending"]), int(row["dead"]), float(row["age"])


@dataclass(frozen=True)
class WebhookHealth:
    """How one endpoint's deliveries stand: ``name`` is the configured name (without the queue)."""

    name: str
    pending: int
    dead: int
    oldest_pending_age: float
    failing_attempts: int  # the most attempts of one waiting delivery that failed (0: none failing)
    last_error: str | None


async def webhook_health(conn: asyncpg.Connection, queue: str) -> list[WebhookHealth]:
    """Every webhook endpoint of ``queue`` that ever delivered or waited, by name."""
    rows = await conn.fetch(sql.query("webhook_health"), queue)
    return [
        WebhookHealth(r["name"].removeprefix(f"{queue}/"), int(r["pending"]), int(r["dead"]), float(r["age"]),
                      int(r["failing_attempts"]), r["last_error"])
        for r in rows
    ]  # fmt: skip
