"""Warning Events for failed reconciles: posted on the JudgeQueue, rate-limited per object and reason."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from judgequeue.controllers import handlers
from judgequeue.controllers.handlers import OperatorConfig, OperatorState, warn_event


def test_same_warning_posted_once_a_minute_per_object_and_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[tuple[str, str, str]] = []

    def fake_warn(body: Any, *, reason: str, message: str) -> None:
        posted.append((body["metadata"]["uid"], reason, message))

    clock = [1000.0]
    monkeypatch.setattr("judgequeue.controllers.handlers.kopf.warn", fake_warn)
    # Only the handlers module's view of the clock (not the time module everyone shares).
    monkeypatch.setattr("judgequeue.controllers.handlers.time", SimpleNamespace(monotonic=lambda: clock[0]))
    state = OperatorState(config=OperatorConfig())
    a, b = {"metadata": {"uid": "a"}}, {"metadata": {"uid": "b"}}
    warn_event(state, a, "ReconcileFailed", "HTTP 403")
    warn_event(state, a, "ReconcileFailed", "HTTP 403")  # a retry loop: not again
    warn_event(state, b, "ReconcileFailed", "HTTP 403")  # another object: its own Event
    warn_event(state, a, "SecretNotFound", "HTTP 403")  # another reason: its own Event
    warn_event(state, a, "ReconcileFailed", "HTTP 500")  # a new message: posted at once
    clock[0] += handlers.WARNING_EVENT_REPEAT
    warn_event(state, a, "ReconcileFailed", "HTTP 500")  # a minute later: posted again
    assert posted == [("a", "ReconcileFailed", "HTTP 403"), ("b", "ReconcileFailed", "HTTP 403"),
                      ("a", "SecretNotFound", "HTTP 403"), ("a", "ReconcileFailed", "HTTP 500"),
                      ("a", "ReconcileFailed", "HTTP 500")]
