"""How soon does a cancelled running job stop? Cancel-to-stopped, p50 and p99 over N tries.

    sudo .venv/bin/python -m bench.cancel [--tries 50] [--judge program|http-call] [--intake direct|stream]

One throwaway database, the system Redis, a dispatcher and a worker, each its own process as each
would be its own pod. Each try submits a job that would run long (``program``: a Python program
spinning for 10 s in the sandbox, which needs root; ``http-call``: a call to an example tool server
that never answers), waits until it runs (the program has burnt 0.3 s of CPU under the worker; the
tool server has the call), commits ``api.cancel()`` and measures from the commit to

* *killed*: the sandboxed program's process gone (``program`` only), and
* *ended*: the worker's ``judgequeue_jobs_in_flight`` back to 0 (its slot free, the job's task over).

Every try must end ``CANCELLED`` with nothing else in its history. Prints the figures and writes
``cancel.json`` to ``--out``. The ended figure includes reading /metrics every 5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.cli import DEFAULT_INTAKE, new_parser, reporter
from judgequeue.core import api
from judgequeue.core.config import INTAKES
from judgequeue.core.store.queues import create_queue
from tests.support.databases import connection, create_database, drop_database
from tests.support.proc_tree import alive, metric, spinning_under
from tests.support.roles import Roles
from tests.support.tool_server import ToolServer, tool_server

progress = reporter("cancel")

SPINNER = {
    "language": "python",
    "source": "import time\nend = time.monotonic() + 10\nwhile time.monotonic() < end:\n    pass\n",
    "tests": [{"input": "", "output": ""}],
    "limits": {"time": 30},
}


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values`` (pure)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(p / 100 * len(ordered))))
    return ordered[rank - 1]


def _until(check: Callable[[], Any], within: float, what: str, every: float = 0.005) -> Any:
    deadline = time.monotonic() + within
    while not (value := check()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {within}s")
        time.sleep(every)
    return value


def _calls(server: ToolServer, key: str) -> int | None:
    return server.effects()["calls"].get(key)


def _gone(pid: int) -> bool:
    return not alive(pid)


async def run(tries: int, judge: str, intake: str) -> dict[str, Any]:
    dsn = await create_database("jq_cancel_bench")
    queue = f"cancel-{uuid.uuid4().hex[:6]}"
    killed: list[float] = []
    ended: list[float] = []
    try:
        async with connection(dsn) as conn:
            await create_queue(conn, queue)
        with tempfile.TemporaryDirectory() as logs, tool_server("--hang") as hanging:
            sandbox = f"/tmp/jq-cancel-bench-{uuid.uuid4().hex[:8]}"
            env = {"JUDGEQUEUE_JUDGE": judge, "JUDGEQUEUE_INTAKE": intake, "JUDGEQUEUE_LEASE_TTL": "60s",
                   "JUDGEQUEUE_LOG_LEVEL": "INFO", "JUDGEQUEUE_SANDBOX_DIR": sandbox,
                   "JUDGEQUEUE_CALL_ENDPOINTS": json.dumps({"slow": {"url": hanging.url + "/x", "deadline": 60}})}
            roles = Roles.on(dsn, queue, Path(logs), **env)
            try:
                roles.start("dispatcher")
                [worker] = roles.start("worker")
                port = worker.port()
                payload = SPINNER if judge == "program" else {"endpoint": "slow", "body": {}}
                for n in range(1, tries + 1):
                    async with connection(dsn) as conn, conn.transaction():
                        sid = await api.submit(conn, queue, payload)
                    spinner = None
                    if judge == "program":
                        spinner = await asyncio.to_thread(
                            _until, lambda: spinning_under(worker.pid, 0.3), 60, "the spinner running"
                        )
                    else:
                        key = f"judgequeue:{queue}:{sid}:1"
                        await asyncio.to_thread(
                            _until, functools.partial(_calls, hanging, key), 60, "the call under way", 0.01
                        )
                    async with connection(dsn) as conn:
                        async with conn.transaction():
                            await api.cancel(conn, queue, sid, "bench")
                        committed = time.monotonic()
                        if spinner is not None:
                            await asyncio.to_thread(_until, functools.partial(_gone, spinner), 30, "the spinner killed")
                            killed.append(time.monotonic() - committed)
                        await asyncio.to_thread(
                            _until, lambda: metric(port, "judgequeue_jobs_in_flight", queue) == 0, 30, "the job ended"
                        )
                        ended.append(time.monotonic() - committed)
                        history = [(e.generation, e.status) for e in await api.history(conn, queue, sid)]
                        if history != [(2, "CANCELLED")] or (await api.result(conn, sid)).status != "CANCELLED":
                            raise RuntimeError(f"try {n}: submission {sid} has {history}")
                    if n % 10 == 0 or n == tries:
                        progress(f"{n}/{tries}: ended p50 {percentile(ended, 50) * 1000:.0f} ms")
                if worker.poll() is not None:
                    raise RuntimeError(f"the worker exited:\n{worker.log()}")
            finally:
                roles.stop()
    finally:
        await drop_database(dsn)

    def figures(values: list[float]) -> dict[str, float]:
        return {"p50_ms": percentile(values, 50) * 1000, "p99_ms": percentile(values, 99) * 1000,
                "max_ms": max(values) * 1000, "mean_ms": statistics.fmean(values) * 1000}  # fmt: skip

    out: dict[str, Any] = {"tries": tries, "judge": judge, "intake": intake, "ended": figures(ended)}
    if killed:
        out["killed"] = figures(killed)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = new_parser(__doc__)
    parser.add_argument("--tries", type=int, default=50)
    parser.add_argument("--judge", choices=("program", "http-call"), default="program")
    parser.add_argument("--intake", choices=INTAKES, default=DEFAULT_INTAKE)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args: argparse.Namespace = parser.parse_args(argv)
    result = asyncio.run(run(args.tries, args.judge, args.intake))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cancel.json").write_text(json.dumps(result, indent=2))
    for name in ("killed", "ended"):
        if name in result:
            f = result[name]
            print(f"{args.judge} ({args.intake}), {args.tries} tries, cancel to {name}: "
                  f"p50 {f['p50_ms']:.0f} ms, p99 {f['p99_ms']:.0f} ms, max {f['max_ms']:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
