"""A Redis connection reset (TCP RST) under uvloop is "Redis unavailable", never a crash.

Found by the server-fault chaos (``tests/chaos.py``, fault ``proxy_reset``): under uvloop, the
roles' event loop, an RST closes the transport at once and redis-py's next write on it raises
``RuntimeError: unable to perform operation on <TCPTransport closed=True ...>; the handler is
closed``. Every role caught only Redis and OS errors, so dispatchers, workers and reapers all
exited with code 1 after one reset. Asyncio's own loop raises a ConnectionError for the same event,
so the tests run on uvloop explicitly.

Which of the two a call meets depends on redis-py: 8.1 writes on the closed transport (the
RuntimeError above), 7.4 and 8.2 notice it is closing and reconnect first (the call succeeds). Both
are fine; a crash is not. The translation itself is pinned in ``tests/unit/test_streams_errors.py``
whatever redis-py is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
import uvloop

from judgequeue.core.transport import redis_errors, streams
from tests.support.redis_servers import redis_server
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import eventually


def _transports_closed(client: aioredis.Redis) -> Callable[[], Awaitable[bool]]:
    """True once every idle pooled connection's transport is closed (the RST was processed)."""

    async def check() -> bool:
        pool: Any = client.connection_pool
        conns = list(pool._available_connections)
        return bool(conns) and all(c._writer is None or c._writer.transport.is_closing() for c in conns)

    return check


async def _after_reset(port: int, call: Callable[[aioredis.Redis], Awaitable[object]]) -> object:
    proxy = TcpProxy(port)
    await proxy.start()
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{proxy.port}/0")
    try:
        await client.ping()
        proxy.reset()
        await eventually(_transports_closed(client), what="the reset connection closed")
        # redis-py may reconnect first (7.4, 8.2) or write on the dead transport: then the reset is
        # reported as what it is, Redis unavailable for this call.
        with contextlib.suppress(redis_errors.RedisUnavailable):
            await call(client)
        return await call(client)  # the next call works either way
    finally:
        await client.aclose()
        await proxy.close()


@pytest.mark.parametrize("operation", ["guarded", "read", "ensure_group"])
def test_reset_connection_is_redis_unavailable_under_uvloop(operation: str) -> None:
    calls: dict[str, Callable[[aioredis.Redis], Awaitable[object]]] = {
        "guarded": lambda c: redis_errors.guarded(lambda: c.ping()),
        "read": lambda c: streams.read(c, "reset-test", "w", count=1, block_ms=1),
        "ensure_group": lambda c: streams.ensure_group(c, "reset-test"),
    }
    with redis_server() as server, asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_after_reset(server.port, calls[operation]))
