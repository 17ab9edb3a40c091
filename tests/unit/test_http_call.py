"""The http-call judge's pure parts: answer classification, retry delays, payload checks, settings."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from judgequeue.core.base.errors import ConfigError
from judgequeue.core.judges import CallLater, Job, Verdict
from judgequeue.core.judges.http_call.client import Answer, CallFailed, check_url, request
from judgequeue.core.judges.http_call.judge import (
    BACKOFF_CAP,
    BUSY_CAP,
    BUSY_DELAY,
    ENDPOINTS_VAR,
    MAX_BODY_VAR,
    RETRY_AFTER_CAP,
    CallSettings,
    Endpoint,
    busy_delay,
    check_payload,
    classify,
    load_call_settings,
    retry_after_seconds,
    retry_delay,
)
from judgequeue.core.roles.worker import deferral
from judgequeue.core.store.leases import Lease


def answer(status: int, body: bytes = b"{}", **headers: str) -> Answer:
    return Answer(status, {k.replace("_", "-").lower(): v for k, v in headers.items()}, body)


@pytest.mark.parametrize(
    ("result", "kind", "status", "reason_has"),
    [
        (answer(200, b'{"ok": true}'), "done", "ACCEPTED", ""),
        (answer(201, b""), "done", "ACCEPTED", ""),
        (answer(200, b"<html>"), "fail", "SYSTEM_ERROR", "response is not JSON"),
        (answer(429, b'{"error": "slow down"}'), "retry", "ACCEPTED", "429: slow down"),
        (answer(503, b"busy"), "retry", "ACCEPTED", "503: busy"),
        (answer(500), "retry", "ACCEPTED", "500"),
        (answer(408), "retry", "ACCEPTED", "408"),
        (answer(400, b'{"message": "field x is required"}'), "fail", "RUNTIME_ERROR", "(400): field x is required"),
        (answer(404, b"no such tool"), "fail", "RUNTIME_ERROR", "(404): no such tool"),
        (answer(422, b'{"error": {"message": "bad input"}}'), "fail", "RUNTIME_ERROR", "bad input"),
        (answer(302, b""), "fail", "SYSTEM_ERROR", "redirects are not followed"),
        (TimeoutError(), "retry", "ACCEPTED", "deadline of 5s"),
        (CallFailed("connection", "refused"), "retry", "ACCEPTED", "connection error: refused"),
        (CallFailed("too_large", "answer of 9 bytes"), "fail", "SYSTEM_ERROR", "response too large"),
    ],
)
def test_every_result_is_classified_once(result: Answer | CallFailed | TimeoutError, kind: str, status: str,
                                         reason_has: str) -> None:
    outcome = classify(result, deadline=5)
    assert (outcome.kind, outcome.status) == (kind, status)
    assert reason_has in outcome.reason


def test_a_successful_answer_is_the_verdicts_details() -> None:
    outcome = classify(answer(200, b'{"summary": "ok", "n": 3}'), deadline=5)
    assert outcome.details == {"http_status": 200, "response": {"summary": "ok", "n": 3}}


def test_retry_after_is_honoured_as_seconds_or_a_date_and_capped() -> None:
    assert classify(answer(429, Retry_After="7"), deadline=5).retry_after == 7
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_seconds("Thu, 01 Jan 2026 12:00:30 GMT", now) == 30
    assert retry_after_seconds("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0  # in the past: at once
    assert retry_after_seconds("99999999") == RETRY_AFTER_CAP
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds(None) is None


def test_retry_delay_backs_off_with_jitter_and_never_before_retry_after() -> None:
    low = [retry_delay(n, None, rand=lambda: 0.0) for n in range(1, 12)]
    high = [retry_delay(n, None, rand=lambda: 1.0) for n in range(1, 12)]
    assert low == sorted(low) and high == sorted(high)
    assert all(lo * 2 == hi for lo, hi in zip(low, high, strict=True))  # half fixed, half random
    assert high[-1] == BACKOFF_CAP
    assert retry_delay(1, 30.0, rand=lambda: 1.0) == 30.0


SETTINGS = CallSettings({"tool": Endpoint("tool", "http://127.0.0.1:1/x")}, max_body=100, max_response=1000)


def test_payload_checks_are_terminal_verdicts_naming_the_problem() -> None:
    assert check_payload({"endpoint": "tool", "body": {"a": 1}}, SETTINGS) == (SETTINGS.endpoints["tool"], b'{"a":1}')
    cases = {
        "unknown endpoint 'elsewhere' (this queue calls: tool)": {"endpoint": "elsewhere", "body": {}},
        "body is 112 bytes, over the limit of 100 bytes": {"endpoint": "tool", "body": "x" * 110},
        "payload: unknown field 'url'": {"endpoint": "tool", "url": "http://evil.example/"},
        'payload must be an object {"endpoint": name, "body": JSON}': {"body": {}},
    }
    for reason, payload in cases.items():
        verdict = check_payload(payload, SETTINGS)
        assert isinstance(verdict, Verdict) and verdict.status == "RUNTIME_ERROR"
        assert verdict.details["reason"] == reason
    assert isinstance(check_payload([1], SETTINGS), Verdict)


def test_idempotency_key_is_one_per_request() -> None:
    first = Job("q", 7, generation=1, request_generation=1)
    rescued = Job("q", 7, generation=3, request_generation=1, failures=1)
    rejudged = Job("q", 7, generation=4, request_generation=4)
    assert first.idempotency_key == rescued.idempotency_key == "judgequeue:q:7:1"
    assert rejudged.idempotency_key == "judgequeue:q:7:4"


def test_settings_read_endpoints_and_url_files(tmp_path: Path) -> None:
    (tmp_path / "url").write_text("https://tools.internal:8443/run?v=2\n")
    env = {
        ENDPOINTS_VAR: json.dumps({
            "a": {"url": "http://127.0.0.1:9/", "concurrency": 2, "deadline": 1.5, "tries": 3},
            "b": {"urlFile": str(tmp_path / "url"), "rate": "600/m"},
            "c": {"url": "http://127.0.0.1:9/", "rate": 2.5},
        }),
        MAX_BODY_VAR: "10",
    }  # fmt: skip
    settings = load_call_settings(env)
    assert settings.endpoints["a"] == Endpoint("a", "http://127.0.0.1:9/", 2, 1.5, 3)
    assert settings.endpoints["b"].url == "https://tools.internal:8443/run?v=2"
    # A rate is calls a second across the fleet, written with its unit or as a number a second.
    assert (settings.endpoints["a"].rate, settings.endpoints["b"].rate, settings.endpoints["c"].rate) == (0, 10, 2.5)
    assert settings.max_body == 10


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "must name the endpoints"),
        ("{", "is not JSON"),
        ("[]", "non-empty JSON object"),
        ('{"a": "http://x/"}', "['a'] must be an object"),
        ('{"a": {}}', "exactly one of url and urlFile"),
        ('{"a": {"url": "ftp://x/"}}', "scheme must be http or https"),
        ('{"a": {"url": "http://x/", "concurrency": 0}}', "concurrency must be between 1 and 1024"),
        ('{"a": {"url": "http://x/", "deadline": "long"}}', "deadline must be a number"),
        ('{"a": {"url": "http://x/", "retries": 3}}', "unknown field 'retries'"),
        ('{"a": {"url": "http://x/", "rate": "10"}}', "rate must be calls per time unit, like 10/s"),
        ('{"a": {"url": "http://x/", "rate": "10/d"}}', "rate must be calls per time unit"),
        ('{"a": {"url": "http://x/", "rate": -1}}', "rate must be between 0 and 100000"),
        ('{"a": {"urlFile": "/nonexistent/url"}}', "urlFile: cannot read"),
    ],
)
def test_bad_settings_name_the_variable_and_field(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=ENDPOINTS_VAR) as info:
        load_call_settings({ENDPOINTS_VAR: value})
    assert message in str(info.value)


def test_bad_size_bound_names_its_variable() -> None:
    with pytest.raises(ConfigError, match=MAX_BODY_VAR):
        load_call_settings({ENDPOINTS_VAR: '{"a": {"url": "http://x/"}}', MAX_BODY_VAR: "lots"})


def test_urls_are_checked() -> None:
    assert check_url("http://127.0.0.1:8765/effect") == "http://127.0.0.1:8765/effect"
    for bad in ("127.0.0.1:80", "http:///path", "http://x:notaport/"):
        with pytest.raises(ValueError):
            check_url(bad)


def test_waiting_for_a_busy_endpoint_backs_off_to_a_cap() -> None:
    assert busy_delay(0, rand=lambda: 1.0) == BUSY_DELAY
    assert busy_delay(0, rand=lambda: 0.0) == BUSY_DELAY / 2
    assert [busy_delay(n, rand=lambda: 1.0) for n in range(1, 4)] == [BUSY_DELAY * 2, BUSY_DELAY * 4, BUSY_DELAY * 8]
    assert busy_delay(50, rand=lambda: 1.0) == BUSY_CAP


async def test_a_shadow_job_is_not_deferred_but_explained() -> None:
    """Shadow verdicts are judged once: a CallLater there becomes a SYSTEM_ERROR naming the reason
    (and touches no database: the pool is never used)."""
    lease = Lease(1, 1, uuid.uuid4(), {}, datetime.now(UTC))
    later = CallLater(1.0, "endpoint answered 503: busy")
    verdict = await deferral.defer(None, "q", lease, later, shadow=True)
    assert verdict == Verdict("SYSTEM_ERROR", {"reason": f"a shadow job is not tried again later: {later.reason}"})


def test_the_request_carries_url_credentials_as_basic_auth_only() -> None:
    req = request("https://bot:s%40cret@tools.example:8443/run?v=2", b'{"a":1}', {"Idempotency-Key": "k"})
    assert (req.host, req.port, req.secure) == ("tools.example", 8443, True)
    head, _, body = req.data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /run?v=2 HTTP/1.1"
    assert "Host: tools.example:8443" in lines and "Idempotency-Key: k" in lines
    assert "Authorization: Basic Ym90OnNAY3JldA==" in lines  # bot:s@cret
    assert b"s%40cret" not in req.data and body == b'{"a":1}'
    plain = request("http://[::1]:8765", b"", {})
    assert (plain.host, plain.port, plain.secure) == ("::1", 8765, False)
    assert b"Host: [::1]:8765\r\n" in plain.data and b"POST / HTTP/1.1" in plain.data
    assert b"Authorization" not in plain.data
