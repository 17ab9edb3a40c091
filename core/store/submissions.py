"""Reads of ``judgequeue.submissions`` and the one write tools make to it (docs/design.md §2, §3).

The table's writes are owned by narrow doors: the SQL functions behind :func:`outbox.submit` and
:func:`outbox.rejudge`, the lease fence in :mod:`leases` (acquire, renew, verdict, release,
rescue), the dispatcher's mark (a DEAD delivery ends its submission, in the same statement) and
the dead-letter record. This module holds what the tools need besides: reading rows and counts,
and the generation bump of a DLQ replay. Terminal means a status in :data:`states.VERDICTS`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from ..base.states import VERDICTS
from . import sql


async def read(conn: asyncpg.Connection, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The rows (id, status, generation, verdict, created_at, finished_at) of ``ids`` that exist,
    the verdict decoded from its JSON (None until there is one)."""
    rows = await conn.fetch(sql.query("submissions_read"), list(ids))
    return {r["id"]: {**r, "verdict": None if r["verdict"] is None else json.loads(r["verdict"])} for r in rows}


def is_terminal(status: str) -> bool:
    """True for a verdict: the submission will not change again without a generation bump."""
    return status in VERDICTS


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
