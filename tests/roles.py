"""Run judgequeue roles as real processes for recovery tests, and check the end state."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

from judgequeue.core.states import VERDICTS

JUDGEQUEUE = str(Path(sys.executable).parent / "judgequeue")

TERMINAL = VERDICTS  # one list of verdicts, core/states.py

FAST_SETTINGS = {
    "JUDGEQUEUE_JUDGE": "sleep",
    "JUDGEQUEUE_SCHEDULE": "200ms",
    "JUDGEQUEUE_CLAIM_TTL": "1s",
    "JUDGEQUEUE_BACKOFF_BASE": "100ms",
    "JUDGEQUEUE_BACKOFF_MAX": "1s",
    "JUDGEQUEUE_MAX_ATTEMPTS": "100",
    "JUDGEQUEUE_LEASE_TTL": "1500ms",
    "JUDGEQUEUE_GRACE_PERIOD": "1s",
    "JUDGEQUEUE_REAPER_INTERVAL": "200ms",
    "JUDGEQUEUE_VISIBILITY_TIMEOUT": "1s",
    "JUDGEQUEUE_MAX_DELIVERIES": "50",
    "JUDGEQUEUE_MAX_RETRIES": "50",
    "JUDGEQUEUE_LOG_LEVEL": "WARNING",
}


def json_events(path: Path) -> list[dict[str, Any]]:
    """The JSON log events of one process's log file (lines that are not JSON objects are skipped)."""
    out: list[dict[str, Any]] = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


def stop_process(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds (as a kubelet would)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)


class Roles:
    """A set of role processes sharing one environment; logs go to ``log_dir``."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("JUDGEQUEUE_")}
        self.env.update(FAST_SETTINGS)
        self.env["JUDGEQUEUE_METRICS_PORT"] = "0"
        self.env.update(env)
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, role: str, count: int = 1, **env: str) -> list[subprocess.Popen[bytes]]:
        """Start ``count`` processes of ``role``; ``env`` adds variables for these processes only."""
        started = []
        for _ in range(count):
            with open(self.log_dir / f"{role}-{len(self.procs)}.log", "wb") as log:
                proc = subprocess.Popen(
                    [JUDGEQUEUE, role], env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT
                )
            self.procs.append(proc)
            started.append(proc)
        return started

    def alive(self) -> int:
        return sum(1 for p in self.procs if p.poll() is None)

    def stop(self) -> list[int]:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=20))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        return codes

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
    from judgequeue.core import outbox

    deadline = time.monotonic() + within
    while True:
        try:
            conn = await asyncpg.connect(dsn, timeout=2, **(connect_options or {}))
            try:
                async with conn.transaction():
                    return await outbox.submit(conn, queue, payload)
            finally:
                await conn.close()
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
            conn = await asyncpg.connect(dsn, timeout=2)
            try:
                rows = await conn.fetch("SELECT id, status FROM judgequeue.submissions WHERE id = ANY($1)", ids)
            finally:
                await conn.close()
            last = {r["id"]: r["status"] for r in rows}
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
