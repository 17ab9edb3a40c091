"""Every Postgres and Redis connection judgequeue opens is made here, so poolers and failover are
handled in one place.

Postgres behind a transaction pooler (PgBouncer ``pool_mode=transaction``): consecutive
transactions of one client connection may run on different server sessions, so a named prepared
statement made on one is missing (or already taken) on the next. asyncpg's statement cache is turned
off there (``statement_cache_size=0``: unnamed statements, parsed and executed before the
transaction ends, which poolers of every kind pass through). Nothing else is per session: settings
the roles need (``synchronous_commit``) are set per transaction in their SQL, never as startup
parameters, which PgBouncer refuses unless told to ignore them.

Failover: a multi-host DSN (``postgresql://h1:5432,h2:5432/db?target_session_attrs=read-write``):
every new connection tries the hosts in order and keeps the first that qualifies. asyncpg does this
itself but under one timeout for all hosts, so a first host that swallows connections (a frozen
server, a dead machine whose address drops packets) would use it all up on every attempt and the
next host would never be tried; here each host gets :data:`HOST_CONNECT_TIMEOUT` of its own.
(Hosts are taken in order, so ``target_session_attrs=prefer-standby`` acts like ``any``: judgequeue
writes, and wants ``read-write``.)

Redis: a ``redis+sentinel://`` URL (see :mod:`judgequeue.core.transport.redis_url`) gives a client whose
connections ask the sentinels for the current master each time they (re)connect, and drop a
connection that finds its master demoted to a replica.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel

from .redis_url import is_sentinel_url, parse_sentinel_url


def postgres_options(pooler: str) -> dict[str, Any]:
    """asyncpg connect options for a DSN reached through ``pooler`` (none, session, transaction)."""
    if pooler == "transaction":
        return {"statement_cache_size": 0}
    return {}


#: Seconds a role's statement may run, and a role may wait for a pooled connection, before giving up
#: as if the connection broke. Every statement a role runs is a short, indexed batch (milliseconds);
#: without a bound, a server that stops answering without closing (frozen, partitioned, an old
#: primary after failover) holds the call until TCP gives up, minutes later. The acquire bound
#: matters as much: asyncpg's release of a connection whose statement was cancelled waits for the
#: server to acknowledge the cancel, for as long as the acquire's timeout, forever without one.
STATEMENT_TIMEOUT = 10.0
#: The same bound for a role's Redis calls (a worker's blocking read waits far less than this).
REDIS_TIMEOUT = 10.0

#: Seconds one host of a multi-host DSN may take to give a usable connection before the next is tried.
HOST_CONNECT_TIMEOUT = 5.0


def split_hosts(dsn: str) -> list[str]:
    """A multi-host ``postgresql://`` URL as one URL per host, in order (same user, database and
    options, ``target_session_attrs`` included); a single-host DSN as itself (pure)."""
    parts = urlsplit(dsn)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return [dsn]
    return [urlunsplit(parts._replace(netloc=f"{userinfo}{at}{host}")) for host in hosts.split(",") if host]


# ``timeout`` keeps asyncpg.connect's name: the pool calls this in its place with the same keywords.
async def _connect_in_turn(
    dsn: str, *, timeout: float = 60.0, host_timeout: float = HOST_CONNECT_TIMEOUT, **options: Any  # noqa: ASYNC109
) -> asyncpg.Connection:
    """asyncpg.connect, trying the hosts of a multi-host DSN one at a time, each within ``host_timeout``.

    ``timeout`` bounds the whole attempt, like asyncpg's. The last host's error is raised when none
    qualifies (refused, timed out, or not what ``target_session_attrs`` asks for).
    """
    hosts = split_hosts(dsn)
    if len(hosts) == 1:
        return await asyncpg.connect(dsn, timeout=timeout, **options)
    last: BaseException | None = None
    async with asyncio.timeout(timeout):
        for host in hosts:
            try:
                return await asyncpg.connect(host, timeout=min(host_timeout, timeout), **options)
            except (
                OSError,
                TimeoutError,
                asyncpg.PostgresError,
                asyncpg.InterfaceError,
                asyncpg.exceptions.InternalClientError,  # TargetServerAttributeNotMatched
            ) as exc:
                last = exc
    assert last is not None
    raise last


async def connect_postgres(
    dsn: str, *, pooler: str = "none", host_timeout: float = HOST_CONNECT_TIMEOUT, **options: Any
) -> asyncpg.Connection:
    """One Postgres connection with the options ``pooler`` needs, multi-host DSNs tried host by host."""
    return await _connect_in_turn(dsn, host_timeout=host_timeout, **postgres_options(pooler), **options)


async def create_postgres_pool(dsn: str, *, pooler: str = "none", **options: Any) -> asyncpg.Pool:
    """A Postgres pool with the options ``pooler`` needs; its connections are made like
    :func:`connect_postgres`'s (host by host for a multi-host DSN)."""
    pool = await asyncpg.create_pool(dsn, connect=_connect_in_turn, **postgres_options(pooler), **options)
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
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_options)
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
