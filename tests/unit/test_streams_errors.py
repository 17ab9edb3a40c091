"""How a failed Redis call is classified (``redis_errors.transport_error``, ``redis_errors.guarded``), pure.

The uvloop case (a write on a transport the peer reset raises a RuntimeError) reproduces against a
real server only with some redis-py releases (see tests/integration/test_connection_reset.py), so
the mapping is pinned here with the exact error uvloop raises.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.exceptions as rexc

from judgequeue.core.base.errors import TransportError
from judgequeue.core.transport import redis_errors

UVLOOP_CLOSED = RuntimeError(
    "unable to perform operation on <TCPTransport closed=True reading=False 0x55f10972a910>; the handler is closed"
)


def test_uvloop_write_on_a_reset_connection_is_redis_unavailable() -> None:
    assert redis_errors.closed_transport(UVLOOP_CLOSED)
    assert isinstance(redis_errors.transport_error(UVLOOP_CLOSED), redis_errors.RedisUnavailable)


@pytest.mark.parametrize(
    "exc",
    [rexc.ConnectionError("reset"), ConnectionResetError(104, "reset"), TimeoutError(), OSError(111, "refused")],
)
def test_connection_failures_are_transport_errors(exc: BaseException) -> None:
    assert isinstance(redis_errors.transport_error(exc), TransportError)


@pytest.mark.parametrize("exc", [RuntimeError("some other bug"), ValueError("bad"), KeyError("k")])
def test_bugs_are_not_transport_errors(exc: BaseException) -> None:
    assert redis_errors.transport_error(exc) is None


def test_guarded_raises_the_mapped_error_and_lets_bugs_through() -> None:
    async def fail(exc: BaseException) -> None:
        raise exc

    with pytest.raises(redis_errors.RedisUnavailable) as caught:
        asyncio.run(redis_errors.guarded(lambda: fail(UVLOOP_CLOSED)))
    assert caught.value.__cause__ is UVLOOP_CLOSED
    with pytest.raises(RuntimeError, match="some other bug"):
        asyncio.run(redis_errors.guarded(lambda: fail(RuntimeError("some other bug"))))
