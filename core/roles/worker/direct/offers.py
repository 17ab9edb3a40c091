"""Offers, the table's door: an idle worker's open slots that submits fill (core/store/sql/schema.sql).

A worker that waits for work (registered as a waiter, see :mod:`judgequeue.core.runtime.wakeup`) also
offers some of its free slots in ``judgequeue.worker_offers``. ``judgequeue.submit()`` fills one in
the submit's own transaction: the submission is written already leased to that worker and its
outbox row already ``SENT``, and the worker alone is notified on its own channel with the job (its
payload too, when small). Between the application's commit and the judge there is then no
statement of the worker's at all: that take was most of the CPU a job cost and most of its wait.

What keeps it safe is what keeps any lease safe: the fence, the heartbeat, the expiry that the
reaper rescues. An offer lives only while its worker refreshes it (a dead worker's offers stop being
filled within :data:`~tuning.OFFER_VALIDITY`); a notification lost with a connection is made up by the worker's
next :func:`sync`, which reports every filled offer it has not seen. A flag flip and a filling
submit exclude each other (a lock taken in the submit, see the migration), so no submit hands a
row over under flags that changed before its commit. Offers are made only while the worker waits:
at a busy queue the submits write PENDING rows and notify nobody, as before (a NOTIFY per commit
would serialise the commits).

Only a queue where offers may be open pays for them: the statement that opens or refreshes a
worker's offers keeps the queue's ``offers_until`` at or past their expiry (a write of the queue
row about once per :data:`~tuning.OFFER_VALIDITY` between all its workers; the withdrawal of the
queue's last open offer ends it at once, so a busy queue's submits stop looking), and
``judgequeue.submit()`` reads it with its queue check and looks for an offer only before it, so a
queue no worker offers in (every queue of the stream intake) runs the submit of before offers. The
signal comes from the offers themselves, not from a setting that could disagree with them; the two
ways it can miss an offer (the sync found the queue row locked and left it; another worker's
withdrawal ended it while this one's new offers were not committed yet) leave that offer unfilled
until the worker's next refresh, which is harmless: the submit's PENDING row wakes the worker,
which takes its offers back and the row in.

Payloads travel in notifications, which any role of the database can LISTEN for if it knows the
channel's name; the name is random (:func:`channel_name`) and known only from the table.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from ....store import sql
from . import tuning

_NO_PAYLOAD = object()

#: ``reserved_from`` of a worker that keeps no reserved offers: past every slot number.
NO_RESERVED = 2**31 - 1


@dataclass(frozen=True)
class Filled:
    """A filled offer: the job is the worker's, leased to it by the submit (generation 1)."""

    slot: int
    submission: int
    attempt: uuid.UUID
    #: When the submission was created (database clock); None only without a job (see below).
    created_at: datetime | None
    #: The job's payload, when :attr:`has_payload`; without it the notification could not carry it
    #: (too large) or, from :func:`sync`, the lease no longer stands.
    payload: Any = None
    has_payload: bool = False


@dataclass(frozen=True)
class Synced:
    """What one :func:`sync` found."""

    withdrawn: list[int]
    #: Filled offers not yet reported seen; ``has_payload`` False: the lease no longer stands.
    filled: list[Filled]
    #: Every slot of the worker's the table held before the statement.
    present: set[int]


def channel_name() -> str:
    """A worker's own notification channel: random, since notifications carry payloads (pure but
    for the randomness); lowercase hex, a valid identifier as it is."""
    return "jq_offers_" + secrets.token_hex(12)


def parse_notification(text: str) -> Filled:
    """A fill notification (``<submission> <attempt> <slot> <created epoch>[ <payload JSON>]``, see
    ``judgequeue.submit()``); raises ValueError for anything else (pure)."""
    parts = text.split(" ", 4)
    if len(parts) < 4:
        raise ValueError(f"not an offer notification: {text[:80]!r}")
    created = datetime.fromtimestamp(float(parts[3]), UTC)
    payload: Any = _NO_PAYLOAD
    if len(parts) == 5:
        payload = json.loads(parts[4])
    return Filled(
        slot=int(parts[2]),
        submission=int(parts[0]),
        attempt=uuid.UUID(parts[1]),
        created_at=created,
        payload=None if payload is _NO_PAYLOAD else payload,
        has_payload=payload is not _NO_PAYLOAD,
    )


def reserved_slots(concurrency: int, percent: int) -> int:
    """Slots a worker keeps for the first class of a queue with several (pure): ``percent`` of its
    ``concurrency`` rounded up, so any share above 0 keeps one at least, and never every slot, so
    the other classes always have one to run in (a worker of one slot keeps none)."""
    return min(-(-concurrency * percent // 100), concurrency - 1)


def to_add(concurrency: int, busy: int, open_now: int, limit: int) -> int:
    """How many new offers a waiting worker makes (pure): it keeps up to ``limit`` open within its
    free slots (``concurrency - busy``), topping up once three quarters are gone, so a trickle
    costs one statement per many jobs, not one each (a quarter left lasts several round trips of
    the top-up at the rates offers are made for, see :data:`~tuning.OFFER_MAX_FILL_RATE`)."""
    want = min(limit, concurrency - busy)
    if want <= 0 or open_now > want // 4:
        return 0
    return want - open_now


def reserved_to_add(reserve: int, reserved_busy: int, free: int, open_now: int) -> int:
    """How many reserved offers a worker opens now (pure): every reserved slot no job holds, within
    its ``free`` slots, topped up once half of them are gone. A first-class trickle then costs one
    statement per few jobs rather than one each (every reserved job frees its slot within a verdict's
    write), while half the reserve stays open for the next arrivals meanwhile."""
    want = min(reserve - reserved_busy, free)
    if want <= 0 or open_now > want // 2:
        return 0
    return want - open_now


def full_takes(rows: int, limit: int, streak: int) -> int:
    """Takes in a row that filled their room, after one that found ``rows`` with room for ``limit``
    (pure): a take that filled its room stopped at its limit, so more rows are likely waiting; one
    that found fewer took every ready row there was (the worker keeps up: a new arrival is in its
    next take) and ends the streak. A take with no room says nothing new."""
    if limit <= 0:
        return streak
    return streak + 1 if rows >= limit else 0


def backlog_seen(full_takes: int, full_for: float) -> bool:
    """Whether a worker believes a backlog drains behind its takes (pure): :data:`~tuning.BACKLOG_TAKES`
    takes in a row filled their room, or the last did and no take has found fewer for
    :data:`~tuning.BACKLOG_WAIT` seconds (``full_for``: since the streak's first; a worker whose
    slots are all held by long jobs takes nothing until one ends, and one that finds them all held
    counts as a full take)."""
    return full_takes >= tuning.BACKLOG_TAKES or (full_takes > 0 and full_for >= tuning.BACKLOG_WAIT)


async def sync(
    conn: asyncpg.Connection,
    queue: str,
    worker: str,
    *,
    channel: str,
    lease_ttl: float,
    open_slots: Sequence[int],
    seen: Sequence[tuple[int, uuid.UUID]],
    withdraw: bool,
    refresh: bool = True,
    reserved_from: int = NO_RESERVED,
) -> Synced:
    """Bring the worker's offers in line in one statement (``offers_sync``): ``open_slots`` are
    open (filled ones in ``seen`` opened again, missing ones added), and with ``refresh`` every
    open offer stays alive for :data:`~tuning.OFFER_VALIDITY` more; or with ``withdraw`` its open offers are taken
    back but for those in ``open_slots`` (the reserved ones it keeps; those a submit is filling
    this moment stay too, and are reported filled later). Slots numbered ``reserved_from`` and up
    are reserved offers: a submit fills them only with a first-class job no ready job of its class
    is ahead of (``judgequeue.submit()``). Filled offers
    in ``seen`` (slot and the attempt that filled it) not opened again are forgotten. By attempt,
    not slot: a slot opened again by a statement whose answer was lost can be filled again before
    the next sync, and that fill must be reported, not wiped. Unless withdrawing, the statement
    also keeps the queue's ``offers_until`` at or past the expiry it gives the offers; a withdrawal
    that keeps nothing and leaves the queue no open offer (none of another worker's unexpired) ends
    it now."""
    rows = await conn.fetch(
        sql.query("offers_sync"),
        queue,
        worker,
        channel,
        float(lease_ttl),
        tuning.OFFER_VALIDITY,
        list(open_slots),
        [slot for slot, _ in seen],
        withdraw,
        [attempt for _, attempt in seen],
        refresh,
        reserved_from,
    )
    filled = [
        Filled(
            slot=r["slot"],
            submission=r["submission"],
            attempt=r["attempt"],
            created_at=r["created_at"],
            payload=None if r["payload"] is None else json.loads(r["payload"]),
            has_payload=r["payload"] is not None,
        )
        for r in rows
        if r["kind"] == "filled"
    ]
    withdrawn = [r["slot"] for r in rows if r["kind"] == "withdrawn"]
    return Synced(withdrawn, filled, {r["slot"] for r in rows if r["kind"] == "present"})
