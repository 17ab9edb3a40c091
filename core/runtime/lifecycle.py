"""What every role does around its work: open connections patiently, wait on events, close in time.

A role started before Postgres is reachable (a pod scheduled before the database, a failover) waits
with backoff instead of exiting; shutdown never hangs on a pool whose connections are stuck behind a
stalled network.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import asyncpg
import redis.asyncio as aioredis

from ..base.errors import DB_ERRORS, TransportError, reason
from ..config import Settings
from ..transport import streams
from ..transport.connect import REDIS_TIMEOUT, STATEMENT_TIMEOUT, create_postgres_pool, redis_client

__all__ = [
    "DB_ERRORS",
    "Connections",
    "HeldSession",
    "backoff",
    "cancel_within",
    "instance_id",
    "open_connections",
    "unless_stopped",
    "wait_any",
]

log = logging.getLogger("judgequeue.lifecycle")

T = TypeVar("T")


#: Seconds each clean-up step at shutdown may take (releasing leases, unregistering, closing): the
#: network may be what failed, and a shutdown that waits for it ends in a SIGKILL instead.
SHUTDOWN_STEP = 1.0


def instance_id(role: str) -> str:
    """A name unique to this process, readable in claims, consumers and logs."""
    return f"{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def backoff(failures: int, *, base: float = 0.1, cap: float = 5.0) -> float:
    """Exponential retry delay after ``failures`` consecutive failures (pure)."""
    return float(min(cap, base * 2 ** max(0, failures - 1)))


async def wait_any(stop: asyncio.Event, other: asyncio.Event | None, within: float) -> bool:
    """Wait until ``stop`` or ``other`` is set or ``within`` seconds pass; True if an event fired."""
    events = [stop] + ([other] if other is not None else [])
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        done, _ = await asyncio.wait(waiters, timeout=within, return_when=asyncio.FIRST_COMPLETED)
        return bool(done)
    finally:
        for w in waiters:
            w.cancel()


async def unless_stopped(stop: asyncio.Event, work: Awaitable[T], *, grace: float = 0.0) -> T | None:
    """``await work``, unless ``stop`` is set first: then ``work`` gets ``grace`` seconds to end by
    itself (work that waits on ``stop`` ends at once), is cancelled, and None is returned.

    A role's step may be stuck on a server that stopped answering (bounded only by
    :data:`STATEMENT_TIMEOUT`); SIGTERM must not wait that out. Every step wrapped in this is safe
    to abandon half-way: its effects are redone or rescued like a crash's (a lease the reaper
    rescues, an entry still pending, a waiter row pruned). If the caller itself is cancelled, so is
    ``work``.
    """
    task = asyncio.ensure_future(work)
    if task.done():
        return task.result()
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopping), return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and grace > 0:
            await asyncio.wait((task,), timeout=grace)
    except BaseException:
        task.cancel()
        raise
    finally:
        stopping.cancel()
    if task.done():
        return task.result()
    await cancel_within(task, SHUTDOWN_STEP)
    return None


async def best_effort(work: Awaitable[Any], within: float) -> None:
    """Give a shutdown step ``within`` seconds, then cancel it and go on without waiting for it to
    unwind (a call cancelled on a stalled server waits for the server's cancel acknowledgement).
    What it raises is dropped: a best-effort step's failure is redone or pruned by another role."""
    task = asyncio.ensure_future(work)
    await asyncio.wait({task}, timeout=within)
    if not task.done():
        task.cancel()
    task.add_done_callback(_drop_outcome)


def _drop_outcome(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not report it as never retrieved


async def cancel_within(task: asyncio.Future[Any], within: float) -> None:
    """Cancel ``task`` and wait at most ``within`` seconds for it to finish.

    A task cancelled in the middle of a database call may still be releasing its connection (asyncpg
    waits for the server to acknowledge the cancel, bounded by the acquire's timeout); shutdown
    does not wait for that beyond ``within``.
    """
    task.cancel()
    await asyncio.wait({task}, timeout=within)


@dataclass
class Connections:
    pool: asyncpg.Pool
    redis: aioredis.Redis

    async def close(self, within: float = SHUTDOWN_STEP) -> None:
        """Close both; connections still busy after ``within`` seconds are terminated."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.redis.aclose(), within)
        # Not wait_for: cancelling a pool's close waits for that close to unwind, which a stalled
        # server can drag out; terminate cuts every connection at once instead.
        closing = asyncio.ensure_future(self.pool.close())
        await asyncio.wait({closing}, timeout=within)
        if not closing.done():
            log.warning("postgres pool did not close in time; terminating it", extra={"within": within})
            self.pool.terminate()
            await cancel_within(closing, within)


class Doorbell:
    """A wake-up that one task waits on and anything (a callback, another task) rings: an
    ``asyncio.Event`` whose wait takes a timeout at the cost of one future and one timer, where
    ``asyncio.wait_for`` or :func:`wait_any` start a task per wait (12-14 µs a wait on these
    machines against about 3; the verdict writer and the offers wait once per group of jobs)."""

    __slots__ = ("_rung", "_waiter")

    def __init__(self) -> None:
        self._rung = False
        self._waiter: asyncio.Future[None] | None = None

    def ring(self) -> None:
        self._rung = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._rung = False

    def is_set(self) -> bool:
        return self._rung

    async def wait(self, within: float | None = None) -> bool:
        """Until rung (at once if it is) or ``within`` seconds pass; True if rung. One waiter at a time."""
        if self._rung:
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        timer = loop.call_later(within, _settle, waiter) if within is not None else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        return self._rung


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class HeldSession:
    """One pooled connection kept across a role's sequential loop instead of one per statement.

    A pool acquire/release pair costs wall time and CPU on every statement (docs/performance.md), and
    the dispatcher's claim and the worker's lease are on the commit-to-start path. After an error,
    :meth:`drop` discards the connection (the pool opens a new one) and the next :meth:`get` takes
    a fresh one.

    A held connection can die under the holder: when the server ends the session (a terminated
    backend, ``idle_session_timeout``, a restart), asyncpg hands the connection back to the pool
    itself and every later call on the holder's handle raises "released back to the pool". So
    :meth:`get` checks the handle is still attached, and :meth:`drop` terminates rather than
    releases: a connection that just failed may be in a protocol state no reset can repair, and
    must never be handed to another task.
    """

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._conn: asyncpg.Connection | None = None

    async def get(self) -> asyncpg.Connection:
        if self._conn is None or not _usable(self._conn):
            await self.drop()
            self._conn = await self._pool.acquire(timeout=STATEMENT_TIMEOUT)
        return self._conn

    async def drop(self) -> None:
        """Give up the held connection (after an error, or at the end): it is closed, not reused."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with contextlib.suppress(Exception):
            conn.terminate()  # the pool replaces it; a handle already detached raises, harmlessly
        with contextlib.suppress(Exception):
            await self._pool.release(conn)

    async def release(self, within: float = SHUTDOWN_STEP) -> None:
        """Give the held connection back to the pool in good order (a loop ending normally), or
        close it if that takes over ``within`` seconds: a release waits for the cancel requests of
        statements abandoned on it, which a stalled server never answers."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            await asyncio.wait_for(self._pool.release(conn), within)
        except Exception:
            with contextlib.suppress(Exception):
                conn.terminate()


def _usable(conn: asyncpg.Connection) -> bool:
    """Whether a pooled handle is still attached to an open connection (asyncpg may have taken it back)."""
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:
        return False


async def keep_session(_conn: asyncpg.Connection) -> None:
    """Pool reset hook that sends nothing: the roles leave no session state behind.

    asyncpg's default reset sends ``RESET ALL; UNLISTEN *; ...`` on every release, a full round trip
    that each ``async with pool.acquire()`` waits for, between the claim and the append and between
    the lease and the judge (one round trip per acquire on the critical path; docs/performance.md
    has the measurement).
    The roles never SET, LISTEN or take session advisory locks on pooled connections (the
    dispatcher listens on its own connection), and asyncpg still rolls back any transaction left
    open before calling this hook.
    """


async def open_connections(settings: Settings, stop: asyncio.Event, *, pool_size: int) -> Connections | None:
    """A Postgres pool and a Redis client for a role, waiting out an unreachable Postgres with backoff.

    Both go through :mod:`judgequeue.core.transport.connect` (a transaction pooler, a multi-host DSN, a
    Sentinel URL). No session setting is passed at connect time: a role that wants one for its
    writes sets it per transaction in its SQL, which works behind any pooler.
    Returns None if ``stop`` is set first. The consumer group is created when Redis answers; if it
    does not yet, the roles' own NOGROUP handling creates it later.
    """
    failures = 0
    pool: asyncpg.Pool | None = None
    while pool is None:
        if stop.is_set():
            return None
        try:
            pool = await create_postgres_pool(
                settings.postgres_dsn,
                pooler=settings.postgres_pooler,
                min_size=1,
                max_size=pool_size,
                reset=keep_session,
                command_timeout=STATEMENT_TIMEOUT,
                timeout=STATEMENT_TIMEOUT,  # to connect
            )
        except DB_ERRORS as exc:
            failures += 1
            delay = backoff(failures, base=0.5, cap=30.0)
            log.warning("postgres unavailable; retrying", extra={"error": reason(exc), "retry_in": delay})
            await wait_any(stop, None, delay)
    redis = redis_client(settings.redis_url, socket_timeout=REDIS_TIMEOUT, socket_connect_timeout=REDIS_TIMEOUT)
    with contextlib.suppress(TransportError):
        # A shadow worker reads the shadow stream: its group is the one it needs (and /readyz checks).
        await streams.ensure_group(redis, settings.queue, shadow=settings.worker.shadow == "judge")
    return Connections(pool, redis)


class Role(Protocol):
    """What :func:`serve` runs: a role instance with a name that runs until ``stop`` is set."""

    name: str

    async def run(self, stop: asyncio.Event) -> None: ...


async def serve(
    settings: Settings,
    stop: asyncio.Event,
    make: Callable[[Connections], Role],
    *,
    role: str,
    pool_size: int,
    **log_fields: object,
) -> None:
    """A role's entry point: open its connections, build it, log that it started, run it, close."""
    conns = await open_connections(settings, stop, pool_size=pool_size)
    if conns is None:
        return
    try:
        instance = make(conns)
        # What exists now (modules, the role, its connections) lives as long as the process: out of
        # the collector's generations, every later collection walks only what the role allocates
        # while serving, not the ~40,000 objects of its imports.
        gc.freeze()
        logging.getLogger(f"judgequeue.{role}").info(
            f"{role} started", extra={role: instance.name, "queue": settings.queue, **log_fields}
        )
        await instance.run(stop)
    finally:
        await conns.close()
