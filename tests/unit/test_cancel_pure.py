"""Pure parts of cancelling (docs/cancel.md): the notification's format, the statuses, the figures
of bench.cancel, and how a cancellation reads on the command line."""

from __future__ import annotations

from bench.cancel import percentile
from judgequeue.core import api
from judgequeue.core.base import states
from judgequeue.core.cli.submit import verdict_lines
from judgequeue.core.roles.worker.cancels import parse_notice


def test_a_cancel_notice_is_parsed_totally() -> None:
    assert parse_notice("q 12 3") == ("q", 12, 3)
    for bad in ("", "q", "q 1", "q a 2", "q 1 b", "q 1 2 3", "q  1 2"):
        assert parse_notice(bad) is None


def test_cancelled_is_final_but_never_a_judges_verdict() -> None:
    assert "CANCELLED" not in states.VERDICTS  # a judge cannot return it
    assert (*states.VERDICTS, "CANCELLED") == states.ENDED_STATUSES
    assert "CANCELLED" in states.SUBMISSION_STATUSES and "CANCELLED" in states.TERMINAL_OUTBOX_STATES
    assert api.HISTORY_CAUSES == ("judged", "rejudged", "rescued", "cancelled", "applied")


def test_a_cancellation_shows_its_reason() -> None:
    row = {"id": 7, "status": "CANCELLED", "generation": 2,
           "verdict": {"status": "CANCELLED", "reason": "duplicate of 6", "generation": 2}}  # fmt: skip
    assert verdict_lines(row) == ["CANCELLED", "  reason: duplicate of 6"]


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([3.0], 99) == 3.0
