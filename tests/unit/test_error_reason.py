"""What a log line says of a failure: the exception's message, or its type where it has none."""

from __future__ import annotations

import asyncpg

from judgequeue.core.base.errors import reason


def test_a_message_is_kept() -> None:
    assert reason(ConnectionRefusedError("connection refused")) == "connection refused"
    assert reason(asyncpg.QueryCanceledError("canceling statement due to lock timeout")) == (
        "canceling statement due to lock timeout"
    )


def test_a_bare_timeout_is_named() -> None:
    """A statement or pool timeout is a TimeoutError without a message: it used to log ``"error": ""``."""
    assert reason(TimeoutError()) == "TimeoutError"
