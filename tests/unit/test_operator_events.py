"""Warning Events for failed reconciles: posted on the JudgeQueue, rate-limited per object and reason."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from judgequeue.controllers import kube_events
from judgequeue.controllers.kube_events import warn_event
from judgequeue.controllers.state import OperatorConfig, OperatorState


def test_same_warning_posted_once_a_minute_per_object_and_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[tuple[str, str, str]] = []

    def fake_warn(body: Any, *, reason: str, message: str) -> None:
        posted.append((body["metadata"]["uid"], reason, message))

    clock = [1000.0]
    monkeypatch.setattr("judgequeue.controllers.kube_events.kopf.warn", fake_warn)
    # Only the kube_events module's view of the clock (not the time module everyone shares).
    monkeypatch.setattr("judgequeue.controllers.kube_events.time", SimpleNamespace(monotonic=lambda: clock[0]))
    state = OperatorState(config=OperatorConfig())
    a, b = {"metadata": {"uid": "a"}}, {"metadata": {"uid": "b"}}
    warn_event(state, a, "ReconcileFailed", "HTTP 403")
    warn_event(state, a, "ReconcileFailed", "HTTP 403")  # a retry loop: not again
    warn_event(state, b, "ReconcileFailed", "HTTP 403")  # another object: its own Event
    warn_event(state, a, "SecretNotFound", "HTTP 403")  # another reason: its own Event
    warn_event(state, a, "ReconcileFailed", "HTTP 500")  # a new message: posted at once
    clock[0] += kube_events.WARNING_EVENT_REPEAT
    warn_event(state, a, "ReconcileFailed", "HTTP 500")  # a minute later: posted again
    assert posted == [("a", "ReconcileFailed", "HTTP 403"), ("b", "ReconcileFailed", "HTTP 403"),
                      ("a", "SecretNotFound", "HTTP 403"), ("a", "ReconcileFailed", "HTTP 500"),
                      ("a", "ReconcileFailed", "HTTP 500")]


def test_every_condition_change_is_an_event_and_failures_are_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[tuple[str, str, str]] = []
    monkeypatch.setattr("judgequeue.controllers.kube_events.kopf.warn",
                        lambda body, *, reason, message: posted.append(("Warning", reason, message)))
    monkeypatch.setattr("judgequeue.controllers.kube_events.kopf.event",
                        lambda body, *, type, reason, message: posted.append((type, reason, message)))
    state = OperatorState(config=OperatorConfig())
    body = {"metadata": {"uid": "u"}}

    def cond(type_: str, status: str, reason: str, message: str = "m") -> dict[str, str]:
        return {"type": type_, "status": status, "reason": reason, "message": message}

    before = [cond("Ready", "True", "AllReplicasAvailable"), cond("Progressing", "False", "Reconciled"),
              cond("Degraded", "False", "Reconciled"), cond("CutoverApplied", "True", "Applied")]
    after = [cond("Ready", "False", "ContainersFailing", "worker pod p exited 2: bad judge"),
             cond("Progressing", "True", "RollingOut", "worker: 1 of 1 updated, 1 old still running"),
             cond("Degraded", "True", "RoleMisconfigured", "worker refuses its configuration: bad judge"),
             cond("CutoverApplied", "False", "DatabaseUnavailable", "cannot read or write queue 'q'")]
    kube_events.announce(state, body, before, after)
    assert posted == [("Warning", "ContainersFailing", "worker pod p exited 2: bad judge"),
                      ("Normal", "RollingOut", "worker: 1 of 1 updated, 1 old still running"),
                      ("Warning", "RoleMisconfigured", "worker refuses its configuration: bad judge"),
                      ("Warning", "DatabaseUnavailable", "cannot read or write queue 'q'")]
    posted.clear()
    kube_events.announce(state, body, after, after)  # nothing moved: nothing posted
    kube_events.announce(state, body, after, [{**after[0], "message": "another pod"}])  # the message alone
    assert posted == []
    kube_events.announce(state, body, after, before)  # recovered: Normal Events
    assert [(t, r) for t, r, _ in posted] == [("Normal", "AllReplicasAvailable"), ("Normal", "Reconciled"),
                                             ("Normal", "Reconciled"), ("Normal", "Applied")]


def test_nothing_secret_leaves_in_events_logs_or_status() -> None:
    from judgequeue.controllers import diff, redact

    redact.remember("postgresql://judgequeue:s3cret-remembered@db.judge.svc:5432/judge")
    text = ("cannot connect to postgresql://judgequeue:s3cret-remembered@db.judge.svc:5432/judge;"
            " bare s3cret-remembered; other redis://:hunter2-other@redis:6379/0;"
            " host=db password=kw-secret user=x; https://h/x?token=q-secret&a=1; {\"password\": \"js-secret\"}")
    scrubbed = redact.redact(text)
    for secret in ("s3cret-remembered", "hunter2-other", "kw-secret", "q-secret", "js-secret"):
        assert secret not in scrubbed, scrubbed
    assert "redis://:***@redis:6379/0" in scrubbed and "host=db password=*** user=x" in scrubbed
    # A word that merely contains a short password is left alone; its URL form is not.
    redact.remember("redis://:pw@r:6379/0")
    assert redact.redact("a pwd-less wordpw") == "a pwd-less wordpw"
    # An env var someone added to a child: hidden by its name, or by what its value looks like.
    added = diff.Difference("spec.template.spec.containers[worker].env[API_TOKEN]",
                            {"name": "API_TOKEN", "value": "tok-abcdef"}, diff.MISSING)
    assert "tok-abcdef" not in redact.difference(added).describe()
    url = diff.Difference("spec.template.spec.containers[worker].env[DATABASE_URL]",
                          {"name": "DATABASE_URL", "value": "postgresql://judgequeue:x" + "y" * 200 + "-pw@db/j"},
                          diff.MISSING)
    assert "-pw@" not in redact.difference(url).describe(120) and "yyy" not in redact.difference(url).describe(120)
    status = redact.redact_tree({"conditions": [{"message": "postgresql://u:inline-pw@h/d"}],
                                 "env": [{"name": "DB_PASSWORD", "value": "plain"}]})
    assert status == {"conditions": [{"message": "postgresql://u:***@h/d"}],
                      "env": [{"name": "DB_PASSWORD", "value": "***"}]}


def test_log_records_are_scrubbed(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from judgequeue.controllers.redact import RedactFilter

    logger = logging.getLogger("judgequeue.test.redact")
    logger.addFilter(RedactFilter())
    try:
        with caplog.at_level(logging.INFO, logger="judgequeue.test.redact"):
            logger.info("dsn %s", "postgresql://u:log-secret@h/d", extra={"diff": ["redis://:field-secret@r/0"]})
            try:
                raise ValueError("postgresql://u:exc-secret@h/d")
            except ValueError:
                logger.exception("failed")
    finally:
        logger.filters.clear()
    text = " ".join(f"{r.getMessage()} {getattr(r, 'diff', '')} {getattr(r, 'exc', '')}" for r in caplog.records)
    assert "secret" not in text.replace("***", ""), text
    assert "ValueError" in text
