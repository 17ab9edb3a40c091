"""Helpers shared by benchmark scripts: throwaway databases, pgbench and redis-benchmark runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from judgequeue.core.migrate import migrate

ADMIN_DSN = os.environ.get("JUDGEQUEUE_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("JUDGEQUEUE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def dsn_for(database: str) -> str:
    return urlunsplit(urlsplit(ADMIN_DSN)._replace(path="/" + database))


async def create_database(prefix: str = "jq_bench") -> str:
    """A new migrated database; returns its DSN (drop it with drop_database)."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    conn = await asyncpg.connect(dsn_for(name))
    try:
        await migrate(conn)
    finally:
        await conn.close()
    return dsn_for(name)


async def drop_database(dsn: str) -> None:
    name = urlsplit(dsn).path.lstrip("/")
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


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


def ratio(ours: float, limit: float) -> str:
    return f"{100 * ours / limit:.0f}%" if limit else "n/a"
