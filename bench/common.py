"""Helpers shared by benchmark scripts: throwaway databases (from ``tests.support.databases``), pgbench and
redis-benchmark runs, timing a judging that must be accepted."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import asyncpg

# The throwaway databases are the tests' own (one implementation, no pytest import there).
from tests.support.databases import REDIS_URL, create_database, drop_database

if TYPE_CHECKING:  # the judge benchmarks only; the others need not import the judges
    from judgequeue.core.judges.program import ProgramJudge

__all__ = [
    "REDIS_URL",
    "create_database",
    "drop_database",
    "judge_accepted",
    "pgbench",
    "ratio",
    "redis_benchmark_xadd",
    "span_seconds",
]


def pgbench(
    dsn: str, script: str, *, clients: int, jobs: int = 2, seconds: int | None = None, transactions: int | None = None
) -> float:
    """Run a custom pgbench script; returns transactions per second (excluding connection time)."""
    if shutil.which("pgbench") is None:
        raise RuntimeError("pgbench not found (apt-get install postgresql-contrib)")
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        args = ["pgbench", "-n", "-c", str(clients), "-j", str(jobs), "-f", path]
        args += ["-T", str(seconds)] if seconds else ["-t", str(transactions)]
        out = subprocess.run([*args, dsn], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    if not match:
        raise RuntimeError(f"unexpected pgbench output:\n{out}")
    return float(match.group(1))


def redis_benchmark_xadd(*, pipeline: int, requests: int = 200_000, redis_url: str = REDIS_URL) -> float:
    """redis-benchmark XADD requests/s on the server at ``redis_url`` (pipelined ``pipeline`` deep)."""
    url = urlsplit(redis_url)
    key = f"jq-bench-xadd-{uuid.uuid4().hex[:6]}"
    out = subprocess.run(
        [
            "redis-benchmark",
            "-h",
            url.hostname or "127.0.0.1",
            "-p",
            str(url.port or 6379),
            "-q",
            "-n",
            str(requests),
            "-P",
            str(pipeline),
            "XADD",
            key,
            "*",
            "f",
            "v",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    subprocess.run(
        ["redis-cli", "-h", url.hostname or "127.0.0.1", "-p", str(url.port or 6379), "DEL", key],
        capture_output=True,
        check=False,
    )
    match = re.search(r"([\d.]+) requests per second", out.replace("\r", "\n"))
    if not match:
        raise RuntimeError(f"unexpected redis-benchmark output:\n{out}")
    return float(match.group(1))


async def span_seconds(db: asyncpg.Connection | asyncpg.Pool, after: int) -> float:
    """Seconds from the first submit to the last verdict of the submissions with ``id > after``."""
    span: float = await db.fetchval(
        "SELECT extract(epoch FROM max(finished_at) - min(created_at))::float8"
        " FROM judgequeue.submissions WHERE id > $1",
        after,
    )
    return span


def ratio(ours: float, limit: float) -> str:
    return f"{100 * ours / limit:.0f}%" if limit else "n/a"


async def judge_accepted(judge: ProgramJudge, payload: dict[str, Any], tests: int, what: str) -> float:
    """Seconds ``judge`` took to judge ``payload``; exits naming ``what`` unless it was accepted on
    all ``tests`` tests (a benchmark of a failing run would time the wrong thing)."""
    started = time.monotonic()
    verdict = await judge.judge(payload)
    took = time.monotonic() - started
    if verdict.status != "ACCEPTED" or len(verdict.details["tests"]) != tests:
        raise SystemExit(f"{what} was not accepted on every test: {verdict.details}")
    return took
