"""The dispatcher's pure decision, by name: ``dispatcher.plan_marks`` (docs/design.md §2)."""

from __future__ import annotations

from datetime import UTC, datetime

from judgequeue.core.base.errors import TransportError
from judgequeue.core.roles.dispatcher import plan_marks
from judgequeue.core.store import outbox
from judgequeue.core.transport import streams


def _row(outbox_id: int, mode: str = "live") -> outbox.ClaimedRow:
    return outbox.ClaimedRow(outbox_id, outbox_id, 1, datetime.now(UTC), 0, "CLAIMED", mode, 1, 0.0)


def test_plan_marks_counts_a_duplicate_as_sent() -> None:
    rows = [_row(1), _row(2)]
    results = [streams.EnqueueResult("appended", "1-0"), streams.EnqueueResult("duplicate", "1-0")]
    marks, counts = plan_marks(rows, results)
    assert [(m.outbox_id, m.result) for m in marks] == [(1, "sent"), (2, "sent")]
    assert counts == {"sent": 1, "duplicate": 1}


def test_plan_marks_retries_an_entry_that_failed_and_sends_the_rest() -> None:
    marks, counts = plan_marks([_row(1), _row(2)], [streams.EnqueueResult("error", error="OOM"),
                                                     streams.EnqueueResult("appended", "2-0")])
    assert [(m.result, m.error) for m in marks] == [("retry", "OOM"), ("sent", None)]
    assert counts == {"retry": 1, "sent": 1}


def test_plan_marks_only_releases_rows_when_redis_is_unreachable() -> None:
    """An outage must not count attempts (maxAttempts would end submissions for a Redis restart)."""
    marks, counts = plan_marks([_row(1), _row(2, "shadow")], TransportError("connection refused"))
    assert [m.result for m in marks] == ["release", "release"]
    assert all(m.error is not None and "connection refused" in m.error for m in marks)
    assert counts == {"release": 2}


def test_plan_marks_marks_shadow_rows_shadow_sent() -> None:
    marks, counts = plan_marks([_row(1, "shadow"), _row(2, "shadow")],
                               [streams.EnqueueResult("appended", "1-0"), streams.EnqueueResult("duplicate")])
    assert [m.result for m in marks] == ["shadow_sent", "shadow_sent"]
    assert counts == {"shadow_sent": 1, "shadow_duplicate": 1}
