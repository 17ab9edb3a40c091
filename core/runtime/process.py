"""Run one role as a process: JSON logs, SIGTERM/SIGINT to a stop event, the health/metrics port.

A role is ``async def run(settings, stop) -> None`` that owns its connections, runs until ``stop``
is set and then shuts down gracefully. :func:`run_role` gives it the process around it and turns the
outcome into an exit code: 0 after a clean stop, 1 when the role failed or ended on its own. A second
signal cancels the role at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
from collections.abc import Callable, Coroutine
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from ..base import metrics as _metrics  # noqa: F401  (registers judgequeue_build_info, which every role's /metrics shows)
from ..base.errors import ConfigError, RoleUnfit, reason
from ..base.logs import setup_logging
from ..config import Settings, redact_url
from ..store import sql
from ..transport.connect import connect_postgres, redis_client
from ..transport.streams import GROUP, work_key
from .http import HealthServer, Readiness

log = logging.getLogger("judgequeue.runtime")

RoleMain = Callable[[Settings, asyncio.Event], Coroutine[Any, Any, None]]

_early_signals: list[int] = []


def catch_early_signals() -> None:
    """Remember SIGTERM/SIGINT that arrive before the event loop runs; :func:`serve_role` honours them."""

    def remember(signum: int, _frame: object) -> None:
        _early_signals.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, remember)


class ReadinessProbe:
    """Cheap, time-bounded readiness: Postgres and Redis answer, and (optionally) the group exists.

    Keeps one Postgres connection and one Redis client of its own (never the role's), reconnecting
    after a failure; every check has its own timeout so one slow dependency cannot hang the probe.
    """

    def __init__(self, settings: Settings, *, need_group: bool, timeout: float = 1.5) -> None:
        self._settings = settings
        self._need_group = need_group
        self._timeout = timeout
        self._pg: asyncpg.Connection | None = None
        self._redis: aioredis.Redis | None = None
        self._lock = asyncio.Lock()
        self.role_alive: Callable[[], bool] = lambda: True
        self._rights_checked = False

    async def _check_postgres(self) -> str:
        if self._pg is None or self._pg.is_closed():
            self._pg = await connect_postgres(
                self._settings.postgres_dsn, pooler=self._settings.postgres_pooler, timeout=self._timeout
            )
        await self._pg.fetchval(sql.query("ping"), timeout=self._timeout)
        if not self._rights_checked:
            await self._warn_broad_rights(self._pg)
        return "ok"

    async def _warn_broad_rights(self, conn: asyncpg.Connection) -> None:
        """Log once when the role's Postgres user can do far more than its job (a quick start's
        superuser URL works, but one leaked Secret is then the whole judge; docs/security.md)."""
        row = await conn.fetchrow(sql.query("session_rights"), timeout=self._timeout)
        self._rights_checked = True
        if row is not None and (row["superuser"] or row["owner"]):
            log.warning(
                "postgres credentials hold more than this role needs: give it a login user granted only"
                " its component's group role (judgequeue roles)",
                extra={"event": "broad_credentials", "superuser": row["superuser"], "schema_owner": row["owner"]},
            )

    async def _check_redis(self) -> list[str]:
        if self._redis is None:
            self._redis = redis_client(
                self._settings.redis_url, socket_timeout=self._timeout, socket_connect_timeout=self._timeout
            )
        await self._redis.ping()
        if not self._need_group:
            return ["ok"]
        key = work_key(self._settings.queue, self._settings.worker.shadow == "judge")  # a shadow worker's own
        try:
            groups = await self._redis.xinfo_groups(key)
        except aioredis.ResponseError:  # no such stream yet
            groups = []
        names = {g["name"].decode() if isinstance(g["name"], bytes) else g["name"] for g in groups}
        return ["ok", "ok" if GROUP in names else f"group {GROUP!r} missing on {key}"]

    async def __call__(self) -> Readiness:
        async with self._lock:
            checks: dict[str, str] = {}
            try:
                checks["postgres"] = await asyncio.wait_for(self._check_postgres(), self._timeout)
            except Exception as exc:
                checks["postgres"] = unreachable(exc)
                await self._drop_pg()
            try:
                redis_checks = await asyncio.wait_for(self._check_redis(), self._timeout)
                checks["redis"] = redis_checks[0]
                if self._need_group:
                    checks["group"] = redis_checks[1]
            except Exception as exc:
                checks["redis"] = unreachable(exc)
            checks["role"] = "ok" if self.role_alive() else "stopped"
            return Readiness(all(v == "ok" for v in checks.values()), checks)

    async def _drop_pg(self) -> None:
        if self._pg is not None:
            with contextlib.suppress(Exception):
                self._pg.terminate()
            self._pg = None

    async def close(self) -> None:
        await self._drop_pg()
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
            self._redis = None


def unreachable(exc: BaseException) -> str:
    """A readiness check's failure: the error's type, and the TLS failure behind it when there is one
    (a certificate the role does not trust is the one cause an operator cannot guess from the type).
    Only the TLS library's own reason is quoted: connection errors' messages are not (they may name
    the server in ways a probe's body should not)."""
    text = f"unreachable: {type(exc).__name__}"
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"{text}: TLS certificate verify failed: {cause.verify_message or cause.reason}"
        if isinstance(cause, ssl.SSLError):
            return f"{text}: TLS error: {cause.reason or type(cause).__name__}"
        cause = cause.__cause__ or cause.__context__
    message = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in message:  # a client that kept only the text of the TLS error
        reason = message.split("certificate verify failed:", 1)[-1].split("(_ssl.c", 1)[0].strip(" .")
        return f"{text}: TLS certificate verify failed: {reason or 'see the role log'}"
    return text


class RefusedReadiness:
    """Readiness of a worker whose judge refused to start: never ready, saying why (fail closed)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def __call__(self) -> Readiness:
        return Readiness(False, {"judge": self.reason})

    async def close(self) -> None:
        return None


async def _idle(_settings: Settings, stop: asyncio.Event) -> None:
    """The role of a refused worker: connect nowhere, take no job, wait to be stopped."""
    await stop.wait()


def await_chain(task: asyncio.Task[Any]) -> str:
    """Where a task waits: its coroutine and every coroutine it awaits, outermost first."""
    frames = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is not None:
            frames.append(f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {frame.f_code.co_name}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return " -> ".join(frames) or "(not started)"


def log_tasks() -> None:
    """On SIGUSR1: log where every task of the role is waiting, one line each (a stuck role's map)."""
    for task in asyncio.all_tasks():
        log.warning("task", extra={"task": task.get_name(), "awaiting": await_chain(task)})


async def serve_role(
    role: str, settings: Settings, main: RoleMain, *, need_group: bool, refused: str | None = None
) -> int:
    """Run ``main`` with the HTTP port and signal handling around it; return the exit code.

    ``refused`` (a worker whose judge cannot start, e.g. no sandbox): serve ``/healthz`` and
    ``/metrics`` but answer ``/readyz`` 503 with that reason, run nothing, and exit 2 once stopped."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    probe: ReadinessProbe | RefusedReadiness
    if refused is not None:
        probe, main = RefusedReadiness(refused), _idle
    else:
        probe = ReadinessProbe(settings, need_group=need_group)
    server = HealthServer(settings.metrics_port, probe, host=settings.metrics_address)
    try:
        await server.start()
    except OSError as exc:
        log.error(
            "cannot listen on the metrics port",
            extra={"address": settings.metrics_address, "port": settings.metrics_port, "error": reason(exc)},
        )
        return 1
    log.info(
        f"{role} starting",
        extra={"role": role, "pid": os.getpid(), "port": server.port, "settings": settings.redacted()},
    )
    task = asyncio.create_task(main(settings, stop), name=role)
    if isinstance(probe, ReadinessProbe):
        probe.role_alive = lambda: not task.done() and not stop.is_set()
    else:
        log.error(f"{role} refused to start its judge: not ready, taking no jobs",
                  extra={"role": role, "reason": probe.reason})

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("second signal: cancelling", extra={"signal": signal.Signals(signum).name})
            task.cancel()
        else:
            log.info("stopping", extra={"signal": signal.Signals(signum).name})
            stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    loop.add_signal_handler(signal.SIGUSR1, log_tasks)
    if _early_signals:
        on_signal(_early_signals[0])
    code = 0
    try:
        await task
        if not stop.is_set():
            log.error(f"{role} ended without being asked to stop", extra={"role": role})
            code = 1
        elif refused is not None:
            code = 2  # it never ran: the exit says so, as the plain refusal's does
    except ConfigError as exc:  # found by the role itself (e.g. an unknown judge plugin)
        log.error(str(exc), extra={"role": role})
        code = 2
    except RoleUnfit as exc:  # it gave its work back; restarted, it starts afresh
        log.error(str(exc), extra={"role": role})
        code = 1
    except asyncio.CancelledError:
        log.error(f"{role} cancelled before it finished shutting down", extra={"role": role})
        code = 1
    except Exception:
        log.exception(f"{role} failed", extra={"role": role})
        code = 1
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            loop.remove_signal_handler(signum)
        await server.close()
        await probe.close()
    log.info(f"{role} stopped", extra={"role": role, "exit_code": code})
    return code


def run_role(role: str, settings: Settings, main: RoleMain, *, need_group: bool) -> int:
    """Set up JSON logging and run the role to completion; return the process exit code."""
    setup_logging(settings.log_level)
    logging.getLogger("judgequeue").debug(
        "connections", extra={"postgres": redact_url(settings.postgres_dsn), "redis": redact_url(settings.redis_url)}
    )
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(serve_role(role, settings, main, need_group=need_group))


def run_refused(role: str, settings: Settings, reason: str) -> int:
    """Serve a worker whose judge refused to start until it is stopped: live, never ready (``reason``
    on ``/readyz``), no connection opened, no job taken; exit code 2."""
    setup_logging(settings.log_level)
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(serve_role(role, settings, _idle, need_group=False, refused=reason))


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop where installed (it roughly halves asyncpg/redis-py overhead per call), else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency everywhere but Windows
        return None
    return uvloop.new_event_loop
