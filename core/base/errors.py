"""Typed errors of judgequeue's public API.

Every error a caller can act on has its own class; database errors raised by judgequeue's SQL
functions carry SQLSTATEs in the private ``JQ`` class and are translated here, so callers in
Python get the same error whether validation happened in Python or in SQL.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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


class InvalidClass(JudgeQueueError, ValueError):
    """A priority class the queue does not declare (the message lists the ones it does), a fairness
    key out of bounds, a bulk rejudge without a filter, or an invalid set of classes."""


class WatermarkMovedBack(JudgeQueueError, ValueError):
    """A cutover watermark may only move forward."""


class CutoverBlocked(JudgeQueueError):
    """A flag flip waited too long for submit transactions that filled workers' offers (migration
    0010) to commit; nothing was changed. Retry, or end those transactions."""


class QueueOwned(JudgeQueueError):
    """The queue belongs to another owner (a JudgeQueue); nothing was changed."""

    def __init__(self, message: str, owner: str) -> None:
        super().__init__(message)
        self.owner = owner


class UnknownSubmission(JudgeQueueError, LookupError):
    """No submission has this id."""


class NotShadowed(JudgeQueueError, LookupError):
    """A legacy verdict for a submission that has no shadow verdict to be compared with: its queue is
    not in shadow mode and never sent it to shadow judging; nothing was written."""


class InvalidVerdict(JudgeQueueError, ValueError):
    """A legacy verdict's name is not a verdict, or its details are not a JSON object."""


class InvalidReason(JudgeQueueError, ValueError):
    """A cancellation's reason is missing, blank or over 1,000 characters; nothing was cancelled."""


class UnknownRejudging(JudgeQueueError, LookupError):
    """No rejudging of the queue has this id."""


class RejudgingRefused(JudgeQueueError):
    """A rejudging cannot do what was asked in its state: apply a cancelled one, cancel an applied
    one, apply one whose proposed verdicts are still missing (without ``partial``), open one on a
    queue not in live mode; nothing was changed."""


class ConfigError(JudgeQueueError, ValueError):
    """A configuration value is missing or malformed; the message names the variable."""


class Failure(JudgeQueueError):
    """An expected failure of a command: printed as one line, with its exit code (1 by default)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class RoleUnfit(JudgeQueueError):
    """A running role found it cannot do its job any more (a worker whose sandbox directory was
    removed under it): it has given its work back and exits non-zero, so it is restarted afresh."""


class TransportError(JudgeQueueError):
    """Redis could not be reached or refused the command; the operation may be retried."""


_SQLSTATE_ERRORS: dict[str, type[JudgeQueueError]] = {
    "JQ001": InvalidQueueName,
    "JQ002": UnknownQueue,
    "JQ003": PayloadTooLarge,
    "JQ004": InvalidPayload,
    "JQ005": WatermarkMovedBack,
    "JQ006": UnknownSubmission,
    "JQ007": NotShadowed,
    "JQ008": InvalidVerdict,
    "JQ009": InvalidClass,
    "JQ010": InvalidReason,
    "JQ020": UnknownRejudging,
    "JQ021": RejudgingRefused,
}


#: Every exception a database call can raise that is about the database or the link to it, not a bug
#: in the caller: server errors, the client's view of a lost or confused connection (a backend
#: terminated by the server can leave asyncpg's protocol in an error state for the instant before
#: the close is seen: InternalClientError), sockets and timeouts. Roles catch exactly these.
DB_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
    ConnectionError,
    TimeoutError,
)

#: What a step of a role may fail with and be retried later: Redis or the database unavailable.
SERVER_ERRORS: tuple[type[BaseException], ...] = (TransportError, *DB_ERRORS)

#: SQLSTATE classes that no retry of the same statement with the same values can fix: data
#: exceptions (a number out of range, a bad encoding) and integrity constraint violations.
_PERMANENT_CLASSES = ("22", "23")


def is_permanent(exc: BaseException) -> bool:
    """True when a database error is about the values sent, so retrying them is pointless (pure).

    Everything else in :data:`DB_ERRORS` is transient: a lost or terminated connection
    (08, 57P01-57P05), serialization failures and deadlocks (40), lock and statement timeouts
    (55P03, 57014), too many connections (53), a server starting up or shutting down, and even a
    missing table (42, migrations not applied yet), which an operator fixes without a restart. The
    caller of a permanent error sets aside the one item that caused it and keeps serving the others;
    judgequeue's own validation errors (SQLSTATE class JQ) are permanent too.
    """
    state = getattr(exc, "sqlstate", None)
    if not isinstance(exc, asyncpg.PostgresError) or not isinstance(state, str):
        return False
    return state[:2] in _PERMANENT_CLASSES or state.startswith("JQ")


def reason(exc: BaseException) -> str:
    """An exception's message for a log line, or its type's name where it has none (a statement or
    pool timeout is a bare ``TimeoutError``, which logged an empty error)."""
    return str(exc) or type(exc).__name__


def describe(exc: BaseException) -> str:
    """One line naming a database error for logs, DLQ reasons and ``last_error`` (bounded)."""
    state = getattr(exc, "sqlstate", None)
    text = f"{type(exc).__name__}: {exc}" if not state else f"{type(exc).__name__} ({state}): {exc}"
    return text[:500]


def translate_pg_error(exc: asyncpg.PostgresError) -> JudgeQueueError | None:
    """Map an error raised by judgequeue's SQL functions to its typed error, or None if foreign."""
    cls = _SQLSTATE_ERRORS.get(getattr(exc, "sqlstate", "") or "")
    if cls is None:
        return None
    return cls(getattr(exc, "message", str(exc)))


@contextlib.contextmanager
def typed_pg_errors() -> Iterator[None]:
    """Around a call of judgequeue's SQL functions: an error they raise comes out as its typed error
    (:func:`translate_pg_error`), raised from the original; any other error comes out as it is."""
    try:
        yield
    except asyncpg.PostgresError as exc:
        translated = translate_pg_error(exc)
        if translated is None:
            raise
        raise translated from exc
