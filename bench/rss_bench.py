"""Resident memory of each idle role, started exactly as a Deployment starts it.

    .venv/bin/python -m bench.rss_bench [--settle 5s] [--target-mb 80] [--json]

Creates a throwaway database and queue, starts ``judgequeue dispatcher``, ``worker`` (``--judge``,
default program) and ``reaper`` as processes, waits until each answers ``/readyz`` with 200, lets them idle
for ``--settle``, reads VmRSS (and the peak, VmHWM) from /proc, then stops them with SIGTERM.
Exit code 1 when any role is over the target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import asyncpg

from bench.common import REDIS_URL, create_database, drop_database
from judgequeue.core.config import parse_duration
from judgequeue.core.store.queues import create_queue

ROLES = ("dispatcher", "worker", "reaper")
JUDGEQUEUE = str(Path(sys.executable).with_name("judgequeue"))


def proc_status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def port_of(log: Path, deadline: float) -> int:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        for line in log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "port" in event and "starting" in event.get("msg", ""):
                return int(event["port"])
        time.sleep(0.05)
    raise TimeoutError(f"no port logged in {log}:\n{log.read_text()}")


def wait_ready(port: int, deadline: float) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"/readyz on port {port} not 200 within {deadline}s")


async def _setup(queue: str) -> str:
    dsn = await create_database("jq_rss")
    conn = await asyncpg.connect(dsn)
    try:
        await create_queue(conn, queue)
    finally:
        await conn.close()
    return dsn


def measure(settle: float, judge: str) -> dict[str, dict[str, float]]:
    queue = f"rss-{uuid.uuid4().hex[:8]}"
    dsn = asyncio.run(_setup(queue))
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUDGEQUEUE_")}
    env.update(
        JUDGEQUEUE_POSTGRES_DSN=dsn,
        JUDGEQUEUE_REDIS_URL=REDIS_URL,
        JUDGEQUEUE_QUEUE=queue,
        JUDGEQUEUE_METRICS_PORT="0",
        JUDGEQUEUE_LOG_LEVEL="WARNING",
        JUDGEQUEUE_JUDGE=judge,
    )
    logs = Path(tempfile.mkdtemp(prefix="jq-rss-"))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    results: dict[str, dict[str, float]] = {}
    try:
        for role in ROLES:
            log = logs / f"{role}.log"
            with log.open("wb") as out:
                procs[role] = subprocess.Popen(
                    [JUDGEQUEUE, role, "--log-level", "INFO"], env=env, stdout=out, stderr=subprocess.STDOUT
                )
            wait_ready(port_of(log, 30), 30)
        time.sleep(settle)  # idle on purpose: this is the measurement window, not synchronisation
        for role, proc in procs.items():
            results[role] = {
                "rss_mb": proc_status_kb(proc.pid, "VmRSS") / 1024,
                "peak_rss_mb": proc_status_kb(proc.pid, "VmHWM") / 1024,
            }
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        asyncio.run(drop_database(dsn))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settle", type=parse_duration, default=5.0, help="idle time before sampling (default 5s)")
    parser.add_argument("--target-mb", type=float, default=80.0, help="per-role RSS target (default 80)")
    parser.add_argument("--judge", default="program", help="the worker's judge plugin (default program)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = measure(args.settle, args.judge)
    over = [role for role, r in results.items() if r["rss_mb"] > args.target_mb]
    if args.json:
        print(json.dumps({"target_mb": args.target_mb, "roles": results, "over_target": over}, indent=2))
    else:
        python = sys.version.split()[0]
        print(f"idle RSS per role (target <= {args.target_mb:g} MB, judge {args.judge}, python {python})")
        for role, r in results.items():
            mark = "" if r["rss_mb"] <= args.target_mb else "  OVER TARGET"
            print(f"  {role:<10} {r['rss_mb']:6.1f} MB   (peak {r['peak_rss_mb']:.1f} MB){mark}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
