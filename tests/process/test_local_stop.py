"""How ``judgequeue local`` stops its roles, with real role processes against real Postgres and Redis:
stopped at the earliest moment (the SIGTERM before the interpreter has installed any handler) or
once they run, the roles are reported as stopped cleanly, never as a failure."""

from __future__ import annotations

import signal
from pathlib import Path

from judgequeue.core.local.children import start_children, stop_children, stopped_summary
from tests.support.databases import REDIS_URL
from tests.support.roles import clean_env
from tests.support.waiting import eventually

PLAN = ("worker", "dispatcher", "reaper")


def _env(dsn: str, queue: str) -> dict[str, str]:
    return clean_env(JUDGEQUEUE_POSTGRES_DSN=dsn, JUDGEQUEUE_REDIS_URL=REDIS_URL, JUDGEQUEUE_QUEUE=queue,
                     JUDGEQUEUE_METRICS_PORT="0", JUDGEQUEUE_JUDGE="noop")  # fmt: skip


async def test_roles_stopped_as_they_start_are_named_starting_not_failed(
    pg_dsn: str, queue: str, tmp_path: Path
) -> None:
    children = start_children(PLAN, lambda _i: _env(pg_dsn, queue), tmp_path)
    codes = await stop_children(children, grace=30)  # at once: no role has read its command line yet
    clean, line = stopped_summary(codes)
    assert clean, line
    assert set(codes.values()) <= {0, -signal.SIGTERM}, codes
    assert all(label in line for label, code in codes.items() if code == -signal.SIGTERM), line


async def test_roles_stopped_once_they_run_stop_cleanly(pg_dsn: str, queue: str, tmp_path: Path) -> None:
    children = start_children(PLAN, lambda _i: _env(pg_dsn, queue), tmp_path)
    try:
        await eventually(lambda: all(f"{c.role} starting" in c.log_path.read_text() for c in children), within=60,
                         what="every role running")  # fmt: skip
    finally:
        codes = await stop_children(children, grace=30)
    assert stopped_summary(codes) == (True, "all roles stopped cleanly"), [c.tail() for c in children]
