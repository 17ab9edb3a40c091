"""Typed errors of judgequeue's public API.

Every error a caller can act on has its own class; database errors raised by judgequeue's SQL
functions carry SQLSTATEs in the private ``JQ`` class and are translated here, so callers in
Python get the same error whether validation happened in Python or in SQL.
"""

from __future__ import annotations

import asyncpg


class JudgeQueueError(Exception):
    """Base class of every error judgequeue raises on purpose."""


class InvalidQueueName(JudgeQueueError, ValueError):
    """A queue name is not a DNS label."""


class UnknownQueue(JudgeQueueError, LookupError):
    """The queue does not exist (create it first)."""


class PayloadTooLarge(JudgeQueueError, ValueError):
    """The serialised payload is over the documented size limit."""


class InvalidPayload(JudgeQueueError, ValueError):
    """The payload is not a JSON-serialisable value."""


class WatermarkMovedBack(JudgeQueueError, ValueError):
    """A cutover watermark may only move forward."""


class UnknownSubmission(JudgeQueueError, LookupError):
    """No submission has this id."""


class ConfigError(JudgeQueueError, ValueError):
    """A configuration value is missing or malformed; the message names the variable."""


class TransportError(JudgeQueueError):
    """Redis could not be reached or refused the command; the operation may be retried."""


_SQLSTATE_ERRORS: dict[str, type[JudgeQueueError]] = {
    "JQ001": InvalidQueueName,
    "JQ002": UnknownQueue,
    "JQ003": PayloadTooLarge,
    "JQ004": InvalidPayload,
    "JQ005": WatermarkMovedBack,
    "JQ006": UnknownSubmission,
}


def translate_pg_error(exc: asyncpg.PostgresError) -> JudgeQueueError | None:
    """Map an error raised by judgequeue's SQL functions to its typed error, or None if foreign."""
    cls = _SQLSTATE_ERRORS.get(getattr(exc, "sqlstate", "") or "")
    if cls is None:
        return None
    return cls(getattr(exc, "message", str(exc)))
