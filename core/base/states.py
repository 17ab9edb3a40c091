"""Every status, state and mode the tables allow, in one place (docs/design.md §3).

SQL receives these lists as array parameters (``= ANY($n::text[])``) instead of repeating them as
string literals, so a new terminal status is pruned, counted and awaited everywhere at once.
``tests/integration/test_sql.py`` compares them with the CHECK constraints of a migrated database, so a
migration that adds a status (e.g. 0006's ``OUTPUT_LIMIT``/``IDLENESS_LIMIT``) fails that test
until it is added here too: append it to :data:`VERDICTS`, nothing else.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

#: A submission waits in these: queued (PENDING) or leased to a worker (JUDGING).
WAITING_STATUSES: Final[tuple[str, ...]] = ("PENDING", "JUDGING")

#: A verdict: the terminal status a judge gives a submission (SYSTEM_ERROR carries a reason).
#: PRESENTATION_ERROR is only ever given when a custom checker asks for it (testlib exit code 2);
#: docs/judges.md has the one table saying what each means.
Verdict = Literal[
    "ACCEPTED",
    "WRONG_ANSWER",
    "TIME_LIMIT",
    "MEMORY_LIMIT",
    "OUTPUT_LIMIT",
    "IDLENESS_LIMIT",
    "RUNTIME_ERROR",
    "COMPILE_ERROR",
    "PRESENTATION_ERROR",
    "SYSTEM_ERROR",
]

#: Terminal submission statuses, i.e. verdicts, in the order docs and tables list them.
VERDICTS: Final[tuple[Verdict, ...]] = get_args(Verdict)

#: A cancelled submission (``judgequeue.cancel()``): final like a verdict, but never a judge's.
CANCELLED: Final = "CANCELLED"

#: Final submission statuses: a verdict, or cancelled. Only a generation bump (a rejudge) reopens one.
ENDED_STATUSES: Final[tuple[str, ...]] = (*VERDICTS, CANCELLED)

#: Every value of ``judgequeue.submissions.status``.
SUBMISSION_STATUSES: Final[tuple[str, ...]] = WAITING_STATUSES + ENDED_STATUSES

OutboxState = Literal["PENDING", "CLAIMED", "SENT", "DEAD", "SKIPPED", "SHADOW_SENT", "CANCELLED"]

#: Outbox rows still to be sent (the claim index's predicate).
WAITING_OUTBOX_STATES: Final[tuple[OutboxState, ...]] = ("PENDING", "CLAIMED")

#: Final outbox rows, pruned after the retention.
TERMINAL_OUTBOX_STATES: Final[tuple[OutboxState, ...]] = ("SENT", "DEAD", "SKIPPED", "SHADOW_SENT", "CANCELLED")

#: Every value of ``judgequeue.outbox.state``.
OUTBOX_STATES: Final[tuple[OutboxState, ...]] = WAITING_OUTBOX_STATES + TERMINAL_OUTBOX_STATES

#: Why a verdict of a submission's history was stored (``judgequeue.verdict_history.cause``): the
#: submit's judging, a rejudge's (or a DLQ replay's), a judging after a lease expiry or release, a
#: cancellation; ``applied`` is kept for verdicts a rejudging applies.
HISTORY_CAUSES: Final[tuple[str, ...]] = ("judged", "rejudged", "rescued", "cancelled", "applied")

Mode = Literal["live", "shadow"]

#: Every value of ``judgequeue.queues.mode``.
MODES: Final[tuple[Mode, ...]] = ("live", "shadow")
