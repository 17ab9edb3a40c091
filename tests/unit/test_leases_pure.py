"""The fence's pure classification, by name: ``leases.classify_stale`` (docs/design.md §2)."""

from __future__ import annotations

from judgequeue.core.store.leases import classify_stale


def test_classify_stale_names_why_an_envelope_gets_no_lease() -> None:
    assert classify_stale(1, None, None) == "unknown_submission"
    assert classify_stale(1, 2, "PENDING") == "generation_moved"
    assert classify_stale(1, 1, "ACCEPTED") == "already_terminal"
    assert classify_stale(1, 1, "JUDGING") == "already_judging"
