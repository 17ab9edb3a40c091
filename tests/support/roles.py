"""The one way tests run judgequeue as real processes: roles, ``local`` and the CLI; their logs; the end state.

:class:`RoleProcess` is one ``judgequeue <role>`` child with its JSON log in a file; :class:`Roles` a set of
them on one queue over the fast settings preset (:data:`tests.support.settings.FAST_ROLE_ENV`);
:func:`run_cli` a command run to completion. The chaos harness, the recovery and fault tests, the
probe tests and the kube tier's node agent all start and stop processes through these.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg

from judgequeue.core.base.states import VERDICTS
from tests.support.databases import REDIS_URL, connection
from tests.support.queries import submissions
from tests.support.settings import FAST_ROLE_ENV
from tests.support.waiting import wait_for

JUDGEQUEUE = str(Path(sys.executable).parent / "judgequeue")

TERMINAL = VERDICTS  # one list of verdicts, core/base/states.py


def clean_env(**variables: str) -> dict[str, str]:
    """This process's environment without any JUDGEQUEUE_* variable, plus ``variables``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUDGEQUEUE_")}
    env.update(variables)
    return env


def role_env(pg_dsn: str, queue: str, *, redis_url: str = REDIS_URL, **extra: str) -> dict[str, str]:
    """The connection variables of a role on ``queue``, a metrics port of its own, and ``extra``."""
    return {
        "JUDGEQUEUE_POSTGRES_DSN": pg_dsn,
        "JUDGEQUEUE_REDIS_URL": redis_url,
        "JUDGEQUEUE_QUEUE": queue,
        "JUDGEQUEUE_METRICS_PORT": "0",
        **extra,
    }


def log_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a process's log: its JSON object, or ``{"unparsed": line}`` for anything else."""
    out: list[dict[str, Any]] = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        out.append(event if isinstance(event, dict) else {"unparsed": line})
    return out


def json_events(path: Path) -> list[dict[str, Any]]:
    """The JSON log events of one process's log file (lines that are not JSON objects are skipped)."""
    return [event for event in log_lines(path) if "unparsed" not in event]


def last_error(path: Path) -> str:
    """What a process died of: its last ERROR event (the exception's last line), else its last line."""
    try:
        lines = log_lines(path)
    except OSError:
        return "(no log)"
    for event in reversed(lines):
        if event.get("level") == "ERROR":
            exc = str(event.get("exc") or "").strip().splitlines()
            return f"{event.get('msg')}: {exc[-1] if exc else ''}"[:1000]
    return str(lines[-1].get("unparsed", lines[-1]))[:1000] if lines else "(empty log)"


def stop_process(process: subprocess.Popen[bytes], timeout: float, *, terminate: bool = True) -> int:
    """SIGTERM (unless already sent: ``terminate=False``), then SIGKILL if it has not exited within
    ``timeout`` seconds, as a kubelet would. A second SIGTERM is never sent: a role may take it as
    "stop now"."""
    if terminate and process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(timeout)


def http_get(port: int, path: str, timeout: float = 5.0, host: str = "127.0.0.1") -> tuple[int, str]:
    """The status and body of ``GET http://host:port/path`` (an HTTP error status is an answer, not an error)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_serving(process: subprocess.Popen[bytes], port: int, within: float, what: str) -> None:
    """Wait until ``process`` answers ``/healthz`` on ``port`` with 200 (an unready role still serves
    it); fail at once with its output if it exits first."""

    def serving() -> bool:
        assert process.poll() is None, process.communicate()
        try:
            return http_get(port, "/healthz", timeout=2)[0] == 200
        except OSError:
            return False

    wait_for(serving, within, what)


def run_cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``judgequeue ARGS`` to completion, output captured as text."""
    return subprocess.run(
        [JUDGEQUEUE, *args], env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


class RoleProcess(subprocess.Popen[bytes]):
    """``judgequeue <role> [args]`` started as a Deployment starts it, its output (JSON log) in ``log_path``.

    The one way the tests start a judgequeue process that keeps running (roles, ``local``): a
    ``Popen`` with the log helpers beside it.
    """

    def __init__(
        self,
        role: str,
        env: dict[str, str],
        log_path: Path,
        *args: str,
        cwd: Path | None = None,
        new_session: bool = False,
        append: bool = False,
    ) -> None:
        self.role = role
        self.log_path = log_path
        with log_path.open("ab" if append else "wb") as log:
            super().__init__(
                [JUDGEQUEUE, role, *args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                start_new_session=new_session,
            )

    def events(self) -> list[dict[str, Any]]:
        """Every log line, parsed (``{"unparsed": line}`` for a line that is not JSON)."""
        return log_lines(self.log_path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def port(self, within: float = 20.0) -> int:
        """The metrics/probe port the role logged when it started listening."""

        def find() -> int | None:
            if self.poll() is not None:
                raise AssertionError(f"{self.role} exited early:\n{self.log()}")
            return next((e["port"] for e in self.events() if "port" in e and "starting" in e.get("msg", "")), None)

        port: int = wait_for(find, within, f"{self.role} to log its port")
        return port

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait (SIGKILL after ``timeout``); the exit code."""
        return stop_process(self, timeout)

    def ensure_dead(self) -> None:
        if self.poll() is None:
            self.kill()
            self.wait()


class Roles:
    """A set of role processes sharing one environment (the fast preset under it); logs go to ``log_dir``."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = clean_env(**FAST_ROLE_ENV, JUDGEQUEUE_METRICS_PORT="0")
        self.env.update(env)
        self.log_dir = log_dir
        self.procs: list[RoleProcess] = []

    @classmethod
    def on(cls, pg_dsn: str, queue: str, log_dir: Path, *, redis_url: str = REDIS_URL, **env: str) -> Roles:
        """Roles of ``queue`` on the given servers, with ``env`` over the fast preset."""
        return cls(role_env(pg_dsn, queue, redis_url=redis_url, **env), log_dir)

    def start(self, role: str, count: int = 1, **env: str) -> list[RoleProcess]:
        """Start ``count`` processes of ``role``; ``env`` adds variables for these processes only."""
        started = []
        for _ in range(count):
            proc = RoleProcess(role, {**self.env, **env}, self.log_dir / f"{role}-{len(self.procs)}.log")
            self.procs.append(proc)
            started.append(proc)
        return started

    def start_all(self, dispatchers: int = 1, workers: int = 1, reapers: int = 1) -> None:
        """Start a whole deployment: dispatchers, then workers, then reapers (log files numbered in that order)."""
        for role, count in (("dispatcher", dispatchers), ("worker", workers), ("reaper", reapers)):
            if count:
                self.start(role, count)

    def alive(self) -> int:
        return sum(1 for p in self.procs if p.poll() is None)

    def stop(self, timeout: float = 20.0) -> list[int]:
        """SIGTERM every process, then wait for each (SIGKILL after ``timeout``); their exit codes."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        return [stop_process(p, timeout, terminate=False) for p in self.procs]

    @contextlib.asynccontextmanager
    async def all_stay_up(self) -> AsyncIterator[Roles]:
        """Whatever the block does to the servers, every process must still be running at its end;
        then each is stopped (SIGTERM, from a thread: proxies on this event loop keep forwarding)
        and must exit 0. If the block fails, the processes are stopped and its error stands."""
        try:
            yield self
            assert self.alive() == len(self.procs), f"a role exited during the run\n{self.logs()}"
        finally:
            codes = await asyncio.to_thread(self.stop)
        assert codes == [0] * len(codes), f"exit codes {codes}\n{self.logs()}"

    def events(self, role: str) -> list[dict[str, Any]]:
        """Every JSON log event of ``role``'s processes (lines that are not JSON are skipped)."""
        return [event for path in sorted(self.log_dir.glob(f"{role}-*.log")) for event in json_events(path)]

    def logs(self) -> str:
        return "\n".join(f"--- {f.name}\n{f.read_text()[-3000:]}" for f in sorted(self.log_dir.glob("*.log")))


async def submit_retrying(
    dsn: str, queue: str, payload: object, *, within: float = 30, connect_options: dict[str, Any] | None = None
) -> int:
    """Submit like an application would during an outage: retry until the commit succeeds.

    Only submissions whose id we got back count as committed. ``connect_options`` go to
    asyncpg.connect (``statement_cache_size=0`` behind a transaction pooler).
    """
    from judgequeue.core.store import outbox

    deadline = time.monotonic() + within
    while True:
        try:
            async with connection(dsn, timeout=2, **(connect_options or {})) as conn, conn.transaction():
                return await outbox.submit(conn, queue, payload)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)  # the application's retry pacing


async def wait_all_terminal(dsn: str, ids: list[int], *, within: float, roles: Roles | None = None) -> dict[int, str]:
    """Wait until every submission has a terminal status; return the statuses."""
    deadline = time.monotonic() + within
    last: dict[int, str] = {}
    while True:
        try:
            async with connection(dsn, timeout=2) as conn:
                rows = await submissions(conn, ids)
            last = {sid: row["status"] for sid, row in rows.items()}
            if len(last) == len(ids) and all(s in TERMINAL for s in last.values()):
                return last
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            pass
        if time.monotonic() > deadline:
            waiting = {i: s for i, s in last.items() if s not in TERMINAL}
            detail = roles.logs() if roles else ""
            raise AssertionError(
                f"{len(waiting)} of {len(ids)} not terminal within {within}s: {list(waiting.items())[:10]}\n{detail}"
            )
        await asyncio.sleep(0.1)
