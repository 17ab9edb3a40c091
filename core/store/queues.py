"""Queues and their cutover flags (docs/design.md §5).

``judgequeue.queues`` is the single source of truth for a queue's mode, watermark and pause flag.
Dispatchers read it inside each claim transaction, so a change made here takes effect for every
replica at one instant. The watermark only moves forward; a database trigger enforces it for every
writer, and this module turns its error into :class:`WatermarkMovedBack`.

A queue may have one owner: the JudgeQueue whose spec holds its flags. Git is the
truth only if one spec is: :func:`claim_queue` records the owner on first use and refuses any
other, and :func:`set_cutover` with ``owner`` writes only while that owner holds the queue.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from ..base.classes import JobClass, check_classes
from ..base.errors import CutoverBlocked, QueueOwned, UnknownQueue, typed_pg_errors
from ..base.names import validate_queue_name
from ..base.states import MODES as MODES  # re-exported: the operator knows them as queues'
from ..base.states import Mode as Mode
from . import sql

#: Seconds a flag flip waits for submit transactions that filled workers' offers and are still open
#: (the interlock in submit()) before it gives up with :class:`CutoverBlocked`.
FLIP_WAIT = 10.0

#: The channel on which every change of a queue's flags or owner is announced at its commit, whoever
#: made it (the ``queues_notify`` trigger): the payload is the queue's name.
QUEUES_CHANNEL = "judgequeue_queues"

@dataclass(frozen=True)
class QueueFlags:
    """A queue's cutover flags as stored, with the version that changes whenever they do, and its
    owner (None: no JudgeQueue owns it)."""

    name: str
    mode: Mode
    watermark: datetime | None
    paused: bool
    config_version: int
    updated_at: datetime
    owner: str | None


def _flags(row: asyncpg.Record) -> QueueFlags:
    return sql.row_as(QueueFlags, row)


async def create_queue(conn: asyncpg.Connection, name: str, *, mode: Mode = "live") -> QueueFlags:
    """Create the queue if it does not exist (idempotent); an existing queue keeps its flags.

    A new queue starts live with no watermark (everything is dispatched) unless created in shadow mode.
    """
    validate_queue_name(name)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    await conn.execute(sql.query("queue_create"), name, mode)
    return await get_queue(conn, name)


async def get_queue(conn: asyncpg.Connection, name: str) -> QueueFlags:
    row = await conn.fetchrow(sql.query("queue_get"), name)
    if row is None:
        raise UnknownQueue(f"unknown queue {name!r} (create it with: judgequeue queue create {name})")
    return _flags(row)


async def list_queues(conn: asyncpg.Connection) -> list[QueueFlags]:
    return [_flags(r) for r in await conn.fetch(sql.query("queue_list"))]


def _owned_elsewhere(name: str, owner: str) -> QueueOwned:
    return QueueOwned(f"queue {name!r} belongs to {owner} (recorded in judgequeue.queues.owner); nothing was"
                      " changed", owner)


async def claim_queue(conn: asyncpg.Connection, name: str, owner: str, *, mode: Mode = "live") -> QueueFlags:
    """The queue's flags, after making sure ``owner`` owns it: a missing queue is created owned by
    ``owner`` (in ``mode``, as :func:`create_queue`), an unowned one is claimed with its flags kept.

    Raises :class:`QueueOwned` naming the owner when someone else holds the queue; then nothing was
    written. While ``owner`` already holds it, this is one read.
    """
    validate_queue_name(name)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not owner:
        raise ValueError("an owner is required")
    row = await conn.fetchrow(sql.query("queue_get"), name)
    if row is not None and row["owner"] == owner:
        return _flags(row)
    if row is not None and row["owner"] is not None:
        raise _owned_elsewhere(name, str(row["owner"]))
    claimed = await conn.fetchrow(sql.query("queue_claim"), name, mode, owner)
    if claimed is not None:
        return _flags(claimed)
    row = await conn.fetchrow(sql.query("queue_get"), name)  # claimed by someone else in between
    if row is not None and row["owner"] == owner:
        return _flags(row)
    raise _owned_elsewhere(name, str(row["owner"] if row is not None else "an unknown owner"))


async def release_queue(conn: asyncpg.Connection, name: str, owner: str) -> bool:
    """Give up ``owner``'s hold on the queue (its flags stay); False if ``owner`` did not hold it."""
    return bool(await conn.fetchval(sql.query("queue_release"), name, owner))


async def owned_queues(conn: asyncpg.Connection, owner: str) -> list[str]:
    """The names of the queues ``owner`` holds."""
    return [str(r["name"]) for r in await conn.fetch(sql.query("queue_owned_by"), owner)]


async def take_back_queue(conn: asyncpg.Connection, name: str, owner: str, usurper: str) -> bool:
    """Make ``owner`` the owner again of a queue whose owner was set to ``usurper`` by hand (only
    while ``usurper`` holds it); False if someone else holds it by now. Ownership changes hands
    through :func:`release_queue` and :func:`claim_queue`, never directly from one owner to another."""
    return bool(await conn.fetchval(sql.query("queue_take_back"), name, owner, usurper))


_UNSET: object = object()


async def set_cutover(
    conn: asyncpg.Connection,
    name: str,
    *,
    mode: Mode | None = None,
    watermark: datetime | object | None = _UNSET,
    paused: bool | None = None,
    wait: float = FLIP_WAIT,
    owner: str | None = None,
) -> QueueFlags:
    """Change any of a queue's flags in one statement; unchanged arguments keep their value. With
    ``owner``, only while ``owner`` holds the queue (:func:`claim_queue`): else :class:`QueueOwned`.

    A submit that filled a worker's offer decided on the flags it read and hands its job over when
    its transaction commits, so the flip first waits for such transactions, at most
    ``wait`` seconds; a submit that comes meanwhile writes a PENDING row and does not wait.

    Raises :class:`WatermarkMovedBack` if the watermark would move back (or be cleared),
    :class:`UnknownQueue` if the queue does not exist and :class:`CutoverBlocked` if the wait ran
    out. Nothing is changed when it raises.
    """
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if watermark is not _UNSET and watermark is not None and not isinstance(watermark, datetime):
        raise TypeError("watermark must be a timezone-aware datetime or None")
    if isinstance(watermark, datetime) and watermark.tzinfo is None:
        raise ValueError("watermark must be timezone-aware")
    try:
        with typed_pg_errors():  # a flip that waited too long is no JQ error: it comes out as it is
            async with conn.transaction():  # a savepoint inside the caller's own transaction
                old = await conn.fetchval(sql.query("queue_flip_wait"), f"{max(1, round(wait * 1000))}ms")
                await conn.execute(sql.query("queue_flip_lock"), name)
                row = await conn.fetchrow(
                    sql.query("queue_set_cutover"),
                    name,
                    mode,
                    watermark is not _UNSET,
                    None if watermark is _UNSET else watermark,
                    paused,
                    owner,
                )
                await conn.fetchval(sql.query("queue_flip_wait"), old)
    except asyncpg.LockNotAvailableError as exc:
        holders, oldest = await conn.fetchrow(sql.query("queue_flip_blockers"), name)
        raise CutoverBlocked(
            f"queue {name!r}: the flip waited {wait:g}s for {holders} open transaction(s) that submitted"
            f" to a worker's offer (the oldest open for {oldest:.0f}s) and did not commit; nothing was"
            " changed: retry, or end those transactions"
        ) from exc
    if row is None:
        if owner is not None:
            current = await conn.fetchrow(sql.query("queue_get"), name)
            if current is not None:
                raise QueueOwned(f"queue {name!r} is not held by {owner} (owner: {current['owner'] or 'none'});"
                                 " nothing was changed", str(current["owner"] or ""))
        raise UnknownQueue(f"unknown queue {name!r} (create it with: judgequeue queue create {name})")
    return _flags(row)


async def database_now(conn: asyncpg.Connection) -> datetime:
    """The database clock, which every watermark and time decision uses (never the caller's clock)."""
    now: datetime = await conn.fetchval(sql.query("db_now"))
    return now


async def listen_queues(conn: asyncpg.Connection, on_change: Callable[[str], object]) -> Callable[[], Awaitable[None]]:
    """Call ``on_change(name)`` whenever a queue's flags (mode, watermark, paused) or owner change, or
    a queue is created or deleted, at the commit of whatever changed them: judgequeue's own writes,
    ``judgequeue cutover set`` and plain SQL alike. Returns a coroutine function that stops listening.

    ``conn`` must reach Postgres directly (LISTEN does not work through a transaction pooler) and stay
    open; a closed connection hears nothing more, so a caller checks ``conn.is_closed()`` and listens
    again on a new one (it may have missed changes meanwhile: read the row again then)."""

    def heard(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        on_change(str(payload))

    await conn.add_listener(QUEUES_CHANNEL, heard)

    async def stop() -> None:
        if not conn.is_closed():
            await conn.remove_listener(QUEUES_CHANNEL, heard)

    return stop


async def set_classes(conn: asyncpg.Connection, name: str, classes: Sequence[JobClass]) -> bool:
    """Declare ``name``'s priority classes, highest first (validated as the database's CHECK does);
    returns whether they changed. Jobs already queued keep their rank until delivered again."""
    check_classes(classes)
    if await get_classes(conn, name) is None:
        raise UnknownQueue(f"unknown queue {name!r} (create it with: judgequeue queue create {name})")
    changed = await conn.fetchval(
        sql.query("queue_set_classes"), name, [c.name for c in classes], [c.share for c in classes]
    )
    return bool(changed)


async def get_classes(conn: asyncpg.Connection, name: str) -> tuple[JobClass, ...] | None:
    """``name``'s classes, highest first, or None for an unknown queue."""
    row = await conn.fetchrow(sql.query("queue_classes"), name)
    if row is None:
        return None
    return tuple(JobClass(n, int(s)) for n, s in zip(row["classes"], row["class_shares"], strict=True))
