"""Redis failures as :class:`~judgequeue.core.base.errors.TransportError` subclasses, so callers can
tell "try again later" (the outbox row stays retryable) from a bug; :func:`guarded` runs a call
under that translation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.exceptions as rexc

from ..base.errors import TransportError


class RedisUnavailable(TransportError):
    """Connection refused, reset or timed out."""


class RedisReadOnly(TransportError):
    """The server is a replica (READONLY), e.g. during a failover."""


class RedisOutOfMemory(TransportError):
    """The server refused a write under maxmemory (OOM)."""


class RedisCommandError(TransportError):
    """Any other error reply."""


def translate_redis_error(exc: BaseException) -> TransportError:
    """Map a redis-py exception to judgequeue's typed transport errors.

    redis-py strips the error code (``OOM``, ``READONLY``) from the messages of the classes it maps
    them to; it is put back so logs and ``last_error`` say what happened.
    """
    message = str(exc) or type(exc).__name__
    if isinstance(exc, rexc.ReadOnlyError) or message.startswith("READONLY"):
        return RedisReadOnly(message if message.startswith("READONLY") else f"READONLY {message}")
    if isinstance(exc, rexc.OutOfMemoryError) or message.startswith("OOM"):
        return RedisOutOfMemory(message if message.startswith("OOM") else f"OOM {message}")
    if isinstance(exc, (rexc.ConnectionError, rexc.TimeoutError, ConnectionError, TimeoutError, OSError)):
        return RedisUnavailable(message)
    return RedisCommandError(message)


def closed_transport(exc: BaseException) -> bool:
    """Whether ``exc`` is uvloop refusing a write on a connection the peer reset (pure).

    Under uvloop (the roles' loop) a TCP RST closes the transport at once, and redis-py's next write
    on it raises ``RuntimeError: unable to perform operation on <TCPTransport closed=True ...>; the
    handler is closed`` instead of an OSError (asyncio's loop drops the write and the read fails with
    a ConnectionError). redis-py has already disconnected that connection, so the next call
    reconnects: it is Redis unavailable for this call, not a bug.
    """
    return isinstance(exc, RuntimeError) and "handler is closed" in str(exc)


T = TypeVar("T")


def transport_error(exc: BaseException) -> TransportError | None:
    """The :class:`TransportError` a failed Redis call means, or None when it is not one (a bug).

    One place for the whole mapping: redis-py's errors, socket errors and timeouts, and uvloop's
    refusal to write on a connection the peer reset (:func:`closed_transport`).
    """
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, (rexc.RedisError, ConnectionError, TimeoutError, OSError)):
        return translate_redis_error(exc)
    if closed_transport(exc):
        return RedisUnavailable(str(exc))
    return None


async def guarded(call: Callable[[], Awaitable[T]]) -> T:
    """Run a Redis call, turning redis-py errors into :class:`TransportError`."""
    try:
        return await call()
    except Exception as exc:
        mapped = transport_error(exc)
        if mapped is None or mapped is exc:
            raise
        raise mapped from exc
