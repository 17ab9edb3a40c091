"""Every Postgres and Redis connection judgequeue opens is made here, so poolers and failover are
handled in one place.

Postgres behind a transaction pooler (PgBouncer ``pool_mode=transaction``): consecutive
transactions of one client connection may run on different server sessions, so a named prepared
statement made on one is missing (or already taken) on the next. asyncpg's statement cache is turned
off there (``statement_cache_size=0``: unnamed statements, parsed and executed before the
transaction ends, which poolers of every kind pass through). Nothing else is per session: settings
the roles need (``synchronous_commit``) are set per transaction in their SQL, never as startup
parameters, which PgBouncer refuses unless told to ignore them.

Failover: a multi-host DSN (``postgresql://h1:5432,h2:5432/db?target_session_attrs=read-write``) is
asyncpg's own; every new connection tries the hosts in order and keeps the writable one.

Redis: a ``redis+sentinel://`` URL (see :mod:`judgequeue.core.redis_url`) gives a client whose
connections ask the sentinels for the current master each time they (re)connect, and drop a
connection that finds its master demoted to a replica.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel

from .redis_url import is_sentinel_url, parse_sentinel_url


def postgres_options(pooler: str) -> dict[str, Any]:
    """asyncpg connect options for a DSN reached through ``pooler`` (none, session, transaction)."""
    if pooler == "transaction":
        return {"statement_cache_size": 0}
    return {}


async def connect_postgres(dsn: str, *, pooler: str = "none", **options: Any) -> asyncpg.Connection:
    """One Postgres connection (asyncpg.connect with the options ``pooler`` needs)."""
    return await asyncpg.connect(dsn, **postgres_options(pooler), **options)


async def create_postgres_pool(dsn: str, *, pooler: str = "none", **options: Any) -> asyncpg.Pool:
    """A Postgres pool (asyncpg.create_pool with the options ``pooler`` needs)."""
    pool = await asyncpg.create_pool(dsn, **postgres_options(pooler), **options)
    assert pool is not None  # asyncpg returns None only when not awaited
    return pool


class SentinelMaster(aioredis.Redis):
    """The master's client; closing it also closes the connections it opened to the sentinels."""

    sentinel_manager: Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for sentinel_client in self.sentinel_manager.sentinels if self.sentinel_manager is not None else []:
            await sentinel_client.aclose()


def redis_client(url: str, **options: Any) -> aioredis.Redis:
    """A Redis client for a plain URL or a ``redis+sentinel://`` URL.

    ``options`` (socket timeouts, retry) apply to the data connections; the sentinels are asked
    with the same timeouts. No I/O happens here: the master is looked up on first use.
    """
    if not is_sentinel_url(url):
        return aioredis.Redis.from_url(url, **options)
    target = parse_sentinel_url(url)
    sentinel_options = {k: v for k, v in options.items() if k in ("socket_timeout", "socket_connect_timeout")}
    if target.sentinel_password:
        sentinel_options["password"] = target.sentinel_password
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_options)  # type: ignore[no-untyped-call]
    client: SentinelMaster = sentinel.master_for(
        target.master,
        redis_class=SentinelMaster,
        db=target.db,
        username=target.username,
        password=target.password,
        **options,
    )
    client.sentinel_manager = sentinel
    return client
