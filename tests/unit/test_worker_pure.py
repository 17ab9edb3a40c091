"""The worker's pure pieces, by name: ``leases.unleased``, ``judges.judge_failure``, and verdict
storage's ``verdicts.stored_verdict`` and ``verdicts.unstorable_replacement`` (docs/design.md §2)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from judgequeue.core.judges import Verdict, judge_failure
from judgequeue.core.roles.worker import verdicts
from judgequeue.core.runtime import lifecycle
from judgequeue.core.store import leases

LEASE = leases.Lease(7, 2, uuid.uuid4(), {}, datetime.now(UTC))


def test_unleased_keeps_duplicates_and_order() -> None:
    assert leases.unleased([(1, 1), (1, 1), (2, 1), (3, 1)], [(1, 1), (3, 1)]) == [(1, 1), (2, 1)]
    assert leases.unleased([], [(1, 1)]) == []
    assert leases.unleased([(5, 2)], []) == [(5, 2)]


def test_judge_failure_explains_itself() -> None:
    failure = judge_failure(ValueError("boom"))
    assert failure.status == "SYSTEM_ERROR" and failure.details["reason"] == "judge raised ValueError: boom"


def test_backoff_doubles_up_to_its_cap() -> None:
    assert lifecycle.backoff(1) == 0.1 and lifecycle.backoff(10) == 5.0


def _stored(verdict: Verdict) -> Verdict:
    checked, doc, text = verdicts.stored_verdict(verdict, LEASE, "w")
    assert json.loads(text) == json.loads(json.dumps(doc))  # the text is the document
    assert (doc["attempt"], doc["generation"], doc["worker"]) == (str(LEASE.attempt), 2, "w")
    return checked


def test_stored_verdict_keeps_what_jsonb_can_hold() -> None:
    fine = Verdict("ACCEPTED", {"time": 0.5, "out": ["é", "😀"]})
    assert _stored(fine) == fine


def test_stored_verdict_explains_unserialisable_details() -> None:
    for odd in ({"x": float("inf")}, {"x": float("nan")}, {"x": object()}, {"x": {1, 2}}):
        checked = _stored(Verdict("ACCEPTED", odd))
        assert checked.status == "SYSTEM_ERROR" and "not storable as JSON" in checked.details["reason"]


def test_stored_verdict_replaces_nul_and_lone_surrogates() -> None:
    cleaned = _stored(Verdict("WRONG_ANSWER", {"a\x00": ("b\x00", "\udcff")}))
    assert cleaned == Verdict("WRONG_ANSWER", {"a\ufffd": ["b\ufffd", "\ufffd"]})


def test_unstorable_replacement_keeps_the_fence_fields() -> None:
    doc = {"status": "ACCEPTED", "details": {"x": 1}, "attempt": str(LEASE.attempt), "generation": 2, "worker": "w"}
    replaced = verdicts.unstorable_replacement(leases.VerdictWrite(LEASE, "ACCEPTED", doc))
    assert replaced.lease is LEASE and replaced.status == "SYSTEM_ERROR"
    assert replaced.verdict["status"] == "SYSTEM_ERROR" and "refused" in replaced.verdict["reason"]
    assert (replaced.verdict["attempt"], replaced.verdict["generation"], replaced.verdict["worker"]) == (
        str(LEASE.attempt), 2, "w"
    )
