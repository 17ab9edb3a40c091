"""The transactional outbox: submit, rejudge, claim, mark and prune (docs/design.md §1, §3).

``submit`` runs inside the caller's transaction, so "the submission was accepted" and "a judge job
will run" commit together. Dispatchers ``claim`` ready rows with ``FOR UPDATE SKIP LOCKED`` in one
short statement that also reads the queue's cutover flags, then ``mark`` the results of a batch in
one statement fenced on the claim owner. Backoff, jitter and max attempts are computed in SQL on
the database clock. With direct intake a worker claims, marks and leases the same rows in one
statement of its own (:mod:`judgequeue.core.roles.worker.direct.takes`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from ..base.errors import InvalidClass, InvalidPayload, PayloadTooLarge, UnknownSubmission, typed_pg_errors
from ..base.names import validate_queue_name
from ..base.states import ENDED_STATUSES
from ..base.states import OUTBOX_STATES as OUTBOX_STATES  # re-exported: callers know them as outbox's
from ..base.states import TERMINAL_OUTBOX_STATES as TERMINAL_OUTBOX_STATES
from ..base.states import WAITING_OUTBOX_STATES as WAITING_OUTBOX_STATES
from ..base.states import OutboxState as OutboxState
from . import sql

#: Largest accepted payload, as UTF-8 JSON text. The SQL function enforces the same limit.
MAX_PAYLOAD_BYTES = 1_048_576

#: sent / shadow_sent / dead are final; retry counts an attempt and backs off; release backs off
#: without counting (the transport as a whole was down, not this row's fault).
Result = Literal["sent", "shadow_sent", "retry", "dead", "release"]


def encode_payload(payload: Any) -> str:
    """Serialise a payload to JSON text, or raise one clear error; nothing is written on error."""
    return json_text(payload, subject="payload is", limit=MAX_PAYLOAD_BYTES)


def json_text(value: Any, *, subject: str, limit: int) -> str:
    """``value`` as compact JSON text of at most ``limit`` bytes, or one clear error that starts with
    ``subject`` (what it is and its verb: "payload is"); checked before anything is written."""
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{subject} not JSON-serialisable: {exc}") from None
    size = len(text.encode())
    if size > limit:
        raise PayloadTooLarge(f"{subject} {size} bytes, over the limit of {limit} bytes")
    return text


async def _call(conn: asyncpg.Connection, statement: str, *args: Any) -> Any:
    with typed_pg_errors():
        return await conn.fetchval(statement, *args)


async def submit(
    conn: asyncpg.Connection, queue: str, payload: Any, *, job_class: str | None = None, key: str | None = None
) -> int:
    """Write a submission and its outbox row; return the submission id.

    Call it inside your own ``conn.transaction()`` so the submission commits (or rolls back) with
    your application's writes. Outside a transaction it is still atomic on its own. ``job_class``
    is one of the queue's priority classes (None: its first, highest); a class it does not declare is
    refused with :class:`InvalidClass` naming the valid ones. ``key`` is the fairness key within the
    class (a contest id, a user id): keys take turns, so one key's burst does not starve another's.
    """
    validate_queue_name(queue)
    text = encode_payload(payload)
    if key is not None and not 1 <= len(key) <= MAX_KEY_CHARS:
        raise InvalidClass(f"fairness key must be 1 to {MAX_KEY_CHARS} characters, got {len(key)}")
    if job_class is None and key is None:
        # The two-argument form every schema version has: an application upgraded before its
        # database (judgequeue migrate) goes on submitting while it names no class.
        submission_id: int = await _call(conn, sql.query("submit"), queue, text)
    else:
        submission_id = await _call(conn, sql.query("submit_in_class"), queue, text, job_class, key)
    return submission_id


#: Longest fairness key (the SQL function enforces the same).
MAX_KEY_CHARS = 200


async def rejudge(conn: asyncpg.Connection, submission_id: int, *, job_class: str | None = None) -> int:
    """Start a new generation of a submission (finished or running) and queue it; return the generation.

    A running attempt of the old generation can no longer write its verdict (the fence drops it). The
    new delivery is in ``job_class`` (None: the queue's lowest class), which later rescues keep.
    """
    generation: int | None = await _call(conn, sql.query("rejudge"), submission_id, job_class)
    if generation is None:  # pragma: no cover - the SQL function raises JQ006 instead
        raise UnknownSubmission(f"unknown submission {submission_id}")
    return generation


def selected_ids(
    queue: str,
    ids: Sequence[int] | None,
    problem: str | None,
    since: datetime | None,
    until: datetime | None,
    what: str,
) -> list[int] | None:
    """Check a selection of ``queue``'s submissions (:func:`rejudge_many`'s, or a rejudging's) before
    its statement runs: a valid queue name and at least one filter (``what`` names the caller in the
    refusal). The ``ids`` as the statement takes them."""
    validate_queue_name(queue)
    if ids is None and problem is None and since is None and until is None:
        raise InvalidClass(f"{what} needs at least one of: ids, problem, since, until")
    return None if ids is None else list(ids)


async def rejudge_many(
    conn: asyncpg.Connection,
    queue: str,
    *,
    job_class: str | None = None,
    ids: Sequence[int] | None = None,
    problem: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[tuple[int, int]]:
    """Rejudge every submission of ``queue`` matching all the filters given (``ids``, the payload's
    ``problem``, created in ``[since, until)``) in one statement, in ``job_class`` (None: the lowest);
    returns (submission, new generation) pairs. At least one filter is required."""
    listed = selected_ids(queue, ids, problem, since, until, "a bulk rejudge")
    with typed_pg_errors():
        rows = await conn.fetch(sql.query("rejudge_many"), queue, job_class, listed, problem, since, until)
    return [(r["submission_id"], r["generation"]) for r in rows]


@dataclass(frozen=True)
class ClassBacklog:
    """One priority class of a queue: its rank (0: the first), its waiting rows and the oldest one's
    age in seconds (database clock)."""

    name: str
    rank: int
    waiting: int
    age: float


async def class_backlog(conn: asyncpg.Connection, queue: str) -> list[ClassBacklog]:
    """Each class ``queue`` declares, highest first, with its backlog (empty for an unknown queue)."""
    return [sql.row_as(ClassBacklog, r) for r in await conn.fetch(sql.query("outbox_waiting_by_class"), queue)]


@dataclass(frozen=True)
class ClaimedRow:
    """An outbox row claimed for dispatch, with the queue flags read in the same statement."""

    outbox_id: int
    submission_id: int
    generation: int
    created_at: datetime
    attempts: int
    state: OutboxState  # CLAIMED, or SKIPPED when the row predates a live watermark
    mode: str
    config_version: int
    age: float  # seconds from creation to this claim, on the DB clock
    class_rank: int = 0  # its class's rank (0: the first)
    fair_seq: int = 0  # its fairness key's turn in the class (0: no key)


async def claim(conn: asyncpg.Connection, queue: str, *, limit: int, owner: str, claim_ttl: float) -> list[ClaimedRow]:
    """Claim up to ``limit`` ready rows for ``owner`` (one short statement, no lock held afterwards).

    Ready means PENDING and past its backoff, or CLAIMED by someone whose claim TTL passed. A paused
    (or missing) queue yields nothing. In live mode with a watermark, rows created before it come
    back as SKIPPED and are already final: the legacy path owned them.
    """
    _, claimed = await mark_and_claim(
        conn, [], owner=owner, retry=_NO_MARKS, queue=queue, limit=limit, claim_ttl=claim_ttl
    )  # fmt: skip
    return claimed


def _claimed_rows(rows: Sequence[asyncpg.Record]) -> list[ClaimedRow]:
    claimed = [sql.row_as(ClaimedRow, r, outbox_id="id") for r in rows]
    # The claim's order (docs/design.md, "Priority classes and fair share"): the batch goes to the
    # stream in it, so a higher class's rows in one batch come before a lower's, and keys take turns.
    claimed.sort(key=lambda row: (row.class_rank, row.fair_seq, row.outbox_id))
    return claimed


@dataclass(frozen=True)
class Mark:
    outbox_id: int
    result: Result
    error: str | None = None


@dataclass(frozen=True)
class Retry:
    """What a ``retry`` mark does to its row: back to PENDING after an exponential backoff with
    jitter (``backoff_base`` seconds, doubling per attempt up to ``backoff_max``), or DEAD once
    ``attempts >= max_attempts``. A ``release`` waits half to one ``backoff_base`` and costs no attempt."""

    max_attempts: int
    backoff_base: float
    backoff_max: float


_NO_MARKS = Retry(max_attempts=1, backoff_base=0.0, backoff_max=0.0)  # a claim alone marks nothing


async def mark(conn: asyncpg.Connection, marks: Sequence[Mark], *, owner: str, retry: Retry) -> dict[int, OutboxState]:
    """Record the outcome of a dispatched batch in one statement; return the new state per row.

    Only rows still CLAIMED by ``owner`` change: a dispatcher whose claim expired and was taken over
    marks nothing (the row is absent from the result). ``retry`` rows follow the :class:`Retry`
    policy; DEAD rows end their submission in SYSTEM_ERROR with the last error as the reason.
    """
    if not marks:
        return {}
    applied, _ = await mark_and_claim(conn, marks, owner=owner, retry=retry, queue="", limit=0, claim_ttl=0.0)
    return applied


async def mark_and_claim(
    conn: asyncpg.Connection,
    marks: Sequence[Mark],
    *,
    owner: str,
    retry: Retry,
    queue: str,
    limit: int,
    claim_ttl: float,
    hand_off: float = 0.0,
) -> tuple[dict[int, OutboxState], list[ClaimedRow]]:
    """:func:`mark` the previous batch and :func:`claim` the next one in one statement and commit.

    It commits without waiting for the WAL flush (set per transaction, so it works behind any
    pooler): a claim lost in a database crash is claimed again, and a lost mark re-sends a row whose
    duplicate the dedup marker absorbs (or, once its entry is acked, the lease fence).

    Exactly the two statements' effects (a row being marked is never claimed by the same
    statement), minus one round trip and one commit per batch for a dispatcher that loops.
    ``hand_off``: a live queue's rows are claimed only once they have been ready this many seconds
    (direct intake leaves them to the workers first); shadow rows are claimed at once.
    """
    rows = await conn.fetch(
        sql.query("outbox_mark_claim"),
        [m.outbox_id for m in marks],
        [m.result for m in marks],
        [m.error for m in marks],
        retry.max_attempts,
        float(retry.backoff_base),
        float(retry.backoff_max),
        owner,
        queue,
        limit,
        float(claim_ttl),
        float(hand_off),
    )
    applied = {r["id"]: r["state"] for r in rows if not r["claimed"]}
    return applied, _claimed_rows([r for r in rows if r["claimed"]])


async def prune(
    conn: asyncpg.Connection, queue: str, *, retention: float, batch: int = 1000, max_batches: int = 100
) -> int:
    """Delete ``queue``'s terminal outbox rows older than ``retention`` seconds, ``batch`` per statement.

    Small batches keep each transaction short; ``max_batches`` bounds one call's work.
    """
    return await sql.prune_in_batches(conn, sql.query("outbox_prune"), retention, batch, queue,
                                      list(TERMINAL_OUTBOX_STATES), max_batches=max_batches)


async def prune_submissions(
    conn: asyncpg.Connection, queue: str, *, retention: float, batch: int = 1000, max_batches: int = 100
) -> int:
    """Delete ``queue``'s terminal submissions finished more than ``retention`` seconds ago.

    Oldest first, ``batch`` rows per statement (short transactions, served by the partial index
    ``submissions_finished``); ``max_batches`` bounds one call's work. A
    submission still waiting (PENDING, JUDGING) is never touched, and one a rejudge reopens
    meanwhile is skipped (it is locked, or no longer finished when re-checked). A stream entry or
    DLQ replay that names a pruned submission later is stale (``unknown_submission``).
    """
    return await sql.prune_in_batches(conn, sql.query("submissions_prune"), retention, batch, queue,
                                      list(ENDED_STATUSES), max_batches=max_batches)


@dataclass(frozen=True)
class OutboxStats:
    by_state: dict[str, int]
    oldest_pending_age: float  # seconds, 0 when nothing is pending


async def stats(conn: asyncpg.Connection, queue: str, *, include_terminal: bool = True) -> OutboxStats:
    """Row counts by state and the age of the oldest row still waiting to be sent.

    PENDING/CLAIMED come from the claim index and are cheap. Terminal rows are everything kept for
    ``retention`` and cost a scan: pass ``include_terminal=False`` on frequent refreshes (their
    counts are then absent from ``by_state``).
    """
    active = await conn.fetchrow(sql.query("outbox_waiting_stats"), queue)
    assert active is not None
    by_state: dict[str, int] = {"PENDING": active["pending"], "CLAIMED": active["claimed"]}
    if include_terminal:
        by_state.update(dict.fromkeys(TERMINAL_OUTBOX_STATES, 0))
        rows = await conn.fetch(sql.query("outbox_other_stats"), queue, list(WAITING_OUTBOX_STATES))
        by_state.update({r["state"]: r["n"] for r in rows})
    return OutboxStats(by_state=by_state, oldest_pending_age=float(active["age"]))


@dataclass(frozen=True)
class Stranded:
    """A delivery sent long ago whose submission was never leased: its stream entry is likely lost."""

    outbox_id: int
    submission_id: int
    generation: int


async def find_stranded(conn: asyncpg.Connection, queue: str, *, older_than: float, batch: int = 500) -> list[Stranded]:
    """The deliveries :func:`resend_stranded` would re-send now (reads only, locks nothing)."""
    rows = await conn.fetch(sql.query("outbox_find_stranded"), queue, float(older_than), batch)
    return [Stranded(r["id"], r["submission_id"], r["generation"]) for r in rows]


async def resend_stranded(
    conn: asyncpg.Connection, queue: str, *, older_than: float, batch: int = 500, only: Sequence[int] | None = None
) -> int:
    """Put back to PENDING the SENT rows of submissions still PENDING ``older_than`` seconds after sending.

    That only happens when the stream entry was lost (Redis restarted without persistence, failed
    over to an empty replica, was flushed; or Postgres failed over to an asynchronous standby that
    missed a lease or a generation bump whose entry was already consumed): the re-send reaches the
    stream again. ``only`` restricts it to these outbox ids (still re-checked): the reaper first
    finds them with :func:`find_stranded` and clears their dedup markers, which a Postgres failover
    leaves behind and which would otherwise absorb the re-send until they expire.
    """
    ids = list(only) if only is not None else None
    rows = await conn.fetch(sql.query("outbox_resend_stranded"), queue, float(older_than), batch, ids)
    return len(rows)


#: Writes after which a table that was never analysed is analysed by the reaper.
ANALYZE_AFTER = 1000


async def analyze_new_tables(
    conn: asyncpg.Connection, *, after: int = ANALYZE_AFTER, skip: Collection[str] = ()
) -> list[str]:
    """``ANALYZE`` ``outbox`` and ``submissions`` if they have rows but no statistics yet; their names.

    Until a table's first analysis (autovacuum's first pass: up to its 60 s ``naptime`` on a new
    database) the planner serves the take's claim with a bitmap scan, which never marks the index
    entries of taken rows dead as a plain index scan does: each take walks every row taken so far,
    and under load commit-to-verdict climbs for that minute (docs/performance.md). Once analysed,
    autovacuum keeps the statistics. The statements run as the schema's owner (their functions:
    docs/security.md), so a reaper's role analyses tables it does not own; a caller passes what it
    has analysed already as ``skip``.
    """
    statements = {"outbox": sql.query("analyze_outbox"), "submissions": sql.query("analyze_submissions")}
    names = [r["name"] for r in await conn.fetch(sql.query("tables_never_analyzed"), after) if r["name"] not in skip]
    for name in names:
        await conn.execute(statements[name])
    return names
