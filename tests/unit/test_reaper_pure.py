"""The reaper's pure decision, by name: ``reaper.decide`` (docs/design.md §2)."""

from __future__ import annotations

from judgequeue.core.roles.reaper import ClaimedEntry, decide
from judgequeue.core.transport.envelope import Envelope


def _entry(deliveries: int, consumer: str = "w1") -> ClaimedEntry:
    return ClaimedEntry("1-0", Envelope(5, 1, 1, 5, 1.0, deliveries).fields(), consumer, 1)


def test_decide_requeues_an_entry_under_max_deliveries() -> None:
    decision = decide(_entry(deliveries=2), 3)
    assert decision.action == "requeue" and decision.envelope is not None and decision.envelope.submission == 5


def test_decide_dead_letters_at_max_deliveries_naming_the_last_consumer() -> None:
    last = decide(_entry(deliveries=3), 3)
    assert last.action == "dead_letter" and "3 deliveries" in last.reason and "w1" in last.reason


def test_decide_dead_letters_an_entry_that_is_not_an_envelope() -> None:
    bad = decide(ClaimedEntry("1-0", {"hello": "world"}, "w1", 1), 3)
    assert bad.action == "dead_letter" and bad.envelope is None and "malformed" in bad.reason
