"""The webhook deliverer's pure decisions: what an answer means, and when to try again."""

from __future__ import annotations

from judgequeue.core.judges.http_call.client import Answer, CallFailed
from judgequeue.core.roles.reaper.webhooks import BACKOFF_CAP, classify, retry_delay


def answer(status: int, **headers: str) -> Answer:
    return Answer(status, {k.lower().replace("_", "-"): v for k, v in headers.items()}, b"")


def test_answers_are_delivered_retried_or_refused() -> None:
    assert classify(answer(200), 10).kind == "delivered"
    assert classify(answer(204), 10).kind == "delivered"
    for status in (408, 425, 429, 500, 502, 503):
        assert classify(answer(status), 10).kind == "retry", status
    assert classify(answer(503, Retry_After="7"), 10).retry_after == 7.0
    assert classify(answer(429, Retry_After="soon"), 10).retry_after is None
    for status in (301, 400, 401, 404, 410, 422):
        outcome = classify(answer(status), 10)
        assert outcome.kind == "refused" and f"answered {status}" in outcome.error, status
    assert classify(TimeoutError(), 2.5).error == "no answer within 2.5s"
    assert classify(CallFailed("connection", "refused"), 10).kind == "retry"


def test_backoff_doubles_with_jitter_up_to_its_cap_and_never_before_retry_after() -> None:
    assert [retry_delay(n, None, rand=lambda: 1.0) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert [retry_delay(n, None, rand=lambda: 0.0) for n in (1, 2, 3, 4)] == [0.25, 0.5, 1.0, 2.0]
    assert retry_delay(50, None, rand=lambda: 1.0) == BACKOFF_CAP
    assert retry_delay(1, 30.0, rand=lambda: 1.0) == 30.0
    assert retry_delay(10, 1.0, rand=lambda: 1.0) == BACKOFF_CAP  # the backoff, when later than Retry-After
